"""Pooling: each output summarises a window of the input (max, mean, L2 norm), NCHW layout.

Inputs are float32 NCHW tensors (or (rows, length) for 1-D pooling) of 1-3M elements. The
prompts state window, stride, padding and the output size rule exactly: floor division
(a trailing partial window is dropped), how padding enters a max (ignored) or a mean (counted
as zeros), PyTorch's adaptive-pooling window bounds, and for argmax the index convention and
the tie rule. Kernels vary in style: guarded one-thread-per-output, grid-stride loops, 2-D
blocks with one grid layer per (n, c) plane, a shared-memory tile with halo, a whole plane in
dynamic shared memory, a block-per-plane warp-shuffle reduction, and float4 loads.
"""

from __future__ import annotations

from taskgen.core import Buffer, OpSpec, grid_stride_launch

CATEGORY = "pooling"
BLOCK = 256
GRID_STRIDE_BLOCKS = 1024  # grid-stride kernels launch a fixed grid and loop

NCHW_ARGS = "int planes, int height, int width"  # planes = batch * channels


def _task(**kw) -> OpSpec:
    return OpSpec(category=CATEGORY, **kw)


def _nchw_constants(shape: tuple[int, int, int, int], extra: str = "") -> str:
    n, c, h, w = shape
    return (
        f"const int batch = {n};\nconst int channels = {c};\nconst int height = {h};\nconst int width = {w};"
        + (f"\n{extra}" if extra else "")
    )


def _nchw_input(shape: tuple[int, ...]) -> str:
    return f"x = rng.standard_normal({shape!r}).astype(np.float32)"


def _gen(setup: str, body: str, out: str = "y") -> str:
    return (
        f"{setup}\n\n\n{body}\n\n\n"
        f"{out}_ref = reference(x.astype(np.float64)).astype(np.float32)  # float64 math, stored as float32"
    )


def _guarded(fn: str, args: str, count: str) -> tuple[str, str]:
    return (
        f"{{k}}{fn}<<<({count} + {BLOCK - 1}) / {BLOCK}, {BLOCK}>>>({args});",
        f"{fn} is launched once with ({count} + {BLOCK - 1}) / {BLOCK} blocks of {BLOCK} threads, one thread per "
        f"output element ({count} outputs); the last block is only partly used.",
    )


# --------------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------------

MAXPOOL_SHAPES = {
    "16x32x64x64": (16, 32, 64, 64),
    "8x24x75x93": (8, 24, 75, 93),
}  # the second has odd H and W


def _maxpool2d_2x2(tag: str) -> OpSpec:
    n, c, h, w = shape = MAXPOOL_SHAPES[tag]
    oh, ow = h // 2, w // 2
    fn = "maxpool2d_2x2_kernel"
    sig = f"(const float* __restrict__ x, float* __restrict__ y, {NCHW_ARGS})"
    launch, note = _guarded(fn, "d_x, d_y, batch * channels, height, width", "out_count")
    formula = (
        "y[n][c][i][j] = max(x[n][c][2i][2j], x[n][c][2i][2j+1], x[n][c][2i+1][2j], x[n][c][2i+1][2j+1])"
    )
    return _task(
        op="maxpool2d_2x2_stride2",
        name="MaxPool2D_2x2_Stride2",
        split="train",
        variant=tag,
        description=f"2-D max pooling with a 2x2 window and stride 2 over an NCHW float32 tensor of shape {shape}.",
        level1=f"Write a CUDA kernel for 2-D max pooling, window 2x2, stride 2, no padding, on a float32 NCHW tensor "
        f"x of shape {shape} (row-major). The output y has shape ({n}, {c}, {oh}, {ow}), i.e. H/2 and W/2 "
        f"rounded down (a trailing odd row or column is dropped), with {formula}. Use one thread per output "
        f"element over the flattened output index (decompose it into plane = n*C + c, i, j), {BLOCK} "
        f"threads per block and a bounds check; take the max with fmaxf.",
        level2=f"2-D max pooling (2x2 window, stride 2, no padding, floor output size) of an NCHW float32 tensor of "
        f"shape {shape} to shape ({n}, {c}, {oh}, {ow}): {formula}.",
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", (n, c, oh, ow))],
        constants=_nchw_constants(
            shape, "const int out_count = batch * channels * (height / 2) * (width / 2);"
        ),
        kernels=f"""
        // One thread per output, flattened over (plane, i, j); the window is never partial because the
        // output size is rounded down.
        __global__ void {fn}{sig} {{
            int oh = height / 2;
            int ow = width / 2;
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < planes * oh * ow) {{
                int ox = i % ow;
                int oy = (i / ow) % oh;
                int p = i / (ow * oh);
                const float* src = x + (p * height + 2 * oy) * width + 2 * ox;
                y[i] = fmaxf(fmaxf(src[0], src[1]), fmaxf(src[width], src[width + 1]));
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note + " planes = batch * channels.",
        gen=_gen(
            _nchw_input(shape),
            "def reference(x):\n"
            "    n, c, h, w = x.shape\n"
            "    oh, ow = h // 2, w // 2  # floor: a trailing odd row/column is dropped\n"
            "    return x[:, :, :2 * oh, :2 * ow].reshape(n, c, oh, 2, ow, 2).max(axis=(3, 5))",
        ),
    )


def _avgpool2d_3x3_pad1() -> OpSpec:
    n, c, h, w = shape = (8, 32, 60, 70)
    fn = "avgpool2d_3x3_pad1_kernel"
    sig = "(const float* __restrict__ x, float* __restrict__ y, int height, int width)"
    formula = "y[n][c][i][j] = (1/9) * sum_{a=-1..1, b=-1..1} x[n][c][i+a][j+b]"
    return _task(
        op="avgpool2d_3x3_stride1_pad1",
        name="AvgPool2D_3x3_Stride1_Pad1",
        split="train",
        description=f"2-D average pooling with a 3x3 window, stride 1 and zero padding 1 (padding counted in the "
        f"divisor) over an NCHW float32 tensor of shape {shape}.",
        level1=f"Write a CUDA kernel for 2-D average pooling, window 3x3, stride 1, padding 1, on a float32 NCHW "
        f"tensor x of shape {shape}; the output y has the same shape, {formula}, where positions outside "
        f"the H x W plane count as 0 and the divisor is always 9 (count_include_pad). Use 16 x 16 thread "
        f"blocks over (j, i) with one grid layer per (n, c) plane (blockIdx.z = n*C + c); each block loads an "
        f"18 x 18 shared-memory tile (its 16 x 16 outputs plus a 1-element halo, 0 outside the plane, "
        f"loaded with a strided loop), calls __syncthreads() once with all threads, then each thread inside "
        f"the plane sums 9 tile values.",
        level2=f"Average pooling with a 3x3 window, stride 1, zero padding 1 and divisor 9 everywhere (padding is "
        f"counted) of an NCHW float32 tensor of shape {shape}; output of the same shape: {formula}.",
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", shape)],
        constants=_nchw_constants(shape),
        kernels=f"""
        constexpr int AP_TILE = 16;
        constexpr int AP_SPAN = AP_TILE + 2;  // the block's outputs plus a one-element halo on each side

        // tile[tr][tc] holds the plane at (row0 + tr, col0 + tc), 0 outside it (zero padding), so every
        // output sums 9 tile values without bounds checks; windows overlap, so each input is loaded once.
        __global__ void {fn}{sig} {{
            __shared__ float tile[AP_SPAN][AP_SPAN];
            const float* src = x + blockIdx.z * height * width;
            int row0 = blockIdx.y * AP_TILE - 1;
            int col0 = blockIdx.x * AP_TILE - 1;
            for (int t = threadIdx.y * AP_TILE + threadIdx.x; t < AP_SPAN * AP_SPAN; t += AP_TILE * AP_TILE) {{
                int r = row0 + t / AP_SPAN;
                int c = col0 + t % AP_SPAN;
                bool inside = r >= 0 && r < height && c >= 0 && c < width;
                tile[t / AP_SPAN][t % AP_SPAN] = inside ? src[r * width + c] : 0.0f;
            }}
            __syncthreads();
            int r = blockIdx.y * AP_TILE + threadIdx.y;
            int c = blockIdx.x * AP_TILE + threadIdx.x;
            if (r < height && c < width) {{
                float sum = 0.0f;
                for (int a = 0; a < 3; ++a)
                    for (int b = 0; b < 3; ++b) sum += tile[threadIdx.y + a][threadIdx.x + b];
                y[(blockIdx.z * height + r) * width + c] = sum / 9.0f;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=f"""
        dim3 block(16, 16);
        dim3 grid((width + 15) / 16, (height + 15) / 16, batch * channels);
        {{k}}{fn}<<<grid, block>>>(d_x, d_y, height, width);
        """,
        launch_note=f"{fn} is launched once with blocks of 16 x 16 threads (x along W, y along H) and a grid of "
        f"((width + 15) / 16, (height + 15) / 16, batch * channels) blocks; blockIdx.z is the (n, c) "
        f"plane. Edge blocks are only partly inside the plane.",
        gen=_gen(
            _nchw_input(shape),
            "def reference(x):\n"
            "    h, w = x.shape[2:]\n"
            "    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))  # zero padding, counted in the divisor\n"
            "    return sum(xp[:, :, a:a + h, b:b + w] for a in range(3) for b in range(3)) / 9.0",
        ),
    )


MAXPOOL1D_SHAPES = {"256x4096": (256, 4096), "300x4999": (300, 4999)}


def _maxpool1d(tag: str) -> OpSpec:
    rows, length = MAXPOOL1D_SHAPES[tag]
    out_len = (length - 3) // 2 + 1
    fn = "maxpool1d_k3s2_kernel"
    sig = "(const float* __restrict__ x, float* __restrict__ y, int rows, int length)"
    launch, note = grid_stride_launch(
        fn, "d_x, d_y, rows, length", "rows * out_len", GRID_STRIDE_BLOCKS, BLOCK
    )
    formula = "y[r][j] = max(x[r][2j], x[r][2j+1], x[r][2j+2])"
    return _task(
        op="maxpool1d_k3_stride2",
        name="MaxPool1D_Kernel3_Stride2",
        split="train",
        variant=tag,
        description=f"1-D max pooling with window 3 and stride 2 along each row of a {rows}x{length} float32 "
        f"array.",
        level1=f"Write a CUDA kernel for 1-D max pooling, window 3, stride 2, no padding, along the last axis of a "
        f"row-major float32 array x of shape ({rows}, {length}). The output y has shape ({rows}, {out_len}) "
        f"(out_len = (length - 3) / 2 + 1, rounded down) with {formula}. Use a grid-stride loop over the "
        f"flattened output index with a fixed grid of {GRID_STRIDE_BLOCKS} blocks of {BLOCK} threads, and "
        f"fmaxf.",
        level2=f"1-D max pooling (window 3, stride 2, no padding) along each row of a ({rows}, {length}) float32 "
        f"array, giving ({rows}, {out_len}): {formula}.",
        inputs=[Buffer("x", "float32", (rows, length))],
        outputs=[Buffer("y", "float32", (rows, out_len))],
        constants=f"const int rows = {rows};\nconst int length = {length};\nconst int out_len = (length - 3) / 2 + 1;",
        kernels=f"""
        // Grid-stride loop over (row, j); windows of consecutive j overlap by one element.
        __global__ void {fn}{sig} {{
            int out_len = (length - 3) / 2 + 1;
            int total = rows * out_len;
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {{
                int r = i / out_len;
                int j = i - r * out_len;
                const float* src = x + r * length + 2 * j;
                y[i] = fmaxf(fmaxf(src[0], src[1]), src[2]);
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note,
        gen=_gen(
            f"x = rng.standard_normal({(rows, length)!r}).astype(np.float32)",
            "def reference(x):\n"
            "    m = (x.shape[1] - 3) // 2 + 1\n"
            "    # window j covers columns 2j, 2j+1, 2j+2\n"
            "    return np.maximum(np.maximum(x[:, 0:2 * m:2], x[:, 1:2 * m + 1:2]), x[:, 2:2 * m + 2:2])",
        ),
    )


def _global_avgpool() -> OpSpec:
    n, c, h, w = shape = (8, 64, 56, 56)
    fn = "global_avgpool_kernel"
    sig = "(const float* __restrict__ x, float* __restrict__ y, int plane_size)"
    return _task(
        op="global_avgpool_nchw",
        name="Global_AvgPool_NCHW",
        split="train",
        description=f"Global average pooling: the mean over H and W of each (n, c) plane of an NCHW float32 tensor "
        f"of shape {shape}.",
        level1=f"Write a CUDA kernel for global average pooling of a float32 NCHW tensor x of shape {shape}: "
        f"y[n][c] = mean over i, j of x[n][c][i][j], output shape ({n}, {c}). Use one block of 256 threads "
        f"per (n, c) plane (blockIdx.x = n*C + c, plane of H*W = {h * w} contiguous floats): each thread "
        f"sums a strided subset, then reduce within each warp with __shfl_down_sync (full mask, all 32 "
        f"lanes active), write the 8 warp sums to shared memory, __syncthreads(), and let warp 0 reduce "
        f"them and write the sum divided by H*W.",
        level2=f"For an NCHW float32 tensor of shape {shape}, compute y[n][c] = (1 / (H*W)) * sum_{{i,j}} "
        f"x[n][c][i][j], output shape ({n}, {c}).",
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", (n, c))],
        constants=_nchw_constants(shape),
        kernels=f"""
        constexpr int GAP_THREADS = 256;
        constexpr int GAP_WARPS = GAP_THREADS / 32;

        // One block per plane: strided per-thread sums (coalesced), a shuffle tree inside each warp, then
        // warp 0 combines the per-warp sums. Every block has 8 full warps, so the full mask is valid.
        __global__ void {fn}{sig} {{
            __shared__ float warp_sums[GAP_WARPS];
            const float* src = x + blockIdx.x * plane_size;
            float s = 0.0f;
            for (int i = threadIdx.x; i < plane_size; i += GAP_THREADS) s += src[i];
            for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffff, s, off);
            int lane = threadIdx.x & 31;
            int warp = threadIdx.x >> 5;
            if (lane == 0) warp_sums[warp] = s;
            __syncthreads();
            if (warp == 0) {{
                s = lane < GAP_WARPS ? warp_sums[lane] : 0.0f;
                for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffff, s, off);
                if (lane == 0) y[blockIdx.x] = s / plane_size;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=f"{{k}}{fn}<<<batch * channels, 256>>>(d_x, d_y, height * width);",
        launch_note=f"{fn} is launched once with batch * channels blocks of 256 threads, one block per (n, c) plane; "
        f"plane_size = height * width.",
        gen=_gen(
            f"x = rng.uniform(-1.0, 2.0, {shape!r}).astype(np.float32)",
            "def reference(x):\n    return x.mean(axis=(2, 3))",
        ),
    )


def _maxpool2d_argmax() -> OpSpec:
    n, c, h, w = shape = (8, 32, 80, 96)
    oh, ow = h // 2, w // 2
    fn = "maxpool2d_2x2_argmax_kernel"
    sig = f"(const float* __restrict__ x, float* __restrict__ y, int* __restrict__ idx, {NCHW_ARGS})"
    launch, note = grid_stride_launch(
        fn, "d_x, d_y, d_idx, batch * channels, height, width", "out_count", GRID_STRIDE_BLOCKS, BLOCK
    )
    return _task(
        op="maxpool2d_2x2_with_argmax",
        name="MaxPool2D_2x2_With_Argmax",
        split="train",
        description=f"2-D max pooling (2x2 window, stride 2) over an NCHW float32 tensor of shape {shape} that also "
        f"returns the position of each maximum.",
        level1=f"Write a CUDA kernel for 2-D max pooling with indices, window 2x2, stride 2, no padding, on a "
        f"float32 NCHW tensor x of shape {shape}. Outputs, both of shape ({n}, {c}, {oh}, {ow}): y (float32) "
        f"the window maximum, and idx (int32) its position inside its own H x W plane, row * W + col (as "
        f"PyTorch's return_indices). The window of output (i, j) is scanned in the order (2i, 2j), (2i, 2j+1), "
        f"(2i+1, 2j), (2i+1, 2j+1) and a later element replaces the current maximum only if strictly "
        f"greater, so ties keep the first. Use a grid-stride loop over the flattened output index with a "
        f"fixed grid of {GRID_STRIDE_BLOCKS} blocks of {BLOCK} threads.",
        level2=f"2-D max pooling (2x2, stride 2) of an NCHW float32 tensor of shape {shape}: output y ({n}, {c}, "
        f"{oh}, {ow}) holds each window's maximum and idx (int32, same shape) its position row * W + col in "
        f"the input plane; on ties the first element in row-major window order wins.",
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", (n, c, oh, ow)), Buffer("idx", "int32", (n, c, oh, ow))],
        constants=_nchw_constants(
            shape, "const int out_count = batch * channels * (height / 2) * (width / 2);"
        ),
        kernels=f"""
        // Grid-stride loop over outputs. Candidates are visited in row-major window order and replace the
        // best only when strictly greater, which fixes the winner on ties.
        __global__ void {fn}{sig} {{
            int oh = height / 2;
            int ow = width / 2;
            int total = planes * oh * ow;
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {{
                int ox = i % ow;
                int oy = (i / ow) % oh;
                const float* plane = x + (i / (ow * oh)) * height * width;
                int first = 2 * oy * width + 2 * ox;
                int best = first;
                float best_v = plane[first];
                int others[3] = {{first + 1, first + width, first + width + 1}};
                for (int k = 0; k < 3; ++k) {{
                    float v = plane[others[k]];
                    if (v > best_v) {{
                        best_v = v;
                        best = others[k];
                    }}
                }}
                y[i] = best_v;
                idx[i] = best;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note + " planes = batch * channels.",
        gen=_nchw_input(shape) + "\n\n\n"
        "def reference(x):\n"
        "    n, c, h, w = x.shape\n"
        "    oh, ow = h // 2, w // 2\n"
        "    # (n, c, oh, ow, 4): the window in row-major order; argmax returns the first maximum\n"
        "    win = x.reshape(n, c, oh, 2, ow, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, oh, ow, 4)\n"
        "    k = win.argmax(axis=-1)\n"
        "    rows = 2 * np.arange(oh)[:, None] + k // 2\n"
        "    cols = 2 * np.arange(ow)[None, :] + k % 2\n"
        "    return np.take_along_axis(win, k[..., None], axis=-1)[..., 0], rows * w + cols\n\n\n"
        "y_ref, idx_ref = reference(x)  # a max is a selection: exact in float32\n"
        "idx_ref = idx_ref.astype(np.int32)",
    )


def _l2pool() -> OpSpec:
    n, c, h, w = shape = (8, 32, 64, 100)
    oh, ow = h // 2, w // 2
    fn = "l2pool2d_2x2_kernel"
    sig = "(const float* __restrict__ x, float* __restrict__ y, int height, int width)"
    formula = (
        "y[n][c][i][j] = sqrt(x[n][c][2i][2j]^2 + x[n][c][2i][2j+1]^2 + x[n][c][2i+1][2j]^2 + "
        "x[n][c][2i+1][2j+1]^2)"
    )
    return _task(
        op="lppool2d_l2_2x2",
        name="LPPool2D_L2_2x2",
        split="train",
        description=f"L2 (power-2) pooling with a 2x2 window and stride 2 over an NCHW float32 tensor of shape "
        f"{shape}.",
        level1=f"Write a CUDA kernel for L2 pooling (LPPool2d with p = 2), window 2x2, stride 2, no padding, on a "
        f"float32 NCHW tensor x of shape {shape}: {formula}, output shape ({n}, {c}, {oh}, {ow}). Use 2-D "
        f"blocks of 32 x 8 threads over the output (x along j, y along i) with one grid layer per (n, c) "
        f"plane (blockIdx.z = n*C + c), a bounds check on i and j, and sqrtf.",
        level2=f"L2 pooling (2x2 window, stride 2) of an NCHW float32 tensor of shape {shape} to ({n}, {c}, {oh}, "
        f"{ow}): {formula}.",
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", (n, c, oh, ow))],
        constants=_nchw_constants(shape),
        kernels=f"""
        // 2-D blocks over the output plane, one grid layer per (n, c) plane.
        __global__ void {fn}{sig} {{
            int oh = height / 2;
            int ow = width / 2;
            int j = blockIdx.x * blockDim.x + threadIdx.x;
            int i = blockIdx.y * blockDim.y + threadIdx.y;
            if (i < oh && j < ow) {{
                const float* src = x + (blockIdx.z * height + 2 * i) * width + 2 * j;
                float a = src[0], b = src[1], c = src[width], d = src[width + 1];
                y[(blockIdx.z * oh + i) * ow + j] = sqrtf(a * a + b * b + c * c + d * d);
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=f"""
        dim3 block(32, 8);
        dim3 grid((width / 2 + 31) / 32, (height / 2 + 7) / 8, batch * channels);
        {{k}}{fn}<<<grid, block>>>(d_x, d_y, height, width);
        """,
        launch_note=f"{fn} is launched once with blocks of 32 x 8 threads (x along the output column j, y along the "
        f"output row i) and a grid of ((width / 2 + 31) / 32, (height / 2 + 7) / 8, batch * channels) "
        f"blocks; blockIdx.z is the (n, c) plane.",
        gen=_gen(
            _nchw_input(shape),
            "def reference(x):\n"
            "    n, c, h, w = x.shape\n"
            "    return np.sqrt((x * x).reshape(n, c, h // 2, 2, w // 2, 2).sum(axis=(3, 5)))",
        ),
    )


# --------------------------------------------------------------------------------------------
# eval: operations that do not occur in train
# --------------------------------------------------------------------------------------------


def _adaptive_avgpool() -> OpSpec:
    n, c, h, w = shape = (16, 64, 45, 37)
    out = 7
    fn = "adaptive_avgpool2d_kernel"
    sig = "(const float* __restrict__ x, float* __restrict__ y, int height, int width, int out_h, int out_w)"
    bounds = "rows floor(i*H/7) .. ceil((i+1)*H/7) - 1 and columns floor(j*W/7) .. ceil((j+1)*W/7) - 1"
    return _task(
        op="adaptive_avgpool2d_7x7",
        name="Adaptive_AvgPool2D_7x7",
        split="eval",
        description=f"Adaptive average pooling of an NCHW float32 tensor of shape {shape} to a 7x7 output per "
        f"plane.",
        level1=f"Write a CUDA kernel for adaptive average pooling (as PyTorch AdaptiveAvgPool2d((7, 7))) of a float32 "
        f"NCHW tensor x of shape {shape} (H = {h}, W = {w}) to y of shape ({n}, {c}, {out}, {out}): "
        f"y[n][c][i][j] is the mean of x[n][c] over {bounds} (windows of varying size that may overlap). "
        f"Use one block of 128 threads per (n, c) plane: copy the whole H x W plane into dynamic shared "
        f"memory (H*W floats, coalesced strided loop), __syncthreads(), then threads loop over the 49 "
        f"outputs, each averaging its window from shared memory.",
        level2=f"Adaptive average pooling of an NCHW float32 tensor of shape {shape} to ({n}, {c}, {out}, {out}): "
        f"output (i, j) of each plane is the mean over {bounds}.",
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", (n, c, out, out))],
        constants=_nchw_constants(shape, f"const int out_h = {out};\nconst int out_w = {out};"),
        kernels=f"""
        // One block per plane. The windows overlap and vary in size, so the plane is staged once in
        // dynamic shared memory (height * width floats) and every output reads its window from there.
        __global__ void {fn}{sig} {{
            extern __shared__ float plane[];
            const float* src = x + blockIdx.x * height * width;
            for (int t = threadIdx.x; t < height * width; t += blockDim.x) plane[t] = src[t];
            __syncthreads();
            for (int o = threadIdx.x; o < out_h * out_w; o += blockDim.x) {{
                int i = o / out_w;
                int j = o % out_w;
                int r0 = i * height / out_h;
                int r1 = ((i + 1) * height + out_h - 1) / out_h;  // ceil
                int c0 = j * width / out_w;
                int c1 = ((j + 1) * width + out_w - 1) / out_w;
                float sum = 0.0f;
                for (int r = r0; r < r1; ++r)
                    for (int c = c0; c < c1; ++c) sum += plane[r * width + c];
                y[blockIdx.x * out_h * out_w + o] = sum / ((r1 - r0) * (c1 - c0));
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=f"{{k}}{fn}<<<batch * channels, 128, height * width * sizeof(float)>>>(d_x, d_y, height, width, "
        f"out_h, out_w);",
        launch_note=f"{fn} is launched once with batch * channels blocks of 128 threads, one block per (n, c) plane, "
        f"and height * width * sizeof(float) bytes of dynamic shared memory; out_h = out_w = {out}.",
        gen=_gen(
            _nchw_input(shape),
            f"def reference(x):\n"
            f"    n, c, h, w = x.shape\n"
            f"    out = {out}\n"
            f"    y = np.empty((n, c, out, out))\n"
            f"    for i in range(out):  # 49 windows, each a vectorised mean over all planes\n"
            f"        r0, r1 = i * h // out, -(-(i + 1) * h // out)\n"
            f"        for j in range(out):\n"
            f"            c0, c1 = j * w // out, -(-(j + 1) * w // out)\n"
            f"            y[:, :, i, j] = x[:, :, r0:r1, c0:c1].mean(axis=(2, 3))\n"
            f"    return y",
        ),
    )


def _maxpool2d_3x3_s2() -> OpSpec:
    n, c, h, w = shape = (4, 32, 111, 97)
    oh, ow = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    fn = "maxpool2d_3x3s2p1_kernel"
    sig = f"(const float* __restrict__ x, float* __restrict__ y, {NCHW_ARGS}, int out_h, int out_w)"
    launch, note = _guarded(fn, "d_x, d_y, batch * channels, height, width, out_h, out_w", "out_count")
    formula = (
        "y[n][c][i][j] = max over a, b in {0, 1, 2} of x[n][c][2i - 1 + a][2j - 1 + b], out-of-range "
        "positions skipped"
    )
    return _task(
        op="maxpool2d_3x3_stride2_pad1",
        name="MaxPool2D_3x3_Stride2_Pad1",
        split="eval",
        description=f"2-D max pooling with a 3x3 window, stride 2 and padding 1 (ResNet stem) over an NCHW float32 "
        f"tensor of shape {shape}.",
        level1=f"Write a CUDA kernel for 2-D max pooling, window 3x3, stride 2, padding 1 (padding never wins: it "
        f"acts as -infinity), on a float32 NCHW tensor x of shape {shape}. Output shape ({n}, {c}, {oh}, {ow}) "
        f"with out = (in + 2 - 3) / 2 + 1 rounded down; {formula}. Use one thread per output over the "
        f"flattened output index, {BLOCK} threads per block and a bounds check; start from -FLT_MAX and skip "
        f"window rows and columns outside the plane (every window has at least one valid element).",
        level2=f"Max pooling (3x3 window, stride 2, padding 1 that is ignored by the max) of an NCHW float32 tensor "
        f"of shape {shape} to ({n}, {c}, {oh}, {ow}): {formula}.",
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", (n, c, oh, ow))],
        constants=_nchw_constants(
            shape,
            "const int out_h = (height + 2 - 3) / 2 + 1;\n"
            "const int out_w = (width + 2 - 3) / 2 + 1;\n"
            "const int out_count = batch * channels * out_h * out_w;",
        ),
        kernels=f"""
        // One thread per output; the padding is never read: rows and columns outside the plane are skipped.
        __global__ void {fn}{sig} {{
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < planes * out_h * out_w) {{
                int ox = i % out_w;
                int oy = (i / out_w) % out_h;
                const float* src = x + (i / (out_w * out_h)) * height * width;
                float m = -FLT_MAX;
                for (int r = max(2 * oy - 1, 0); r <= min(2 * oy + 1, height - 1); ++r)
                    for (int c = max(2 * ox - 1, 0); c <= min(2 * ox + 1, width - 1); ++c)
                        m = fmaxf(m, src[r * width + c]);
                y[i] = m;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note + " planes = batch * channels.",
        gen=_gen(
            _nchw_input(shape),
            "def reference(x):\n"
            "    h, w = x.shape[2:]\n"
            "    oh, ow = (h - 1) // 2 + 1, (w - 1) // 2 + 1\n"
            "    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)  # padding never wins\n"
            "    # output (i, j) reads padded rows 2i .. 2i+2 and columns 2j .. 2j+2\n"
            "    taps = [xp[:, :, a:a + 2 * oh - 1:2, b:b + 2 * ow - 1:2] for a in range(3) for b in range(3)]\n"
            "    return np.max(taps, axis=0)",
        ),
    )


def _channel_max_mean() -> OpSpec:
    n, c, h, w = shape = (8, 64, 56, 56)
    fn = "channel_max_mean_pool_kernel"
    sig = "(const float* __restrict__ x, float* __restrict__ y, int batch, int channels, int plane_size)"
    launch, note = _guarded(fn, "d_x, d_y, batch, channels, height * width", "batch * height * width")
    return _task(
        op="channel_max_mean_pool",
        name="Channel_Max_Mean_Pool",
        split="eval",
        description=f"Pool an NCHW float32 tensor of shape {shape} across channels into two maps per pixel, the "
        f"channel maximum and the channel mean (as in CBAM spatial attention).",
        level1=f"Write a CUDA kernel that pools a float32 NCHW tensor x of shape {shape} across the channel axis: for "
        f"every n, i, j, y[n][0][i][j] = max over c of x[n][c][i][j] and y[n][1][i][j] = mean over c of "
        f"x[n][c][i][j]; y has shape ({n}, 2, {h}, {w}). Use one thread per (n, i, j) pixel ({BLOCK} threads "
        f"per block, bounds check) that loops over the {c} channels with a stride of H*W floats (neighbouring "
        f"threads read neighbouring addresses, so the loads coalesce).",
        level2=f"For an NCHW float32 tensor of shape {shape} compute y[n][0][i][j] = max_c x[n][c][i][j] and "
        f"y[n][1][i][j] = mean_c x[n][c][i][j], output shape ({n}, 2, {h}, {w}).",
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", (n, 2, h, w))],
        constants=_nchw_constants(shape),
        kernels=f"""
        // One thread per pixel walks down the channels; consecutive threads hold consecutive pixels, so
        // every channel step is one coalesced load per warp.
        __global__ void {fn}{sig} {{
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < batch * plane_size) {{
                int b = i / plane_size;
                int s = i - b * plane_size;
                const float* src = x + b * channels * plane_size + s;
                float m = src[0];
                float sum = src[0];
                for (int ch = 1; ch < channels; ++ch) {{
                    float v = src[ch * plane_size];
                    m = fmaxf(m, v);
                    sum += v;
                }}
                y[(2 * b) * plane_size + s] = m;
                y[(2 * b + 1) * plane_size + s] = sum / channels;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note + " plane_size = height * width.",
        gen=_gen(
            _nchw_input(shape),
            "def reference(x):\n    return np.stack([x.max(axis=1), x.mean(axis=1)], axis=1)",
        ),
    )


def _maxpool3d() -> OpSpec:
    shape = (2, 16, 31, 48, 62)
    n, c, d, h, w = shape
    out = (n, c, d // 2, h // 2, w // 2)
    fn = "maxpool3d_2x2x2_kernel"
    sig = "(const float* __restrict__ x, float* __restrict__ y, int planes, int depth, int height, int width)"
    launch, note = _guarded(fn, "d_x, d_y, batch * channels, depth, height, width", "out_count")
    return _task(
        op="maxpool3d_2x2x2",
        name="MaxPool3D_2x2x2",
        split="eval",
        description=f"3-D max pooling with a 2x2x2 window and stride 2 over an NCDHW float32 tensor of shape "
        f"{shape}.",
        level1=f"Write a CUDA kernel for 3-D max pooling, window 2x2x2, stride 2, no padding, on a float32 NCDHW "
        f"tensor x of shape {shape} (row-major). The output y has shape {out} (D, H and W halved and rounded "
        f"down, so the odd last depth slice is dropped) and y[n][c][k][i][j] is the max of the 8 elements "
        f"x[n][c][2k + a][2i + b][2j + e], a, b, e in {{0, 1}}. Use one thread per output over the "
        f"flattened output index, {BLOCK} threads per block and a bounds check.",
        level2=f"3-D max pooling (2x2x2 window, stride 2, no padding, floor output size) of an NCDHW float32 tensor "
        f"of shape {shape} to {out}.",
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", out)],
        constants=(
            f"const int batch = {n};\nconst int channels = {c};\nconst int depth = {d};\n"
            f"const int height = {h};\nconst int width = {w};\n"
            "const int out_count = batch * channels * (depth / 2) * (height / 2) * (width / 2);"
        ),
        kernels=f"""
        // One thread per output, flattened over (plane, k, i, j); the 8 window elements are two 2x2
        // squares in consecutive depth slices.
        __global__ void {fn}{sig} {{
            int od = depth / 2;
            int oh = height / 2;
            int ow = width / 2;
            int o = blockIdx.x * blockDim.x + threadIdx.x;
            if (o < planes * od * oh * ow) {{
                int j = o % ow;
                int i = (o / ow) % oh;
                int k = (o / (ow * oh)) % od;
                int p = o / (ow * oh * od);
                int slice = height * width;
                const float* src = x + ((p * depth + 2 * k) * height + 2 * i) * width + 2 * j;
                float m = fmaxf(fmaxf(src[0], src[1]), fmaxf(src[width], src[width + 1]));
                src += slice;
                m = fmaxf(m, fmaxf(fmaxf(src[0], src[1]), fmaxf(src[width], src[width + 1])));
                y[o] = m;
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note + " planes = batch * channels.",
        gen=_gen(
            _nchw_input(shape),
            "def reference(x):\n"
            "    n, c, d, h, w = x.shape\n"
            "    od, oh, ow = d // 2, h // 2, w // 2  # floor: the odd last slice is dropped\n"
            "    win = x[:, :, :2 * od, :2 * oh, :2 * ow].reshape(n, c, od, 2, oh, 2, ow, 2)\n"
            "    return win.max(axis=(3, 5, 7))",
        ),
    )


# --------------------------------------------------------------------------------------------
# pretrain: a third pool, disjoint from train and eval
# --------------------------------------------------------------------------------------------


def _avgpool2d_2x2() -> OpSpec:
    n, c, h, w = shape = (16, 32, 64, 64)
    oh, ow = h // 2, w // 2
    fn = "avgpool2d_2x2_kernel"
    sig = f"(const float* __restrict__ x, float* __restrict__ y, {NCHW_ARGS})"
    launch, note = grid_stride_launch(
        fn, "d_x, d_y, batch * channels, height, width", "out_count", GRID_STRIDE_BLOCKS, BLOCK
    )
    return _task(
        op="avgpool2d_2x2_stride2",
        name="AvgPool2D_2x2_Stride2",
        split="pretrain",
        description=f"2-D average pooling with a 2x2 window and stride 2 over an NCHW float32 tensor of shape "
        f"{shape}.",
        level1=f"Write a CUDA kernel for 2-D average pooling, window 2x2, stride 2, no padding, on a float32 NCHW "
        f"tensor x of shape {shape}: y[n][c][i][j] = (x[n][c][2i][2j] + x[n][c][2i][2j+1] + "
        f"x[n][c][2i+1][2j] + x[n][c][2i+1][2j+1]) / 4, output shape ({n}, {c}, {oh}, {ow}). Use a "
        f"grid-stride loop over the flattened output index with a fixed grid of {GRID_STRIDE_BLOCKS} blocks "
        f"of {BLOCK} threads.",
        level2=f"2-D average pooling (2x2 window, stride 2) of an NCHW float32 tensor of shape {shape} to ({n}, {c}, "
        f"{oh}, {ow}).",
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", (n, c, oh, ow))],
        constants=_nchw_constants(
            shape, "const int out_count = batch * channels * (height / 2) * (width / 2);"
        ),
        kernels=f"""
        // Grid-stride loop over the flattened output (plane, i, j).
        __global__ void {fn}{sig} {{
            int oh = height / 2;
            int ow = width / 2;
            int total = planes * oh * ow;
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {{
                int ox = i % ow;
                int oy = (i / ow) % oh;
                const float* src = x + ((i / (ow * oh)) * height + 2 * oy) * width + 2 * ox;
                y[i] = 0.25f * ((src[0] + src[1]) + (src[width] + src[width + 1]));
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note + " planes = batch * channels.",
        gen=_gen(
            _nchw_input(shape),
            "def reference(x):\n"
            "    n, c, h, w = x.shape\n"
            "    return x.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))",
        ),
    )


def _avgpool1d_k4() -> OpSpec:
    rows, length = 256, 4096
    fn = "avgpool1d_k4s4_kernel"
    sig = "(const float* __restrict__ x, float* __restrict__ y, int out_count)"
    launch, note = _guarded(fn, "d_x, d_y, out_count", "out_count")
    return _task(
        op="avgpool1d_k4_stride4",
        name="AvgPool1D_Kernel4_Stride4",
        split="pretrain",
        description=f"1-D average pooling with window 4 and stride 4 along each row of a {rows}x{length} float32 "
        f"array.",
        level1=f"Write a CUDA kernel for 1-D average pooling, window 4, stride 4, along the last axis of a row-major "
        f"float32 array x of shape ({rows}, {length}): y[r][j] = (x[r][4j] + x[r][4j+1] + x[r][4j+2] + "
        f"x[r][4j+3]) / 4, output shape ({rows}, {length // 4}). Since the length is a multiple of 4, output "
        f"k of the flattened array averages the four consecutive inputs 4k .. 4k+3: load them with one "
        f"aligned float4 read. One thread per output, {BLOCK} threads per block, bounds check.",
        level2=f"1-D average pooling (window 4, stride 4) along each row of a ({rows}, {length}) float32 array, "
        f"giving ({rows}, {length // 4}).",
        inputs=[Buffer("x", "float32", (rows, length))],
        outputs=[Buffer("y", "float32", (rows, length // 4))],
        constants=f"const int rows = {rows};\nconst int length = {length};\nconst int out_count = rows * (length / 4);",
        kernels=f"""
        // length % 4 == 0, so the windows tile the flattened array and window k is the float4 at k
        // (cudaMalloc memory is 256-byte aligned): one 16-byte load per output.
        __global__ void {fn}{sig} {{
            int k = blockIdx.x * blockDim.x + threadIdx.x;
            if (k < out_count) {{
                float4 v = reinterpret_cast<const float4*>(x)[k];
                y[k] = 0.25f * ((v.x + v.y) + (v.z + v.w));
            }}
        }}
        """,
        signatures=[f"__global__ void {fn}{sig}"],
        launch=launch,
        launch_note=note,
        gen=_gen(
            f"x = rng.standard_normal({(rows, length)!r}).astype(np.float32)",
            "def reference(x):\n    r, n = x.shape\n    return x.reshape(r, n // 4, 4).mean(axis=2)",
        ),
    )


def specs() -> list[OpSpec]:
    return [
        # train: 6 ops, two of them at two shapes (the second shape has sizes no block divides)
        _maxpool2d_2x2("16x32x64x64"),
        _maxpool2d_2x2("8x24x75x93"),
        _avgpool2d_3x3_pad1(),
        _maxpool1d("256x4096"),
        _maxpool1d("300x4999"),
        _global_avgpool(),
        _maxpool2d_argmax(),
        _l2pool(),
        # eval
        _adaptive_avgpool(),
        _maxpool2d_3x3_s2(),
        _channel_max_mean(),
        _maxpool3d(),
        # pretrain
        _avgpool2d_2x2(),
        _avgpool1d_k4(),
    ]
