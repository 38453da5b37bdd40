"""Normalization: softmax variants, layer/RMS/L2/min-max row norms, batch/group/instance norm.

Most ops reduce each row of a (rows, cols) float32 matrix to a few statistics (max, sum,
mean, variance) and then rescale the row; the channel norms do the same over NCHW planes or
groups of planes. The kernels show the idiomatic ways to do a row reduction: one block per
row with a shared-memory tree, one block per row with a two-level warp-shuffle reduction, one
warp per row with butterfly shuffles, a fixed grid striding over rows, and a row cached in
dynamic shared memory. Softmax-type ops subtract the row max before exp, and variances are
taken as the mean of squared deviations (second pass), both for numerical stability.
Every column loop is strided, so any column count works.
"""

from __future__ import annotations

from taskgen.core import Buffer, OpSpec, matrix_io

CATEGORY = "normalization"

# --------------------------------------------------------------------------------------
# Device helpers shared by several kernels (each task carries its own copy in `kernels`).
# --------------------------------------------------------------------------------------

SMEM_TREE_MAX = """
// Tree maximum in shared memory; buf holds blockDim.x floats, blockDim.x is a power of two, and
// every thread of the block must call it (it syncs).
__device__ float block_max(float v, float* buf) {
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] = fmaxf(buf[threadIdx.x], buf[threadIdx.x + s]);
        __syncthreads();
    }
    float r = buf[0];
    __syncthreads();  // buf is reused by the next reduction
    return r;
}
"""

SMEM_TREE_SUM = """
// Tree sum in shared memory; buf holds blockDim.x floats, blockDim.x is a power of two, and
// every thread of the block must call it (it syncs).
__device__ float block_sum(float v, float* buf) {
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    float r = buf[0];
    __syncthreads();  // buf is reused by the next reduction
    return r;
}
"""

# Two-level sum: shuffle-down inside each warp, then warp 0 adds the per-warp sums.
WARP_SHUFFLE_BLOCK_SUM = """
// Sum over a full warp; afterwards lane 0 holds the warp's total.
__device__ float warp_sum_down(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffff, v, offset);
    return v;
}

// Sum over the whole block, returned to every thread. blockDim.x is a multiple of 32 (so all
// warps are full) and every thread of the block must call it (it syncs).
__device__ float block_sum(float v) {
    __shared__ float warp_sums[32];
    __shared__ float total;
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    v = warp_sum_down(v);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < blockDim.x / 32 ? warp_sums[lane] : 0.0f;
        v = warp_sum_down(v);
        if (lane == 0) total = v;
    }
    __syncthreads();
    float r = total;
    __syncthreads();  // the next call rewrites warp_sums and total
    return r;
}
"""

# Butterfly (xor) reductions leave the result in every lane, which suits one warp per row.
WARP_XOR_MAX_SUM = """
__device__ float warp_all_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
    return v;
}

__device__ float warp_all_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}
"""


def _gen(inputs: str, reference: str, call: str) -> str:
    """gen.py body: draw the inputs, define `reference` (float64 math), store as float32."""
    return f"{inputs}\n\n\n{reference.strip()}\n\n\n{call}"


# --------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------


def row_softmax(rows: int, cols: int, variant: str) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = "constexpr int SOFTMAX_THREADS = 256;  // block size; sizes the shared buffer\n"
    kernels += (
        SMEM_TREE_MAX
        + SMEM_TREE_SUM
        + """
// One block per row, three strided passes: the row max, the sum of exp(x - max), the write.
// Subtracting the max keeps every exp() argument <= 0, so nothing overflows.
__global__ void row_softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float buf[SOFTMAX_THREADS];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    float m = -FLT_MAX;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m, buf);
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - m);
    float inv_sum = 1.0f / block_sum(s, buf);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = expf(xr[j] - m) * inv_sum;
}
"""
    )
    return OpSpec(
        op="row_softmax",
        name="Row_Softmax",
        category=CATEGORY,
        split="train",
        variant=variant,
        description=f"Softmax of each row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that computes the softmax of each row of a float32 matrix x with
            {rows} rows and {cols} columns (row-major): y[r][j] = exp(x[r][j] - m_r) / sum_k exp(x[r][k] - m_r),
            where m_r is the maximum of row r (subtracting it keeps exp from overflowing). Launch one block
            of 256 threads per row. Each thread walks the row with stride blockDim.x; reduce the per-thread
            maximum and then the per-thread sum of exponentials with a tree reduction in a 256-float shared
            array (__syncthreads between steps), then write the normalized values. The column count is not
            a multiple of the block size, so bound every loop by cols.
        """,
        level2=f"""
            Compute the row-wise softmax of a {rows}x{cols} float32 matrix: y[r][j] = exp(x[r][j] - max_r) /
            sum_k exp(x[r][k] - max_r).
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void row_softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int cols)"
        ],
        launch="{k}row_softmax_kernel<<<rows, 256>>>(d_x, d_y, cols);",
        launch_note="row_softmax_kernel is launched once with one block per row (grid = rows) and 256 threads "
        "per block, no dynamic shared memory; block b handles row b.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\nx = (rng.standard_normal((rows, cols)) * 2.0).astype(np.float32)",
            """
def reference(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # Outputs are probabilities (<= 1); float32 exp and a 1k-term sum give ~1e-6 relative error.
        atol=1e-6,
        rtol=1e-4,
    )


def row_log_softmax(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = (
        WARP_XOR_MAX_SUM
        + """
// One warp per row (blockDim.x is a multiple of 32). Lanes stride over the row by 32.
__global__ void row_log_softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together, so the full-mask shuffles stay valid
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    float m = -FLT_MAX;
    for (int j = lane; j < cols; j += 32) m = fmaxf(m, xr[j]);
    m = warp_all_max(m);
    float s = 0.0f;
    for (int j = lane; j < cols; j += 32) s += expf(xr[j] - m);
    float log_sum = logf(warp_all_sum(s));
    // (x - m) - log(sum) rather than x - (m + log(sum)): the shift is exact before the subtraction.
    for (int j = lane; j < cols; j += 32) yr[j] = (xr[j] - m) - log_sum;
}
"""
    )
    return OpSpec(
        op="row_log_softmax",
        name="Row_Log_Softmax",
        category=CATEGORY,
        split="train",
        description=f"Log-softmax of each row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that computes the log-softmax of each row of a float32 matrix x with {rows}
            rows and {cols} columns: y[r][j] = (x[r][j] - m_r) - log(sum_k exp(x[r][k] - m_r)), m_r the row
            maximum. Use one warp (32 threads) per row, 8 rows per block of 256 threads: each lane strides
            over the row by 32, then reduce the maximum and the sum of exponentials across the warp with
            __shfl_xor_sync butterflies (full mask; warps past the last row exit as a whole before any
            shuffle). The row count is not a multiple of 8.
        """,
        level2=f"""
            Compute the row-wise log-softmax of a {rows}x{cols} float32 matrix: y[r][j] = x[r][j] - max_r -
            log(sum_k exp(x[r][k] - max_r)).
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void row_log_softmax_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int rows, int cols)"
        ],
        launch="{k}row_log_softmax_kernel<<<(rows + 7) / 8, 256>>>(d_x, d_y, rows, cols);",
        launch_note="row_log_softmax_kernel is launched once with (rows + 7) / 8 blocks of 256 threads: one warp "
        "per row, warp w of block b handles row 8 * b + w; warps of the last block past the last row "
        "must do nothing.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\nx = (rng.standard_normal((rows, cols)) * 2.0).astype(np.float32)",
            """
def reference(x):
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # Outputs lie in about [-20, 0]; float32 ulp there is ~2e-6, plus the error of log(sum).
        atol=1e-4,
        rtol=1e-5,
    )


def layer_norm(rows: int, cols: int, variant: str) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    inputs += [Buffer("gamma", "float32", (cols,)), Buffer("beta", "float32", (cols,))]
    kernels = (
        WARP_SHUFFLE_BLOCK_SUM
        + """
// One block per row: mean, then variance as the mean of squared deviations (a second pass over
// the row avoids the cancellation of E[x^2] - mean^2), then the affine normalized write.
__global__ void layer_norm_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                  const float* __restrict__ beta, float* __restrict__ y, int cols, float eps) {
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += xr[j];
    float mean = block_sum(s) / cols;
    float q = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float d = xr[j] - mean;
        q += d * d;
    }
    float rstd = rsqrtf(block_sum(q) / cols + eps);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = (xr[j] - mean) * rstd * gamma[j] + beta[j];
}
"""
    )
    return OpSpec(
        op="layer_norm",
        name="Layer_Normalization",
        category=CATEGORY,
        split="train",
        variant=variant,
        description=f"Layer normalization with per-column gamma and beta over each row of a {rows}x{cols} "
        "float32 matrix.",
        level1=f"""
            Write a CUDA kernel for layer normalization of a float32 matrix x with {rows} rows and {cols}
            columns: for each row, mean = sum_j x[j] / {cols}, var = sum_j (x[j] - mean)^2 / {cols} (biased),
            y[j] = (x[j] - mean) / sqrt(var + eps) * gamma[j] + beta[j] with eps = 1e-5 and gamma, beta of
            length {cols}. Launch one block of 256 threads per row. Reduce each sum in two levels: a
            __shfl_down_sync loop inside each warp, lane 0 stores the warp's sum in shared memory, and warp 0
            adds the 8 warp sums; broadcast the result through shared memory. Compute the variance in a
            second pass over the row (sum of squared deviations from the mean).
        """,
        level2=f"""
            Apply layer normalization to each row of a {rows}x{cols} float32 matrix: y = (x - mean) /
            sqrt(var + 1e-5) * gamma + beta, with the row's mean and biased variance and per-column gamma
            and beta.
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants + "\nconst float eps = 1e-5f;",
        kernels=kernels,
        signatures=[
            "__global__ void layer_norm_kernel(const float* __restrict__ x, const float* __restrict__ gamma, "
            "const float* __restrict__ beta, float* __restrict__ y, int cols, float eps)"
        ],
        launch="{k}layer_norm_kernel<<<rows, 256>>>(d_x, d_gamma, d_beta, d_y, cols, eps);",
        launch_note="layer_norm_kernel is launched once with one block per row (grid = rows) and 256 threads per "
        "block, no dynamic shared memory; eps = 1e-5.",
        gen=_gen(
            f"""rows, cols = {rows}, {cols}
x = (rng.standard_normal((rows, cols)) * 1.5 + 0.3).astype(np.float32)
gamma = rng.uniform(0.5, 1.5, cols).astype(np.float32)
beta = rng.uniform(-0.5, 0.5, cols).astype(np.float32)""",
            """
def reference(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta
""",
            "y_ref = reference(*(a.astype(np.float64) for a in (x, gamma, beta))).astype(np.float32)",
        ),
        # Outputs up to ~8 in magnitude; float32 row statistics over 1-2k terms are good to ~1e-6.
        atol=1e-4,
        rtol=1e-4,
    )


def rms_norm(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    inputs.append(Buffer("weight", "float32", (cols,)))
    kernels = """
constexpr int RMS_THREADS = 512;  // block size; sizes the shared buffer

// A fixed grid strides over the rows. The row loop depends only on blockIdx, so every thread of
// a block runs the same iterations and reaches the same __syncthreads.
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                float* __restrict__ y, int rows, int cols, float eps) {
    __shared__ float partial[RMS_THREADS];
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + (size_t)row * cols;
        float* yr = y + (size_t)row * cols;
        float q = 0.0f;
        for (int j = threadIdx.x; j < cols; j += blockDim.x) q += xr[j] * xr[j];
        partial[threadIdx.x] = q;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
            __syncthreads();
        }
        float inv_rms = rsqrtf(partial[0] / cols + eps);
        __syncthreads();  // everyone has read partial[0] before the next row overwrites it
        for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = xr[j] * inv_rms * weight[j];
    }
}
"""
    return OpSpec(
        op="rms_norm",
        name="RMS_Normalization",
        category=CATEGORY,
        split="train",
        description=f"RMS normalization with a per-column weight over each row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel for RMS normalization of a float32 matrix x with {rows} rows and {cols}
            columns: for each row, y[j] = x[j] / sqrt(mean_k x[k]^2 + eps) * weight[j], eps = 1e-6, weight of
            length {cols}. Launch a fixed grid of 1024 blocks of 512 threads; block b handles rows b, b + 1024,
            ... (a block-stride loop over rows). For each row, accumulate per-thread sums of squares with a
            stride of blockDim.x, reduce them with a tree in a 512-float shared array, and __syncthreads
            before the shared array is reused for the next row.
        """,
        level2=f"""
            Apply RMS normalization to each row of a {rows}x{cols} float32 matrix: y = x / sqrt(mean(x^2) +
            1e-6) * weight, with a per-column weight.
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants + "\nconst float eps = 1e-6f;",
        kernels=kernels,
        signatures=[
            "__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight, "
            "float* __restrict__ y, int rows, int cols, float eps)"
        ],
        launch="{k}rms_norm_kernel<<<1024, 512>>>(d_x, d_weight, d_y, rows, cols, eps);",
        launch_note=f"rms_norm_kernel is launched once with a fixed grid of 1024 blocks of 512 threads, fewer blocks "
        f"than the {rows} rows, so each block must loop over rows blockIdx.x, blockIdx.x + gridDim.x, "
        "...; eps = 1e-6.",
        gen=_gen(
            f"""rows, cols = {rows}, {cols}
x = rng.standard_normal((rows, cols)).astype(np.float32)
weight = rng.uniform(0.5, 1.5, cols).astype(np.float32)""",
            """
def reference(x, weight, eps=1e-6):
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * weight
""",
            "y_ref = reference(x.astype(np.float64), weight.astype(np.float64)).astype(np.float32)",
        ),
        # Outputs up to ~8; the 2048-term sum of squares is accurate to ~1e-6 relative in float32.
        atol=1e-5,
        rtol=1e-4,
    )


def l2_row_normalize(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = """
// One warp per row, 4 rows per block of 128 threads.
__global__ void l2_row_normalize_kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together, so the full-mask shuffles stay valid
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    float q = 0.0f;
    for (int j = lane; j < cols; j += 32) q += xr[j] * xr[j];
    for (int offset = 16; offset > 0; offset >>= 1) q += __shfl_down_sync(0xffffffff, q, offset);
    float norm = sqrtf(__shfl_sync(0xffffffff, q, 0));  // lane 0 holds the total: broadcast it
    float inv = 1.0f / fmaxf(norm, 1e-12f);
    for (int j = lane; j < cols; j += 32) yr[j] = xr[j] * inv;
}
"""
    return OpSpec(
        op="l2_row_normalize",
        name="L2_Row_Normalization",
        category=CATEGORY,
        split="train",
        description=f"Scale each row of a {rows}x{cols} float32 matrix to unit Euclidean norm.",
        level1=f"""
            Write a CUDA kernel that divides each row of a float32 matrix x ({rows} rows, {cols} columns) by its
            Euclidean norm: y[r][j] = x[r][j] / max(sqrt(sum_k x[r][k]^2), 1e-12). Use one warp per row, 4
            warps per block of 128 threads: lanes stride over the row by 32, reduce the sum of squares with a
            __shfl_down_sync loop and broadcast lane 0's total with __shfl_sync. The row count is not a
            multiple of 4: warps past the last row exit before any shuffle.
        """,
        level2=f"""
            L2-normalize each row of a {rows}x{cols} float32 matrix: y = x / max(||x||_2, 1e-12) per row.
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void l2_row_normalize_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int rows, int cols)"
        ],
        launch="{k}l2_row_normalize_kernel<<<(rows + 3) / 4, 128>>>(d_x, d_y, rows, cols);",
        launch_note="l2_row_normalize_kernel is launched once with (rows + 3) / 4 blocks of 128 threads: one warp per "
        "row, warp w of block b handles row 4 * b + w; warps past the last row must do nothing.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\nx = (rng.standard_normal((rows, cols)) * 3.0).astype(np.float32)",
            """
def reference(x):
    return x / np.maximum(np.sqrt((x * x).sum(axis=1, keepdims=True)), 1e-12)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # Outputs are ~0.03 in magnitude: a small atol, and the 1k-term norm is good to ~1e-6 relative.
        atol=1e-6,
        rtol=1e-4,
    )


def batch_norm_inference(batch: int, channels: int, height: int, width: int) -> OpSpec:
    shape = (batch, channels, height, width)
    params = ["running_mean", "running_var", "gamma", "beta"]
    kernels = """
// Elementwise, 2-D grid: blockIdx.y is the (n, c) plane, blockIdx.x * blockDim.x + threadIdx.x
// the pixel inside it. The channel, and so its four parameters, is the same for the whole block.
__global__ void batch_norm_inference_kernel(const float* __restrict__ x, const float* __restrict__ running_mean,
                                            const float* __restrict__ running_var, const float* __restrict__ gamma,
                                            const float* __restrict__ beta, float* __restrict__ y,
                                            int channels, int hw, float eps) {
    int plane = blockIdx.y;  // n * channels + c
    int c = plane % channels;
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= hw) return;
    float scale = gamma[c] * rsqrtf(running_var[c] + eps);
    size_t i = (size_t)plane * hw + p;
    y[i] = (x[i] - running_mean[c]) * scale + beta[c];
}
"""
    return OpSpec(
        op="batch_norm_inference",
        name="Batch_Norm_Inference",
        category=CATEGORY,
        split="train",
        description=f"Inference-mode batch normalization of a float32 NCHW tensor {shape} with per-channel "
        "running statistics, gamma and beta.",
        level1=f"""
            Write a CUDA kernel for inference-mode batch normalization of a float32 tensor x in NCHW layout
            with N = {batch}, C = {channels}, H = {height}, W = {width}: y[n][c][h][w] = (x[n][c][h][w] -
            running_mean[c]) / sqrt(running_var[c] + eps) * gamma[c] + beta[c], eps = 1e-5, with four
            per-channel arrays of length {channels}. Use a 2-D grid: blockIdx.y selects the (n, c) plane
            (N*C planes), blockIdx.x with 256 threads per block covers the H*W = {height * width} pixels of the
            plane (not a multiple of 256, so guard the pixel index); the channel is blockIdx.y % C.
        """,
        level2=f"""
            Apply inference-mode batch normalization to a float32 NCHW tensor of shape {shape}: y = (x -
            running_mean[c]) / sqrt(running_var[c] + 1e-5) * gamma[c] + beta[c] for channel c.
        """,
        inputs=[Buffer("x", "float32", shape)] + [Buffer(p, "float32", (channels,)) for p in params],
        outputs=[Buffer("y", "float32", shape)],
        constants=f"const int batch = {batch};\nconst int channels = {channels};\n"
        f"const int hw = {height * width};\nconst float eps = 1e-5f;",
        kernels=kernels,
        signatures=[
            "__global__ void batch_norm_inference_kernel(const float* __restrict__ x, "
            "const float* __restrict__ running_mean, const float* __restrict__ running_var, "
            "const float* __restrict__ gamma, const float* __restrict__ beta, float* __restrict__ y, "
            "int channels, int hw, float eps)"
        ],
        launch="dim3 grid((hw + 255) / 256, batch * channels);\n"
        "{k}batch_norm_inference_kernel<<<grid, 256>>>(d_x, d_running_mean, d_running_var, d_gamma, d_beta, "
        "d_y, channels, hw, eps);",
        launch_note="batch_norm_inference_kernel is launched once with a 2-D grid of ((hw + 255) / 256, "
        "batch * channels) blocks of 256 threads: blockIdx.y is the (n, c) plane n * channels + c, "
        "blockIdx.x * 256 + threadIdx.x the pixel in it (hw = H * W); eps = 1e-5.",
        gen=_gen(
            f"""x = (rng.standard_normal({shape!r}) * 2.0 + 0.5).astype(np.float32)
running_mean = rng.uniform(-0.5, 1.0, {channels}).astype(np.float32)
running_var = rng.uniform(0.5, 4.0, {channels}).astype(np.float32)
gamma = rng.uniform(0.5, 1.5, {channels}).astype(np.float32)
beta = rng.uniform(-0.5, 0.5, {channels}).astype(np.float32)""",
            """
def reference(x, mean, var, gamma, beta, eps=1e-5):
    per_channel = lambda a: a.reshape(1, -1, 1, 1)
    return (x - per_channel(mean)) / np.sqrt(per_channel(var) + eps) * per_channel(gamma) + per_channel(beta)
""",
            "y_ref = reference(*(a.astype(np.float64) for a in (x, running_mean, running_var, gamma, beta)))"
            ".astype(np.float32)",
        ),
        atol=1e-5,
        rtol=1e-5,  # elementwise: a few float32 roundings
    )


# --------------------------------------------------------------------------------------
# eval (held-out ops)
# --------------------------------------------------------------------------------------


def softmax_temperature(rows: int, cols: int, temperature: float) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = (
        WARP_XOR_MAX_SUM
        + """
// Block-wide max and sum: lane 0 of each warp posts its warp's result in `slots`, then every
// thread folds the posted values itself (at most 32). Every thread must call them (they sync).
__device__ float block_all_max(float v, float* slots) {
    v = warp_all_max(v);
    if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = v;
    __syncthreads();
    float r = slots[0];
    for (int w = 1; w < blockDim.x / 32; ++w) r = fmaxf(r, slots[w]);
    __syncthreads();  // slots is reused by the next call
    return r;
}

__device__ float block_all_sum(float v, float* slots) {
    v = warp_all_sum(v);
    if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = v;
    __syncthreads();
    float r = slots[0];
    for (int w = 1; w < blockDim.x / 32; ++w) r += slots[w];
    __syncthreads();  // slots is reused by the next call
    return r;
}

// One block per row; the scaled row is cached in dynamic shared memory (cols floats), so global
// memory is read once and written once. Each thread touches the same columns j in every pass,
// so the cached row needs no extra barrier between passes.
__global__ void softmax_temperature_kernel(const float* __restrict__ x, float* __restrict__ y, int cols,
                                           float temperature) {
    extern __shared__ float row[];
    __shared__ float slots[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    float m = -FLT_MAX;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = xr[j] / temperature;
        row[j] = v;
        m = fmaxf(m, v);
    }
    m = block_all_max(m, slots);
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float e = expf(row[j] - m);
        row[j] = e;
        s += e;
    }
    float inv_sum = 1.0f / block_all_sum(s, slots);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = row[j] * inv_sum;
}
"""
    )
    return OpSpec(
        op="softmax_temperature",
        name="Softmax_With_Temperature",
        category=CATEGORY,
        split="eval",
        description=f"Softmax of each row of a {rows}x{cols} float32 matrix divided by a temperature of "
        f"{temperature}.",
        level1=f"""
            Write a CUDA kernel that computes a temperature softmax over each row of a float32 matrix x with
            {rows} rows and {cols} columns: z = x / T with T = {temperature}, y[r][j] = exp(z[r][j] - max_r z) /
            sum_k exp(z[r][k] - max_r z). Launch one block of 512 threads per row with {cols} floats of dynamic
            shared memory: cache the scaled row there, reduce the max and the sum of exponentials with
            __shfl_xor_sync inside each warp and a small shared array across the 16 warps, and write the
            normalized row.
        """,
        level2=f"""
            Compute softmax(x / {temperature}) over each row of a {rows}x{cols} float32 matrix, subtracting the
            row maximum for stability.
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants + f"\nconst float temperature = {temperature}f;",
        kernels=kernels,
        signatures=[
            "__global__ void softmax_temperature_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int cols, float temperature)"
        ],
        launch="{k}softmax_temperature_kernel<<<rows, 512, cols * sizeof(float)>>>(d_x, d_y, cols, temperature);",
        launch_note=f"softmax_temperature_kernel is launched once with one block per row (grid = rows), 512 threads "
        f"per block and cols * sizeof(float) bytes of dynamic shared memory; temperature = {temperature}.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\nx = (rng.standard_normal((rows, cols)) * 2.0).astype(np.float32)",
            f"""
def reference(x, temperature={temperature}):
    z = x / temperature
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        atol=1e-6,
        rtol=1e-4,  # as for row_softmax
    )


def group_norm(batch: int, channels: int, groups: int, height: int, width: int) -> OpSpec:
    shape = (batch, channels, height, width)
    group_size = channels // groups * height * width
    kernels = (
        WARP_SHUFFLE_BLOCK_SUM
        + """
// One block per (sample, group). In NCHW the channels of a group are adjacent, so the group is
// one contiguous run of channels_per_group * hw values starting at blockIdx.x * group_size.
__global__ void group_norm_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                  const float* __restrict__ beta, float* __restrict__ y,
                                  int channels, int groups, int hw, float eps) {
    int channels_per_group = channels / groups;
    int group_size = channels_per_group * hw;
    int first_channel = (blockIdx.x % groups) * channels_per_group;
    const float* xg = x + (size_t)blockIdx.x * group_size;
    float* yg = y + (size_t)blockIdx.x * group_size;
    float s = 0.0f;
    for (int k = threadIdx.x; k < group_size; k += blockDim.x) s += xg[k];
    float mean = block_sum(s) / group_size;
    float q = 0.0f;
    for (int k = threadIdx.x; k < group_size; k += blockDim.x) {
        float d = xg[k] - mean;
        q += d * d;
    }
    float rstd = rsqrtf(block_sum(q) / group_size + eps);
    for (int k = threadIdx.x; k < group_size; k += blockDim.x) {
        int c = first_channel + k / hw;
        yg[k] = (xg[k] - mean) * rstd * gamma[c] + beta[c];
    }
}
"""
    )
    return OpSpec(
        op="group_norm",
        name="Group_Normalization",
        category=CATEGORY,
        split="eval",
        description=f"Group normalization ({groups} groups) of a float32 NCHW tensor {shape} with per-channel "
        "gamma and beta.",
        level1=f"""
            Write a CUDA kernel for group normalization of a float32 NCHW tensor x with N = {batch}, C =
            {channels}, H = {height}, W = {width} and G = {groups} groups of {channels // groups} channels: for each
            sample n and group g, take the mean and biased variance over the group's {group_size} values (its
            channels times H*W), then y = (x - mean) / sqrt(var + eps) * gamma[c] + beta[c], eps = 1e-5, gamma
            and beta of length C. Launch one block of 512 threads per (n, g); the group is a contiguous run
            of memory. Reduce with __shfl_down_sync inside warps and a shared array across warps, computing
            the variance in a second pass (squared deviations from the mean).
        """,
        level2=f"""
            Apply group normalization with {groups} groups to a float32 NCHW tensor of shape {shape}:
            normalize each (sample, group) to zero mean and unit variance (eps = 1e-5), then scale and shift
            by per-channel gamma and beta.
        """,
        inputs=[
            Buffer("x", "float32", shape),
            Buffer("gamma", "float32", (channels,)),
            Buffer("beta", "float32", (channels,)),
        ],
        outputs=[Buffer("y", "float32", shape)],
        constants=f"const int batch = {batch};\nconst int channels = {channels};\nconst int groups = {groups};\n"
        f"const int hw = {height * width};\nconst float eps = 1e-5f;",
        kernels=kernels,
        signatures=[
            "__global__ void group_norm_kernel(const float* __restrict__ x, const float* __restrict__ gamma, "
            "const float* __restrict__ beta, float* __restrict__ y, int channels, int groups, int hw, "
            "float eps)"
        ],
        launch="{k}group_norm_kernel<<<batch * groups, 512>>>(d_x, d_gamma, d_beta, d_y, channels, groups, hw, eps);",
        launch_note="group_norm_kernel is launched once with batch * groups blocks of 512 threads: block "
        "n * groups + g normalizes group g of sample n; hw = H * W, eps = 1e-5.",
        gen=_gen(
            f"""x = (rng.standard_normal({shape!r}) * 1.5 + 0.4).astype(np.float32)
gamma = rng.uniform(0.5, 1.5, {channels}).astype(np.float32)
beta = rng.uniform(-0.5, 0.5, {channels}).astype(np.float32)""",
            f"""
def reference(x, gamma, beta, groups={groups}, eps=1e-5):
    n, c, h, w = x.shape
    g = x.reshape(n, groups, -1)
    mean = g.mean(axis=2, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=2, keepdims=True)
    normed = ((g - mean) / np.sqrt(var + eps)).reshape(n, c, h, w)
    return normed * gamma.reshape(1, c, 1, 1) + beta.reshape(1, c, 1, 1)
""",
            "y_ref = reference(*(a.astype(np.float64) for a in (x, gamma, beta))).astype(np.float32)",
        ),
        # Statistics over 8k values in float32 are good to ~1e-6 relative; outputs up to ~8.
        atol=1e-4,
        rtol=1e-4,
    )


def min_max_row_normalize(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = """
constexpr int MINMAX_THREADS = 256;  // block size; sizes the shared buffers

// One block per row: the row minimum and maximum come from one tree reduction over two shared
// arrays at once, then the row is mapped onto [0, 1].
__global__ void min_max_row_normalize_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float lo[MINMAX_THREADS];
    __shared__ float hi[MINMAX_THREADS];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        mn = fminf(mn, xr[j]);
        mx = fmaxf(mx, xr[j]);
    }
    lo[threadIdx.x] = mn;
    hi[threadIdx.x] = mx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            lo[threadIdx.x] = fminf(lo[threadIdx.x], lo[threadIdx.x + s]);
            hi[threadIdx.x] = fmaxf(hi[threadIdx.x], hi[threadIdx.x + s]);
        }
        __syncthreads();
    }
    mn = lo[0];
    float inv_range = 1.0f / (hi[0] - mn);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = (xr[j] - mn) * inv_range;
}
"""
    return OpSpec(
        op="min_max_row_normalize",
        name="Min_Max_Row_Normalization",
        category=CATEGORY,
        split="eval",
        description=f"Rescale each row of a {rows}x{cols} float32 matrix linearly onto [0, 1] using its minimum "
        "and maximum.",
        level1=f"""
            Write a CUDA kernel that min-max normalizes each row of a float32 matrix x with {rows} rows and
            {cols} columns: y[r][j] = (x[r][j] - min_r) / (max_r - min_r). Launch one block of 256 threads per
            row; each thread scans its strided columns for a local min and max, then reduce both at once with
            a tree over two 256-float shared arrays (__syncthreads between steps), and write the rescaled
            row.
        """,
        level2=f"""
            Min-max normalize each row of a {rows}x{cols} float32 matrix: y = (x - min(row)) / (max(row) -
            min(row)).
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void min_max_row_normalize_kernel(const float* __restrict__ x, "
            "float* __restrict__ y, int cols)"
        ],
        launch="{k}min_max_row_normalize_kernel<<<rows, 256>>>(d_x, d_y, cols);",
        launch_note="min_max_row_normalize_kernel is launched once with one block per row (grid = rows) and 256 "
        "threads per block, no dynamic shared memory.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\nx = (rng.standard_normal((rows, cols)) * 3.0 + 1.0).astype(np.float32)",
            """
def reference(x):
    lo = x.min(axis=1, keepdims=True)
    return (x - lo) / (x.max(axis=1, keepdims=True) - lo)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        atol=1e-5,
        rtol=1e-5,  # outputs in [0, 1], a few roundings each
    )


# --------------------------------------------------------------------------------------
# pretrain
# --------------------------------------------------------------------------------------


def instance_norm(batch: int, channels: int, height: int, width: int) -> OpSpec:
    shape = (batch, channels, height, width)
    kernels = (
        "constexpr int INSTANCE_THREADS = 256;  // block size; sizes the shared buffer\n"
        + SMEM_TREE_SUM
        + """
// One block per (n, c) plane of hw contiguous values: mean, variance (second pass), normalize.
__global__ void instance_norm_kernel(const float* __restrict__ x, float* __restrict__ y, int hw, float eps) {
    __shared__ float buf[INSTANCE_THREADS];
    const float* xp = x + (size_t)blockIdx.x * hw;
    float* yp = y + (size_t)blockIdx.x * hw;
    float s = 0.0f;
    for (int k = threadIdx.x; k < hw; k += blockDim.x) s += xp[k];
    float mean = block_sum(s, buf) / hw;
    float q = 0.0f;
    for (int k = threadIdx.x; k < hw; k += blockDim.x) {
        float d = xp[k] - mean;
        q += d * d;
    }
    float rstd = rsqrtf(block_sum(q, buf) / hw + eps);
    for (int k = threadIdx.x; k < hw; k += blockDim.x) yp[k] = (xp[k] - mean) * rstd;
}
"""
    )
    return OpSpec(
        op="instance_norm",
        name="Instance_Normalization",
        category=CATEGORY,
        split="pretrain",
        description=f"Instance normalization (no affine) of each (sample, channel) plane of a float32 NCHW tensor "
        f"{shape}.",
        level1=f"""
            Write a CUDA kernel for instance normalization of a float32 NCHW tensor x with N = {batch}, C =
            {channels}, H = {height}, W = {width}: every (n, c) plane of H*W = {height * width} values is
            normalized to y = (x - mean) / sqrt(var + eps) with its own mean and biased variance, eps = 1e-5.
            Launch one block of 256 threads per plane; reduce with a tree in a 256-float shared array and
            compute the variance in a second pass.
        """,
        level2=f"""
            Apply instance normalization (no affine parameters, eps = 1e-5) to a float32 NCHW tensor of shape
            {shape}: normalize each (n, c) plane to zero mean and unit variance.
        """,
        inputs=[Buffer("x", "float32", shape)],
        outputs=[Buffer("y", "float32", shape)],
        constants=f"const int planes = {batch * channels};\nconst int hw = {height * width};\nconst float eps = 1e-5f;",
        kernels=kernels,
        signatures=[
            "__global__ void instance_norm_kernel(const float* __restrict__ x, float* __restrict__ y, int hw, "
            "float eps)"
        ],
        launch="{k}instance_norm_kernel<<<planes, 256>>>(d_x, d_y, hw, eps);",
        launch_note="instance_norm_kernel is launched once with one block per (n, c) plane (grid = N * C) and 256 "
        "threads per block; hw = H * W, eps = 1e-5.",
        gen=_gen(
            f"x = (rng.standard_normal({shape!r}) * 2.0 - 0.5).astype(np.float32)",
            """
def reference(x, eps=1e-5):
    mean = x.mean(axis=(2, 3), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=(2, 3), keepdims=True)
    return (x - mean) / np.sqrt(var + eps)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        atol=1e-4,
        rtol=1e-4,  # as for layer_norm
    )


def row_mean_center(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = """
// One warp per row, 8 rows per block of 256 threads.
__global__ void row_mean_center_kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together, so the full-mask shuffles stay valid
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    float s = 0.0f;
    for (int j = lane; j < cols; j += 32) s += xr[j];
    for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffff, s, offset);
    float mean = s / cols;  // every lane holds the full sum after the butterfly
    for (int j = lane; j < cols; j += 32) yr[j] = xr[j] - mean;
}
"""
    return OpSpec(
        op="row_mean_center",
        name="Row_Mean_Centering",
        category=CATEGORY,
        split="pretrain",
        description=f"Subtract each row's mean from the row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that centers each row of a float32 matrix x ({rows} rows, {cols} columns):
            y[r][j] = x[r][j] - mean_r. Use one warp per row, 8 warps per block of 256 threads; lanes stride
            over the row by 32 and a __shfl_xor_sync butterfly gives every lane the row sum.
        """,
        level2=f"""
            Subtract the row mean from every element of a {rows}x{cols} float32 matrix.
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void row_mean_center_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int rows, int cols)"
        ],
        launch="{k}row_mean_center_kernel<<<(rows + 7) / 8, 256>>>(d_x, d_y, rows, cols);",
        launch_note="row_mean_center_kernel is launched once with (rows + 7) / 8 blocks of 256 threads: one warp per "
        "row, warp w of block b handles row 8 * b + w.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\nx = (rng.standard_normal((rows, cols)) + 2.0).astype(np.float32)",
            """
def reference(x):
    return x - x.mean(axis=1, keepdims=True)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # The mean of ~2 over 1k terms carries ~1e-6 absolute error into every output.
        atol=1e-5,
        rtol=1e-5,
    )


def specs() -> list[OpSpec]:
    return [
        # train: two ops at two sizes, the second with a column count no block size divides
        row_softmax(4096, 1024, "4096x1024"),
        row_softmax(2000, 1531, "2000x1531"),
        row_log_softmax(2050, 1000),
        layer_norm(4096, 1024, "4096x1024"),
        layer_norm(2000, 1531, "2000x1531"),
        rms_norm(4096, 2048),
        l2_row_normalize(4095, 1024),
        batch_norm_inference(32, 64, 28, 28),
        # eval
        softmax_temperature(1024, 4096, 0.7),
        group_norm(16, 64, 8, 32, 32),
        min_max_row_normalize(2048, 2000),
        # pretrain
        instance_norm(8, 128, 32, 32),
        row_mean_center(2050, 1024),
    ]
