"""Matrix multiplication: naive and shared-memory tiled GEMM, matrix-vector products, batched,
transposed and fused variants (category "matmul").

Matrices are float32 and row-major; inputs are uniform in [-1, 1]. The kernels cover the
idioms of the family: one thread per output element, shared-memory tiling with zero-padded
edge tiles, register blocking (several outputs per thread), one warp per row with a shuffle
reduction, and a split of the summation over thread rows combined in shared memory. Every
size is passed to the kernels, and the odd shapes (no tile divides them) check the guards.

Tolerance: an output that sums K products of uniform(-1, 1) values has magnitude about
sqrt(K) / 3 (about 11 for K = 1024, 21 for K = 4096). Float32 accumulation in any order
(sequential, tiled, shuffle tree, with or without fma) is off by a random walk of roughly
6e-8 * K / 7, i.e. below 1e-4 even for K = 4096. atol = rtol = 1e-3 leaves room for every
summation order, while one missing or doubled product (about 0.3) fails.
"""

from __future__ import annotations

from taskgen.core import Buffer, OpSpec, int_constants, kernel_signatures

CATEGORY = "matmul"
SUM_ATOL = 1e-3
SUM_RTOL = 1e-3


def _uniform(name: str, shape: str) -> str:
    return f"{name} = rng.uniform(-1.0, 1.0, {shape}).astype(np.float32)"


def _gen_ab(dims: str, shape_a: str, shape_b: str, product: str, out: str = "C") -> str:
    """gen.py body for out = product(A, B) of two uniform matrices."""
    return "\n".join(
        [
            dims,
            _uniform("A", shape_a),
            _uniform("B", shape_b),
            "",
            "",
            "def reference(A, B):",
            f"    return {product}",
            "",
            "",
            f"{out}_ref = reference(A.astype(np.float64), B.astype(np.float64)).astype(np.float32)",
        ]
    )


# ---------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------

NAIVE_KERNEL = """
// One thread per element C[row][col]. threadIdx.x runs along a row of C, so a warp reads
// consecutive elements of B and writes consecutive elements of C (coalesced), while
// A[row][k] is one address per half-warp (16 x 16 blocks), i.e. a broadcast.
__global__ void matmul_naive_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int K, int N) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M && col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k)
            acc += A[row * K + k] * B[k * N + col];
        C[row * N + col] = acc;
    }
}
"""


def _matmul_naive(M: int, K: int, N: int, variant: str = "") -> OpSpec:
    return OpSpec(
        op="matmul_naive",
        name="Naive_Matrix_Multiply",
        category=CATEGORY,
        split="train",
        variant=variant,
        description=f"Multiply a {M}x{K} float32 matrix A by a {K}x{N} matrix B, giving C = A B ({M}x{N}).",
        level1=f"""
            Write a CUDA kernel that computes the matrix product C = A B, C[i][j] = sum over k of
            A[i][k] * B[k][j], for row-major float32 matrices A ({M} x {K}), B ({K} x {N}) and C
            ({M} x {N}). Use one thread per output element on a 2-D grid of 16 x 16 thread blocks:
            threadIdx.x indexes the column of C (so reads of B and writes of C are coalesced) and
            threadIdx.y the row. Each thread loops over k, accumulates in a float register and
            writes C once. Guard row < M and col < N: the grid is rounded up to whole blocks.
            """,
        level2=f"""
            Compute C = A B for row-major float32 matrices A ({M} x {K}) and B ({K} x {N}):
            C[i][j] = sum over k of A[i][k] * B[k][j]. C is {M} x {N}.
            """,
        inputs=[Buffer("A", "float32", (M, K)), Buffer("B", "float32", (K, N))],
        outputs=[Buffer("C", "float32", (M, N))],
        constants=int_constants(M=M, K=K, N=N),
        kernels=NAIVE_KERNEL,
        signatures=kernel_signatures(NAIVE_KERNEL),
        launch="""
            dim3 block(16, 16);
            dim3 grid((N + 15) / 16, (M + 15) / 16);
            {k}matmul_naive_kernel<<<grid, block>>>(d_A, d_B, d_C, M, K, N);
            """,
        launch_note="matmul_naive_kernel is launched once with 16 x 16 thread blocks on a grid of "
        "((N + 15) / 16, (M + 15) / 16) blocks: blockIdx.x / threadIdx.x cover the columns of C, "
        "blockIdx.y / threadIdx.y its rows; edge blocks are partly outside C.",
        gen=_gen_ab(f"M, K, N = {M}, {K}, {N}", "(M, K)", "(K, N)", "A @ B"),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


TILED_KERNEL = """
constexpr int TILE = 16;

// Each 16 x 16 block computes one 16 x 16 tile of C. It walks K in steps of TILE, staging a
// tile of A and a tile of B in shared memory, so each global element is loaded once per
// block rather than once per thread. Entries outside A or B are stored as 0, which adds
// nothing to the dot product, so the inner loop needs no bounds checks.
__global__ void matmul_tiled_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int K, int N) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int ka = k0 + tx;  // column of A loaded by this thread
        int kb = k0 + ty;  // row of B loaded by this thread
        As[ty][tx] = (row < M && ka < K) ? A[row * K + ka] : 0.0f;
        Bs[ty][tx] = (kb < K && col < N) ? B[kb * N + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k)
            acc += As[ty][k] * Bs[k][tx];
        __syncthreads();  // the tiles are overwritten in the next step
    }
    if (row < M && col < N)
        C[row * N + col] = acc;
}
"""


def _matmul_tiled(M: int, K: int, N: int, variant: str = "") -> OpSpec:
    return OpSpec(
        op="matmul_tiled",
        name="Tiled_Matrix_Multiply",
        category=CATEGORY,
        split="train",
        variant=variant,
        description=f"Multiply a {M}x{K} float32 matrix A by a {K}x{N} matrix B with shared-memory tiling, "
        f"giving C = A B ({M}x{N}).",
        level1=f"""
            Write a shared-memory tiled CUDA kernel for C = A B, C[i][j] = sum over k of A[i][k] *
            B[k][j], with row-major float32 A ({M} x {K}), B ({K} x {N}) and C ({M} x {N}). Use 16 x 16
            thread blocks, each computing a 16 x 16 tile of C. Loop over K in steps of 16: every
            thread loads one element of the A tile and one of the B tile into __shared__ arrays,
            __syncthreads(), accumulates the 16 products of its row of the A tile and column of the
            B tile, and __syncthreads() again before the next step. The sizes need not be multiples
            of 16: load 0 for tile entries outside A or B (keep every thread in the loop, because of
            the barriers) and guard the final store.
            """,
        level2=f"""
            Compute C = A B for row-major float32 matrices A ({M} x {K}) and B ({K} x {N}):
            C[i][j] = sum over k of A[i][k] * B[k][j]. C is {M} x {N}.
            """,
        inputs=[Buffer("A", "float32", (M, K)), Buffer("B", "float32", (K, N))],
        outputs=[Buffer("C", "float32", (M, N))],
        constants=int_constants(M=M, K=K, N=N),
        kernels=TILED_KERNEL,
        signatures=kernel_signatures(TILED_KERNEL),
        launch="""
            dim3 block(16, 16);
            dim3 grid((N + 15) / 16, (M + 15) / 16);
            {k}matmul_tiled_kernel<<<grid, block>>>(d_A, d_B, d_C, M, K, N);
            """,
        launch_note="matmul_tiled_kernel is launched once with 16 x 16 thread blocks on a grid of "
        "((N + 15) / 16, (M + 15) / 16) blocks; block (bx, by) computes rows 16*by.. and columns "
        "16*bx.. of C. No dynamic shared memory (declare the tiles statically).",
        gen=_gen_ab(f"M, K, N = {M}, {K}, {N}", "(M, K)", "(K, N)", "A @ B"),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


MATVEC_KERNEL = """
// One warp per row of A: the 32 lanes stride along the row (coalesced loads), then a
// shuffle tree adds the 32 partial sums. A warp's lanes share one row, so a warp past the
// last row returns as a whole and every full-mask shuffle has all 32 lanes present.
__global__ void matvec_warp_kernel(const float* __restrict__ A, const float* __restrict__ x, float* __restrict__ y, int M, int N) {
    int lane = threadIdx.x & 31;
    int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= M) return;
    const float* a = A + (size_t)row * N;
    float sum = 0.0f;
    for (int c = lane; c < N; c += 32)
        sum += a[c] * x[c];
    for (int offset = 16; offset > 0; offset >>= 1)
        sum += __shfl_down_sync(0xffffffff, sum, offset);
    if (lane == 0)
        y[row] = sum;
}
"""


def _matvec(M: int, N: int) -> OpSpec:
    return OpSpec(
        op="matrix_vector_multiply",
        name="Matrix_Vector_Multiply",
        category=CATEGORY,
        split="train",
        description=f"Multiply a {M}x{N} float32 matrix A by a vector x of {N} elements, giving y = A x.",
        level1=f"""
            Write a CUDA kernel for the matrix-vector product y = A x, y[i] = sum over j of A[i][j] *
            x[j], with a row-major float32 matrix A ({M} x {N}) and x of {N} elements. Assign one
            warp to each row: launch blocks of 256 threads (8 warps, 8 rows per block); lane l of
            the warp sums A[i][j] * x[j] for j = l, l + 32, ... (coalesced reads), then the warp
            combines its 32 partial sums with __shfl_down_sync(0xffffffff, ...) and lane 0 writes
            y[i]. {M} is not a multiple of 8: warps beyond the last row must exit as a whole.
            """,
        level2=f"""
            Compute y = A x for a row-major float32 matrix A ({M} x {N}) and a vector x ({N}):
            y[i] = sum over j of A[i][j] * x[j]. y has {M} elements.
            """,
        inputs=[Buffer("A", "float32", (M, N)), Buffer("x", "float32", (N,))],
        outputs=[Buffer("y", "float32", (M,))],
        constants=int_constants(M=M, N=N),
        kernels=MATVEC_KERNEL,
        signatures=kernel_signatures(MATVEC_KERNEL),
        launch="{k}matvec_warp_kernel<<<(M + 7) / 8, 256>>>(d_A, d_x, d_y, M, N);",
        launch_note="matvec_warp_kernel is launched once with (M + 7) / 8 blocks of 256 threads: one warp "
        "(32 consecutive threads) per row of A, global warp index = row; the last block has "
        "warps past row M - 1.",
        gen="\n".join(
            [
                f"M, N = {M}, {N}",
                _uniform("A", "(M, N)"),
                _uniform("x", "N"),
                "",
                "",
                "def reference(A, x):",
                "    return A @ x",
                "",
                "",
                "y_ref = reference(A.astype(np.float64), x.astype(np.float64)).astype(np.float32)",
            ]
        ),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


BATCHED_KERNEL = """
constexpr int TILE = 32;  // edge of the square tile of C computed by one block
constexpr int ROWS = 8;   // blockDim.y; each thread computes TILE / ROWS = 4 rows of the tile

// C[b] = A[b] B[b] for the batch b = blockIdx.z. A 32 x 8 block computes a 32 x 32 tile of
// C[b]: thread (tx, ty) owns column tx and rows ty, ty + 8, ty + 16, ty + 24, so each value
// read from the B tile feeds 4 outputs (register blocking). Edge tiles are zero-padded.
__global__ void batched_matmul_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int K, int N) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    const float* Ab = A + (size_t)blockIdx.z * M * K;
    const float* Bb = B + (size_t)blockIdx.z * K * N;
    float* Cb = C + (size_t)blockIdx.z * M * N;
    int tx = threadIdx.x, ty = threadIdx.y;
    int row0 = blockIdx.y * TILE;
    int col = blockIdx.x * TILE + tx;
    float acc[TILE / ROWS];
#pragma unroll
    for (int i = 0; i < TILE / ROWS; ++i) acc[i] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        for (int r = ty; r < TILE; r += ROWS) {
            int arow = row0 + r, acol = k0 + tx;
            As[r][tx] = (arow < M && acol < K) ? Ab[(size_t)arow * K + acol] : 0.0f;
            int brow = k0 + r;
            Bs[r][tx] = (brow < K && col < N) ? Bb[(size_t)brow * N + col] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < TILE; ++k) {
            float b = Bs[k][tx];
#pragma unroll
            for (int i = 0; i < TILE / ROWS; ++i)
                acc[i] += As[ty + i * ROWS][k] * b;
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TILE / ROWS; ++i) {
        int row = row0 + ty + i * ROWS;
        if (row < M && col < N)
            Cb[(size_t)row * N + col] = acc[i];
    }
}
"""


def _batched_matmul(batch: int, M: int, K: int, N: int) -> OpSpec:
    return OpSpec(
        op="batched_matmul",
        name="Batched_Matrix_Multiply",
        category=CATEGORY,
        split="train",
        description=f"Multiply {batch} pairs of float32 matrices, C[b] = A[b] B[b] with A[b] {M}x{K} and "
        f"B[b] {K}x{N}.",
        level1=f"""
            Write a CUDA kernel for the batched matrix product C[b] = A[b] B[b], b = 0..{batch - 1},
            with float32 tensors A ({batch} x {M} x {K}), B ({batch} x {K} x {N}) and C ({batch} x {M} x
            {N}), each matrix row-major and the batches stored one after another. Use a 3-D grid with
            blockIdx.z = b and 32 x 8 thread blocks that each compute a 32 x 32 tile of C[b]: stage
            32 x 32 tiles of A[b] and B[b] in shared memory (each thread loads 4 elements of each, zero
            outside the matrices), __syncthreads(), and let thread (tx, ty) accumulate column tx of rows
            ty, ty + 8, ty + 16, ty + 24 in 4 registers. M = {M} and N = {N} are not multiples of 32:
            guard the stores.
            """,
        level2=f"""
            For each b in 0..{batch - 1}, compute C[b] = A[b] B[b] where A is {batch} x {M} x {K}, B is
            {batch} x {K} x {N} (float32, row-major, batches contiguous): C[b][i][j] = sum over k of
            A[b][i][k] * B[b][k][j].
            """,
        inputs=[Buffer("A", "float32", (batch, M, K)), Buffer("B", "float32", (batch, K, N))],
        outputs=[Buffer("C", "float32", (batch, M, N))],
        constants=int_constants(BATCH=batch, M=M, K=K, N=N),
        kernels=BATCHED_KERNEL,
        signatures=kernel_signatures(BATCHED_KERNEL),
        launch="""
            dim3 block(32, 8);
            dim3 grid((N + 31) / 32, (M + 31) / 32, BATCH);
            {k}batched_matmul_kernel<<<grid, block>>>(d_A, d_B, d_C, M, K, N);
            """,
        launch_note="batched_matmul_kernel is launched once with 32 x 8 thread blocks on a grid of "
        "((N + 31) / 32, (M + 31) / 32, BATCH) blocks: blockIdx.z is the batch, block (bx, by) "
        "computes rows 32*by..32*by+31 and columns 32*bx..32*bx+31 of C[b], so each thread "
        "produces 4 outputs.",
        gen=_gen_ab(
            f"BATCH, M, K, N = {batch}, {M}, {K}, {N}",
            "(BATCH, M, K)",
            "(BATCH, K, N)",
            "np.matmul(A, B)  # batched over the leading axis",
        ),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


OUTER_KERNEL = """
// Grid-stride loop over the flattened M x N output. Consecutive threads write consecutive
// columns of one row (coalesced); x[i] is the same for most of a warp.
__global__ void outer_product_kernel(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ C, int M, int N) {
    int total = M * N;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += blockDim.x * gridDim.x) {
        int i = idx / N;
        int j = idx - i * N;
        C[idx] = x[i] * y[j];
    }
}
"""


def _outer_product(M: int, N: int) -> OpSpec:
    return OpSpec(
        op="outer_product",
        name="Vector_Outer_Product",
        category=CATEGORY,
        split="train",
        description=f"Form the outer product C = x y^T of float32 vectors x ({M}) and y ({N}), a {M}x{N} matrix.",
        level1=f"""
            Write a CUDA kernel for the outer product C[i][j] = x[i] * y[j] of float32 vectors x ({M}
            elements) and y ({N} elements); C is a row-major {M} x {N} matrix. Use a grid-stride loop
            over the flattened index idx = i * {N} + j with 256 threads per block and a fixed grid of
            1024 blocks; recover i = idx / N and j = idx - i * N, so that consecutive threads write
            consecutive elements of C.
            """,
        level2=f"""
            Compute the outer product C = x y^T of x ({M} floats) and y ({N} floats): C[i][j] = x[i] * y[j],
            a row-major {M} x {N} float32 matrix.
            """,
        inputs=[Buffer("x", "float32", (M,)), Buffer("y", "float32", (N,))],
        outputs=[Buffer("C", "float32", (M, N))],
        constants=int_constants(M=M, N=N),
        kernels=OUTER_KERNEL,
        signatures=kernel_signatures(OUTER_KERNEL),
        launch="{k}outer_product_kernel<<<1024, 256>>>(d_x, d_y, d_C, M, N);",
        launch_note="outer_product_kernel is launched once with 1024 blocks of 256 threads, fewer threads "
        "than outputs, so each thread loops over the flattened output with a grid stride.",
        gen="\n".join(
            [
                f"M, N = {M}, {N}",
                _uniform("x", "M"),
                _uniform("y", "N"),
                "",
                "",
                "def reference(x, y):",
                "    return np.outer(x, y)",
                "",
                "",
                "C_ref = reference(x.astype(np.float64), y.astype(np.float64)).astype(np.float32)",
            ]
        ),
    )


GEMM_KERNEL = """
constexpr int TILE = 32;

// D = alpha * A B + beta * C. A 32 x 32 block computes a 32 x 32 tile of D with the
// shared-memory tiling of a plain matmul (zero-padded edge tiles); the epilogue reads C once
// per output and applies alpha and beta.
__global__ void gemm_alpha_beta_kernel(const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ C, float* __restrict__ D, int M, int K, int N, float alpha, float beta) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = (row < M && k0 + tx < K) ? A[(size_t)row * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(size_t)(k0 + ty) * N + col] : 0.0f;
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < TILE; ++k)
            acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N) {
        size_t idx = (size_t)row * N + col;
        D[idx] = alpha * acc + beta * C[idx];
    }
}
"""


def _gemm_alpha_beta(M: int, K: int, N: int, alpha: float, beta: float) -> OpSpec:
    return OpSpec(
        op="gemm_alpha_beta",
        name="GEMM_Alpha_Beta",
        category=CATEGORY,
        split="train",
        description=f"General matrix multiply D = alpha A B + beta C (alpha = {alpha}, beta = {beta}) with A "
        f"{M}x{K}, B {K}x{N}, C and D {M}x{N} (float32).",
        level1=f"""
            Write a CUDA GEMM kernel computing D = alpha * (A B) + beta * C with alpha = {alpha},
            beta = {beta}, and row-major float32 matrices A ({M} x {K}), B ({K} x {N}), C and D ({M} x
            {N}); C is an input and D a separate output. Use 32 x 32 thread blocks, each computing a
            32 x 32 tile of D with shared-memory tiling over K (tiles of A and B staged in __shared__
            arrays, zero outside the matrices, __syncthreads() around the inner product), then apply
            alpha and beta in the epilogue. Guard the store: {M} and {N} are not multiples of 32.
            """,
        level2=f"""
            Compute D = alpha * (A B) + beta * C with alpha = {alpha}, beta = {beta}, A ({M} x {K}),
            B ({K} x {N}), C ({M} x {N}); all float32, row-major. D is {M} x {N}.
            """,
        inputs=[
            Buffer("A", "float32", (M, K)),
            Buffer("B", "float32", (K, N)),
            Buffer("C", "float32", (M, N)),
        ],
        outputs=[Buffer("D", "float32", (M, N))],
        constants=int_constants(M=M, K=K, N=N)
        + f"\nconst float alpha = {alpha}f;\nconst float beta = {beta}f;",
        kernels=GEMM_KERNEL,
        signatures=kernel_signatures(GEMM_KERNEL),
        launch="""
            dim3 block(32, 32);
            dim3 grid((N + 31) / 32, (M + 31) / 32);
            {k}gemm_alpha_beta_kernel<<<grid, block>>>(d_A, d_B, d_C, d_D, M, K, N, alpha, beta);
            """,
        launch_note="gemm_alpha_beta_kernel is launched once with 32 x 32 thread blocks (1024 threads) on a "
        "grid of ((N + 31) / 32, (M + 31) / 32) blocks; block (bx, by) computes rows 32*by.. and "
        "columns 32*bx.. of D.",
        gen="\n".join(
            [
                f"M, K, N = {M}, {K}, {N}",
                f"alpha, beta = {alpha}, {beta}",
                _uniform("A", "(M, K)"),
                _uniform("B", "(K, N)"),
                _uniform("C", "(M, N)"),
                "",
                "",
                "def reference(A, B, C):",
                "    return alpha * (A @ B) + beta * C",
                "",
                "",
                "D_ref = reference(A.astype(np.float64), B.astype(np.float64), C.astype(np.float64)).astype(np.float32)",
            ]
        ),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


# ---------------------------------------------------------------------------------------
# eval: held-out operations
# ---------------------------------------------------------------------------------------

AT_B_KERNEL = """
constexpr int TILE = 16;

// C = A^T B with A stored K x M. Both operands are read along their rows (coalesced): the
// block stages At[kk][i] = A[k0 + kk][row0 + i] and Bs[kk][j] = B[k0 + kk][col0 + j], and
// C[row][col] sums At[kk][ty] * Bs[kk][tx]. Entries outside the matrices are zero.
__global__ void matmul_at_b_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int K, int N) {
    __shared__ float At[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row0 = blockIdx.y * TILE;
    int row = row0 + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int k = k0 + ty;
        At[ty][tx] = (k < K && row0 + tx < M) ? A[k * M + row0 + tx] : 0.0f;
        Bs[ty][tx] = (k < K && col < N) ? B[k * N + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk)
            acc += At[kk][ty] * Bs[kk][tx];
        __syncthreads();
    }
    if (row < M && col < N)
        C[row * N + col] = acc;
}
"""


def _matmul_at_b(M: int, K: int, N: int) -> OpSpec:
    return OpSpec(
        op="matmul_at_b",
        name="Transposed_A_Matrix_Multiply",
        category=CATEGORY,
        split="eval",
        description=f"Compute C = A^T B where A is a {K}x{M} and B a {K}x{N} float32 matrix, giving a "
        f"{M}x{N} matrix.",
        level1=f"""
            Write a CUDA kernel for C = A^T B, C[i][j] = sum over k of A[k][i] * B[k][j], where A is a
            row-major float32 {K} x {M} matrix (A^T is never formed), B is {K} x {N} and C is {M} x {N}.
            Use 16 x 16 thread blocks with shared-memory tiling over k: in each step stage the 16 x 16
            block of A with rows k0..k0+15 and columns 16*blockIdx.y.. and the block of B with rows
            k0..k0+15 and columns 16*blockIdx.x.., both loaded along rows so the loads are coalesced,
            zero outside the matrices; __syncthreads() before and after the inner product. Guard the
            store: {M} and {N} are not multiples of 16.
            """,
        level2=f"""
            Compute C = A^T B for row-major float32 A ({K} x {M}) and B ({K} x {N}): C[i][j] = sum over k
            of A[k][i] * B[k][j]. C is {M} x {N}.
            """,
        inputs=[Buffer("A", "float32", (K, M)), Buffer("B", "float32", (K, N))],
        outputs=[Buffer("C", "float32", (M, N))],
        constants=int_constants(M=M, K=K, N=N),
        kernels=AT_B_KERNEL,
        signatures=kernel_signatures(AT_B_KERNEL),
        launch="""
            dim3 block(16, 16);
            dim3 grid((N + 15) / 16, (M + 15) / 16);
            {k}matmul_at_b_kernel<<<grid, block>>>(d_A, d_B, d_C, M, K, N);
            """,
        launch_note="matmul_at_b_kernel is launched once with 16 x 16 thread blocks on a grid of "
        "((N + 15) / 16, (M + 15) / 16) blocks; block (bx, by) computes rows 16*by.. and "
        "columns 16*bx.. of C. The kernel receives M, K, N with A of shape K x M.",
        gen=_gen_ab(f"M, K, N = {M}, {K}, {N}", "(K, M)", "(K, N)", "A.T @ B"),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


VECMAT_KERNEL = """
constexpr int COLS = 32;    // blockDim.x: adjacent columns per block
constexpr int SLICES = 16;  // blockDim.y: the rows of A are split among 16 thread rows

// y[j] = sum over i of x[i] * A[i][j]. A block owns 32 adjacent columns; thread row ty sums
// rows ty, ty + 16, ... so a warp reads 32 consecutive floats of one row of A (coalesced).
// The 16 partial sums of each column are then added in shared memory by thread row 0.
__global__ void vecmat_kernel(const float* __restrict__ x, const float* __restrict__ A, float* __restrict__ y, int M, int N) {
    __shared__ float partial[SLICES][COLS];
    int tx = threadIdx.x, ty = threadIdx.y;
    int col = blockIdx.x * COLS + tx;
    float sum = 0.0f;
    if (col < N)
        for (int i = ty; i < M; i += SLICES)
            sum += x[i] * A[(size_t)i * N + col];
    partial[ty][tx] = sum;
    __syncthreads();
    if (ty == 0 && col < N) {
        float total = 0.0f;
        for (int s = 0; s < SLICES; ++s)
            total += partial[s][tx];
        y[col] = total;
    }
}
"""


def _vecmat(M: int, N: int) -> OpSpec:
    return OpSpec(
        op="vector_matrix_multiply",
        name="Vector_Matrix_Multiply",
        category=CATEGORY,
        split="eval",
        description=f"Multiply a row vector x of {M} floats by a {M}x{N} float32 matrix A, giving y = x^T A "
        f"({N} elements).",
        level1=f"""
            Write a CUDA kernel for the vector-matrix product y = x^T A, y[j] = sum over i of x[i] *
            A[i][j], with x of {M} floats and a row-major float32 matrix A ({M} x {N}); y has {N}
            elements. Use 32 x 16 thread blocks, each owning 32 adjacent columns: thread (tx, ty) sums
            x[i] * A[i][col] over the rows i = ty, ty + 16, ... (a warp then reads 32 consecutive floats
            of a row, coalesced), writes its partial sum to a 16 x 32 __shared__ array, and after
            __syncthreads() the threads with ty == 0 add the 16 partial sums of their column and store
            y. {N} is not a multiple of 32: guard the columns, but keep every thread at the barrier.
            """,
        level2=f"""
            Compute y = x^T A for x ({M} floats) and a row-major float32 matrix A ({M} x {N}):
            y[j] = sum over i of x[i] * A[i][j]. y has {N} elements.
            """,
        inputs=[Buffer("x", "float32", (M,)), Buffer("A", "float32", (M, N))],
        outputs=[Buffer("y", "float32", (N,))],
        constants=int_constants(M=M, N=N),
        kernels=VECMAT_KERNEL,
        signatures=kernel_signatures(VECMAT_KERNEL),
        launch="""
            dim3 block(32, 16);
            {k}vecmat_kernel<<<(N + 31) / 32, block>>>(d_x, d_A, d_y, M, N);
            """,
        launch_note="vecmat_kernel is launched once with 32 x 16 thread blocks on (N + 31) / 32 blocks: block b "
        "owns columns 32*b..32*b+31 (threadIdx.x), and the 16 thread rows (threadIdx.y) share "
        "the rows of A.",
        gen="\n".join(
            [
                f"M, N = {M}, {N}",
                _uniform("x", "M"),
                _uniform("A", "(M, N)"),
                "",
                "",
                "def reference(x, A):",
                "    return x @ A",
                "",
                "",
                "y_ref = reference(x.astype(np.float64), A.astype(np.float64)).astype(np.float32)",
            ]
        ),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


GRAM_KERNEL = """
constexpr int TILE = 16;

// G[i][j] = dot(row i of A, row j of A). Block (bx, by) computes G rows 16*by.. and columns
// 16*bx..; both operands are row tiles of A, staged along rows (coalesced). Ac is read
// down a column (Ac[tx][kk]), so its rows are padded to TILE + 1 floats: the 16 threads of
// a half-warp then hit 16 different banks instead of one.
__global__ void gram_matrix_kernel(const float* __restrict__ A, float* __restrict__ G, int M, int K) {
    __shared__ float Ar[TILE][TILE];
    __shared__ float Ac[TILE][TILE + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;     // row of G, and the row of A loaded into Ar
    int crow = blockIdx.x * TILE + ty;    // row of A loaded into Ac
    int col = blockIdx.x * TILE + tx;     // column of G
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int k = k0 + tx;
        Ar[ty][tx] = (row < M && k < K) ? A[row * K + k] : 0.0f;
        Ac[ty][tx] = (crow < M && k < K) ? A[crow * K + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk)
            acc += Ar[ty][kk] * Ac[tx][kk];
        __syncthreads();
    }
    if (row < M && col < M)
        G[row * M + col] = acc;
}
"""


def _gram_matrix(M: int, K: int) -> OpSpec:
    return OpSpec(
        op="gram_matrix",
        name="Gram_Matrix",
        category=CATEGORY,
        split="eval",
        description=f"Compute the Gram matrix G = A A^T of a {M}x{K} float32 matrix A ({M}x{M}).",
        level1=f"""
            Write a CUDA kernel for the Gram matrix G = A A^T, G[i][j] = sum over k of A[i][k] * A[j][k],
            of a row-major float32 matrix A ({M} x {K}); G is {M} x {M}. Use 16 x 16 thread blocks with
            shared-memory tiling over k: block (bx, by) stages the 16 rows 16*by.. of A and the 16 rows
            16*bx.. of A (columns k0..k0+15, loaded along rows, zero outside A) in two __shared__ tiles,
            the second padded to 16 x 17 floats because it is read column-wise; __syncthreads() around
            the inner product. Guard the store: {M} is not a multiple of 16.
            """,
        level2=f"""
            Compute G = A A^T for a row-major float32 matrix A ({M} x {K}): G[i][j] = sum over k of
            A[i][k] * A[j][k]. G is {M} x {M}.
            """,
        inputs=[Buffer("A", "float32", (M, K))],
        outputs=[Buffer("G", "float32", (M, M))],
        constants=int_constants(M=M, K=K),
        kernels=GRAM_KERNEL,
        signatures=kernel_signatures(GRAM_KERNEL),
        launch="""
            dim3 block(16, 16);
            dim3 grid((M + 15) / 16, (M + 15) / 16);
            {k}gram_matrix_kernel<<<grid, block>>>(d_A, d_G, M, K);
            """,
        launch_note="gram_matrix_kernel is launched once with 16 x 16 thread blocks on a grid of "
        "((M + 15) / 16, (M + 15) / 16) blocks; block (bx, by) computes rows 16*by.. and columns "
        "16*bx.. of G.",
        gen="\n".join(
            [
                f"M, K = {M}, {K}",
                _uniform("A", "(M, K)"),
                "",
                "",
                "def reference(A):",
                "    return A @ A.T",
                "",
                "",
                "G_ref = reference(A.astype(np.float64)).astype(np.float32)",
            ]
        ),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


# ---------------------------------------------------------------------------------------
# pretrain
# ---------------------------------------------------------------------------------------

BATCHED_MATVEC_KERNEL = """
// y[b] = A[b] x[b]: one thread per (batch, row), blockIdx.y = batch. The batch's vector is
// staged in shared memory once per block (a block-stride copy), since every row reads all of it.
__global__ void batched_matvec_kernel(const float* __restrict__ A, const float* __restrict__ x, float* __restrict__ y, int M, int N) {
    extern __shared__ float xs[];  // N floats
    int b = blockIdx.y;
    for (int j = threadIdx.x; j < N; j += blockDim.x)
        xs[j] = x[(size_t)b * N + j];
    __syncthreads();
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M) {
        const float* a = A + ((size_t)b * M + row) * N;
        float sum = 0.0f;
        for (int j = 0; j < N; ++j)
            sum += a[j] * xs[j];
        y[(size_t)b * M + row] = sum;
    }
}
"""


def _batched_matvec(batch: int, M: int, N: int) -> OpSpec:
    return OpSpec(
        op="batched_matvec",
        name="Batched_Matrix_Vector_Multiply",
        category=CATEGORY,
        split="pretrain",
        description=f"Multiply {batch} float32 matrices A[b] ({M}x{N}) by their own vectors x[b] ({N}), "
        f"giving y[b] = A[b] x[b].",
        level1=f"""
            Write a CUDA kernel for y[b] = A[b] x[b], b = 0..{batch - 1}, with float32 A ({batch} x {M} x
            {N}), x ({batch} x {N}) and y ({batch} x {M}), all row-major. Use one thread per (batch, row):
            blockIdx.y is the batch and 128 threads per block cover the rows. Each block first copies
            x[b] into dynamic shared memory ({N} floats) and calls __syncthreads(); then each thread with
            row < {M} computes the dot product of its row with the staged vector.
            """,
        level2=f"""
            For each b in 0..{batch - 1}, compute y[b] = A[b] x[b] with A ({batch} x {M} x {N}) and x
            ({batch} x {N}), float32: y[b][i] = sum over j of A[b][i][j] * x[b][j].
            """,
        inputs=[Buffer("A", "float32", (batch, M, N)), Buffer("x", "float32", (batch, N))],
        outputs=[Buffer("y", "float32", (batch, M))],
        constants=int_constants(BATCH=batch, M=M, N=N),
        kernels=BATCHED_MATVEC_KERNEL,
        signatures=kernel_signatures(BATCHED_MATVEC_KERNEL),
        launch="""
            dim3 grid((M + 127) / 128, BATCH);
            {k}batched_matvec_kernel<<<grid, 128, N * sizeof(float)>>>(d_A, d_x, d_y, M, N);
            """,
        launch_note="batched_matvec_kernel is launched once with 128 threads per block on a grid of "
        "((M + 127) / 128, BATCH) blocks (blockIdx.y = batch) and N * sizeof(float) bytes of "
        "dynamic shared memory for the batch's vector.",
        gen="\n".join(
            [
                f"BATCH, M, N = {batch}, {M}, {N}",
                _uniform("A", "(BATCH, M, N)"),
                _uniform("x", "(BATCH, N)"),
                "",
                "",
                "def reference(A, x):",
                "    return np.einsum('bij,bj->bi', A, x)",
                "",
                "",
                "y_ref = reference(A.astype(np.float64), x.astype(np.float64)).astype(np.float32)",
            ]
        ),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


LINEAR_KERNEL = """
// Y = X W + bias (a fully connected layer). One thread per output Y[row][col] on a 2-D grid;
// the bias of the column initialises the accumulator.
__global__ void linear_forward_kernel(const float* __restrict__ X, const float* __restrict__ W, const float* __restrict__ bias, float* __restrict__ Y, int M, int K, int N) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = bias[col];
    for (int k = 0; k < K; ++k)
        acc += X[row * K + k] * W[k * N + col];
    Y[row * N + col] = acc;
}
"""


def _linear_forward(M: int, K: int, N: int) -> OpSpec:
    return OpSpec(
        op="linear_layer_forward",
        name="Linear_Layer_Forward",
        category=CATEGORY,
        split="pretrain",
        description=f"Fully connected layer Y = X W + bias with X {M}x{K}, W {K}x{N} and bias {N} (float32).",
        level1=f"""
            Write a CUDA kernel for a fully connected layer Y = X W + bias: Y[i][j] = bias[j] + sum over
            k of X[i][k] * W[k][j], with row-major float32 X ({M} x {K}), W ({K} x {N}), bias ({N}) and Y
            ({M} x {N}). Use one thread per output on a 2-D grid of 32 x 8 thread blocks (threadIdx.x
            along the columns); return early for threads outside Y.
            """,
        level2=f"""
            Compute Y = X W + bias for X ({M} x {K}), W ({K} x {N}) and bias ({N}), float32 row-major:
            Y[i][j] = bias[j] + sum over k of X[i][k] * W[k][j].
            """,
        inputs=[
            Buffer("X", "float32", (M, K)),
            Buffer("W", "float32", (K, N)),
            Buffer("bias", "float32", (N,)),
        ],
        outputs=[Buffer("Y", "float32", (M, N))],
        constants=int_constants(M=M, K=K, N=N),
        kernels=LINEAR_KERNEL,
        signatures=kernel_signatures(LINEAR_KERNEL),
        launch="""
            dim3 block(32, 8);
            dim3 grid((N + 31) / 32, (M + 7) / 8);
            {k}linear_forward_kernel<<<grid, block>>>(d_X, d_W, d_bias, d_Y, M, K, N);
            """,
        launch_note="linear_forward_kernel is launched once with 32 x 8 thread blocks on a grid of "
        "((N + 31) / 32, (M + 7) / 8) blocks; threadIdx.x / blockIdx.x cover the columns of Y.",
        gen="\n".join(
            [
                f"M, K, N = {M}, {K}, {N}",
                _uniform("X", "(M, K)"),
                _uniform("W", "(K, N)"),
                _uniform("bias", "N"),
                "",
                "",
                "def reference(X, W, bias):",
                "    return X @ W + bias",
                "",
                "",
                "Y_ref = reference(X.astype(np.float64), W.astype(np.float64), bias.astype(np.float64)).astype(np.float32)",
            ]
        ),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


def specs() -> list[OpSpec]:
    return [
        # train; the two GEMMs come as a square power of two and an odd rectangle (M x K x N)
        _matmul_naive(1024, 1024, 1024, variant="1024"),
        _matmul_naive(1000, 750, 900, variant="1000x750x900"),
        _matmul_tiled(1024, 1024, 1024, variant="1024"),
        _matmul_tiled(1000, 750, 900, variant="1000x750x900"),
        _matvec(4100, 4000),
        _batched_matmul(32, 250, 256, 300),
        _outer_product(2000, 1500),
        _gemm_alpha_beta(900, 1000, 700, alpha=1.5, beta=-0.75),
        # eval
        _matmul_at_b(700, 1024, 600),
        _vecmat(3000, 6000),
        _gram_matrix(1000, 600),
        # pretrain
        _batched_matvec(64, 300, 256),
        _linear_forward(512, 512, 384),
    ]
