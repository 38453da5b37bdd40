"""Stencils: each output is a fixed combination of the input values around it.

1-D stencils and convolutions run on float32 vectors of at least 1M elements, 2-D stencils on
images of 1-2M pixels, one 3-D stencil on a ~1M-voxel volume. Every prompt states the boundary
rule exactly, because that is where stencil kernels go wrong:
- zero padding: a neighbour outside the array reads as 0;
- clamp: a neighbour's index is clamped into range (edge replication);
- fixed boundary (Jacobi): boundary cells are copied unchanged.
Kernels vary in style: guarded one-thread-per-output, grid-stride loops, shared-memory tiles
with halos (padded tile loads, one __syncthreads reached by every thread), and a two-pass
separable filter through a scratch buffer.
"""

from __future__ import annotations

from taskgen.core import Buffer, OpSpec, grid_stride_launch

CATEGORY = "stencil"
BLOCK = 256  # 1-D kernels
GRID_STRIDE_BLOCKS = 1024  # grid-stride kernels launch a fixed grid and loop
SIZES_1D = {
    "1048576": 1 << 20,
    "1500007": 1_500_007,
    "1000003": 1_000_003,
}  # odd sizes: no block divides them

VEC_SIGNATURE = "(const float* __restrict__ x, float* __restrict__ y, int n)"
IMG_SIGNATURE = "(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)"


def _task(**kw) -> OpSpec:
    return OpSpec(category=CATEGORY, **kw)


def _guarded_1d(fn: str, args: str) -> tuple[str, str]:
    return (
        f"{{k}}{fn}<<<(n + {BLOCK - 1}) / {BLOCK}, {BLOCK}>>>({args});",
        f"{fn} is launched once with (n + {BLOCK - 1}) / {BLOCK} blocks of {BLOCK} threads, one thread per "
        f"output element; the last block is only partly used.",
    )


def _grid_2d(fn: str, args: str, bx: int, by: int, z: str = "") -> tuple[str, str]:
    """A 2-D grid of bx x by blocks over (cols, rows); `z` optionally names the grid's z extent."""
    gz = f", {z}" if z else ""
    launch = (
        f"dim3 block({bx}, {by});\n"
        f"dim3 grid((cols + {bx - 1}) / {bx}, (rows + {by - 1}) / {by}{gz});\n"
        f"{{k}}{fn}<<<grid, block>>>({args});"
    )
    note = (
        f"{fn} is launched once with blocks of {bx} x {by} threads (x along columns, y along rows) and a grid "
        f"of ((cols + {bx - 1}) / {bx}, (rows + {by - 1}) / {by}{gz}) blocks; blocks on the right and bottom "
        f"edges are only partly inside the image."
    )
    if z:
        note += f" blockIdx.z is the {z} index."
    return launch, note


def _gen_1d(n: int, body: str, draw: str = "rng.uniform(-1.0, 1.0, n)") -> str:
    return (
        f"n = {n}\nx = ({draw}).astype(np.float32)\n\n\n{body}\n\n\n"
        "y_ref = reference(x.astype(np.float64)).astype(np.float32)  # float64 math, stored as float32"
    )


def _gen_2d(
    rows: int,
    cols: int,
    body: str,
    x: str = "x",
    out: str = "y",
    draw: str = "rng.uniform(-1.0, 1.0, (rows, cols))",
) -> str:
    return (
        f"rows, cols = {rows}, {cols}\n{x} = ({draw}).astype(np.float32)\n\n\n{body}\n\n\n"
        f"{out}_ref = reference({x}.astype(np.float64)).astype(np.float32)  # float64 math, stored as float32"
    )


# --------------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------------


def _stencil1d_3pt(tag: str) -> OpSpec:
    n = SIZES_1D[tag]
    fn = "stencil1d_3pt_kernel"
    launch, note = _guarded_1d(fn, "d_x, d_y, n")
    return _task(
        op="stencil1d_3pt_smooth",
        name="Stencil_1D_3Point_Smooth",
        split="train",
        variant=tag,
        description=f"Apply the 3-point smoothing stencil 0.25, 0.5, 0.25 with zero padding to a float32 vector "
        f"of {n} elements.",
        level1=f"Write a CUDA kernel that computes y[i] = 0.25 * x[i-1] + 0.5 * x[i] + 0.25 * x[i+1] for every i of "
        f"a float32 vector x of n = {n} elements. Boundary rule: zero padding, i.e. x[-1] and x[n] read as "
        f"0. Use one thread per output with {BLOCK} threads per block and a bounds check i < n; read a "
        f"neighbour only when its index is inside [0, n).",
        level2=f"Compute y[i] = 0.25 x[i-1] + 0.5 x[i] + 0.25 x[i+1] for a float32 vector of {n} elements, "
        f"treating x[-1] and x[n] as 0.",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels=f"""
        // One thread per output; a neighbour outside [0, n) is zero padding and is never read.
        __global__ void {fn}{VEC_SIGNATURE} {{
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) {{
                float left = i > 0 ? x[i - 1] : 0.0f;
                float right = i + 1 < n ? x[i + 1] : 0.0f;
                y[i] = 0.25f * left + 0.5f * x[i] + 0.25f * right;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{VEC_SIGNATURE}"],
        launch=launch,
        launch_note=note,
        gen=_gen_1d(
            n,
            "def reference(x):\n"
            "    xp = np.pad(x, 1)  # zero padding\n"
            "    return 0.25 * xp[:-2] + 0.5 * xp[1:-1] + 0.25 * xp[2:]",
        ),
    )


def _stencil1d_5pt() -> OpSpec:
    n = SIZES_1D["1048576"]
    fn = "stencil1d_5pt_kernel"
    launch, note = grid_stride_launch(fn, "d_x, d_y, n", "n", GRID_STRIDE_BLOCKS, BLOCK)
    formula = "y[i] = (-x[i-2] + 16 x[i-1] - 30 x[i] + 16 x[i+1] - x[i+2]) / 12"
    return _task(
        op="stencil1d_5pt_second_derivative",
        name="Stencil_1D_5Point_Second_Derivative",
        split="train",
        description=f"Apply the fourth-order 5-point second-derivative stencil with clamped indices to a float32 "
        f"vector of {n} elements.",
        level1=f"Write a CUDA kernel that computes {formula} for every i of a float32 vector x of n = {n} elements. "
        f"Boundary rule: clamp, i.e. a neighbour index j is replaced by min(max(j, 0), n - 1). Use a "
        f"grid-stride loop over a fixed grid of {GRID_STRIDE_BLOCKS} blocks of {BLOCK} threads; clamp the "
        f"four neighbour indices with min/max.",
        level2=f"Compute {formula} for a float32 vector of {n} elements, clamping neighbour indices to [0, n-1].",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels=f"""
        // Grid-stride loop; clamped neighbour indices replicate the end values (no branches).
        __global__ void {fn}{VEC_SIGNATURE} {{
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {{
                float xm2 = x[max(i - 2, 0)];
                float xm1 = x[max(i - 1, 0)];
                float xp1 = x[min(i + 1, n - 1)];
                float xp2 = x[min(i + 2, n - 1)];
                y[i] = (16.0f * (xm1 + xp1) - (xm2 + xp2) - 30.0f * x[i]) / 12.0f;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{VEC_SIGNATURE}"],
        launch=launch,
        launch_note=note,
        gen=_gen_1d(
            n,
            "def reference(x):\n"
            '    xp = np.pad(x, 2, mode="edge")  # clamp = edge replication\n'
            "    return (-xp[:-4] + 16 * xp[1:-3] - 30 * xp[2:-2] + 16 * xp[3:-1] - xp[4:]) / 12.0",
        ),
    )


def _conv1d(tag: str) -> OpSpec:
    n = SIZES_1D[tag]
    fn = "conv1d_tiled_kernel"
    sig = "(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int n)"
    formula = "y[i] = sum_{j=0..8} w[j] * x[i + j - 4]"
    return _task(
        op="conv1d_width9_clamp_tiled",
        name="Conv1D_Width9_Shared_Tile",
        split="train",
        variant=tag,
        description=f"Convolve a float32 vector of {n} elements with a 9-tap filter (cross-correlation, clamped "
        f"boundary).",
        level1=f"Write a CUDA kernel that computes the 1-D convolution {formula} (cross-correlation: the filter is "
        f"not flipped) of a float32 vector x of n = {n} elements with a 9-tap float32 filter w. Boundary "
        f"rule: clamp, i.e. x[j] for j < 0 reads x[0] and for j >= n reads x[n-1]. Use a shared-memory tile: "
        f"each block of 256 threads computes 256 consecutive outputs, first loads x[start - 4 .. start + "
        f"259] (256 + 8 values, halo of 4 on each side, clamped indices) and the 9 filter taps into shared "
        f"memory, calls __syncthreads() once (reached by all threads), then each thread with a valid output "
        f"sums over the tile.",
        level2=f"Compute {formula} for a float32 vector x of {n} elements and a 9-tap filter w (no flip), with x "
        f"indices clamped to [0, n-1].",
        inputs=[Buffer("x", "float32", (n,)), Buffer("w", "float32", (9,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels=f"""
        constexpr int CONV1D_BLOCK = 256;
        constexpr int CONV1D_RADIUS = 4;
        constexpr int CONV1D_TAPS = 2 * CONV1D_RADIUS + 1;

        // Each block stages its outputs' inputs plus a halo of CONV1D_RADIUS on each side, so every x
        // element is read from global memory about once instead of CONV1D_TAPS times.
        __global__ void {fn}{sig} {{
            __shared__ float tile[CONV1D_BLOCK + 2 * CONV1D_RADIUS];
            __shared__ float taps[CONV1D_TAPS];
            int start = blockIdx.x * CONV1D_BLOCK;
            for (int t = threadIdx.x; t < CONV1D_BLOCK + 2 * CONV1D_RADIUS; t += CONV1D_BLOCK) {{
                int g = min(max(start - CONV1D_RADIUS + t, 0), n - 1);  // clamp boundary
                tile[t] = x[g];
            }}
            if (threadIdx.x < CONV1D_TAPS) taps[threadIdx.x] = w[threadIdx.x];
            __syncthreads();
            int i = start + threadIdx.x;
            if (i < n) {{
                float acc = 0.0f;
                #pragma unroll
                for (int j = 0; j < CONV1D_TAPS; ++j) acc += taps[j] * tile[threadIdx.x + j];  // x[i + j - 4]
                y[i] = acc;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=f"{{k}}{fn}<<<(n + 255) / 256, 256>>>(d_x, d_w, d_y, n);",
        launch_note=f"{fn} is launched once with (n + 255) / 256 blocks of 256 threads, one thread per output; the "
        f"last block is only partly used, and no dynamic shared memory is passed.",
        gen=f"n = {n}\n"
        "x = rng.uniform(-1.0, 1.0, n).astype(np.float32)\n"
        "w = rng.uniform(-0.5, 0.5, 9).astype(np.float32)\n\n\n"
        "def reference(x, w):\n"
        '    xp = np.pad(x, 4, mode="edge")  # clamp = edge replication\n'
        "    return sum(w[j] * xp[j:j + len(x)] for j in range(9))  # y[i] = sum_j w[j] x[i + j - 4]\n\n\n"
        "y_ref = reference(x.astype(np.float64), w.astype(np.float64)).astype(np.float32)",
    )


def _laplacian2d() -> OpSpec:
    rows, cols = 2048, 1000
    fn = "laplacian2d_5pt_kernel"
    launch, note = _grid_2d(fn, "d_x, d_y, rows, cols", 32, 8)
    formula = "y[r][c] = x[r-1][c] + x[r+1][c] + x[r][c-1] + x[r][c+1] - 4 x[r][c]"
    return _task(
        op="laplacian2d_5pt",
        name="Laplacian_2D_5Point",
        split="train",
        description=f"Apply the 5-point discrete Laplacian with zero padding to a {rows}x{cols} float32 grid.",
        level1=f"Write a CUDA kernel that computes the 5-point Laplacian {formula} on a row-major float32 grid x of "
        f"{rows} rows and {cols} columns. Boundary rule: zero padding, a neighbour outside the grid reads as "
        f"0. Use one thread per cell with 2-D blocks of 32 x 8 threads (x along columns for coalescing), a "
        f"bounds check on both coordinates, and read a neighbour only when it is inside the grid.",
        level2=f"Compute {formula} on a {rows}x{cols} float32 grid, treating cells outside the grid as 0.",
        inputs=[Buffer("x", "float32", (rows, cols))],
        outputs=[Buffer("y", "float32", (rows, cols))],
        constants=f"const int rows = {rows};\nconst int cols = {cols};",
        kernels=f"""
        // One thread per cell; zero padding means out-of-grid neighbours are skipped, never read.
        __global__ void {fn}{IMG_SIGNATURE} {{
            int c = blockIdx.x * blockDim.x + threadIdx.x;
            int r = blockIdx.y * blockDim.y + threadIdx.y;
            if (r < rows && c < cols) {{
                int i = r * cols + c;
                float up = r > 0 ? x[i - cols] : 0.0f;
                float down = r + 1 < rows ? x[i + cols] : 0.0f;
                float left = c > 0 ? x[i - 1] : 0.0f;
                float right = c + 1 < cols ? x[i + 1] : 0.0f;
                y[i] = (up + down) + (left + right) - 4.0f * x[i];
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{IMG_SIGNATURE}"],
        launch=launch,
        launch_note=note,
        gen=_gen_2d(
            rows,
            cols,
            "def reference(x):\n"
            "    xp = np.pad(x, 1)  # zero padding\n"
            "    return xp[:-2, 1:-1] + xp[2:, 1:-1] + xp[1:-1, :-2] + xp[1:-1, 2:] - 4 * x",
        ),
    )


def _conv2d_3x3() -> OpSpec:
    rows, cols = 1000, 1500
    fn = "conv2d_3x3_tiled_kernel"
    sig = "(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols)"
    launch, note = _grid_2d(fn, "d_x, d_w, d_y, rows, cols", 16, 16)
    formula = "y[r][c] = sum_{a=0..2, b=0..2} w[a][b] * x[r + a - 1][c + b - 1]"
    return _task(
        op="conv2d_3x3_zero_pad_tiled",
        name="Conv2D_3x3_Shared_Tile",
        split="train",
        description=f"Convolve a {rows}x{cols} float32 image with a 3x3 filter (cross-correlation, zero padding) "
        f"using shared-memory tiles.",
        level1=f"Write a CUDA kernel that computes the 2-D convolution {formula} (cross-correlation: the filter is "
        f"not flipped) of a row-major float32 image x of {rows} rows and {cols} columns with a 3x3 float32 "
        f"filter w (row-major, 9 values). Boundary rule: zero padding, pixels outside the image read as 0. "
        f"Use 16 x 16 thread blocks, one thread per output pixel; each block first loads an 18 x 18 "
        f"shared-memory tile (its 16 x 16 pixels plus a 1-pixel halo, 0 for pixels outside the image, "
        f"loaded cooperatively with a strided loop) and the 9 taps, calls __syncthreads() once with all "
        f"threads, then threads inside the image compute their output from the tile.",
        level2=f"Compute {formula} for a {rows}x{cols} float32 image x and a 3x3 filter w (no flip), treating "
        f"pixels outside the image as 0.",
        inputs=[Buffer("x", "float32", (rows, cols)), Buffer("w", "float32", (3, 3))],
        outputs=[Buffer("y", "float32", (rows, cols))],
        constants=f"const int rows = {rows};\nconst int cols = {cols};",
        kernels=f"""
        constexpr int C3_TILE = 16;
        constexpr int C3_SPAN = C3_TILE + 2;  // the block's pixels plus a one-pixel halo on each side

        // tile[tr][tc] holds x[row0 + tr][col0 + tc]; out-of-image pixels are stored as 0 (zero padding),
        // so the inner loop needs no bounds checks.
        __global__ void {fn}{sig} {{
            __shared__ float tile[C3_SPAN][C3_SPAN];
            __shared__ float taps[9];
            int row0 = blockIdx.y * C3_TILE - 1;
            int col0 = blockIdx.x * C3_TILE - 1;
            int tid = threadIdx.y * C3_TILE + threadIdx.x;
            for (int t = tid; t < C3_SPAN * C3_SPAN; t += C3_TILE * C3_TILE) {{
                int r = row0 + t / C3_SPAN;
                int c = col0 + t % C3_SPAN;
                bool inside = r >= 0 && r < rows && c >= 0 && c < cols;
                tile[t / C3_SPAN][t % C3_SPAN] = inside ? x[r * cols + c] : 0.0f;
            }}
            if (tid < 9) taps[tid] = w[tid];
            __syncthreads();
            int r = blockIdx.y * C3_TILE + threadIdx.y;
            int c = blockIdx.x * C3_TILE + threadIdx.x;
            if (r < rows && c < cols) {{
                float acc = 0.0f;
                #pragma unroll
                for (int a = 0; a < 3; ++a)
                    #pragma unroll
                    for (int b = 0; b < 3; ++b) acc += taps[a * 3 + b] * tile[threadIdx.y + a][threadIdx.x + b];
                y[r * cols + c] = acc;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note,
        gen=f"rows, cols = {rows}, {cols}\n"
        "x = rng.uniform(-1.0, 1.0, (rows, cols)).astype(np.float32)\n"
        "w = rng.uniform(-0.5, 0.5, (3, 3)).astype(np.float32)\n\n\n"
        "def reference(x, w):\n"
        "    xp = np.pad(x, 1)  # zero padding\n"
        "    nr, nc = x.shape\n"
        "    return sum(w[a, b] * xp[a:a + nr, b:b + nc] for a in range(3) for b in range(3))\n\n\n"
        "y_ref = reference(x.astype(np.float64), w.astype(np.float64)).astype(np.float32)",
    )


def _sobel() -> OpSpec:
    rows, cols = 1080, 1920
    fn = "sobel_magnitude_kernel"
    sig = "(const float* __restrict__ img, float* __restrict__ mag, int rows, int cols)"
    launch, note = _grid_2d(fn, "d_img, d_mag, rows, cols", 16, 16)
    math = (
        "gx = (p[r-1][c+1] + 2 p[r][c+1] + p[r+1][c+1]) - (p[r-1][c-1] + 2 p[r][c-1] + p[r+1][c-1]), "
        "gy = (p[r+1][c-1] + 2 p[r+1][c] + p[r+1][c+1]) - (p[r-1][c-1] + 2 p[r-1][c] + p[r-1][c+1]), "
        "mag[r][c] = sqrt(gx^2 + gy^2)"
    )
    return _task(
        op="sobel_gradient_magnitude",
        name="Sobel_Gradient_Magnitude",
        split="train",
        description=f"Compute the Sobel gradient magnitude of a {rows}x{cols} float32 image with clamped borders.",
        level1=f"Write a CUDA kernel that computes the Sobel gradient magnitude of a row-major float32 image p of "
        f"{rows} rows and {cols} columns: {math}. Boundary rule: clamp, i.e. a row index is clamped to "
        f"[0, rows-1] and a column index to [0, cols-1] (edge replication). Use one thread per pixel with "
        f"16 x 16 blocks and a bounds check; a small __device__ helper that loads a pixel at clamped "
        f"coordinates keeps the kernel readable; use sqrtf.",
        level2=f"For a {rows}x{cols} float32 image p with clamped (edge-replicated) borders compute {math}.",
        inputs=[Buffer("img", "float32", (rows, cols))],
        outputs=[Buffer("mag", "float32", (rows, cols))],
        constants=f"const int rows = {rows};\nconst int cols = {cols};",
        kernels=f"""
        // Pixel at clamped coordinates: the border replicates the edge pixels.
        __device__ __forceinline__ float sobel_pixel(const float* __restrict__ img, int r, int c, int rows, int cols) {{
            r = min(max(r, 0), rows - 1);
            c = min(max(c, 0), cols - 1);
            return img[r * cols + c];
        }}

        __global__ void {fn}{sig} {{
            int c = blockIdx.x * blockDim.x + threadIdx.x;
            int r = blockIdx.y * blockDim.y + threadIdx.y;
            if (r < rows && c < cols) {{
                float nw = sobel_pixel(img, r - 1, c - 1, rows, cols);
                float n = sobel_pixel(img, r - 1, c, rows, cols);
                float ne = sobel_pixel(img, r - 1, c + 1, rows, cols);
                float w = sobel_pixel(img, r, c - 1, rows, cols);
                float e = sobel_pixel(img, r, c + 1, rows, cols);
                float sw = sobel_pixel(img, r + 1, c - 1, rows, cols);
                float s = sobel_pixel(img, r + 1, c, rows, cols);
                float se = sobel_pixel(img, r + 1, c + 1, rows, cols);
                float gx = (ne + 2.0f * e + se) - (nw + 2.0f * w + sw);
                float gy = (sw + 2.0f * s + se) - (nw + 2.0f * n + ne);
                mag[r * cols + c] = sqrtf(gx * gx + gy * gy);
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note,
        gen=_gen_2d(
            rows,
            cols,
            "def reference(p):\n"
            '    q = np.pad(p, 1, mode="edge")  # clamp = edge replication\n'
            "    h, w = p.shape\n"
            "\n"
            "    def at(dr, dc):  # p[r + dr][c + dc] for every (r, c)\n"
            "        return q[1 + dr:1 + dr + h, 1 + dc:1 + dc + w]\n"
            "\n"
            "    gx = (at(-1, 1) + 2 * at(0, 1) + at(1, 1)) - (at(-1, -1) + 2 * at(0, -1) + at(1, -1))\n"
            "    gy = (at(1, -1) + 2 * at(1, 0) + at(1, 1)) - (at(-1, -1) + 2 * at(-1, 0) + at(-1, 1))\n"
            "    return np.sqrt(gx * gx + gy * gy)",
            x="img",
            out="mag",
            draw="rng.uniform(0.0, 1.0, (rows, cols))",
        ),
    )


def _jacobi() -> OpSpec:
    rows, cols = 1024, 1024
    fn = "jacobi_poisson_step_kernel"
    sig = (
        "(const float* __restrict__ u, const float* __restrict__ f, float* __restrict__ u_new, int rows, "
        "int cols, float h2)"
    )
    launch, note = grid_stride_launch(
        fn, "d_u, d_f, d_u_new, rows, cols, h2", "rows * cols", GRID_STRIDE_BLOCKS, BLOCK
    )
    formula = "u_new[r][c] = 0.25 * (u[r-1][c] + u[r+1][c] + u[r][c-1] + u[r][c+1] + h2 * f[r][c])"
    return _task(
        op="jacobi_poisson_step",
        name="Jacobi_Poisson_Step",
        split="train",
        description=f"Perform one Jacobi iteration for the 2-D Poisson equation on a {rows}x{cols} float32 grid "
        f"with fixed boundary values.",
        level1=f"Write a CUDA kernel that performs one Jacobi sweep for -laplace(u) = f on a row-major {rows}x{cols} "
        f"float32 grid: for interior cells (0 < r < rows-1 and 0 < c < cols-1) {formula}, with h2 = 1/1024 "
        f"(passed as a float argument); boundary cells (first/last row and column) keep their value, "
        f"u_new = u (Dirichlet boundary). Read only u and f, write only u_new. Use a grid-stride loop over "
        f"the flattened index i = r * cols + c with a fixed grid of {GRID_STRIDE_BLOCKS} blocks of {BLOCK} "
        f"threads.",
        level2=f"One Jacobi iteration on a {rows}x{cols} float32 grid: interior cells get {formula} with "
        f"h2 = 1/1024; boundary cells are copied from u.",
        inputs=[Buffer("u", "float32", (rows, cols)), Buffer("f", "float32", (rows, cols))],
        outputs=[Buffer("u_new", "float32", (rows, cols))],
        constants=f"const int rows = {rows};\nconst int cols = {cols};\nconst float h2 = 1.0f / 1024.0f;",
        kernels=f"""
        // Grid-stride loop over all cells; reading u and writing u_new (never in place) is what makes
        // this Jacobi rather than Gauss-Seidel.
        __global__ void {fn}{sig} {{
            int total = rows * cols;
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {{
                int r = i / cols;
                int c = i - r * cols;
                if (r == 0 || c == 0 || r == rows - 1 || c == cols - 1) {{
                    u_new[i] = u[i];  // Dirichlet boundary
                }} else {{
                    u_new[i] = 0.25f * ((u[i - cols] + u[i + cols]) + (u[i - 1] + u[i + 1]) + h2 * f[i]);
                }}
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note,
        gen=f"rows, cols = {rows}, {cols}\n"
        "h2 = 1.0 / 1024.0  # exact in float32\n"
        "u = rng.uniform(0.0, 1.0, (rows, cols)).astype(np.float32)\n"
        "f = rng.uniform(-50.0, 50.0, (rows, cols)).astype(np.float32)\n\n\n"
        "def reference(u, f):\n"
        "    out = u.copy()  # boundary cells keep their value\n"
        "    neighbours = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:]\n"
        "    out[1:-1, 1:-1] = 0.25 * (neighbours + h2 * f[1:-1, 1:-1])\n"
        "    return out\n\n\n"
        "u_new_ref = reference(u.astype(np.float64), f.astype(np.float64)).astype(np.float32)",
    )


# --------------------------------------------------------------------------------------------
# eval: operations that do not occur in train
# --------------------------------------------------------------------------------------------


def _box_blur_5x5() -> OpSpec:
    rows, cols = 1200, 1700
    fn = "box_blur_5x5_kernel"
    launch, note = _grid_2d(fn, "d_x, d_y, rows, cols", 16, 16)
    formula = "y[r][c] = (1/25) * sum_{a=-2..2, b=-2..2} x[r + a][c + b]"
    return _task(
        op="box_blur_5x5",
        name="Box_Blur_5x5",
        split="eval",
        description=f"Blur a {rows}x{cols} float32 image with a 5x5 box filter (mean of the window, clamped "
        f"borders).",
        level1=f"Write a CUDA kernel that computes the 5x5 box blur {formula} of a row-major float32 image x of "
        f"{rows} rows and {cols} columns. Boundary rule: clamp, a row index is clamped to [0, rows-1] and a "
        f"column index to [0, cols-1]; the divisor is always 25. Use 16 x 16 thread blocks and a 20 x 20 "
        f"shared-memory tile (the block's pixels plus a 2-pixel halo on each side, loaded cooperatively "
        f"with a strided loop at clamped coordinates), one __syncthreads() reached by all threads, then one "
        f"output per thread inside the image.",
        level2=f"Compute {formula} for a {rows}x{cols} float32 image, clamping row and column indices into the "
        f"image.",
        inputs=[Buffer("x", "float32", (rows, cols))],
        outputs=[Buffer("y", "float32", (rows, cols))],
        constants=f"const int rows = {rows};\nconst int cols = {cols};",
        kernels=f"""
        constexpr int BB_TILE = 16;
        constexpr int BB_RADIUS = 2;
        constexpr int BB_SPAN = BB_TILE + 2 * BB_RADIUS;

        // tile[tr][tc] holds x at the clamped coordinates (row0 + tr, col0 + tc); the clamp is done once
        // during the load, so the 25-term sum needs no bounds checks.
        __global__ void {fn}{IMG_SIGNATURE} {{
            __shared__ float tile[BB_SPAN][BB_SPAN];
            int row0 = blockIdx.y * BB_TILE - BB_RADIUS;
            int col0 = blockIdx.x * BB_TILE - BB_RADIUS;
            for (int t = threadIdx.y * BB_TILE + threadIdx.x; t < BB_SPAN * BB_SPAN; t += BB_TILE * BB_TILE) {{
                int r = min(max(row0 + t / BB_SPAN, 0), rows - 1);
                int c = min(max(col0 + t % BB_SPAN, 0), cols - 1);
                tile[t / BB_SPAN][t % BB_SPAN] = x[r * cols + c];
            }}
            __syncthreads();
            int r = blockIdx.y * BB_TILE + threadIdx.y;
            int c = blockIdx.x * BB_TILE + threadIdx.x;
            if (r < rows && c < cols) {{
                float sum = 0.0f;
                #pragma unroll
                for (int a = 0; a < 2 * BB_RADIUS + 1; ++a)
                    #pragma unroll
                    for (int b = 0; b < 2 * BB_RADIUS + 1; ++b) sum += tile[threadIdx.y + a][threadIdx.x + b];
                y[r * cols + c] = sum / 25.0f;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{IMG_SIGNATURE}"],
        launch=launch,
        launch_note=note,
        gen=_gen_2d(
            rows,
            cols,
            "def reference(x):\n"
            '    xp = np.pad(x, 2, mode="edge")  # clamp = edge replication\n'
            "    h, w = x.shape\n"
            "    return sum(xp[a:a + h, b:b + w] for a in range(5) for b in range(5)) / 25.0",
            draw="rng.uniform(0.0, 1.0, (rows, cols))",
        ),
    )


def _stencil3d_7pt() -> OpSpec:
    depth, rows, cols = 60, 130, 140
    fn = "laplacian3d_7pt_kernel"
    sig = "(const float* __restrict__ x, float* __restrict__ y, int depth, int rows, int cols)"
    launch, note = _grid_2d(fn, "d_x, d_y, depth, rows, cols", 32, 8, z="depth")
    formula = (
        "y[z][r][c] = x[z-1][r][c] + x[z+1][r][c] + x[z][r-1][c] + x[z][r+1][c] + x[z][r][c-1] + "
        "x[z][r][c+1] - 6 x[z][r][c]"
    )
    return _task(
        op="laplacian3d_7pt",
        name="Laplacian_3D_7Point",
        split="eval",
        description=f"Apply the 7-point 3-D discrete Laplacian with zero padding to a {depth}x{rows}x{cols} "
        f"float32 volume.",
        level1=f"Write a CUDA kernel that computes the 7-point Laplacian {formula} on a float32 volume x of shape "
        f"({depth}, {rows}, {cols}) stored row-major (index (z * rows + r) * cols + c). Boundary rule: zero "
        f"padding, a neighbour outside the volume reads as 0. Use one thread per voxel: 2-D blocks of 32 x 8 "
        f"threads over (c, r), one grid layer per z slice (blockIdx.z = z), bounds checks on r and c, and "
        f"read a neighbour only when it is inside the volume.",
        level2=f"Compute {formula} on a {depth}x{rows}x{cols} float32 volume, treating voxels outside it as 0.",
        inputs=[Buffer("x", "float32", (depth, rows, cols))],
        outputs=[Buffer("y", "float32", (depth, rows, cols))],
        constants=f"const int depth = {depth};\nconst int rows = {rows};\nconst int cols = {cols};",
        kernels=f"""
        // One thread per voxel; neighbours outside the volume are zero padding and are never read.
        __global__ void {fn}{sig} {{
            int c = blockIdx.x * blockDim.x + threadIdx.x;
            int r = blockIdx.y * blockDim.y + threadIdx.y;
            int z = blockIdx.z;
            if (r < rows && c < cols) {{
                int plane = rows * cols;
                int i = (z * rows + r) * cols + c;
                float s = -6.0f * x[i];
                if (c > 0) s += x[i - 1];
                if (c + 1 < cols) s += x[i + 1];
                if (r > 0) s += x[i - cols];
                if (r + 1 < rows) s += x[i + cols];
                if (z > 0) s += x[i - plane];
                if (z + 1 < depth) s += x[i + plane];
                y[i] = s;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note,
        gen=f"depth, rows, cols = {depth}, {rows}, {cols}\n"
        "x = rng.uniform(-1.0, 1.0, (depth, rows, cols)).astype(np.float32)\n\n\n"
        "def reference(x):\n"
        "    p = np.pad(x, 1)  # zero padding\n"
        "    core = (slice(1, -1),) * 3\n"
        "    total = -6 * x\n"
        "    for axis in range(3):\n"
        "        for shift in (0, 2):  # the neighbour before and after along `axis`\n"
        "            sl = list(core)\n"
        "            sl[axis] = slice(shift, shift + x.shape[axis])\n"
        "            total = total + p[tuple(sl)]\n"
        "    return total\n\n\n"
        "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
    )


def _gaussian_separable() -> OpSpec:
    rows, cols = 1200, 1800
    sig_rows = "(const float* __restrict__ img, float* __restrict__ tmp, int rows, int cols)"
    sig_cols = "(const float* __restrict__ tmp, float* __restrict__ out, int rows, int cols)"
    taps = "[1, 4, 6, 4, 1] / 16"
    return _task(
        op="gaussian_blur_5tap_separable",
        name="Gaussian_Blur_5Tap_Separable",
        split="eval",
        description=f"Blur a {rows}x{cols} float32 image with the separable 5x5 binomial (Gaussian) filter "
        f"{taps} per axis, clamped borders.",
        level1=f"Write two CUDA kernels that blur a row-major float32 image img of {rows} rows and {cols} columns "
        f"with the 5-tap binomial filter g = {taps} along each axis. Pass 1 (gauss5_rows_kernel): "
        f"tmp[r][c] = sum_{{k=-2..2}} g[k+2] * img[r][c+k]. Pass 2 (gauss5_cols_kernel): out[r][c] = "
        f"sum_{{k=-2..2}} g[k+2] * tmp[r+k][c]. Boundary rule: clamp, a column index is clamped to "
        f"[0, cols-1] in pass 1 and a row index to [0, rows-1] in pass 2 (edge replication). tmp is a float32 "
        f"scratch image of the same shape. Use one thread per pixel, 32 x 8 blocks, bounds checks, and the "
        f"exact weights 0.0625, 0.25, 0.375.",
        level2=f"Blur a {rows}x{cols} float32 image with the separable filter g = {taps} (outer product g g^T), "
        f"clamping row and column indices into the image.",
        inputs=[Buffer("img", "float32", (rows, cols))],
        outputs=[Buffer("out", "float32", (rows, cols))],
        scratch=[Buffer("tmp", "float32", (rows, cols))],
        constants=f"const int rows = {rows};\nconst int cols = {cols};",
        kernels=f"""
        // Separable filter: two 5-tap passes (10 reads per pixel) instead of one 5x5 pass (25 reads).
        // Clamping per axis in each pass equals clamping both coordinates in the 2-D filter.

        // Pass 1: along each row, column index clamped.
        __global__ void gauss5_rows_kernel{sig_rows} {{
            int c = blockIdx.x * blockDim.x + threadIdx.x;
            int r = blockIdx.y * blockDim.y + threadIdx.y;
            if (r < rows && c < cols) {{
                const float* row = img + r * cols;
                float s = 0.375f * row[c]
                        + 0.25f * (row[max(c - 1, 0)] + row[min(c + 1, cols - 1)])
                        + 0.0625f * (row[max(c - 2, 0)] + row[min(c + 2, cols - 1)]);
                tmp[r * cols + c] = s;
            }}
        }}

        // Pass 2: down each column of the intermediate, row index clamped.
        __global__ void gauss5_cols_kernel{sig_cols} {{
            int c = blockIdx.x * blockDim.x + threadIdx.x;
            int r = blockIdx.y * blockDim.y + threadIdx.y;
            if (r < rows && c < cols) {{
                float s = 0.375f * tmp[r * cols + c]
                        + 0.25f * (tmp[max(r - 1, 0) * cols + c] + tmp[min(r + 1, rows - 1) * cols + c])
                        + 0.0625f * (tmp[max(r - 2, 0) * cols + c] + tmp[min(r + 2, rows - 1) * cols + c]);
                out[r * cols + c] = s;
            }}
        }}
        """,
        signatures=[
            f"__global__ void gauss5_rows_kernel{sig_rows}",
            f"__global__ void gauss5_cols_kernel{sig_cols}",
        ],
        launch="""
        dim3 block(32, 8);
        dim3 grid((cols + 31) / 32, (rows + 7) / 8);
        {k}gauss5_rows_kernel<<<grid, block>>>(d_img, d_tmp, rows, cols);
        {k}gauss5_cols_kernel<<<grid, block>>>(d_tmp, d_out, rows, cols);
        """,
        launch_note="gauss5_rows_kernel (img -> tmp) is launched first, then gauss5_cols_kernel (tmp -> out), both "
        "with blocks of 32 x 8 threads (x along columns) and a grid of ((cols + 31) / 32, "
        "(rows + 7) / 8) blocks; tmp is a float32 scratch buffer of rows * cols elements.",
        gen=_gen_2d(
            rows,
            cols,
            "def reference(img):\n"
            "    g = np.array([1.0, 4.0, 6.0, 4.0, 1.0]) / 16.0\n"
            "    h, w = img.shape\n"
            '    p = np.pad(img, ((0, 0), (2, 2)), mode="edge")  # clamp columns\n'
            "    tmp = sum(g[k] * p[:, k:k + w] for k in range(5))\n"
            '    p = np.pad(tmp, ((2, 2), (0, 0)), mode="edge")  # clamp rows\n'
            "    return sum(g[k] * p[k:k + h, :] for k in range(5))",
            x="img",
            out="out",
            draw="rng.uniform(0.0, 1.0, (rows, cols))",
        ),
    )


def _median3() -> OpSpec:
    n = SIZES_1D["1048576"]
    fn = "median3_filter_kernel"
    launch, note = _guarded_1d(fn, "d_x, d_y, n")
    return _task(
        op="median3_filter_1d",
        name="Median3_Filter_1D",
        split="eval",
        description=f"Apply a 3-point median filter with clamped indices to a float32 vector of {n} elements.",
        level1=f"Write a CUDA kernel that computes y[i] = median(x[i-1], x[i], x[i+1]) for every i of a float32 "
        f"vector x of n = {n} elements. Boundary rule: clamp, x[-1] reads x[0] and x[n] reads x[n-1]. Use "
        f"one thread per element with {BLOCK} threads per block and a bounds check; the median of three is "
        f"max(min(a, b), min(max(a, b), c)) with fminf/fmaxf (no sorting, no branches).",
        level2=f"Compute y[i] = median(x[i-1], x[i], x[i+1]) for a float32 vector of {n} elements, clamping the "
        f"neighbour indices to [0, n-1].",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels=f"""
        // One thread per element; the median of three is a fixed min/max network, exact in float.
        __global__ void {fn}{VEC_SIGNATURE} {{
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) {{
                float a = x[max(i - 1, 0)];
                float b = x[i];
                float c = x[min(i + 1, n - 1)];
                y[i] = fmaxf(fminf(a, b), fminf(fmaxf(a, b), c));
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{VEC_SIGNATURE}"],
        launch=launch,
        launch_note=note,
        gen=_gen_1d(
            n,
            "def reference(x):\n"
            '    xp = np.pad(x, 1, mode="edge")  # clamp = edge replication\n'
            "    return np.median(np.stack([xp[:-2], xp[1:-1], xp[2:]]), axis=0)",
            draw="rng.standard_normal(n)",
        ),
    )


# --------------------------------------------------------------------------------------------
# pretrain: a third pool, disjoint from train and eval
# --------------------------------------------------------------------------------------------


def _central_diff() -> OpSpec:
    n = SIZES_1D["1048576"]
    fn = "central_diff_kernel"
    launch, note = grid_stride_launch(fn, "d_x, d_y, n", "n", GRID_STRIDE_BLOCKS, BLOCK)
    return _task(
        op="central_difference_1d",
        name="Central_Difference_1D",
        split="pretrain",
        description=f"Compute the central difference (x[i+1] - x[i-1]) / 2 with clamped indices of a float32 "
        f"vector of {n} elements.",
        level1=f"Write a CUDA kernel that computes y[i] = 0.5 * (x[i+1] - x[i-1]) for every i of a float32 vector x "
        f"of n = {n} elements. Boundary rule: clamp, x[-1] reads x[0] and x[n] reads x[n-1]. Use a "
        f"grid-stride loop over a fixed grid of {GRID_STRIDE_BLOCKS} blocks of {BLOCK} threads.",
        level2=f"Compute y[i] = (x[i+1] - x[i-1]) / 2 for a float32 vector of {n} elements, clamping neighbour "
        f"indices to [0, n-1].",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels=f"""
        // Grid-stride loop; clamped indices give one-sided differences at the two ends.
        __global__ void {fn}{VEC_SIGNATURE} {{
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {{
                y[i] = 0.5f * (x[min(i + 1, n - 1)] - x[max(i - 1, 0)]);
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{VEC_SIGNATURE}"],
        launch=launch,
        launch_note=note,
        gen=_gen_1d(
            n,
            "def reference(x):\n"
            '    xp = np.pad(x, 1, mode="edge")  # clamp = edge replication\n'
            "    return 0.5 * (xp[2:] - xp[:-2])",
        ),
    )


def _max_filter_3x3() -> OpSpec:
    rows, cols = 1024, 1024
    fn = "max_filter_3x3_kernel"
    launch, note = _grid_2d(fn, "d_x, d_y, rows, cols", 32, 8)
    formula = "y[r][c] = max over a, b in {-1, 0, 1} of x[r + a][c + b]"
    return _task(
        op="max_filter_3x3",
        name="Max_Filter_3x3",
        split="pretrain",
        description=f"Apply a 3x3 maximum filter (grayscale dilation) with clamped borders to a {rows}x{cols} "
        f"float32 image.",
        level1=f"Write a CUDA kernel that computes the 3x3 maximum filter {formula} of a row-major float32 image x "
        f"of {rows} rows and {cols} columns. Boundary rule: clamp, row and column indices are clamped into "
        f"the image. Use one thread per pixel with 32 x 8 blocks, a bounds check, and fmaxf.",
        level2=f"Compute {formula} for a {rows}x{cols} float32 image, clamping indices into the image.",
        inputs=[Buffer("x", "float32", (rows, cols))],
        outputs=[Buffer("y", "float32", (rows, cols))],
        constants=f"const int rows = {rows};\nconst int cols = {cols};",
        kernels=f"""
        // One thread per pixel; clamped rows and columns are computed once and reused by the 9 reads.
        __global__ void {fn}{IMG_SIGNATURE} {{
            int c = blockIdx.x * blockDim.x + threadIdx.x;
            int r = blockIdx.y * blockDim.y + threadIdx.y;
            if (r < rows && c < cols) {{
                int rs[3] = {{max(r - 1, 0), r, min(r + 1, rows - 1)}};
                int cs[3] = {{max(c - 1, 0), c, min(c + 1, cols - 1)}};
                float m = -FLT_MAX;
                #pragma unroll
                for (int a = 0; a < 3; ++a)
                    #pragma unroll
                    for (int b = 0; b < 3; ++b) m = fmaxf(m, x[rs[a] * cols + cs[b]]);
                y[r * cols + c] = m;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{IMG_SIGNATURE}"],
        launch=launch,
        launch_note=note,
        gen=_gen_2d(
            rows,
            cols,
            "def reference(x):\n"
            '    xp = np.pad(x, 1, mode="edge")  # clamp = edge replication\n'
            "    h, w = x.shape\n"
            "    return np.max([xp[a:a + h, b:b + w] for a in range(3) for b in range(3)], axis=0)",
            draw="rng.standard_normal((rows, cols))",
        ),
    )


def specs() -> list[OpSpec]:
    return [
        # train: 7 ops, two of them at a power-of-two size and an odd size
        _stencil1d_3pt("1048576"),
        _stencil1d_3pt("1500007"),
        _stencil1d_5pt(),
        _conv1d("1048576"),
        _conv1d("1000003"),
        _laplacian2d(),
        _conv2d_3x3(),
        _sobel(),
        _jacobi(),
        # eval
        _box_blur_5x5(),
        _stencil3d_7pt(),
        _gaussian_separable(),
        _median3(),
        # pretrain
        _central_diff(),
        _max_filter_3x3(),
    ]
