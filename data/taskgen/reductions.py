"""Reductions: full-array sums, extrema, norms, counts and argmax, plus per-row and per-column sums.

Each kernel shows one of the standard ways to combine values across threads:
- a shared-memory tree (halve the active threads each step, __syncthreads between steps);
- warp shuffles (__shfl_down_sync / __shfl_xor_sync with the full mask, called only where all
  32 lanes of the warp are active), with a shared array of per-warp results between warps;
- two passes: each block writes one partial into a scratch buffer, one block folds the partials;
- atomics: one atomicAdd per block or per warp into an output the launch zeroes first.

Float sums are checked with tolerances that a correct kernel in any summation order meets, even
naive per-element atomics: inputs have mean zero where possible, so the partial sums stay small
and the float32 rounding error (simulated with sequential float32 accumulation) stays far below
the atol; for sums of squares, which cannot avoid large positive partial sums, rtol is set from
that simulation with a 4x margin.
"""

from __future__ import annotations

from taskgen.core import Buffer, OpSpec, dedent

SIZES = {"1048576": 1 << 20, "1500007": 1_500_007}  # a power of two and a size that no block divides
N = 1 << 20  # single-size 1-D ops
N_ODD = 1_500_007  # single-size ops that should also exercise the tail
BLOCK = 256  # every block-wide kernel below is written for 256-thread blocks (its constexpr matches)
PARTIAL_BLOCKS = 1024  # fixed grid of grid-stride first passes = length of their partials buffer
ROWS, COLS = 2048, 1000  # matrix reductions; COLS is not a multiple of 32 or 256

UNIFORM_PM1 = "rng.uniform(-1.0, 1.0, n)"


def _reduction(**fields) -> OpSpec:
    return OpSpec(category="reduction", **fields)


def _gen(draws: str, reference: str, outputs: str) -> str:
    """gen.py body: draw the inputs, define `reference`, compute the `<output>_ref` arrays."""
    return "\n".join([dedent(draws), "", "", dedent(reference), "", "", dedent(outputs)])


# ---------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------

SUM_KERNELS = """
constexpr int SUM_BLOCK = 256;  // threads per block, a power of two for the tree

// Shared-memory tree: the active half adds the other half's values each step. Every thread of the
// block must call it (it holds barriers); all threads get the block's total.
__device__ float block_tree_sum(float v) {
    __shared__ float cache[SUM_BLOCK];
    cache[threadIdx.x] = v;
    __syncthreads();
    for (int stride = SUM_BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) cache[threadIdx.x] += cache[threadIdx.x + stride];
        __syncthreads();
    }
    return cache[0];
}

// Pass 1: each block folds a grid-stride slice of x into one partial sum.
__global__ void array_sum_partials_kernel(const float* __restrict__ x, float* __restrict__ partials, int n) {
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        acc += x[i];
    float total = block_tree_sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Pass 2: a single block adds up the per-block partials.
__global__ void array_sum_final_kernel(const float* __restrict__ partials, float* __restrict__ out, int num_partials) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x)
        acc += partials[i];
    float total = block_tree_sum(acc);
    if (threadIdx.x == 0) out[0] = total;
}
"""


def array_sum(n: int, size_tag: str) -> OpSpec:
    return _reduction(
        op="array_sum",
        name="Array_Sum",
        split="train",
        variant=size_tag,
        description=f"Sum all {n} elements of a float32 vector into a single value.",
        level1=f"Write CUDA kernels that compute out[0] = sum of x[i] for a float32 vector x of n = {n} elements, "
        f"as a two-pass reduction. Pass 1 runs {PARTIAL_BLOCKS} blocks of {BLOCK} threads: each thread "
        f"accumulates a grid-stride slice of x in a register, then the block combines its threads' sums "
        f"with a shared-memory tree reduction (halve the active threads each step, __syncthreads between "
        f"steps) and thread 0 writes the block's sum to partials[blockIdx.x]. Pass 2 runs one block of "
        f"{BLOCK} threads that reduces the {PARTIAL_BLOCKS} partials the same way and writes out[0].",
        level2=f"Compute the sum of all elements of a float32 vector x of {n} elements; output a single float32 "
        f"value out[0].",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("out", "float32", (1,))],
        scratch=[Buffer("partials", "float32", (PARTIAL_BLOCKS,))],
        constants=f"const int n = {n};\nconst int num_partials = {PARTIAL_BLOCKS};",
        kernels=SUM_KERNELS,
        signatures=[
            "__global__ void array_sum_partials_kernel(const float* __restrict__ x, float* __restrict__ partials, int n)",
            "__global__ void array_sum_final_kernel(const float* __restrict__ partials, float* __restrict__ out, "
            "int num_partials)",
        ],
        launch=f"""
            {{k}}array_sum_partials_kernel<<<num_partials, {BLOCK}>>>(d_x, d_partials, n);
            {{k}}array_sum_final_kernel<<<1, {BLOCK}>>>(d_partials, d_out, num_partials);
            """,
        launch_note=f"array_sum_partials_kernel runs first with num_partials = {PARTIAL_BLOCKS} blocks of {BLOCK} "
        f"threads (fewer threads than elements, so loop with a grid stride) and must write one partial "
        f"sum per block to partials[blockIdx.x] (a float scratch buffer of {PARTIAL_BLOCKS} elements); "
        f"then array_sum_final_kernel runs with 1 block of {BLOCK} threads and writes the total to "
        f"out[0].",
        gen=_gen(
            f"n = {n}\nx = ({UNIFORM_PM1}).astype(np.float32)  # mean zero: partial sums stay small",
            "def reference(x):\n    return np.array([x.sum()])",
            "out_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # float32 error of any summation order is ~0.01 here (sequential: 0.012); a dropped tail of
        # 100 elements moves the sum by ~6.
        atol=0.1,
        rtol=1e-5,
    )


DOT_KERNELS = """
constexpr int DOT_BLOCK = 256;
constexpr int DOT_WARPS = DOT_BLOCK / 32;

// Tree of shuffles inside one warp; lane 0 ends with the warp's sum. Call with all 32 lanes active.
__device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_down_sync(0xffffffff, v, offset);
    return v;
}

// Grid-stride products, then warp shuffles, then warp 0 folds the per-warp sums and thread 0 adds
// the block's share to *out with one atomicAdd (the launch zeroes *out first).
__global__ void dot_product_kernel(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int n) {
    __shared__ float warp_sums[DOT_WARPS];
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        acc = fmaf(x[i], y[i], acc);
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    acc = warp_sum(acc);  // every lane reaches this: the loop above has no early exit
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {  // a whole warp, so the full shuffle mask holds
        acc = warp_sum(lane < DOT_WARPS ? warp_sums[lane] : 0.0f);
        if (lane == 0) atomicAdd(out, acc);
    }
}
"""


def dot_product(n: int, size_tag: str) -> OpSpec:
    return _reduction(
        op="dot_product",
        name="Dot_Product",
        split="train",
        variant=size_tag,
        description=f"Compute the dot product of two float32 vectors of {n} elements.",
        level1=f"Write a CUDA kernel that computes out[0] = sum of x[i] * y[i] for float32 vectors x and y of "
        f"n = {n} elements. Launch {PARTIAL_BLOCKS} blocks of {BLOCK} threads; each thread accumulates a "
        f"grid-stride slice with fmaf, each warp reduces its lanes with __shfl_down_sync (full mask), lane "
        f"0 of each warp stores the warp sum in shared memory, and after __syncthreads warp 0 reduces the "
        f"{BLOCK // 32} warp sums the same way; thread 0 then does one atomicAdd into out[0], which is set "
        f"to zero before the launch.",
        level2=f"Compute the dot product sum(x[i] * y[i]) of two float32 vectors of {n} elements; output a single "
        f"float32 value out[0].",
        inputs=[Buffer("x", "float32", (n,)), Buffer("y", "float32", (n,))],
        outputs=[Buffer("out", "float32", (1,))],
        constants=f"const int n = {n};",
        kernels=DOT_KERNELS,
        signatures=[
            "__global__ void dot_product_kernel(const float* __restrict__ x, const float* __restrict__ y, "
            "float* __restrict__ out, int n)"
        ],
        launch=f"""
            CUDA_CHECK(cudaMemset(d_out, 0, sizeof(float)));
            {{k}}dot_product_kernel<<<{PARTIAL_BLOCKS}, {BLOCK}>>>(d_x, d_y, d_out, n);
            """,
        launch_note=f"out[0] is zeroed with cudaMemset, then dot_product_kernel is launched once with "
        f"{PARTIAL_BLOCKS} blocks of {BLOCK} threads (fewer threads than elements, so loop with a grid "
        f"stride); the blocks must combine their results into out[0] themselves, e.g. with atomicAdd.",
        gen=_gen(
            f"n = {n}\nx = ({UNIFORM_PM1}).astype(np.float32)\ny = ({UNIFORM_PM1}).astype(np.float32)",
            "def reference(x, y):\n    return np.array([np.dot(x, y)])",
            "out_ref = reference(x.astype(np.float64), y.astype(np.float64)).astype(np.float32)",
        ),
        # Mean-zero products: float32 error in any order (atomics included) is < 0.01.
        atol=0.05,
        rtol=1e-5,
    )


MAX_KERNELS = """
constexpr int MAX_BLOCK = 256;
constexpr int MAX_ITEMS = 4;  // elements per thread in pass 1: a block covers MAX_BLOCK * MAX_ITEMS elements
constexpr int MAX_WARPS = MAX_BLOCK / 32;

// Butterfly of xor shuffles: every lane ends with the warp's maximum. Call with all 32 lanes active.
__device__ float warp_max(float v) {
    for (int mask = 16; mask > 0; mask >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, mask));
    return v;
}

// Warp maxima meet in shared memory and warp 0 reduces them. Every thread of the block must call it;
// thread 0 gets the block's maximum.
__device__ float block_max(float v) {
    __shared__ float warp_maxima[MAX_WARPS];
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) warp_maxima[warp] = v;
    __syncthreads();
    if (warp == 0) v = warp_max(lane < MAX_WARPS ? warp_maxima[lane] : -FLT_MAX);
    return v;
}

// Pass 1: block b reduces elements [b * 1024, (b + 1) * 1024); each thread reads 4 of them, 256 apart,
// so consecutive threads read consecutive addresses. Missing elements count as -FLT_MAX.
__global__ void array_max_partials_kernel(const float* __restrict__ x, float* __restrict__ partials, int n) {
    int base = blockIdx.x * MAX_BLOCK * MAX_ITEMS + threadIdx.x;
    float m = -FLT_MAX;
    for (int k = 0; k < MAX_ITEMS; ++k) {
        int i = base + k * MAX_BLOCK;
        if (i < n) m = fmaxf(m, x[i]);
    }
    m = block_max(m);
    if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

// Pass 2: one block reduces the per-block maxima.
__global__ void array_max_final_kernel(const float* __restrict__ partials, float* __restrict__ out, int num_partials) {
    float m = -FLT_MAX;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x)
        m = fmaxf(m, partials[i]);
    m = block_max(m);
    if (threadIdx.x == 0) out[0] = m;
}
"""


def array_max() -> OpSpec:
    n = N
    per_block = BLOCK * 4
    num_partials = (n + per_block - 1) // per_block
    return _reduction(
        op="array_max",
        name="Array_Max",
        split="train",
        description=f"Find the maximum of a float32 vector of {n} elements.",
        level1=f"Write CUDA kernels that compute out[0] = max of x[i] for a float32 vector x of n = {n} elements, "
        f"as a two-pass reduction with warp shuffles. Pass 1 uses blocks of {BLOCK} threads, each block "
        f"covering {per_block} consecutive elements ({per_block // BLOCK} per thread, read {BLOCK} apart "
        f"for coalescing, out-of-range elements treated as -FLT_MAX); reduce within each warp with "
        f"__shfl_xor_sync and fmaxf, store the warp maxima in shared memory, __syncthreads, let warp 0 "
        f"reduce them, and write the block maximum to partials[blockIdx.x]. Pass 2 is one block of "
        f"{BLOCK} threads that reduces the {num_partials} partials the same way into out[0].",
        level2=f"Compute the maximum element of a float32 vector x of {n} elements; output a single float32 value "
        f"out[0].",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("out", "float32", (1,))],
        scratch=[Buffer("partials", "float32", (num_partials,))],
        constants=f"const int n = {n};\nconst int num_partials = (n + {per_block - 1}) / {per_block};",
        kernels=MAX_KERNELS,
        signatures=[
            "__global__ void array_max_partials_kernel(const float* __restrict__ x, float* __restrict__ partials, int n)",
            "__global__ void array_max_final_kernel(const float* __restrict__ partials, float* __restrict__ out, "
            "int num_partials)",
        ],
        launch=f"""
            {{k}}array_max_partials_kernel<<<num_partials, {BLOCK}>>>(d_x, d_partials, n);
            {{k}}array_max_final_kernel<<<1, {BLOCK}>>>(d_partials, d_out, num_partials);
            """,
        launch_note=f"array_max_partials_kernel runs first with num_partials = (n + {per_block - 1}) / {per_block} "
        f"= {num_partials} blocks of {BLOCK} threads, so block b must cover elements [{per_block} * b, "
        f"{per_block} * (b + 1)) ({per_block // BLOCK} per thread) and write its maximum to "
        f"partials[b] (a float scratch buffer of {num_partials} elements); then array_max_final_kernel "
        f"runs with 1 block of {BLOCK} threads and writes the maximum to out[0].",
        gen=_gen(
            f"n = {n}\nx = rng.standard_normal(n).astype(np.float32)",
            "def reference(x):\n    return np.array([x.max()])",
            "out_ref = reference(x.astype(np.float64)).astype(np.float32)  # a max is exact",
        ),
    )


ROW_SUM_KERNELS = """
constexpr int ROW_BLOCK = 256;  // threads per block, a power of two for the tree

// One block per row: threads stride over the row's columns, then a shared-memory tree adds the
// 256 per-thread sums.
__global__ void matrix_row_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    __shared__ float cache[ROW_BLOCK];
    int r = blockIdx.x;
    if (r >= rows) return;  // whole block leaves together, before any barrier
    const float* row = x + (size_t)r * cols;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols; c += ROW_BLOCK)
        acc += row[c];
    cache[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = ROW_BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) cache[threadIdx.x] += cache[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[r] = cache[0];
}
"""


def matrix_row_sum() -> OpSpec:
    return _reduction(
        op="matrix_row_sum",
        name="Matrix_Row_Sum",
        split="train",
        description=f"Sum each row of a {ROWS} x {COLS} float32 matrix.",
        level1=f"Write a CUDA kernel that computes out[r] = sum over c of x[r][c] for a row-major float32 matrix x "
        f"of {ROWS} rows and {COLS} columns. Use one block of {BLOCK} threads per row: each thread sums "
        f"columns threadIdx.x, threadIdx.x + {BLOCK}, ... (coalesced), then the block adds the {BLOCK} "
        f"partial sums with a shared-memory tree reduction (__syncthreads between steps) and thread 0 "
        f"writes out[r].",
        level2=f"Compute the sum of each row of a row-major float32 matrix of shape ({ROWS}, {COLS}); output "
        f"{ROWS} float32 values.",
        inputs=[Buffer("x", "float32", (ROWS, COLS))],
        outputs=[Buffer("out", "float32", (ROWS,))],
        constants=f"const int rows = {ROWS};\nconst int cols = {COLS};",
        kernels=ROW_SUM_KERNELS,
        signatures=[
            "__global__ void matrix_row_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int rows, "
            "int cols)"
        ],
        launch=f"{{k}}matrix_row_sum_kernel<<<rows, {BLOCK}>>>(d_x, d_out, rows, cols);",
        launch_note=f"matrix_row_sum_kernel is launched once with one block per row (rows = {ROWS} blocks) of {BLOCK} "
        f"threads; the threads of a block must loop over the {COLS} columns of their row and combine "
        f"their sums.",
        gen=_gen(
            f"rows, cols = {ROWS}, {COLS}\nx = rng.uniform(-1.0, 1.0, (rows, cols)).astype(np.float32)",
            "def reference(x):\n    return x.sum(axis=1)",
            "out_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # 1000 mean-zero terms: float32 error < 1e-4 in any order; one missing term is ~0.5.
        atol=1e-3,
        rtol=1e-5,
    )


COL_ROWS_PER_BLOCK = 128

COLUMN_SUM_KERNELS = """
constexpr int COL_TILE = 32;            // columns per block = blockDim.x (a warp reads 32 consecutive floats)
constexpr int COL_THREAD_ROWS = 8;      // blockDim.y
constexpr int COL_ROWS_PER_BLOCK = 128; // rows per block = 128 / 8 = 16 rows per thread

// Block (bx, by) sums rows [128 by, 128 by + 128) of columns [32 bx, 32 bx + 32): each thread walks every
// 8th row of its column, the 8 partial sums of a column meet in shared memory, and one atomicAdd per
// column adds the block's share to out (the launch zeroes out first).
__global__ void matrix_column_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    __shared__ float partial[COL_THREAD_ROWS][COL_TILE];
    int c = blockIdx.x * COL_TILE + threadIdx.x;
    int row_begin = blockIdx.y * COL_ROWS_PER_BLOCK;
    int row_end = min(rows, row_begin + COL_ROWS_PER_BLOCK);
    float acc = 0.0f;  // stays 0 for columns past the edge
    if (c < cols)
        for (int r = row_begin + threadIdx.y; r < row_end; r += COL_THREAD_ROWS)
            acc += x[(size_t)r * cols + c];
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float s = 0.0f;
        for (int k = 0; k < COL_THREAD_ROWS; ++k)
            s += partial[k][threadIdx.x];
        atomicAdd(&out[c], s);
    }
}
"""


def matrix_column_sum() -> OpSpec:
    row_blocks = (ROWS + COL_ROWS_PER_BLOCK - 1) // COL_ROWS_PER_BLOCK
    return _reduction(
        op="matrix_column_sum",
        name="Matrix_Column_Sum",
        split="train",
        description=f"Sum each column of a {ROWS} x {COLS} float32 matrix.",
        level1=f"Write a CUDA kernel that computes out[c] = sum over r of x[r][c] for a row-major float32 matrix x "
        f"of {ROWS} rows and {COLS} columns. Use 2-D blocks of 32 x 8 threads, threadIdx.x along the "
        f"columns so that each warp reads 32 consecutive floats; block (bx, by) handles columns 32*bx .. "
        f"32*bx+31 and rows {COL_ROWS_PER_BLOCK}*by .. {COL_ROWS_PER_BLOCK}*by+{COL_ROWS_PER_BLOCK - 1}, "
        f"each thread summing every 8th row of its column. Store the 8 partial sums per column in a "
        f"shared 8 x 32 array, __syncthreads, let the threads with threadIdx.y == 0 add them up and "
        f"atomicAdd the result into out[c] (zeroed before the launch). Guard the column bound: {COLS} is "
        f"not a multiple of 32.",
        level2=f"Compute the sum of each column of a row-major float32 matrix of shape ({ROWS}, {COLS}); output "
        f"{COLS} float32 values.",
        inputs=[Buffer("x", "float32", (ROWS, COLS))],
        outputs=[Buffer("out", "float32", (COLS,))],
        constants=f"const int rows = {ROWS};\nconst int cols = {COLS};",
        kernels=COLUMN_SUM_KERNELS,
        signatures=[
            "__global__ void matrix_column_sum_kernel(const float* __restrict__ x, float* __restrict__ out, "
            "int rows, int cols)"
        ],
        launch=f"""
            CUDA_CHECK(cudaMemset(d_out, 0, cols * sizeof(float)));
            dim3 block(32, 8);
            dim3 grid((cols + 31) / 32, (rows + {COL_ROWS_PER_BLOCK - 1}) / {COL_ROWS_PER_BLOCK});
            {{k}}matrix_column_sum_kernel<<<grid, block>>>(d_x, d_out, rows, cols);
            """,
        launch_note=f"out is zeroed with cudaMemset, then matrix_column_sum_kernel is launched once with 2-D blocks of "
        f"32 x 8 threads and a 2-D grid of ((cols + 31) / 32, (rows + {COL_ROWS_PER_BLOCK - 1}) / "
        f"{COL_ROWS_PER_BLOCK}) = ({(COLS + 31) // 32}, {row_blocks}) blocks: block (bx, by) covers "
        f"columns 32*bx .. 32*bx+31 and rows {COL_ROWS_PER_BLOCK}*by .. "
        f"{COL_ROWS_PER_BLOCK}*by+{COL_ROWS_PER_BLOCK - 1}, so the {row_blocks} blocks of a column must "
        f"combine their sums in out (e.g. atomicAdd).",
        gen=_gen(
            f"rows, cols = {ROWS}, {COLS}\nx = rng.uniform(-1.0, 1.0, (rows, cols)).astype(np.float32)",
            "def reference(x):\n    return x.sum(axis=0)",
            "out_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # 2048 mean-zero terms per column: float32 error < 2e-4 in any order (atomics included).
        atol=1e-3,
        rtol=1e-5,
    )


MATCH_KERNELS = """
// One thread per element. __syncthreads_count gives the block's number of matches in one barrier
// (out-of-range threads vote 0 but still reach it), and thread 0 adds it to *count with one
// integer atomicAdd (exact, so the result does not depend on the order). The launch zeroes *count.
__global__ void count_matching_labels_kernel(const int* __restrict__ pred, const int* __restrict__ labels, int* __restrict__ count, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int match = (i < n) && (pred[i] == labels[i]);
    int block_matches = __syncthreads_count(match);
    if (threadIdx.x == 0 && block_matches > 0) atomicAdd(count, block_matches);
}
"""


def count_matching_labels() -> OpSpec:
    n = N_ODD
    return _reduction(
        op="count_matching_labels",
        name="Count_Matching_Labels",
        split="train",
        description=f"Count the positions where two int32 label arrays of {n} elements agree (correct predictions).",
        level1=f"Write a CUDA kernel that counts the indices i with pred[i] == labels[i] for two int32 arrays of "
        f"n = {n} elements (predicted and true class labels) and writes the count to an int32 count[0]. Use "
        f"one thread per element ({BLOCK} threads per block, bounds check i < n); combine the block's votes "
        f"with __syncthreads_count, which every thread must reach, and let thread 0 atomicAdd the block's "
        f"count into count[0], which is zeroed before the launch.",
        level2=f"Count the indices i where pred[i] == labels[i] for two int32 arrays of {n} elements; output the "
        f"count as a single int32 value.",
        inputs=[Buffer("pred", "int32", (n,)), Buffer("labels", "int32", (n,))],
        outputs=[Buffer("count", "int32", (1,))],
        constants=f"const int n = {n};",
        kernels=MATCH_KERNELS,
        signatures=[
            "__global__ void count_matching_labels_kernel(const int* __restrict__ pred, const int* "
            "__restrict__ labels, int* __restrict__ count, int n)"
        ],
        launch=f"""
            CUDA_CHECK(cudaMemset(d_count, 0, sizeof(int)));
            {{k}}count_matching_labels_kernel<<<(n + {BLOCK - 1}) / {BLOCK}, {BLOCK}>>>(d_pred, d_labels, d_count, n);
            """,
        launch_note=f"count[0] is zeroed with cudaMemset, then count_matching_labels_kernel is launched once with "
        f"(n + {BLOCK - 1}) / {BLOCK} blocks of {BLOCK} threads, one thread per element (the last block "
        f"is only partly used); the blocks must add their counts into count[0] themselves (atomicAdd).",
        gen=_gen(
            f"n = {n}\n"
            "labels = rng.integers(0, 10, n).astype(np.int32)\n"
            "# About 70% correct predictions; the wrong ones are random labels (sometimes right by chance).\n"
            "pred = np.where(rng.random(n) < 0.7, labels, rng.integers(0, 10, n)).astype(np.int32)",
            "def reference(pred, labels):\n    return np.array([np.count_nonzero(pred == labels)])",
            "count_ref = reference(pred, labels).astype(np.int32)",
        ),
    )


# ---------------------------------------------------------------------------------------
# eval (held-out operations)
# ---------------------------------------------------------------------------------------

NORM_KERNELS = """
constexpr int NORM_BLOCK = 256;
constexpr int NORM_WARPS = NORM_BLOCK / 32;

// Lane 0 ends with the warp's sum. Call with all 32 lanes active.
__device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_down_sync(0xffffffff, v, offset);
    return v;
}

// Warp sums meet in shared memory and warp 0 adds them. Every thread of the block must call it;
// thread 0 gets the block's total.
__device__ float block_sum(float v) {
    __shared__ float warp_totals[NORM_WARPS];
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) warp_totals[warp] = v;
    __syncthreads();
    if (warp == 0) v = warp_sum(lane < NORM_WARPS ? warp_totals[lane] : 0.0f);
    return v;
}

// Pass 1: per-block sums of squares over grid-stride slices.
__global__ void vector_l2_norm_partials_kernel(const float* __restrict__ x, float* __restrict__ partials, int n) {
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        float v = x[i];
        acc = fmaf(v, v, acc);
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 2: one block adds the partials and takes the square root.
__global__ void vector_l2_norm_final_kernel(const float* __restrict__ partials, float* __restrict__ out, int num_partials) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x)
        acc += partials[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[0] = sqrtf(acc);
}
"""


def vector_l2_norm() -> OpSpec:
    n = N
    return _reduction(
        op="vector_l2_norm",
        name="Vector_L2_Norm",
        split="eval",
        description=f"Compute the Euclidean (L2) norm of a float32 vector of {n} elements.",
        level1=f"Write CUDA kernels that compute out[0] = sqrt(sum of x[i]^2) for a float32 vector x of n = {n} "
        f"elements, as a two-pass reduction. Pass 1 runs {PARTIAL_BLOCKS} blocks of {BLOCK} threads: each "
        f"thread accumulates squares over a grid-stride slice with fmaf, the block reduces them with "
        f"__shfl_down_sync inside each warp and a shared array of the {BLOCK // 32} warp sums, and writes "
        f"partials[blockIdx.x]. Pass 2 is one block of {BLOCK} threads that sums the {PARTIAL_BLOCKS} "
        f"partials the same way and writes sqrtf of the total to out[0].",
        level2=f"Compute the L2 norm sqrt(sum x[i]^2) of a float32 vector x of {n} elements; output a single "
        f"float32 value out[0].",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("out", "float32", (1,))],
        scratch=[Buffer("partials", "float32", (PARTIAL_BLOCKS,))],
        constants=f"const int n = {n};\nconst int num_partials = {PARTIAL_BLOCKS};",
        kernels=NORM_KERNELS,
        signatures=[
            "__global__ void vector_l2_norm_partials_kernel(const float* __restrict__ x, float* __restrict__ partials, int n)",
            "__global__ void vector_l2_norm_final_kernel(const float* __restrict__ partials, float* __restrict__ out, "
            "int num_partials)",
        ],
        launch=f"""
            {{k}}vector_l2_norm_partials_kernel<<<num_partials, {BLOCK}>>>(d_x, d_partials, n);
            {{k}}vector_l2_norm_final_kernel<<<1, {BLOCK}>>>(d_partials, d_out, num_partials);
            """,
        launch_note=f"vector_l2_norm_partials_kernel runs first with num_partials = {PARTIAL_BLOCKS} blocks of {BLOCK} "
        f"threads (fewer threads than elements, so loop with a grid stride) and must write one partial "
        f"sum of squares per block to partials[blockIdx.x] (a float scratch buffer of "
        f"{PARTIAL_BLOCKS} elements); then vector_l2_norm_final_kernel runs with 1 block of {BLOCK} threads "
        f"and writes the norm to out[0].",
        gen=_gen(
            f"n = {n}\nx = rng.standard_normal(n).astype(np.float32)",
            "def reference(x):\n    return np.array([np.sqrt(np.sum(x * x))])",
            "out_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # The sum of squares reaches 1e6, where small squares lose bits: per-element float32 atomics
        # are off by ~5e-4 relative in the sum, 2.5e-4 in the norm; tree orders by far less.
        atol=1e-3,
        rtol=1e-3,
    )


ROW_MAX_ROWS = 2500  # not a multiple of the 8 rows a block handles: the last block has idle warps
ROW_MAX_KERNELS = """
constexpr int WARPS_PER_BLOCK = 8;  // 256 threads = 8 warps, one matrix row per warp

// One warp per row: lanes stride over the columns, then an xor butterfly of shuffles leaves the
// row maximum in every lane. The row bound is checked per warp, so a warp either runs the full
// shuffle with all 32 lanes or leaves as a whole; there is no block barrier.
__global__ void matrix_row_max_kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (r >= rows) return;
    const float* row = x + (size_t)r * cols;
    float m = -FLT_MAX;
    for (int c = lane; c < cols; c += 32)
        m = fmaxf(m, row[c]);
    for (int mask = 16; mask > 0; mask >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, mask));
    if (lane == 0) out[r] = m;
}
"""


def matrix_row_max() -> OpSpec:
    rows, cols = ROW_MAX_ROWS, COLS
    return _reduction(
        op="matrix_row_max",
        name="Matrix_Row_Max",
        split="eval",
        description=f"Find the maximum of each row of a {rows} x {cols} float32 matrix.",
        level1=f"Write a CUDA kernel that computes out[r] = max over c of x[r][c] for a row-major float32 matrix x "
        f"of {rows} rows and {cols} columns. Assign one warp per row ({BLOCK}-thread blocks hold "
        f"{BLOCK // 32} warps = {BLOCK // 32} rows): the 32 lanes stride over the columns keeping a running "
        f"fmaxf, then reduce across the warp with __shfl_xor_sync (full mask) and lane 0 writes out[r]. "
        f"Warps whose row index is >= {rows} must exit as a whole (the last block is partly used).",
        level2=f"Compute the maximum of each row of a row-major float32 matrix of shape ({rows}, {cols}); output "
        f"{rows} float32 values.",
        inputs=[Buffer("x", "float32", (rows, cols))],
        outputs=[Buffer("out", "float32", (rows,))],
        constants=f"const int rows = {rows};\nconst int cols = {cols};",
        kernels=ROW_MAX_KERNELS,
        signatures=[
            "__global__ void matrix_row_max_kernel(const float* __restrict__ x, float* __restrict__ out, int rows, "
            "int cols)"
        ],
        launch=f"{{k}}matrix_row_max_kernel<<<(rows + 7) / 8, {BLOCK}>>>(d_x, d_out, rows, cols);",
        launch_note=f"matrix_row_max_kernel is launched once with (rows + 7) / 8 = {(rows + 7) // 8} blocks of {BLOCK} "
        f"threads, i.e. one warp per row (block b, warp w handles row 8*b + w); the last block has "
        f"warps without a row.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\nx = rng.standard_normal((rows, cols)).astype(np.float32)",
            "def reference(x):\n    return x.max(axis=1)",
            "out_ref = reference(x.astype(np.float64)).astype(np.float32)  # a max is exact",
        ),
    )


ARGMAX_BLOCKS = 512
ARGMAX_KERNELS = """
constexpr int ARGMAX_BLOCK = 256;       // threads per block, a power of two for the tree
constexpr int NO_INDEX = 0x7fffffff;    // index of the empty candidate; loses every tie

// Larger value wins; on equal values the smaller index wins, i.e. the first occurrence.
__device__ bool argmax_better(float v, int i, float best_v, int best_i) {
    return v > best_v || (v == best_v && i < best_i);
}

// Shared-memory tree over (value, index) pairs. Every thread of the block must call it; all
// threads get the block's winner.
__device__ void argmax_block_tree(float& v, int& idx) {
    __shared__ float vals[ARGMAX_BLOCK];
    __shared__ int idxs[ARGMAX_BLOCK];
    vals[threadIdx.x] = v;
    idxs[threadIdx.x] = idx;
    __syncthreads();
    for (int stride = ARGMAX_BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            float other_v = vals[threadIdx.x + stride];
            int other_i = idxs[threadIdx.x + stride];
            if (argmax_better(other_v, other_i, vals[threadIdx.x], idxs[threadIdx.x])) {
                vals[threadIdx.x] = other_v;
                idxs[threadIdx.x] = other_i;
            }
        }
        __syncthreads();
    }
    v = vals[0];
    idx = idxs[0];
}

// Pass 1: each block finds the best (value, index) in its grid-stride slice. A thread visits its
// indices in increasing order, so a strict > keeps the first occurrence.
__global__ void array_argmax_partials_kernel(const float* __restrict__ x, float* __restrict__ partial_vals, int* __restrict__ partial_idx, int n) {
    float best_v = -FLT_MAX;
    int best_i = NO_INDEX;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        float v = x[i];
        if (v > best_v) {
            best_v = v;
            best_i = i;
        }
    }
    argmax_block_tree(best_v, best_i);
    if (threadIdx.x == 0) {
        partial_vals[blockIdx.x] = best_v;
        partial_idx[blockIdx.x] = best_i;
    }
}

// Pass 2: one block picks the winner among the per-block candidates.
__global__ void array_argmax_final_kernel(const float* __restrict__ partial_vals, const int* __restrict__ partial_idx, int* __restrict__ index, int num_partials) {
    float best_v = -FLT_MAX;
    int best_i = NO_INDEX;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x) {
        if (argmax_better(partial_vals[i], partial_idx[i], best_v, best_i)) {
            best_v = partial_vals[i];
            best_i = partial_idx[i];
        }
    }
    argmax_block_tree(best_v, best_i);
    if (threadIdx.x == 0) index[0] = best_i;
}
"""


def array_argmax() -> OpSpec:
    n = N_ODD
    return _reduction(
        op="array_argmax",
        name="Array_Argmax",
        split="eval",
        description=f"Find the index of the largest element of a float32 vector of {n} elements.",
        level1=f"Write CUDA kernels that compute index[0] = argmax of x (an int32, the first index on ties) for a "
        f"float32 vector x of n = {n} elements, as a two-pass reduction over (value, index) pairs. Pass 1 "
        f"runs {ARGMAX_BLOCKS} blocks of {BLOCK} threads: each thread scans a grid-stride slice keeping its "
        f"best pair, then the block reduces the pairs with a shared-memory tree (two shared arrays for "
        f"values and indices, __syncthreads between steps; larger value wins, smaller index breaks ties) "
        f"and thread 0 writes the block's pair to partial_vals[blockIdx.x] and partial_idx[blockIdx.x]. "
        f"Pass 2 is one block of {BLOCK} threads that reduces the {ARGMAX_BLOCKS} pairs the same way and "
        f"writes the index.",
        level2=f"Compute the index of the maximum element of a float32 vector x of {n} elements (the first one on "
        f"ties, as numpy.argmax); output a single int32 value.",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("index", "int32", (1,))],
        scratch=[
            Buffer("partial_vals", "float32", (ARGMAX_BLOCKS,)),
            Buffer("partial_idx", "int32", (ARGMAX_BLOCKS,)),
        ],
        constants=f"const int n = {n};\nconst int num_partials = {ARGMAX_BLOCKS};",
        kernels=ARGMAX_KERNELS,
        signatures=[
            "__global__ void array_argmax_partials_kernel(const float* __restrict__ x, float* __restrict__ "
            "partial_vals, int* __restrict__ partial_idx, int n)",
            "__global__ void array_argmax_final_kernel(const float* __restrict__ partial_vals, const int* "
            "__restrict__ partial_idx, int* __restrict__ index, int num_partials)",
        ],
        launch=f"""
            {{k}}array_argmax_partials_kernel<<<num_partials, {BLOCK}>>>(d_x, d_partial_vals, d_partial_idx, n);
            {{k}}array_argmax_final_kernel<<<1, {BLOCK}>>>(d_partial_vals, d_partial_idx, d_index, num_partials);
            """,
        launch_note=f"array_argmax_partials_kernel runs first with num_partials = {ARGMAX_BLOCKS} blocks of {BLOCK} "
        f"threads (fewer threads than elements, so loop with a grid stride) and must write each block's "
        f"best value and its index to partial_vals[blockIdx.x] (float) and partial_idx[blockIdx.x] "
        f"(int), scratch buffers of {ARGMAX_BLOCKS} elements; then array_argmax_final_kernel runs with "
        f"1 block of {BLOCK} threads and writes the index of the maximum to index[0].",
        gen=_gen(
            f"n = {n}\nx = rng.standard_normal(n).astype(np.float32)",
            "def reference(x):\n    return np.array([np.argmax(x)])",
            "index_ref = reference(x).astype(np.int32)\n"
            "# A unique maximum away from index 0: tie-breaking cannot matter and the output is not all zeros.\n"
            "assert np.count_nonzero(x == x.max()) == 1 and index_ref[0] != 0",
        ),
    )


# ---------------------------------------------------------------------------------------
# pretrain
# ---------------------------------------------------------------------------------------

MIN_KERNELS = """
constexpr int MIN_BLOCK = 256;  // threads per block, a power of two for the tree

// Shared-memory tree of fminf. Every thread of the block must call it; all threads get the minimum.
__device__ float block_tree_min(float v) {
    __shared__ float cache[MIN_BLOCK];
    cache[threadIdx.x] = v;
    __syncthreads();
    for (int stride = MIN_BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) cache[threadIdx.x] = fminf(cache[threadIdx.x], cache[threadIdx.x + stride]);
        __syncthreads();
    }
    return cache[0];
}

// Pass 1: per-block minima of grid-stride slices; FLT_MAX is the neutral value.
__global__ void array_min_partials_kernel(const float* __restrict__ x, float* __restrict__ partials, int n) {
    float m = FLT_MAX;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        m = fminf(m, x[i]);
    m = block_tree_min(m);
    if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

// Pass 2: one block reduces the per-block minima.
__global__ void array_min_final_kernel(const float* __restrict__ partials, float* __restrict__ out, int num_partials) {
    float m = FLT_MAX;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x)
        m = fminf(m, partials[i]);
    m = block_tree_min(m);
    if (threadIdx.x == 0) out[0] = m;
}
"""


def array_min() -> OpSpec:
    n = N_ODD
    return _reduction(
        op="array_min",
        name="Array_Min",
        split="pretrain",
        description=f"Find the minimum of a float32 vector of {n} elements.",
        level1=f"Write CUDA kernels that compute out[0] = min of x[i] for a float32 vector x of n = {n} elements, "
        f"as a two-pass reduction. Pass 1 runs {PARTIAL_BLOCKS} blocks of {BLOCK} threads: each thread takes "
        f"the fminf over a grid-stride slice (starting from FLT_MAX), the block combines them with a "
        f"shared-memory tree and writes partials[blockIdx.x]. Pass 2 is one block of {BLOCK} threads that "
        f"reduces the {PARTIAL_BLOCKS} partials the same way into out[0].",
        level2=f"Compute the minimum element of a float32 vector x of {n} elements; output a single float32 value "
        f"out[0].",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("out", "float32", (1,))],
        scratch=[Buffer("partials", "float32", (PARTIAL_BLOCKS,))],
        constants=f"const int n = {n};\nconst int num_partials = {PARTIAL_BLOCKS};",
        kernels=MIN_KERNELS,
        signatures=[
            "__global__ void array_min_partials_kernel(const float* __restrict__ x, float* __restrict__ partials, int n)",
            "__global__ void array_min_final_kernel(const float* __restrict__ partials, float* __restrict__ out, "
            "int num_partials)",
        ],
        launch=f"""
            {{k}}array_min_partials_kernel<<<num_partials, {BLOCK}>>>(d_x, d_partials, n);
            {{k}}array_min_final_kernel<<<1, {BLOCK}>>>(d_partials, d_out, num_partials);
            """,
        launch_note=f"array_min_partials_kernel runs first with num_partials = {PARTIAL_BLOCKS} blocks of {BLOCK} "
        f"threads (fewer threads than elements, so loop with a grid stride) and must write one partial "
        f"minimum per block to partials[blockIdx.x] (a float scratch buffer of {PARTIAL_BLOCKS} "
        f"elements); then array_min_final_kernel runs with 1 block of {BLOCK} threads and writes the "
        f"minimum to out[0].",
        gen=_gen(
            f"n = {n}\nx = rng.standard_normal(n).astype(np.float32)",
            "def reference(x):\n    return np.array([x.min()])",
            "out_ref = reference(x.astype(np.float64)).astype(np.float32)  # a min is exact",
        ),
    )


SUMSQ_KERNELS = """
// Grid-stride sum of squares per thread, an xor butterfly of shuffles per warp, then one atomicAdd
// per warp into *out (zeroed by the launch). Every lane reaches the shuffles: the loop has no exit.
__global__ void sum_of_squares_kernel(const float* __restrict__ x, float* __restrict__ out, int n) {
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        float v = x[i];
        acc = fmaf(v, v, acc);
    }
    for (int mask = 16; mask > 0; mask >>= 1)
        acc += __shfl_xor_sync(0xffffffff, acc, mask);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}
"""


def sum_of_squares() -> OpSpec:
    n = N
    return _reduction(
        op="sum_of_squares",
        name="Sum_Of_Squares",
        split="pretrain",
        description=f"Sum the squares of the elements of a float32 vector of {n} elements.",
        level1=f"Write a CUDA kernel that computes out[0] = sum of x[i]^2 for a float32 vector x of n = {n} "
        f"elements. Launch {PARTIAL_BLOCKS} blocks of {BLOCK} threads; each thread accumulates squares over "
        f"a grid-stride slice with fmaf, each warp combines its lanes with __shfl_xor_sync (full mask), and "
        f"lane 0 of every warp atomicAdds the warp sum into out[0], which is zeroed before the launch.",
        level2=f"Compute the sum of squares sum(x[i]^2) of a float32 vector x of {n} elements; output a single "
        f"float32 value out[0].",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("out", "float32", (1,))],
        constants=f"const int n = {n};",
        kernels=SUMSQ_KERNELS,
        signatures=[
            "__global__ void sum_of_squares_kernel(const float* __restrict__ x, float* __restrict__ out, "
            "int n)"
        ],
        launch=f"""
            CUDA_CHECK(cudaMemset(d_out, 0, sizeof(float)));
            {{k}}sum_of_squares_kernel<<<{PARTIAL_BLOCKS}, {BLOCK}>>>(d_x, d_out, n);
            """,
        launch_note=f"out[0] is zeroed with cudaMemset, then sum_of_squares_kernel is launched once with "
        f"{PARTIAL_BLOCKS} blocks of {BLOCK} threads (fewer threads than elements, so loop with a grid "
        f"stride); the threads must combine their sums into out[0] themselves, e.g. with atomicAdd.",
        gen=_gen(
            f"n = {n}\nx = rng.standard_normal(n).astype(np.float32)",
            "def reference(x):\n    return np.array([np.sum(x * x)])",
            "out_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # A total of ~1e6 built from small positive terms: naive per-element float32 accumulation
        # loses ~5e-4 relative (simulated), so rtol leaves a 4x margin for it.
        atol=1e-3,
        rtol=2e-3,
    )


MEAN_KERNELS = """
// Grid-stride sums, an xor butterfly per warp, one atomicAdd per warp into *total (zeroed by the launch).
__global__ void array_mean_accumulate_kernel(const float* __restrict__ x, float* __restrict__ total, int n) {
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        acc += x[i];
    for (int mask = 16; mask > 0; mask >>= 1)
        acc += __shfl_xor_sync(0xffffffff, acc, mask);
    if ((threadIdx.x & 31) == 0) atomicAdd(total, acc);
}

// Runs after the accumulation kernel has finished (same stream), so *total is complete.
__global__ void array_mean_finalize_kernel(const float* __restrict__ total, float* __restrict__ out, int n) {
    out[0] = total[0] / (float)n;
}
"""


def array_mean() -> OpSpec:
    n = N
    return _reduction(
        op="array_mean",
        name="Array_Mean",
        split="pretrain",
        description=f"Compute the arithmetic mean of a float32 vector of {n} elements.",
        level1=f"Write CUDA kernels that compute out[0] = (sum of x[i]) / n for a float32 vector x of n = {n} "
        f"elements. The first kernel runs {PARTIAL_BLOCKS} blocks of {BLOCK} threads: each thread sums a "
        f"grid-stride slice, each warp combines its lanes with __shfl_xor_sync (full mask), and lane 0 "
        f"atomicAdds the warp sum into a scratch float total, zeroed before the launch. A second kernel "
        f"with a single thread writes total / n to out[0].",
        level2=f"Compute the mean of a float32 vector x of {n} elements; output a single float32 value out[0].",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("out", "float32", (1,))],
        scratch=[Buffer("total", "float32", (1,))],
        constants=f"const int n = {n};",
        kernels=MEAN_KERNELS,
        signatures=[
            "__global__ void array_mean_accumulate_kernel(const float* __restrict__ x, float* __restrict__ total, "
            "int n)",
            "__global__ void array_mean_finalize_kernel(const float* __restrict__ total, float* __restrict__ out, "
            "int n)",
        ],
        launch=f"""
            CUDA_CHECK(cudaMemset(d_total, 0, sizeof(float)));
            {{k}}array_mean_accumulate_kernel<<<{PARTIAL_BLOCKS}, {BLOCK}>>>(d_x, d_total, n);
            {{k}}array_mean_finalize_kernel<<<1, 1>>>(d_total, d_out, n);
            """,
        launch_note=f"total[0] (a float scratch buffer of 1 element) is zeroed with cudaMemset; "
        f"array_mean_accumulate_kernel runs first with {PARTIAL_BLOCKS} blocks of {BLOCK} threads "
        f"(fewer threads than elements, so loop with a grid stride) and must leave the sum of x in "
        f"total[0]; then array_mean_finalize_kernel runs with 1 block of 1 thread and writes the mean "
        f"to out[0].",
        gen=_gen(
            f"n = {n}\nx = rng.uniform(-1.0, 3.0, n).astype(np.float32)",
            "def reference(x):\n    return np.array([x.mean()])",
            "out_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # Mean ~1, total ~1e6: float32 summation in any order is within ~2e-5 relative.
        atol=1e-6,
        rtol=1e-4,
    )


def specs() -> list[OpSpec]:
    return [
        *(array_sum(n, size) for size, n in SIZES.items()),
        *(dot_product(n, size) for size, n in SIZES.items()),
        array_max(),
        matrix_row_sum(),
        matrix_column_sum(),
        count_matching_labels(),
        vector_l2_norm(),
        matrix_row_max(),
        array_argmax(),
        array_min(),
        sum_of_squares(),
        array_mean(),
    ]


def at_size(spec: OpSpec, n: int) -> OpSpec | None:
    """A full-array sum or dot product over n elements (their kernels take n as an argument), or None for
    the other reductions. For the renamed SFT copies of taskgen/variants.py."""
    build = {"array_sum": array_sum, "dot_product": dot_product}.get(spec.op)
    return None if build is None else build(n, spec.variant)
