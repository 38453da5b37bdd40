"""Data layout and movement: transposes, tensor permutes, flips, reversal, channel
(de)interleaving, padding, concatenation and tiling (category "layout").

Every op only moves values, so outputs are compared exactly (atol = rtol = 0). The kernels
show the idioms of the family: a guarded one-thread-per-output 2-D grid, grid-stride loops
that enumerate the output so that stores are coalesced, a shared-memory tile with a +1
padded row that turns a strided transpose into coalesced loads and stores, and a block that
reverses its chunk in shared memory. Inputs are random, so no output equals an input
bitwise (a transpose, flip or roll of random data is never the data itself).
"""

from __future__ import annotations

from taskgen.core import Buffer, OpSpec, int_constants, kernel_signatures

CATEGORY = "layout"
EXACT = {"atol": 0.0, "rtol": 0.0}  # pure data movement: every value must arrive unchanged
GRID_STRIDE_BLOCKS = 1024  # grid-stride kernels launch a fixed grid of 256-thread blocks


def _gen(dims: str, draws: list[str], reference: str, args: str, outputs: str) -> str:
    """gen.py body: sizes, the random inputs, `def reference(args)` and the `_ref` outputs."""
    return "\n".join(
        [
            dims,
            *draws,
            "",
            "",
            f"def reference({args}):",
            f"    return {reference}",
            "",
            "",
            f"{outputs} = reference({args})",
        ]
    )


def _normal(name: str, shape: str) -> str:
    return f"{name} = rng.standard_normal({shape}).astype(np.float32)"


def _bytes(name: str, shape: str) -> str:
    return f"{name} = rng.integers(0, 256, {shape}, dtype=np.uint8)"


# ---------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------

TRANSPOSE_NAIVE_KERNEL = """
// One thread per element: a warp reads 32 consecutive floats of a row of x (coalesced) and
// writes them down a column of y, 32 stores `rows` floats apart (uncoalesced).
__global__ void transpose_naive_kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols)
        y[(size_t)c * rows + r] = x[(size_t)r * cols + c];
}
"""


def _transpose_naive(rows: int, cols: int, variant: str) -> OpSpec:
    return OpSpec(
        op="transpose_naive",
        name="Naive_Matrix_Transpose",
        category=CATEGORY,
        split="train",
        variant=variant,
        description=f"Transpose a {rows}x{cols} float32 matrix into a {cols}x{rows} matrix.",
        level1=f"""
            Write a CUDA kernel that transposes a row-major float32 matrix x ({rows} x {cols}) into y
            ({cols} x {rows}): y[c][r] = x[r][c]. Use one thread per element on a 2-D grid of 32 x 8
            thread blocks, threadIdx.x along the columns of x so that the reads are coalesced (the
            writes are strided; this is the simple version). Guard r < rows and c < cols: the grid
            is rounded up to whole blocks.
            """,
        level2=f"""
            Transpose a row-major float32 matrix x of {rows} rows and {cols} columns: y[c][r] = x[r][c],
            y has {cols} rows and {rows} columns.
            """,
        inputs=[Buffer("x", "float32", (rows, cols))],
        outputs=[Buffer("y", "float32", (cols, rows))],
        constants=int_constants(rows=rows, cols=cols),
        kernels=TRANSPOSE_NAIVE_KERNEL,
        signatures=kernel_signatures(TRANSPOSE_NAIVE_KERNEL),
        launch="""
            dim3 block(32, 8);
            dim3 grid((cols + 31) / 32, (rows + 7) / 8);
            {k}transpose_naive_kernel<<<grid, block>>>(d_x, d_y, rows, cols);
            """,
        launch_note="transpose_naive_kernel is launched once with 32 x 8 thread blocks on a grid of "
        "((cols + 31) / 32, (rows + 7) / 8) blocks: x-dimension over the columns of x, "
        "y-dimension over its rows, one thread per element.",
        gen=_gen(f"rows, cols = {rows}, {cols}", [_normal("x", "(rows, cols)")], "x.T", "x", "y_ref"),
        **EXACT,
    )


TRANSPOSE_TILED_KERNEL = """
constexpr int TILE = 32;
constexpr int BLOCK_ROWS = 8;  // blockDim.y; each thread moves TILE / BLOCK_ROWS = 4 elements

// A 32 x 8 block moves one 32 x 32 tile. It reads the tile row by row (coalesced), and after
// the barrier writes the transposed tile row by row as well (coalesced), reading shared
// memory down a column. The +1 padding makes the row stride 33 floats, so the 32 threads of
// a warp reading tile[tx][j] hit 32 different banks instead of one.
__global__ void transpose_tiled_kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    __shared__ float tile[TILE][TILE + 1];
    int tx = threadIdx.x;
    int row0 = blockIdx.y * TILE;  // first row of x in this tile
    int col0 = blockIdx.x * TILE;  // first column of x in this tile
    for (int j = threadIdx.y; j < TILE; j += BLOCK_ROWS) {
        int r = row0 + j, c = col0 + tx;
        if (r < rows && c < cols)
            tile[j][tx] = x[(size_t)r * cols + c];
    }
    __syncthreads();
    // y row (col0 + j) holds column col0 + j of x; thread tx stores its element x[row0 + tx].
    for (int j = threadIdx.y; j < TILE; j += BLOCK_ROWS) {
        int yr = col0 + j, yc = row0 + tx;
        if (yr < cols && yc < rows)
            y[(size_t)yr * rows + yc] = tile[tx][j];
    }
}
"""


def _transpose_tiled(rows: int, cols: int, variant: str) -> OpSpec:
    return OpSpec(
        op="transpose_shared_tiled",
        name="Shared_Memory_Matrix_Transpose",
        category=CATEGORY,
        split="train",
        variant=variant,
        description=f"Transpose a {rows}x{cols} float32 matrix through padded shared-memory tiles.",
        level1=f"""
            Write a CUDA kernel that transposes a row-major float32 matrix x ({rows} x {cols}) into y
            ({cols} x {rows}), y[c][r] = x[r][c], with coalesced reads and writes. Each 32 x 8 thread
            block moves one 32 x 32 tile: it loads the tile into __shared__ float tile[32][33] with
            rows j = threadIdx.y, threadIdx.y + 8, ... (each thread 4 elements), __syncthreads(), then
            writes the transposed tile to y, again row by row, reading tile[threadIdx.x][j]. The +1
            column of padding avoids 32-way shared-memory bank conflicts on that column read. Guard
            both the loads and the stores: the edge tiles are partial, but every thread must reach
            the barrier.
            """,
        level2=f"""
            Transpose a row-major float32 matrix x of {rows} rows and {cols} columns: y[c][r] = x[r][c],
            y has {cols} rows and {rows} columns.
            """,
        inputs=[Buffer("x", "float32", (rows, cols))],
        outputs=[Buffer("y", "float32", (cols, rows))],
        constants=int_constants(rows=rows, cols=cols),
        kernels=TRANSPOSE_TILED_KERNEL,
        signatures=kernel_signatures(TRANSPOSE_TILED_KERNEL),
        launch="""
            dim3 block(32, 8);
            dim3 grid((cols + 31) / 32, (rows + 31) / 32);
            {k}transpose_tiled_kernel<<<grid, block>>>(d_x, d_y, rows, cols);
            """,
        launch_note="transpose_tiled_kernel is launched once with 32 x 8 thread blocks on a grid of "
        "((cols + 31) / 32, (rows + 31) / 32) blocks; block (bx, by) moves the 32 x 32 tile of x "
        "at rows 32*by.. and columns 32*bx.., so each thread moves 4 elements.",
        gen=_gen(f"rows, cols = {rows}, {cols}", [_normal("x", "(rows, cols)")], "x.T", "x", "y_ref"),
        **EXACT,
    )


NCHW_KERNEL = """
// Grid-stride loop over the output in NHWC order, so consecutive threads write consecutive
// floats; each thread decodes (n, h, w, c) from its index and gathers from the NCHW input.
__global__ void nchw_to_nhwc_kernel(const float* __restrict__ x, float* __restrict__ y, int N, int C, int H, int W) {
    int total = N * C * H * W;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += blockDim.x * gridDim.x) {
        int c = idx % C;
        int t = idx / C;
        int w = t % W;
        t /= W;
        int h = t % H;
        int n = t / H;
        y[idx] = x[((n * C + c) * H + h) * W + w];
    }
}
"""


def _nchw_to_nhwc(N: int, C: int, H: int, W: int) -> OpSpec:
    return OpSpec(
        op="nchw_to_nhwc",
        name="NCHW_To_NHWC_Permute",
        category=CATEGORY,
        split="train",
        description=f"Permute a float32 tensor of shape ({N}, {C}, {H}, {W}) from NCHW to NHWC layout.",
        level1=f"""
            Write a CUDA kernel that converts a float32 tensor x stored as NCHW (N = {N}, C = {C}, H =
            {H}, W = {W}) to NHWC: y[n][h][w][c] = x[n][c][h][w], i.e. y[((n*H + h)*W + w)*C + c] =
            x[((n*C + c)*H + h)*W + w]. Use a grid-stride loop over the output index (1024 blocks of
            256 threads), decode c, w, h, n from it with % and /, and gather the input element, so
            that the stores are coalesced.
            """,
        level2=f"""
            Permute a float32 tensor of shape ({N}, {C}, {H}, {W}) in NCHW layout to NHWC layout, shape
            ({N}, {H}, {W}, {C}): y[n][h][w][c] = x[n][c][h][w].
            """,
        inputs=[Buffer("x", "float32", (N, C, H, W))],
        outputs=[Buffer("y", "float32", (N, H, W, C))],
        constants=int_constants(N=N, C=C, H=H, W=W),
        kernels=NCHW_KERNEL,
        signatures=kernel_signatures(NCHW_KERNEL),
        launch=f"{{k}}nchw_to_nhwc_kernel<<<{GRID_STRIDE_BLOCKS}, 256>>>(d_x, d_y, N, C, H, W);",
        launch_note=f"nchw_to_nhwc_kernel is launched once with {GRID_STRIDE_BLOCKS} blocks of 256 threads, "
        "fewer threads than elements, so each thread loops over output indices with a grid stride.",
        gen=_gen(
            f"N, C, H, W = {N}, {C}, {H}, {W}",
            [_normal("x", "(N, C, H, W)")],
            "np.transpose(x, (0, 2, 3, 1))",
            "x",
            "y_ref",
        ),
        **EXACT,
    )


FLIP_H_KERNEL = """
// One thread per output pixel. A warp writes 32 consecutive pixels of a row and reads the
// mirrored 32 pixels, which are also consecutive (in reverse order), so both are coalesced.
__global__ void flip_horizontal_kernel(const float* __restrict__ x, float* __restrict__ y, int H, int W) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < H && c < W)
        y[r * W + c] = x[r * W + (W - 1 - c)];
}
"""


def _flip_horizontal(H: int, W: int) -> OpSpec:
    return OpSpec(
        op="flip_horizontal",
        name="Horizontal_Image_Flip",
        category=CATEGORY,
        split="train",
        description=f"Mirror a {H}x{W} float32 image left to right (reverse the order of the columns).",
        level1=f"""
            Write a CUDA kernel that flips a row-major float32 image x ({H} rows x {W} columns) left to
            right: y[r][c] = x[r][{W} - 1 - c]. Use one thread per output pixel on a 2-D grid of 32 x 8
            thread blocks, threadIdx.x along the columns; guard r < H and c < W ({W} is not a multiple
            of 32).
            """,
        level2=f"""
            Mirror a float32 image of {H} rows and {W} columns horizontally: y[r][c] = x[r][W - 1 - c].
            """,
        inputs=[Buffer("x", "float32", (H, W))],
        outputs=[Buffer("y", "float32", (H, W))],
        constants=int_constants(H=H, W=W),
        kernels=FLIP_H_KERNEL,
        signatures=kernel_signatures(FLIP_H_KERNEL),
        launch="""
            dim3 block(32, 8);
            dim3 grid((W + 31) / 32, (H + 7) / 8);
            {k}flip_horizontal_kernel<<<grid, block>>>(d_x, d_y, H, W);
            """,
        launch_note="flip_horizontal_kernel is launched once with 32 x 8 thread blocks on a grid of "
        "((W + 31) / 32, (H + 7) / 8) blocks, one thread per pixel (x-dimension = column).",
        gen=_gen(f"H, W = {H}, {W}", [_normal("x", "(H, W)")], "x[:, ::-1]", "x", "y_ref"),
        **EXACT,
    )


REVERSE_KERNEL = """
constexpr int CHUNK = 256;  // = blockDim.x

// Block b loads x[b*CHUNK .. b*CHUNK + CHUNK - 1] into shared memory (coalesced), then stores
// the chunk reversed into the mirrored range of y: thread t stores element src = b*CHUNK +
// CHUNK - 1 - t at y[n - 1 - src], so consecutive threads store consecutive addresses too.
__global__ void reverse_array_kernel(const int* __restrict__ x, int* __restrict__ y, int n) {
    __shared__ int buf[CHUNK];
    int t = threadIdx.x;
    int base = blockIdx.x * CHUNK;
    if (base + t < n)
        buf[t] = x[base + t];
    __syncthreads();
    int src = base + CHUNK - 1 - t;
    if (src < n)  // the last chunk is partial; buf[CHUNK - 1 - t] was loaded exactly when src < n
        y[n - 1 - src] = buf[CHUNK - 1 - t];
}
"""


def _reverse_array(n: int) -> OpSpec:
    return OpSpec(
        op="reverse_array",
        name="Array_Reverse",
        category=CATEGORY,
        split="train",
        description=f"Reverse the order of an int32 array of {n} elements.",
        level1=f"""
            Write a CUDA kernel that reverses an int32 array x of n = {n} elements: y[i] = x[n - 1 - i].
            Use blocks of 256 threads that each own a chunk of 256 consecutive input elements: load the
            chunk into a __shared__ int array (coalesced), __syncthreads(), then have thread t store
            element 255 - t of the chunk to its mirrored position, so the stores of a block are also
            consecutive. n is not a multiple of 256: guard both the load and the store of the last
            chunk, and keep every thread at the barrier.
            """,
        level2=f"""
            Reverse an int32 array of {n} elements: y[i] = x[n - 1 - i].
            """,
        inputs=[Buffer("x", "int32", (n,))],
        outputs=[Buffer("y", "int32", (n,))],
        constants=int_constants(n=n),
        kernels=REVERSE_KERNEL,
        signatures=kernel_signatures(REVERSE_KERNEL),
        launch="{k}reverse_array_kernel<<<(n + 255) / 256, 256>>>(d_x, d_y, n);",
        launch_note="reverse_array_kernel is launched once with (n + 255) / 256 blocks of 256 threads; block b "
        "reads input elements 256*b..256*b+255 (the last block is partial).",
        gen=_gen(
            f"n = {n}",
            ["x = rng.integers(-1_000_000, 1_000_000, n).astype(np.int32)"],
            "x[::-1]",
            "x",
            "y_ref",
        ),
        **EXACT,
    )


INTERLEAVE_KERNEL = """
// Planar to packed: a grid-stride loop over pixels; pixel i gathers r[i], g[i], b[i] (three
// coalesced reads) and stores them at rgb[3i], rgb[3i + 1], rgb[3i + 2].
__global__ void interleave_rgb_kernel(const unsigned char* __restrict__ r, const unsigned char* __restrict__ g, const unsigned char* __restrict__ b, unsigned char* __restrict__ rgb, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        rgb[3 * i] = r[i];
        rgb[3 * i + 1] = g[i];
        rgb[3 * i + 2] = b[i];
    }
}
"""


def _interleave_rgb(H: int, W: int) -> OpSpec:
    return OpSpec(
        op="interleave_rgb",
        name="Interleave_RGB_Channels",
        category=CATEGORY,
        split="train",
        description=f"Pack three {H}x{W} uint8 colour planes r, g, b into one interleaved {H}x{W}x3 RGB image.",
        level1=f"""
            Write a CUDA kernel that interleaves three planar uint8 channels r, g, b of an image with
            {H} x {W} pixels into a packed RGB image: rgb[3*i + 0] = r[i], rgb[3*i + 1] = g[i],
            rgb[3*i + 2] = b[i] for pixel i = 0..{H * W - 1} (row-major). Use a grid-stride loop over
            pixels with 1024 blocks of 256 threads; each thread reads one byte of each plane and writes
            its three bytes.
            """,
        level2=f"""
            Interleave three uint8 planes r, g, b of shape ({H}, {W}) into an image of shape ({H}, {W}, 3):
            rgb[y][x][0] = r[y][x], rgb[y][x][1] = g[y][x], rgb[y][x][2] = b[y][x].
            """,
        inputs=[Buffer("r", "uint8", (H, W)), Buffer("g", "uint8", (H, W)), Buffer("b", "uint8", (H, W))],
        outputs=[Buffer("rgb", "uint8", (H, W, 3))],
        constants=int_constants(n=H * W),
        kernels=INTERLEAVE_KERNEL,
        signatures=kernel_signatures(INTERLEAVE_KERNEL),
        launch=f"{{k}}interleave_rgb_kernel<<<{GRID_STRIDE_BLOCKS}, 256>>>(d_r, d_g, d_b, d_rgb, n);",
        launch_note=f"interleave_rgb_kernel is launched once with {GRID_STRIDE_BLOCKS} blocks of 256 threads and "
        "n = H * W pixels, fewer threads than pixels, so each thread loops with a grid stride.",
        gen=_gen(
            f"H, W = {H}, {W}",
            [_bytes("r", "(H, W)"), _bytes("g", "(H, W)"), _bytes("b", "(H, W)")],
            "np.stack([r, g, b], axis=-1)",
            "r, g, b",
            "rgb_ref",
        ),
        **EXACT,
    )


ZERO_PAD_KERNEL = """
// One thread per output pixel of the (H + 2 pad) x (W + 2 pad) image: pixels whose source
// falls outside x are written as 0 explicitly, so every output element is defined.
__global__ void zero_pad_2d_kernel(const float* __restrict__ x, float* __restrict__ y, int H, int W, int pad) {
    int OH = H + 2 * pad, OW = W + 2 * pad;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < OH && c < OW) {
        int sr = r - pad, sc = c - pad;
        bool inside = sr >= 0 && sr < H && sc >= 0 && sc < W;
        y[r * OW + c] = inside ? x[sr * W + sc] : 0.0f;
    }
}
"""


def _zero_pad_2d(H: int, W: int, pad: int) -> OpSpec:
    OH, OW = H + 2 * pad, W + 2 * pad
    return OpSpec(
        op="zero_pad_2d",
        name="Zero_Pad_Image",
        category=CATEGORY,
        split="train",
        description=f"Surround a {H}x{W} float32 image with a border of {pad} zeros on every side ({OH}x{OW}).",
        level1=f"""
            Write a CUDA kernel that zero-pads a row-major float32 image x ({H} x {W}) by pad = {pad}
            pixels on each side, giving y ({OH} x {OW}): y[r][c] = x[r - pad][c - pad] where that pixel
            exists, else 0. Use one thread per output pixel on a 2-D grid of 32 x 8 thread blocks, and
            write the zeros explicitly (do not rely on y being cleared). Guard r < {OH} and c < {OW}.
            """,
        level2=f"""
            Pad a float32 image of {H} x {W} pixels with {pad} zeros on every side: y (shape {OH} x {OW})
            has y[r][c] = x[r - {pad}][c - {pad}] inside and 0 in the border.
            """,
        inputs=[Buffer("x", "float32", (H, W))],
        outputs=[Buffer("y", "float32", (OH, OW))],
        constants=int_constants(H=H, W=W, pad=pad),
        kernels=ZERO_PAD_KERNEL,
        signatures=kernel_signatures(ZERO_PAD_KERNEL),
        launch="""
            dim3 block(32, 8);
            dim3 grid((W + 2 * pad + 31) / 32, (H + 2 * pad + 7) / 8);
            {k}zero_pad_2d_kernel<<<grid, block>>>(d_x, d_y, H, W, pad);
            """,
        launch_note="zero_pad_2d_kernel is launched once with 32 x 8 thread blocks on a grid covering the padded "
        "image, ((W + 2*pad + 31) / 32, (H + 2*pad + 7) / 8) blocks, one thread per output pixel.",
        gen=_gen(
            f"H, W, pad = {H}, {W}, {pad}",
            [_normal("x", "(H, W)")],
            "np.pad(x, pad, mode='constant', constant_values=0.0)",
            "x",
            "y_ref",
        ),
        **EXACT,
    )


CONCAT_KERNEL = """
// Grid-stride loop over the rows x (Ca + Cb) output: a thread picks its source matrix from
// the column, so each row of y is row r of a followed by row r of b.
__global__ void concat_columns_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, int rows, int Ca, int Cb) {
    int C = Ca + Cb;
    int total = rows * C;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += blockDim.x * gridDim.x) {
        int r = idx / C;
        int c = idx - r * C;
        y[idx] = c < Ca ? a[r * Ca + c] : b[r * Cb + (c - Ca)];
    }
}
"""


def _concat_columns(rows: int, Ca: int, Cb: int) -> OpSpec:
    return OpSpec(
        op="concat_columns",
        name="Concatenate_Columns",
        category=CATEGORY,
        split="train",
        description=f"Concatenate a {rows}x{Ca} and a {rows}x{Cb} float32 matrix side by side "
        f"({rows}x{Ca + Cb}).",
        level1=f"""
            Write a CUDA kernel that concatenates two row-major float32 matrices along the columns:
            a ({rows} x {Ca}) and b ({rows} x {Cb}) give y ({rows} x {Ca + Cb}) with y[r][c] = a[r][c]
            for c < {Ca} and y[r][c] = b[r][c - {Ca}] otherwise. Use a grid-stride loop over the output
            index (1024 blocks of 256 threads) so that the stores are coalesced; derive r and c from
            the index.
            """,
        level2=f"""
            Concatenate float32 matrices a ({rows} x {Ca}) and b ({rows} x {Cb}) along the columns into
            y ({rows} x {Ca + Cb}): each row of y is the row of a followed by the row of b.
            """,
        inputs=[Buffer("a", "float32", (rows, Ca)), Buffer("b", "float32", (rows, Cb))],
        outputs=[Buffer("y", "float32", (rows, Ca + Cb))],
        constants=int_constants(rows=rows, Ca=Ca, Cb=Cb),
        kernels=CONCAT_KERNEL,
        signatures=kernel_signatures(CONCAT_KERNEL),
        launch=f"{{k}}concat_columns_kernel<<<{GRID_STRIDE_BLOCKS}, 256>>>(d_a, d_b, d_y, rows, Ca, Cb);",
        launch_note=f"concat_columns_kernel is launched once with {GRID_STRIDE_BLOCKS} blocks of 256 threads, fewer "
        "threads than outputs, so each thread loops over output indices with a grid stride.",
        gen=_gen(
            f"rows, Ca, Cb = {rows}, {Ca}, {Cb}",
            [_normal("a", "(rows, Ca)"), _normal("b", "(rows, Cb)")],
            "np.concatenate([a, b], axis=1)",
            "a, b",
            "y_ref",
        ),
        **EXACT,
    )


# ---------------------------------------------------------------------------------------
# eval: held-out operations
# ---------------------------------------------------------------------------------------

REFLECT_PAD_KERNEL = """
// numpy's "reflect" mode mirrors about the edge pixel without repeating it: -1 -> 1,
// n -> n - 2. One reflection suffices because the launch guarantees pad < n.
__device__ int reflect_index(int i, int n) {
    if (i < 0) return -i;
    if (i >= n) return 2 * n - 2 - i;
    return i;
}

// One thread per output pixel; border pixels read their mirror image inside x.
__global__ void reflect_pad_2d_kernel(const float* __restrict__ x, float* __restrict__ y, int H, int W, int pad) {
    int OH = H + 2 * pad, OW = W + 2 * pad;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < OH && c < OW)
        y[r * OW + c] = x[reflect_index(r - pad, H) * W + reflect_index(c - pad, W)];
}
"""


def _reflect_pad_2d(H: int, W: int, pad: int) -> OpSpec:
    OH, OW = H + 2 * pad, W + 2 * pad
    return OpSpec(
        op="reflect_pad_2d",
        name="Reflect_Pad_Image",
        category=CATEGORY,
        split="eval",
        description=f"Pad a {H}x{W} float32 image by {pad} pixels on every side with its mirror image "
        f"(reflect mode, edge not repeated), giving {OH}x{OW}.",
        level1=f"""
            Write a CUDA kernel that reflect-pads a row-major float32 image x ({H} x {W}) by pad = {pad}
            on each side, giving y ({OH} x {OW}): y[r][c] = x[f(r - pad, H)][f(c - pad, W)] with
            f(i, n) = -i for i < 0, 2n - 2 - i for i >= n, and i otherwise (mirror about the edge pixel,
            which is not repeated, as numpy.pad mode "reflect"). Use a __device__ helper for f, one
            thread per output pixel on a 2-D grid of 32 x 8 thread blocks, and guard r < {OH}, c < {OW}.
            """,
        level2=f"""
            Pad a float32 image of {H} x {W} pixels by {pad} on every side in reflect mode (mirror about
            the edge pixel without repeating it, like numpy.pad mode "reflect"); the result is {OH} x {OW}.
            """,
        inputs=[Buffer("x", "float32", (H, W))],
        outputs=[Buffer("y", "float32", (OH, OW))],
        constants=int_constants(H=H, W=W, pad=pad),
        kernels=REFLECT_PAD_KERNEL,
        signatures=kernel_signatures(REFLECT_PAD_KERNEL),
        launch="""
            dim3 block(32, 8);
            dim3 grid((W + 2 * pad + 31) / 32, (H + 2 * pad + 7) / 8);
            {k}reflect_pad_2d_kernel<<<grid, block>>>(d_x, d_y, H, W, pad);
            """,
        launch_note="reflect_pad_2d_kernel is launched once with 32 x 8 thread blocks on a grid covering the "
        "padded image, ((W + 2*pad + 31) / 32, (H + 2*pad + 7) / 8) blocks, one thread per output pixel.",
        gen=_gen(
            f"H, W, pad = {H}, {W}, {pad}",
            [_normal("x", "(H, W)")],
            "np.pad(x, pad, mode='reflect')",
            "x",
            "y_ref",
        ),
        **EXACT,
    )


DEINTERLEAVE_KERNEL = """
// Packed to planar: one thread per pixel reads its three bytes rgb[3i..3i+2] and writes one
// byte to each plane (the plane stores are coalesced).
__global__ void deinterleave_rgb_kernel(const unsigned char* __restrict__ rgb, unsigned char* __restrict__ r, unsigned char* __restrict__ g, unsigned char* __restrict__ b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        r[i] = rgb[3 * i];
        g[i] = rgb[3 * i + 1];
        b[i] = rgb[3 * i + 2];
    }
}
"""


def _deinterleave_rgb(H: int, W: int) -> OpSpec:
    return OpSpec(
        op="deinterleave_rgb",
        name="Deinterleave_RGB_Channels",
        category=CATEGORY,
        split="eval",
        description=f"Split a packed {H}x{W}x3 uint8 RGB image into three {H}x{W} planes r, g, b.",
        level1=f"""
            Write a CUDA kernel that splits a packed uint8 RGB image rgb ({H} x {W} x 3, channels
            interleaved) into three planes: r[i] = rgb[3*i], g[i] = rgb[3*i + 1], b[i] = rgb[3*i + 2]
            for pixel i = 0..{H * W - 1}. Use one thread per pixel with blocks of 256 threads and a
            bounds check i < n.
            """,
        level2=f"""
            Split an interleaved uint8 image of shape ({H}, {W}, 3) into planes r, g, b of shape ({H}, {W}):
            r[y][x] = rgb[y][x][0], g[y][x] = rgb[y][x][1], b[y][x] = rgb[y][x][2].
            """,
        inputs=[Buffer("rgb", "uint8", (H, W, 3))],
        outputs=[Buffer("r", "uint8", (H, W)), Buffer("g", "uint8", (H, W)), Buffer("b", "uint8", (H, W))],
        constants=int_constants(n=H * W),
        kernels=DEINTERLEAVE_KERNEL,
        signatures=kernel_signatures(DEINTERLEAVE_KERNEL),
        launch="{k}deinterleave_rgb_kernel<<<(n + 255) / 256, 256>>>(d_rgb, d_r, d_g, d_b, n);",
        launch_note="deinterleave_rgb_kernel is launched once with (n + 255) / 256 blocks of 256 threads, "
        "n = H * W pixels, one thread per pixel.",
        gen=_gen(
            f"H, W = {H}, {W}",
            [_bytes("rgb", "(H, W, 3)")],
            "rgb[..., 0], rgb[..., 1], rgb[..., 2]",
            "rgb",
            "r_ref, g_ref, b_ref",
        ),
        **EXACT,
    )


TILE_REPEAT_KERNEL = """
// One thread per output element: y is x repeated reps_y times down and reps_x times across,
// so output (r, c) copies x[r % rows][c % cols].
__global__ void tile_repeat_2d_kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols, int reps_y, int reps_x) {
    int OR = rows * reps_y, OC = cols * reps_x;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < OR && c < OC)
        y[r * OC + c] = x[(r % rows) * cols + (c % cols)];
}
"""


def _tile_repeat_2d(rows: int, cols: int, reps_y: int, reps_x: int) -> OpSpec:
    OR, OC = rows * reps_y, cols * reps_x
    return OpSpec(
        op="tile_repeat_2d",
        name="Tile_Repeat_Matrix",
        category=CATEGORY,
        split="eval",
        description=f"Tile a {rows}x{cols} float32 matrix {reps_y} times vertically and {reps_x} times "
        f"horizontally ({OR}x{OC}).",
        level1=f"""
            Write a CUDA kernel that tiles a row-major float32 matrix x ({rows} x {cols}) {reps_y} times
            down and {reps_x} times across, like numpy.tile(x, ({reps_y}, {reps_x})): y ({OR} x {OC}) has
            y[r][c] = x[r % {rows}][c % {cols}]. Use one thread per output element on a 2-D grid of
            32 x 8 thread blocks, threadIdx.x along the columns, and guard r < {OR}, c < {OC}.
            """,
        level2=f"""
            Repeat a float32 matrix x ({rows} x {cols}) as a {reps_y} x {reps_x} grid of copies
            (numpy.tile(x, ({reps_y}, {reps_x}))), giving a {OR} x {OC} matrix.
            """,
        inputs=[Buffer("x", "float32", (rows, cols))],
        outputs=[Buffer("y", "float32", (OR, OC))],
        constants=int_constants(rows=rows, cols=cols, reps_y=reps_y, reps_x=reps_x),
        kernels=TILE_REPEAT_KERNEL,
        signatures=kernel_signatures(TILE_REPEAT_KERNEL),
        launch="""
            dim3 block(32, 8);
            dim3 grid((cols * reps_x + 31) / 32, (rows * reps_y + 7) / 8);
            {k}tile_repeat_2d_kernel<<<grid, block>>>(d_x, d_y, rows, cols, reps_y, reps_x);
            """,
        launch_note="tile_repeat_2d_kernel is launched once with 32 x 8 thread blocks on a grid covering the "
        "output, ((cols*reps_x + 31) / 32, (rows*reps_y + 7) / 8) blocks, one thread per element.",
        gen=_gen(
            f"rows, cols, reps_y, reps_x = {rows}, {cols}, {reps_y}, {reps_x}",
            [_normal("x", "(rows, cols)")],
            "np.tile(x, (reps_y, reps_x))",
            "x",
            "y_ref",
        ),
        **EXACT,
    )


# ---------------------------------------------------------------------------------------
# pretrain
# ---------------------------------------------------------------------------------------

FLIP_V_KERNEL = """
// One block per output row: the threads stride along the row, copying the mirrored row of x.
__global__ void flip_vertical_kernel(const float* __restrict__ x, float* __restrict__ y, int H, int W) {
    int r = blockIdx.x;
    const float* src = x + (size_t)(H - 1 - r) * W;
    float* dst = y + (size_t)r * W;
    for (int c = threadIdx.x; c < W; c += blockDim.x)
        dst[c] = src[c];
}
"""


def _flip_vertical(H: int, W: int) -> OpSpec:
    return OpSpec(
        op="flip_vertical",
        name="Vertical_Image_Flip",
        category=CATEGORY,
        split="pretrain",
        description=f"Mirror a {H}x{W} float32 image top to bottom (reverse the order of the rows).",
        level1=f"""
            Write a CUDA kernel that flips a row-major float32 image x ({H} x {W}) upside down:
            y[r][c] = x[{H} - 1 - r][c]. Launch one block of 256 threads per output row; the threads
            copy the row with a block-stride loop over the columns.
            """,
        level2=f"""
            Mirror a float32 image of {H} rows and {W} columns vertically: y[r][c] = x[H - 1 - r][c].
            """,
        inputs=[Buffer("x", "float32", (H, W))],
        outputs=[Buffer("y", "float32", (H, W))],
        constants=int_constants(H=H, W=W),
        kernels=FLIP_V_KERNEL,
        signatures=kernel_signatures(FLIP_V_KERNEL),
        launch="{k}flip_vertical_kernel<<<H, 256>>>(d_x, d_y, H, W);",
        launch_note="flip_vertical_kernel is launched once with H blocks of 256 threads: block r writes row r "
        "of y, looping over the columns with a stride of 256.",
        gen=_gen(f"H, W = {H}, {W}", [_normal("x", "(H, W)")], "x[::-1, :]", "x", "y_ref"),
        **EXACT,
    )


ROLL_KERNEL = """
// Circular shift right by `shift` (0 <= shift < n): y[j] = x[(j - shift) mod n]. A grid-stride
// loop over the output keeps the stores coalesced; the reads are a shifted contiguous run.
__global__ void roll_array_kernel(const float* __restrict__ x, float* __restrict__ y, int n, int shift) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += blockDim.x * gridDim.x) {
        int src = j - shift;
        if (src < 0) src += n;
        y[j] = x[src];
    }
}
"""


def _roll_array(n: int, shift: int) -> OpSpec:
    return OpSpec(
        op="roll_array",
        name="Circular_Shift_Array",
        category=CATEGORY,
        split="pretrain",
        description=f"Rotate a float32 array of {n} elements right by {shift} positions (numpy.roll).",
        level1=f"""
            Write a CUDA kernel that rotates a float32 array x of n = {n} elements right by shift =
            {shift} positions, like numpy.roll: y[j] = x[(j - shift) mod n]. Use a grid-stride loop over
            the output with 1024 blocks of 256 threads, wrapping the source index by adding n when it
            is negative.
            """,
        level2=f"""
            Circularly shift a float32 array of {n} elements right by {shift}: y[(i + {shift}) mod n] = x[i].
            """,
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=int_constants(n=n, shift=shift),
        kernels=ROLL_KERNEL,
        signatures=kernel_signatures(ROLL_KERNEL),
        launch=f"{{k}}roll_array_kernel<<<{GRID_STRIDE_BLOCKS}, 256>>>(d_x, d_y, n, shift);",
        launch_note=f"roll_array_kernel is launched once with {GRID_STRIDE_BLOCKS} blocks of 256 threads, fewer "
        "threads than elements, so each thread loops over output indices with a grid stride.",
        gen=_gen(f"n, shift = {n}, {shift}", [_normal("x", "n")], "np.roll(x, shift)", "x", "y_ref"),
        **EXACT,
    )


def specs() -> list[OpSpec]:
    return [
        # train; both transposes come as a power-of-two shape and an odd one no tile divides
        _transpose_naive(2048, 1024, variant="2048x1024"),
        _transpose_naive(1999, 1001, variant="1999x1001"),
        _transpose_tiled(2048, 1024, variant="2048x1024"),
        _transpose_tiled(1999, 1001, variant="1999x1001"),
        _nchw_to_nhwc(8, 64, 56, 56),
        _flip_horizontal(1200, 1750),
        _reverse_array(1_500_007),
        _interleave_rgb(1080, 1920),
        _zero_pad_2d(1000, 1000, pad=3),
        _concat_columns(1000, 700, 500),
        # eval
        _reflect_pad_2d(1000, 1200, pad=4),
        _deinterleave_rgb(1080, 1920),
        _tile_repeat_2d(300, 500, reps_y=4, reps_x=2),
        # pretrain
        _flip_vertical(1100, 1000),
        _roll_array(1 << 20, 12345),
    ]
