"""Scans: prefix sums per row and over whole vectors, cumulative max/min/product, segmented scan,
running mean and stream compaction.

Row scans give each row to one block (or one warp) and walk the row in chunks, carrying the
running total of earlier chunks. Vector scans over millions of elements need several kernels:
scan each tile and keep its total in a scratch buffer, scan the tile totals in one block, then
add each tile's offset (scan-then-propagate), or reduce the tiles first and scan them with
their offsets (reduce-then-scan). The in-block scans cover the common styles: Hillis-Steele
(Kogge-Stone) in shared memory, Brent-Kung up/down sweeps, warp __shfl_up_sync scans, and
raking (a serial run per thread plus a scan of the run totals).

float32 scan results depend on the order of additions, so the data keep partial sums small
(per-row scans of values in [-1, 1]) or exact (values that are multiples of 1/64, whose partial
sums float32 holds exactly); int32 scans are compared exactly.
"""

from __future__ import annotations

from taskgen.core import Buffer, OpSpec, matrix_io

CATEGORY = "scan"

# Inclusive scans over one full warp (all 32 lanes active), by __shfl_up_sync doubling.
WARP_SCAN_FLOAT = """
__device__ float warp_inclusive_sum(float v) {
    int lane = threadIdx.x % 32;
    for (int offset = 1; offset < 32; offset <<= 1) {
        float up = __shfl_up_sync(0xffffffff, v, offset);
        if (lane >= offset) v += up;
    }
    return v;
}
"""

WARP_SCAN_INT = """
__device__ int warp_inclusive_sum(int v) {
    int lane = threadIdx.x % 32;
    for (int offset = 1; offset < 32; offset <<= 1) {
        int up = __shfl_up_sync(0xffffffff, v, offset);
        if (lane >= offset) v += up;
    }
    return v;
}
"""

# Single-block exclusive scan, in place, of any number of int32 values (chunks of blockDim.x
# with a carry). Used on the per-tile totals of the multi-block int scans.
SCAN_TILE_TOTALS_INT = """
// Launched as one block of 1024 threads: replaces tile_totals[t] with the sum of the totals
// before it. Returns (to every thread) the sum of all totals.
__device__ int exclusive_scan_in_place(int* tile_totals, int num_tiles) {
    __shared__ int warp_totals[32];
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int carry = 0;  // sum of the chunks already scanned
    for (int base = 0; base < num_tiles; base += blockDim.x) {  // same trip count for every thread
        int t = base + threadIdx.x;
        int v = t < num_tiles ? tile_totals[t] : 0;
        int incl = warp_inclusive_sum(v);
        if (lane == 31) warp_totals[warp] = incl;
        __syncthreads();
        if (warp == 0) {
            int w = lane < blockDim.x / 32 ? warp_totals[lane] : 0;
            warp_totals[lane] = warp_inclusive_sum(w);
        }
        __syncthreads();
        int before = carry + (warp > 0 ? warp_totals[warp - 1] : 0);
        if (t < num_tiles) tile_totals[t] = before + incl - v;  // exact for ints
        carry += warp_totals[blockDim.x / 32 - 1];
        __syncthreads();  // warp_totals is rewritten by the next chunk
    }
    return carry;
}
"""


def _gen(inputs: str, reference: str, call: str) -> str:
    """gen.py body: draw the inputs, define `reference` (float64 math unless integer)."""
    return f"{inputs}\n\n\n{reference.strip()}\n\n\n{call}"


UNIFORM_ROWS = "rows, cols = {rows}, {cols}\nx = rng.uniform(-1.0, 1.0, (rows, cols)).astype(np.float32)"

# Row prefix sums of values in [-1, 1] reach |S| ~ 100 over <= 2k columns; float32 rounding of a
# running sum there is ~1e-5 per step, ~1e-4 accumulated. A dropped or doubled element moves a
# sum by ~0.5, far outside this tolerance.
ROW_SUM_ATOL, ROW_SUM_RTOL = 1e-3, 1e-4


# --------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------


def row_inclusive_scan(rows: int, cols: int, variant: str) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = """
constexpr int ROW_SCAN_THREADS = 512;  // block size; sizes the shared buffers

// One block per row, walked in chunks of blockDim.x columns. Each chunk is scanned with
// Hillis-Steele steps in shared memory, double-buffered so that a step never reads a value the
// same step overwrites; then the total of the earlier chunks (carry) is added.
__global__ void row_inclusive_scan_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float buf[2][ROW_SCAN_THREADS];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    int t = threadIdx.x;
    float carry = 0.0f;
    for (int base = 0; base < cols; base += blockDim.x) {  // same trip count for every thread
        int j = base + t;
        buf[0][t] = j < cols ? xr[j] : 0.0f;  // pad with 0, the identity of +
        __syncthreads();
        int src = 0;
        for (int offset = 1; offset < blockDim.x; offset <<= 1) {
            float v = buf[src][t];
            if (t >= offset) v += buf[src][t - offset];
            buf[1 - src][t] = v;
            src = 1 - src;
            __syncthreads();
        }
        if (j < cols) yr[j] = carry + buf[src][t];
        carry += buf[src][blockDim.x - 1];
        __syncthreads();  // all reads of buf are done before the next chunk overwrites it
    }
}
"""
    return OpSpec(
        op="row_inclusive_scan",
        name="Row_Inclusive_Prefix_Sum",
        category=CATEGORY,
        split="train",
        variant=variant,
        description=f"Inclusive prefix sum along each row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that computes the inclusive prefix sum of each row of a float32 matrix x with
            {rows} rows and {cols} columns: y[r][j] = x[r][0] + ... + x[r][j]. Launch one block of 512 threads
            per row and walk the row in chunks of 512 columns: load a chunk into shared memory (0 past the
            end of the row), scan it with Hillis-Steele steps (offset 1, 2, 4, ...; double-buffer the shared
            array and __syncthreads after each step), add the running total of the earlier chunks, and
            carry the chunk's last value forward.
        """,
        level2=f"""
            Compute the inclusive prefix sum along each row of a {rows}x{cols} float32 matrix.
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void row_inclusive_scan_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int cols)"
        ],
        launch="{k}row_inclusive_scan_kernel<<<rows, 512>>>(d_x, d_y, cols);",
        launch_note="row_inclusive_scan_kernel is launched once with one block per row (grid = rows) and 512 threads "
        "per block, no dynamic shared memory.",
        gen=_gen(
            UNIFORM_ROWS.format(rows=rows, cols=cols),
            """
def reference(x):
    return np.cumsum(x, axis=1)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        atol=ROW_SUM_ATOL,
        rtol=ROW_SUM_RTOL,
    )


def counts_exclusive_scan(n: int, variant: str) -> OpSpec:
    tile = 1024
    num_tiles = -(-n // tile)
    kernels = (
        f"""
constexpr int SCAN_THREADS = 256;
constexpr int ITEMS_PER_THREAD = 4;
constexpr int SCAN_TILE = SCAN_THREADS * ITEMS_PER_THREAD;  // {tile} counts per block
"""
        + WARP_SCAN_INT
        + """
// Pass 1: each block scans its tile. A thread owns 4 consecutive counts; the thread totals are
// scanned with warp shuffles, and the 8 warp totals by warp 0. Writes the tile-local exclusive
// prefix to out and the tile total to tile_totals[blockIdx.x].
__global__ void tile_exclusive_scan_kernel(const int* __restrict__ counts, int* __restrict__ out,
                                           int* __restrict__ tile_totals, int n) {
    __shared__ int warp_totals[SCAN_THREADS / 32];
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int first = blockIdx.x * SCAN_TILE + threadIdx.x * ITEMS_PER_THREAD;
    int items[ITEMS_PER_THREAD];
    int thread_total = 0;
    for (int k = 0; k < ITEMS_PER_THREAD; ++k) {
        items[k] = first + k < n ? counts[first + k] : 0;
        thread_total += items[k];
    }
    int incl = warp_inclusive_sum(thread_total);
    if (lane == 31) warp_totals[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int w = lane < SCAN_THREADS / 32 ? warp_totals[lane] : 0;
        w = warp_inclusive_sum(w);
        if (lane < SCAN_THREADS / 32) warp_totals[lane] = w;
    }
    __syncthreads();
    int prefix = (warp > 0 ? warp_totals[warp - 1] : 0) + incl - thread_total;
    for (int k = 0; k < ITEMS_PER_THREAD; ++k) {
        if (first + k < n) out[first + k] = prefix;
        prefix += items[k];
    }
    if (threadIdx.x == 0) tile_totals[blockIdx.x] = warp_totals[SCAN_THREADS / 32 - 1];
}
"""
        + SCAN_TILE_TOTALS_INT
        + """
// Pass 2: one block turns the tile totals into exclusive tile offsets.
__global__ void scan_tile_totals_kernel(int* __restrict__ tile_totals, int num_tiles) {
    exclusive_scan_in_place(tile_totals, num_tiles);
}

// Pass 3: add each tile's offset to its elements.
__global__ void add_tile_offsets_kernel(int* __restrict__ out, const int* __restrict__ tile_offsets, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += tile_offsets[i / SCAN_TILE];
}
"""
    )
    return OpSpec(
        op="counts_exclusive_scan",
        name="Exclusive_Scan_Int32_Counts",
        category=CATEGORY,
        split="train",
        variant=variant,
        description=f"Exclusive prefix sum of {n} int32 counts (the output offsets of a bucketing step).",
        level1=f"""
            Write CUDA kernels for the exclusive prefix sum of n = {n} int32 counts (values 0..7):
            offsets[0] = 0, offsets[i] = counts[0] + ... + counts[i-1], exact integer arithmetic. Use three
            kernels over tiles of 1024 elements ({num_tiles} tiles). (1) tile_exclusive_scan_kernel, 256
            threads per tile, each thread holding 4 consecutive counts: scan the thread totals with
            __shfl_up_sync inside each warp, scan the 8 warp totals in warp 0 through shared memory, write the
            tile-local exclusive prefixes to offsets and the tile total to tile_totals[tile]. (2)
            scan_tile_totals_kernel, one block of 1024 threads, replaces tile_totals by its exclusive scan,
            looping over chunks of 1024 with a carry. (3) add_tile_offsets_kernel, one thread per element,
            adds tile_totals[i / 1024] to offsets[i]. Guard every index against n.
        """,
        level2=f"""
            Compute the exclusive prefix sum of {n} int32 values: offsets[i] = sum of counts[0..i-1],
            offsets[0] = 0.
        """,
        inputs=[Buffer("counts", "int32", (n,))],
        outputs=[Buffer("offsets", "int32", (n,))],
        scratch=[Buffer("tile_totals", "int32", (num_tiles,))],
        constants=f"const int n = {n};\nconst int num_tiles = (n + {tile - 1}) / {tile};",
        kernels=kernels,
        signatures=[
            "__global__ void tile_exclusive_scan_kernel(const int* __restrict__ counts, int* __restrict__ out, "
            "int* __restrict__ tile_totals, int n)",
            "__global__ void scan_tile_totals_kernel(int* __restrict__ tile_totals, int num_tiles)",
            "__global__ void add_tile_offsets_kernel(int* __restrict__ out, const int* __restrict__ tile_offsets, "
            "int n)",
        ],
        launch="{k}tile_exclusive_scan_kernel<<<num_tiles, 256>>>(d_counts, d_offsets, d_tile_totals, n);\n"
        "{k}scan_tile_totals_kernel<<<1, 1024>>>(d_tile_totals, num_tiles);\n"
        "{k}add_tile_offsets_kernel<<<(n + 255) / 256, 256>>>(d_offsets, d_tile_totals, n);",
        launch_note=f"Three kernels in order, over tiles of 1024 elements (num_tiles = (n + 1023) / 1024 = "
        f"{num_tiles}; "
        "tile_totals is a zeroed int scratch buffer of num_tiles entries): tile_exclusive_scan_kernel with "
        "num_tiles blocks of 256 threads (block b covers elements 1024 * b .. 1024 * b + 1023, writes "
        "tile-local exclusive prefixes to out and the tile's total to tile_totals[b]); "
        "scan_tile_totals_kernel with 1 block of 1024 threads (tile_totals becomes its exclusive scan); "
        "add_tile_offsets_kernel with (n + 255) / 256 blocks of 256 threads (out[i] += "
        "tile_offsets[i / 1024]).",
        gen=_gen(
            f"n = {n}\ncounts = rng.integers(0, 8, n).astype(np.int32)",
            """
def reference(counts):
    inclusive = np.cumsum(counts, dtype=np.int64)
    return np.concatenate([[0], inclusive[:-1]])
""",
            "offsets_ref = reference(counts).astype(np.int32)  # total < 8n fits in int32",
        ),
    )


def row_exclusive_scan(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = (
        WARP_SCAN_FLOAT
        + """
// Exclusive prefix of v over the block's threads in thread order. blockDim.x is a multiple of
// 32 and every thread of the block must call it (it syncs). Called once per kernel.
__device__ float block_exclusive_sum(float v) {
    __shared__ float warp_totals[32];
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    float incl = warp_inclusive_sum(v);
    float excl = __shfl_up_sync(0xffffffff, incl, 1);  // shift rather than incl - v: no rounding
    if (lane == 0) excl = 0.0f;
    if (lane == 31) warp_totals[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        float w = lane < blockDim.x / 32 ? warp_totals[lane] : 0.0f;
        warp_totals[lane] = warp_inclusive_sum(w);
    }
    __syncthreads();
    return (warp > 0 ? warp_totals[warp - 1] : 0.0f) + excl;
}

// Raking scan, one block per row: thread t owns a contiguous run of ceil(cols / blockDim.x)
// columns. It sums its run, the run totals are scanned across the block, then it rewrites its
// run serially starting from its exclusive prefix.
__global__ void row_exclusive_scan_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    int per_thread = (cols + blockDim.x - 1) / blockDim.x;
    int begin = min((int)threadIdx.x * per_thread, cols);
    int end = min(begin + per_thread, cols);
    float run = 0.0f;
    for (int j = begin; j < end; ++j) run += xr[j];
    float prefix = block_exclusive_sum(run);
    for (int j = begin; j < end; ++j) {
        yr[j] = prefix;
        prefix += xr[j];
    }
}
"""
    )
    return OpSpec(
        op="row_exclusive_scan",
        name="Row_Exclusive_Prefix_Sum",
        category=CATEGORY,
        split="train",
        description=f"Exclusive prefix sum along each row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that computes the exclusive prefix sum of each row of a float32 matrix x with
            {rows} rows and {cols} columns: y[r][0] = 0, y[r][j] = x[r][0] + ... + x[r][j-1]. Launch one block of
            256 threads per row and use a raking scan: thread t owns the contiguous columns [t*k, (t+1)*k) with
            k = ceil(cols / 256) (clipped to the row), sums them serially, the 256 run sums are scanned across
            the block (__shfl_up_sync inside each warp, warp totals scanned by warp 0 through shared memory),
            and each thread then writes its run serially starting from its exclusive prefix.
        """,
        level2=f"""
            Compute the exclusive prefix sum along each row of a {rows}x{cols} float32 matrix (first element of
            each row 0).
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void row_exclusive_scan_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int cols)"
        ],
        launch="{k}row_exclusive_scan_kernel<<<rows, 256>>>(d_x, d_y, cols);",
        launch_note="row_exclusive_scan_kernel is launched once with one block per row (grid = rows) and 256 threads "
        "per block, no dynamic shared memory.",
        gen=_gen(
            UNIFORM_ROWS.format(rows=rows, cols=cols),
            """
def reference(x):
    inclusive = np.cumsum(x, axis=1)
    return np.concatenate([np.zeros((x.shape[0], 1)), inclusive[:, :-1]], axis=1)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        atol=ROW_SUM_ATOL,
        rtol=ROW_SUM_RTOL,
    )


def row_cumulative_max(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = """
// One warp per row, 8 rows per block of 256 threads. The warp walks the row 32 columns at a
// time: a __shfl_up_sync max-scan of the chunk, combined with the maximum of earlier chunks.
__global__ void row_cumulative_max_kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together, so the full-mask shuffles stay valid
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    float carry = -FLT_MAX;  // maximum of the chunks already written
    for (int base = 0; base < cols; base += 32) {  // same trip count for every lane
        int j = base + lane;
        float v = j < cols ? xr[j] : -FLT_MAX;  // pad with the identity of max
        for (int offset = 1; offset < 32; offset <<= 1) {
            float up = __shfl_up_sync(0xffffffff, v, offset);
            if (lane >= offset) v = fmaxf(v, up);
        }
        v = fmaxf(v, carry);
        if (j < cols) yr[j] = v;
        carry = __shfl_sync(0xffffffff, v, 31);
    }
}
"""
    return OpSpec(
        op="row_cumulative_max",
        name="Row_Cumulative_Max",
        category=CATEGORY,
        split="train",
        description=f"Running maximum along each row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that computes the cumulative maximum of each row of a float32 matrix x with
            {rows} rows and {cols} columns: y[r][j] = max(x[r][0], ..., x[r][j]). Use one warp per row, 8 warps
            per block of 256 threads. The warp walks the row in chunks of 32 columns: lane l loads column
            base + l (-FLT_MAX past the end), a __shfl_up_sync loop (offsets 1, 2, 4, 8, 16) makes a max-scan of
            the chunk, combine it with the maximum of the earlier chunks and broadcast lane 31's value with
            __shfl_sync as the new carry. The row count is not a multiple of 8: warps past the last row exit
            before any shuffle.
        """,
        level2=f"""
            Compute the cumulative maximum along each row of a {rows}x{cols} float32 matrix.
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void row_cumulative_max_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int rows, int cols)"
        ],
        launch="{k}row_cumulative_max_kernel<<<(rows + 7) / 8, 256>>>(d_x, d_y, rows, cols);",
        launch_note="row_cumulative_max_kernel is launched once with (rows + 7) / 8 blocks of 256 threads: one warp "
        "per row, warp w of block b handles row 8 * b + w; warps past the last row must do nothing.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\nx = rng.standard_normal((rows, cols)).astype(np.float32)",
            """
def reference(x):
    return np.maximum.accumulate(x, axis=1)
""",
            "y_ref = reference(x)  # max is exact: no float64 needed",
        ),
    )


def row_running_mean(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = (
        WARP_SCAN_FLOAT
        + """
// One block per row, walked in chunks of blockDim.x columns. Each warp scans its 32 values with
// shuffles; after a barrier every thread adds the totals of the warps before it (read from
// shared memory) and the carry of earlier chunks, and divides by the element count.
__global__ void row_running_mean_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float warp_totals[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int num_warps = blockDim.x / 32;
    float carry = 0.0f;  // sum of the row before this chunk
    for (int base = 0; base < cols; base += blockDim.x) {  // same trip count for every thread
        int j = base + threadIdx.x;
        float v = warp_inclusive_sum(j < cols ? xr[j] : 0.0f);
        if (lane == 31) warp_totals[warp] = v;
        __syncthreads();
        float prefix = carry;
        float chunk_total = 0.0f;
        for (int w = 0; w < num_warps; ++w) {
            if (w < warp) prefix += warp_totals[w];
            chunk_total += warp_totals[w];
        }
        if (j < cols) yr[j] = (prefix + v) / (float)(j + 1);
        carry += chunk_total;
        __syncthreads();  // warp_totals is rewritten by the next chunk
    }
}
"""
    )
    return OpSpec(
        op="row_running_mean",
        name="Row_Running_Mean",
        category=CATEGORY,
        split="train",
        description=f"Running (cumulative) mean along each row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that computes the running mean of each row of a float32 matrix x with {rows}
            rows and {cols} columns: y[r][j] = (x[r][0] + ... + x[r][j]) / (j + 1). Launch one block of 256
            threads per row and walk the row in chunks of 256 columns: each warp scans its 32 values with
            __shfl_up_sync, lane 31 stores the warp total in shared memory, and after __syncthreads each
            thread adds the totals of the preceding warps and of the earlier chunks, then divides by j + 1.
            The column count is not a multiple of 256, so pad the last chunk with zeros.
        """,
        level2=f"""
            Compute the running mean along each row of a {rows}x{cols} float32 matrix: y[r][j] = mean of
            x[r][0..j].
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void row_running_mean_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int cols)"
        ],
        launch="{k}row_running_mean_kernel<<<rows, 256>>>(d_x, d_y, cols);",
        launch_note="row_running_mean_kernel is launched once with one block per row (grid = rows) and 256 threads per "
        "block, no dynamic shared memory.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\nx = rng.uniform(-1.0, 3.0, (rows, cols)).astype(np.float32)",
            """
def reference(x):
    return np.cumsum(x, axis=1) / np.arange(1, x.shape[1] + 1)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # Means stay near 1: the prefix-sum rounding (~1e-7 * j) divided by j + 1 is ~1e-6.
        atol=1e-5,
        rtol=1e-4,
    )


def vector_inclusive_scan(n: int) -> OpSpec:
    tile = 2048
    num_tiles = -(-n // tile)
    kernels = (
        f"""
constexpr int SCAN_TILE = {tile};  // elements per tile in all three kernels
"""
        + """
// Pass 1 (reduce): each block of 256 threads sums its tile with a shared-memory tree.
__global__ void tile_sum_kernel(const float* __restrict__ x, float* __restrict__ tile_sums, int n) {
    __shared__ float partial[256];
    int base = blockIdx.x * SCAN_TILE;
    float s = 0.0f;
    for (int k = threadIdx.x; k < SCAN_TILE; k += blockDim.x)
        if (base + k < n) s += x[base + k];
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) tile_sums[blockIdx.x] = partial[0];
}

// Pass 2: a single warp replaces the tile sums by their exclusive scan, 32 tiles per step,
// carrying the running total in a register.
__global__ void tile_offsets_kernel(float* __restrict__ tile_sums, int num_tiles) {
    int lane = threadIdx.x;
    float carry = 0.0f;
    for (int base = 0; base < num_tiles; base += 32) {
        int t = base + lane;
        float incl = t < num_tiles ? tile_sums[t] : 0.0f;
        for (int offset = 1; offset < 32; offset <<= 1) {
            float up = __shfl_up_sync(0xffffffff, incl, offset);
            if (lane >= offset) incl += up;
        }
        float excl = __shfl_up_sync(0xffffffff, incl, 1);
        if (lane == 0) excl = 0.0f;
        if (t < num_tiles) tile_sums[t] = carry + excl;
        carry += __shfl_sync(0xffffffff, incl, 31);
    }
}

// Pass 3 (scan): each block of SCAN_TILE / 2 threads scans its tile in shared memory with
// Brent-Kung sweeps (two elements per thread) and adds the tile's offset.
__global__ void tile_scan_add_kernel(const float* __restrict__ x, const float* __restrict__ tile_offsets,
                                     float* __restrict__ y, int n) {
    __shared__ float s[SCAN_TILE];
    int t = threadIdx.x;
    int i0 = blockIdx.x * SCAN_TILE + t;
    int i1 = i0 + SCAN_TILE / 2;
    s[t] = i0 < n ? x[i0] : 0.0f;  // coalesced loads, 0 past the end
    s[t + SCAN_TILE / 2] = i1 < n ? x[i1] : 0.0f;
    __syncthreads();
    // Up-sweep: after the step with stride d, s[m * 2d - 1] holds the sum of its 2d-element block.
    for (int stride = 1; stride < SCAN_TILE; stride <<= 1) {
        int k = (t + 1) * 2 * stride - 1;
        if (k < SCAN_TILE) s[k] += s[k - stride];
        __syncthreads();
    }
    // Down-sweep: each completed prefix at k feeds the partial block sum stride places later.
    for (int stride = SCAN_TILE / 4; stride > 0; stride >>= 1) {
        int k = (t + 1) * 2 * stride - 1;
        if (k + stride < SCAN_TILE) s[k + stride] += s[k];
        __syncthreads();
    }
    float offset = tile_offsets[blockIdx.x];
    if (i0 < n) y[i0] = offset + s[t];
    if (i1 < n) y[i1] = offset + s[t + SCAN_TILE / 2];
}
"""
    )
    return OpSpec(
        op="vector_inclusive_scan",
        name="Vector_Inclusive_Prefix_Sum",
        category=CATEGORY,
        split="train",
        description=f"Inclusive prefix sum of a float32 vector of {n} elements.",
        level1=f"""
            Write CUDA kernels for the inclusive prefix sum of a float32 vector x of n = {n} elements: y[i] =
            x[0] + ... + x[i]. Use reduce-then-scan over tiles of 2048 elements ({num_tiles} tiles, the last one
            partial). (1) tile_sum_kernel, 256 threads per tile: sum the tile with a shared-memory tree into
            tile_sums[tile]. (2) tile_offsets_kernel, a single warp: replace tile_sums by its exclusive scan with
            __shfl_up_sync, 32 tiles per step with a carry. (3) tile_scan_add_kernel, 1024 threads per tile:
            load the tile into shared memory (two elements per thread, coalesced, 0 past n), scan it with
            Brent-Kung up-sweep and down-sweep steps (__syncthreads after each), and write the tile offset
            plus the in-tile prefix.
        """,
        level2=f"""
            Compute the inclusive prefix sum of a float32 vector of {n} elements.
        """,
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        scratch=[Buffer("tile_sums", "float32", (num_tiles,))],
        constants=f"const int n = {n};\nconst int num_tiles = (n + {tile - 1}) / {tile};",
        kernels=kernels,
        signatures=[
            "__global__ void tile_sum_kernel(const float* __restrict__ x, float* __restrict__ tile_sums, int n)",
            "__global__ void tile_offsets_kernel(float* __restrict__ tile_sums, int num_tiles)",
            "__global__ void tile_scan_add_kernel(const float* __restrict__ x, const float* __restrict__ tile_offsets, "
            "float* __restrict__ y, int n)",
        ],
        launch="{k}tile_sum_kernel<<<num_tiles, 256>>>(d_x, d_tile_sums, n);\n"
        "{k}tile_offsets_kernel<<<1, 32>>>(d_tile_sums, num_tiles);\n"
        "{k}tile_scan_add_kernel<<<num_tiles, 1024>>>(d_x, d_tile_sums, d_y, n);",
        launch_note=f"Three kernels in order, over tiles of 2048 elements (num_tiles = (n + 2047) / 2048 = "
        f"{num_tiles}; "
        "tile_sums is a zeroed float scratch buffer of num_tiles entries): tile_sum_kernel with num_tiles "
        "blocks of 256 threads (block b writes the sum of elements 2048 * b .. 2048 * b + 2047 to "
        "tile_sums[b]); tile_offsets_kernel with 1 block of 32 threads (tile_sums becomes its exclusive "
        "scan); tile_scan_add_kernel with num_tiles blocks of 1024 threads (block b writes y for its tile "
        "using tile_offsets[b]).",
        gen=_gen(
            f"""n = {n}
# Multiples of 1/64 in [-1, 1]: every partial sum (|S| << 2^18) is exact in float32, so the result
# does not depend on the order of additions.
x = (rng.integers(-64, 65, n) / 64.0).astype(np.float32)""",
            """
def reference(x):
    return np.cumsum(x)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        atol=1e-5,
        rtol=1e-5,  # exact by construction
    )


# --------------------------------------------------------------------------------------
# eval (held-out ops)
# --------------------------------------------------------------------------------------


def segmented_inclusive_scan(n: int) -> OpSpec:
    tile = 1024
    num_tiles = -(-n // tile)
    kernels = (
        f"""
constexpr int SEG_TILE = {tile};  // elements per tile; blockDim.x == SEG_TILE in pass 1
"""
        + """
// Pass 1: segmented Hillis-Steele scan of each tile in shared memory on (value, flag) pairs:
// combining an earlier pair a with a later pair b gives (b.flag ? b.value : a.value + b.value,
// a.flag | b.flag). Writes the tile-local result to y, the tile's last value to tile_vals and the
// position of its first segment head (SEG_TILE if none) to tile_heads.
__global__ void segmented_tile_scan_kernel(const float* __restrict__ x, const int* __restrict__ flags,
                                           float* __restrict__ y, float* __restrict__ tile_vals,
                                           int* __restrict__ tile_heads, int n) {
    __shared__ float sv[2][SEG_TILE];
    __shared__ int sf[2][SEG_TILE];
    __shared__ int first_head;
    int t = threadIdx.x;
    int i = blockIdx.x * SEG_TILE + t;
    float v = i < n ? x[i] : 0.0f;
    int f = i < n ? flags[i] : 0;
    if (t == 0) first_head = SEG_TILE;
    sv[0][t] = v;
    sf[0][t] = f;
    __syncthreads();
    if (f) atomicMin(&first_head, t);
    int src = 0;
    for (int offset = 1; offset < SEG_TILE; offset <<= 1) {
        float nv = sv[src][t];
        int nf = sf[src][t];
        if (t >= offset) {
            if (!nf) nv += sv[src][t - offset];
            nf |= sf[src][t - offset];
        }
        sv[1 - src][t] = nv;
        sf[1 - src][t] = nf;
        src = 1 - src;
        __syncthreads();
    }
    if (i < n) y[i] = sv[src][t];
    if (t == SEG_TILE - 1) {
        tile_vals[blockIdx.x] = sv[src][t];
        tile_heads[blockIdx.x] = first_head;
    }
}

// Pass 2: one warp computes each tile's carry-in, the segmented exclusive scan of the tile
// results: a tile with a head starts a new segment for the tiles after it. Replaces tile_vals.
__global__ void segmented_tile_carry_kernel(float* __restrict__ tile_vals, const int* __restrict__ tile_heads,
                                            int num_tiles) {
    int lane = threadIdx.x;
    float carry = 0.0f;  // segmented total at the end of the previous chunk of 32 tiles
    for (int base = 0; base < num_tiles; base += 32) {
        int b = base + lane;
        float v = b < num_tiles ? tile_vals[b] : 0.0f;
        int f = b < num_tiles ? tile_heads[b] < SEG_TILE : 0;
        for (int offset = 1; offset < 32; offset <<= 1) {
            float up_v = __shfl_up_sync(0xffffffff, v, offset);
            int up_f = __shfl_up_sync(0xffffffff, f, offset);
            if (lane >= offset) {
                if (!f) v += up_v;
                f |= up_f;
            }
        }
        if (!f) v += carry;  // no head since the chunk start: the previous segment continues
        float excl = __shfl_up_sync(0xffffffff, v, 1);
        if (lane == 0) excl = carry;
        if (b < num_tiles) tile_vals[b] = excl;
        carry = __shfl_sync(0xffffffff, v, 31);
    }
}

// Pass 3: elements before the first head of their tile continue the segment that was open when
// the tile started, so they get the tile's carry-in.
__global__ void segmented_add_carry_kernel(float* __restrict__ y, const float* __restrict__ tile_carry,
                                           const int* __restrict__ tile_heads, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int b = i / SEG_TILE;
    if (i - b * SEG_TILE < tile_heads[b]) y[i] += tile_carry[b];
}
"""
    )
    return OpSpec(
        op="segmented_inclusive_scan",
        name="Segmented_Inclusive_Prefix_Sum",
        category=CATEGORY,
        split="eval",
        description=f"Inclusive prefix sum of a float32 vector of {n} elements that restarts at every element whose "
        "head flag is 1.",
        level1=f"""
            Write CUDA kernels for a segmented inclusive prefix sum of a float32 vector x of n = {n} elements
            with int32 head flags (1 marks the first element of a segment, flags[0] = 1): y[i] = x[s] + ... +
            x[i], where s <= i is the last index with flags[s] = 1. Segments span several tiles. Use tiles of
            1024 elements ({num_tiles} tiles). (1) segmented_tile_scan_kernel, 1024 threads per tile: a
            double-buffered Hillis-Steele scan in shared memory on (value, flag) pairs with the operator
            (a, b) -> (b.flag ? b.value : a.value + b.value, a.flag | b.flag); write the result to y, the tile's
            last value to tile_vals[tile] and the in-tile index of its first head (1024 if none, found with
            atomicMin in shared memory) to tile_heads[tile]. (2) segmented_tile_carry_kernel, a single warp:
            the segmented exclusive scan of the tile results (a tile with a head resets the carry), stored in
            tile_vals. (3) segmented_add_carry_kernel, one thread per element: add tile_vals[tile] to the
            elements before the tile's first head.
        """,
        level2=f"""
            Compute a segmented inclusive prefix sum of {n} float32 values: the running sum restarts at every
            position whose int32 head flag is 1.
        """,
        inputs=[Buffer("x", "float32", (n,)), Buffer("flags", "int32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        scratch=[Buffer("tile_vals", "float32", (num_tiles,)), Buffer("tile_heads", "int32", (num_tiles,))],
        constants=f"const int n = {n};\nconst int num_tiles = (n + {tile - 1}) / {tile};",
        kernels=kernels,
        signatures=[
            "__global__ void segmented_tile_scan_kernel(const float* __restrict__ x, const int* __restrict__ flags, "
            "float* __restrict__ y, float* __restrict__ tile_vals, int* __restrict__ tile_heads, int n)",
            "__global__ void segmented_tile_carry_kernel(float* __restrict__ tile_vals, "
            "const int* __restrict__ tile_heads, int num_tiles)",
            "__global__ void segmented_add_carry_kernel(float* __restrict__ y, const float* __restrict__ tile_carry, "
            "const int* __restrict__ tile_heads, int n)",
        ],
        launch="{k}segmented_tile_scan_kernel<<<num_tiles, 1024>>>(d_x, d_flags, d_y, d_tile_vals, d_tile_heads, n);\n"
        "{k}segmented_tile_carry_kernel<<<1, 32>>>(d_tile_vals, d_tile_heads, num_tiles);\n"
        "{k}segmented_add_carry_kernel<<<(n + 255) / 256, 256>>>(d_y, d_tile_vals, d_tile_heads, n);",
        launch_note=f"Three kernels in order, over tiles of 1024 elements (num_tiles = (n + 1023) / 1024 = "
        f"{num_tiles}; "
        "scratch: tile_vals, float, and tile_heads, int, num_tiles entries each, zeroed): "
        "segmented_tile_scan_kernel with num_tiles blocks of 1024 threads; segmented_tile_carry_kernel "
        "with 1 block of 32 threads; segmented_add_carry_kernel with (n + 255) / 256 blocks of 256 "
        "threads. What pass 1 leaves in tile_vals and tile_heads is up to you, as long as passes 2 and 3 "
        "read it consistently.",
        gen=_gen(
            f"""n = {n}
x = rng.uniform(-1.0, 1.0, n).astype(np.float32)
# Segment lengths 1..3000: many segments cross tile boundaries, some cover whole tiles.
starts = np.cumsum(rng.integers(1, 3001, n // 1000 + 1))
flags = np.zeros(n, dtype=np.int32)
flags[0] = 1
flags[starts[starts < n]] = 1""",
            """
def reference(x, flags):
    inclusive = np.cumsum(x)
    head = np.maximum.accumulate(np.where(flags == 1, np.arange(len(x)), 0))  # last head at or before i
    before_head = np.concatenate([[0.0], inclusive])[head]  # sum of everything before that head
    return inclusive - before_head
""",
            "y_ref = reference(x.astype(np.float64), flags).astype(np.float32)",
        ),
        atol=ROW_SUM_ATOL,
        rtol=ROW_SUM_RTOL,  # segments <= 3000 values in [-1, 1], as for row scans
    )


def stream_compact_positive(n: int) -> OpSpec:
    tile = 1024
    num_tiles = -(-n // tile)
    kernels = (
        f"""
constexpr int COMPACT_TILE = {tile};  // elements per tile; blockDim.x == COMPACT_TILE in passes 1 and 3
"""
        + WARP_SCAN_INT
        + SCAN_TILE_TOTALS_INT
        + """
// Pass 1: count the kept elements of each tile with a counting barrier.
__global__ void count_positive_kernel(const float* __restrict__ x, int* __restrict__ tile_counts, int n) {
    int i = blockIdx.x * COMPACT_TILE + threadIdx.x;
    int keep = i < n && x[i] > 0.0f;
    int kept = __syncthreads_count(keep);  // every thread reaches it, in range or not
    if (threadIdx.x == 0) tile_counts[blockIdx.x] = kept;
}

// Pass 2: one block turns the tile counts into exclusive tile offsets and stores the total.
__global__ void scan_tile_counts_kernel(int* __restrict__ tile_counts, int* __restrict__ count, int num_tiles) {
    int total = exclusive_scan_in_place(tile_counts, num_tiles);
    if (threadIdx.x == 0) count[0] = total;
}

// Pass 3: each kept element goes to tile offset + kept elements before it in the tile: a ballot
// ranks it inside its warp, and the warps' counts in shared memory give the warp's offset.
__global__ void compact_scatter_kernel(const float* __restrict__ x, const int* __restrict__ tile_offsets,
                                       float* __restrict__ y, int n) {
    __shared__ int warp_counts[COMPACT_TILE / 32];
    int i = blockIdx.x * COMPACT_TILE + threadIdx.x;
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    bool keep = i < n && x[i] > 0.0f;
    unsigned kept = __ballot_sync(0xffffffff, keep);
    if (lane == 0) warp_counts[warp] = __popc(kept);
    __syncthreads();
    int dst = tile_offsets[blockIdx.x] + __popc(kept & ((1u << lane) - 1u));
    for (int w = 0; w < warp; ++w) dst += warp_counts[w];
    if (keep) y[dst] = x[i];
}
"""
    )
    return OpSpec(
        op="stream_compact_positive",
        name="Stream_Compaction_Positive",
        category=CATEGORY,
        split="eval",
        description=f"Copy the positive elements of a float32 vector of {n} elements to the front of the output in "
        "order, zero the rest, and output their count.",
        level1=f"""
            Write CUDA kernels that compact a float32 vector x of n = {n} elements: the elements with x[i] > 0
            go, in their original order, to y[0], y[1], ..., the rest of y is 0, and count[0] (int32) is the
            number of kept elements. Use tiles of 1024 elements ({num_tiles} tiles) and a scan of the tile
            counts. The host zeroes y first (cudaMemset). (1) count_positive_kernel, 1024 threads per tile:
            count the kept elements with __syncthreads_count into tile_counts[tile]. (2)
            scan_tile_counts_kernel, one block of 1024 threads: exclusive scan of tile_counts in place (chunks
            of 1024 with a carry, __shfl_up_sync inside warps), total to count[0]. (3) compact_scatter_kernel,
            1024 threads per tile: rank each kept element inside its warp with __ballot_sync and __popc, add
            the counts of the earlier warps (shared memory) and the tile offset, and write it there.
        """,
        level2=f"""
            Stream compaction of {n} float32 values: write the positive values, in order, to the front of y
            (rest zero) and their number to count[0].
        """,
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,)), Buffer("count", "int32", (1,))],
        scratch=[Buffer("tile_counts", "int32", (num_tiles,))],
        constants=f"const int n = {n};\nconst int num_tiles = (n + {tile - 1}) / {tile};",
        kernels=kernels,
        signatures=[
            "__global__ void count_positive_kernel(const float* __restrict__ x, int* __restrict__ tile_counts, int n)",
            "__global__ void scan_tile_counts_kernel(int* __restrict__ tile_counts, int* __restrict__ count, "
            "int num_tiles)",
            "__global__ void compact_scatter_kernel(const float* __restrict__ x, const int* __restrict__ tile_offsets, "
            "float* __restrict__ y, int n)",
        ],
        launch="CUDA_CHECK(cudaMemset(d_y, 0, n * sizeof(float)));  // the slots past the kept elements stay 0\n"
        "{k}count_positive_kernel<<<num_tiles, 1024>>>(d_x, d_tile_counts, n);\n"
        "{k}scan_tile_counts_kernel<<<1, 1024>>>(d_tile_counts, d_count, num_tiles);\n"
        "{k}compact_scatter_kernel<<<num_tiles, 1024>>>(d_x, d_tile_counts, d_y, n);",
        launch_note=f"The host first zeroes y with cudaMemset, then launches three kernels in order, over tiles of "
        f"1024 elements (num_tiles = (n + 1023) / 1024 = {num_tiles}; tile_counts is a zeroed int scratch "
        "buffer of num_tiles entries): count_positive_kernel with num_tiles blocks of 1024 threads (block "
        "b writes the number of positives in its tile to tile_counts[b]); scan_tile_counts_kernel with 1 "
        "block of 1024 threads (tile_counts becomes its exclusive scan, count[0] the total); "
        "compact_scatter_kernel with num_tiles blocks of 1024 threads (tile_offsets[b] is where block b's "
        "first kept element goes).",
        gen=_gen(
            f"n = {n}\nx = rng.standard_normal(n).astype(np.float32)",
            """
def reference(x):
    kept = x[x > 0]
    y = np.zeros_like(x)
    y[:len(kept)] = kept
    return y, np.array([len(kept)], dtype=np.int32)
""",
            "y_ref, count_ref = reference(x)  # a copy: exact",
        ),
    )


def row_cumulative_product(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = """
// One warp per row, 4 rows per block of 128 threads, 32 columns per step: a __shfl_up_sync
// product scan of the chunk, times the product of the earlier chunks.
__global__ void row_cumulative_product_kernel(const float* __restrict__ x, float* __restrict__ y, int rows,
                                              int cols) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together, so the full-mask shuffles stay valid
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    float carry = 1.0f;  // product of the chunks already written
    for (int base = 0; base < cols; base += 32) {  // same trip count for every lane
        int j = base + lane;
        float v = j < cols ? xr[j] : 1.0f;  // pad with the identity of *
        for (int offset = 1; offset < 32; offset <<= 1) {
            float up = __shfl_up_sync(0xffffffff, v, offset);
            if (lane >= offset) v *= up;
        }
        v *= carry;
        if (j < cols) yr[j] = v;
        carry = __shfl_sync(0xffffffff, v, 31);
    }
}
"""
    return OpSpec(
        op="row_cumulative_product",
        name="Row_Cumulative_Product",
        category=CATEGORY,
        split="eval",
        description=f"Cumulative product along each row of a {rows}x{cols} float32 matrix of values near 1.",
        level1=f"""
            Write a CUDA kernel that computes the cumulative product of each row of a float32 matrix x with
            {rows} rows and {cols} columns (values in [0.97, 1.03]): y[r][j] = x[r][0] * ... * x[r][j]. Use one
            warp per row, 4 warps per block of 128 threads: the warp walks the row 32 columns at a time, scans
            the chunk with __shfl_up_sync multiplications (1 past the end of the row), multiplies by the
            product of the earlier chunks, and broadcasts lane 31's value with __shfl_sync as the new carry.
            Warps past the last row exit before any shuffle.
        """,
        level2=f"""
            Compute the cumulative product along each row of a {rows}x{cols} float32 matrix.
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void row_cumulative_product_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int rows, int cols)"
        ],
        launch="{k}row_cumulative_product_kernel<<<(rows + 3) / 4, 128>>>(d_x, d_y, rows, cols);",
        launch_note="row_cumulative_product_kernel is launched once with (rows + 3) / 4 blocks of 128 threads: one "
        "warp per row, warp w of block b handles row 4 * b + w; warps past the last row must do nothing.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\n"
            "# Near 1, so that 1k-long products stay within about [e^-3, e^3].\n"
            "x = rng.uniform(0.97, 1.03, (rows, cols)).astype(np.float32)",
            """
def reference(x):
    return np.cumprod(x, axis=1)
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        # ~1k float32 multiplications: relative rounding error ~1e-6 typical, ~6e-5 worst case.
        atol=1e-5,
        rtol=1e-4,
    )


# --------------------------------------------------------------------------------------
# pretrain
# --------------------------------------------------------------------------------------


def row_suffix_sum(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = """
constexpr int SUFFIX_THREADS = 256;  // block size; sizes the shared buffer

// One block per row, walked from the right end in chunks of blockDim.x columns: thread t takes
// the t-th column from the chunk's right end, so a prefix scan over t is a suffix scan over
// columns. Single-buffered Kogge-Stone: read, barrier, write, barrier.
__global__ void row_suffix_sum_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float buf[SUFFIX_THREADS];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    int t = threadIdx.x;
    float carry = 0.0f;  // sum of the columns right of the current chunk
    for (int base = 0; base < cols; base += blockDim.x) {  // same trip count for every thread
        int j = cols - 1 - (base + t);
        buf[t] = j >= 0 ? xr[j] : 0.0f;
        __syncthreads();
        for (int offset = 1; offset < blockDim.x; offset <<= 1) {
            float add = t >= offset ? buf[t - offset] : 0.0f;
            __syncthreads();  // every read of this step happens before any write
            buf[t] += add;
            __syncthreads();
        }
        if (j >= 0) yr[j] = carry + buf[t];
        carry += buf[blockDim.x - 1];
        __syncthreads();  // all reads of buf are done before the next chunk overwrites it
    }
}
"""
    return OpSpec(
        op="row_suffix_sum",
        name="Row_Suffix_Sum",
        category=CATEGORY,
        split="pretrain",
        description=f"Reverse (suffix) cumulative sum along each row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that computes the suffix sum of each row of a float32 matrix x with {rows} rows
            and {cols} columns: y[r][j] = x[r][j] + x[r][j+1] + ... + x[r][{cols - 1}]. Launch one block of 256
            threads per row and walk the row from its right end in chunks of 256 columns, thread t taking
            column cols - 1 - (base + t), so that an inclusive Kogge-Stone scan in shared memory over t is the
            suffix scan; add the total of the chunks to the right.
        """,
        level2=f"""
            Compute the reverse cumulative sum (sum from each position to the end of the row) of a
            {rows}x{cols} float32 matrix.
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void row_suffix_sum_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int cols)"
        ],
        launch="{k}row_suffix_sum_kernel<<<rows, 256>>>(d_x, d_y, cols);",
        launch_note="row_suffix_sum_kernel is launched once with one block per row (grid = rows) and 256 threads per "
        "block, no dynamic shared memory.",
        gen=_gen(
            UNIFORM_ROWS.format(rows=rows, cols=cols),
            """
def reference(x):
    return np.cumsum(x[:, ::-1], axis=1)[:, ::-1]
""",
            "y_ref = reference(x.astype(np.float64)).astype(np.float32)",
        ),
        atol=ROW_SUM_ATOL,
        rtol=ROW_SUM_RTOL,
    )


def row_cumulative_min(rows: int, cols: int) -> OpSpec:
    inputs, outputs, constants = matrix_io(rows, cols)
    kernels = """
// One warp per row, 8 rows per block of 256 threads, raking: lane l owns a contiguous run of
// ceil(cols / 32) columns. A shuffle min-scan of the run minima gives each lane the minimum of
// the runs before it, then the lane rewrites its run serially.
__global__ void row_cumulative_min_kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together, so the full-mask shuffles stay valid
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    int per_lane = (cols + 31) / 32;
    int begin = min(lane * per_lane, cols);
    int end = min(begin + per_lane, cols);
    float run = FLT_MAX;
    for (int j = begin; j < end; ++j) run = fminf(run, xr[j]);
    for (int offset = 1; offset < 32; offset <<= 1) {
        float up = __shfl_up_sync(0xffffffff, run, offset);
        if (lane >= offset) run = fminf(run, up);
    }
    float m = __shfl_up_sync(0xffffffff, run, 1);  // minimum of the runs before this lane's
    if (lane == 0) m = FLT_MAX;
    for (int j = begin; j < end; ++j) {
        m = fminf(m, xr[j]);
        yr[j] = m;
    }
}
"""
    return OpSpec(
        op="row_cumulative_min",
        name="Row_Cumulative_Min",
        category=CATEGORY,
        split="pretrain",
        description=f"Running minimum along each row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that computes the cumulative minimum of each row of a float32 matrix x with
            {rows} rows and {cols} columns: y[r][j] = min(x[r][0], ..., x[r][j]). Use one warp per row, 8 warps
            per block of 256 threads, and a raking scan: lane l owns columns [l*k, (l+1)*k) with k = ceil(cols /
            32), computes its run minimum, a __shfl_up_sync min-scan gives the minimum of the earlier runs, and
            the lane rewrites its run serially. Warps past the last row exit before any shuffle.
        """,
        level2=f"""
            Compute the cumulative minimum along each row of a {rows}x{cols} float32 matrix.
        """,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        kernels=kernels,
        signatures=[
            "__global__ void row_cumulative_min_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int rows, int cols)"
        ],
        launch="{k}row_cumulative_min_kernel<<<(rows + 7) / 8, 256>>>(d_x, d_y, rows, cols);",
        launch_note="row_cumulative_min_kernel is launched once with (rows + 7) / 8 blocks of 256 threads: one warp "
        "per row, warp w of block b handles row 8 * b + w; warps past the last row must do nothing.",
        gen=_gen(
            f"rows, cols = {rows}, {cols}\nx = rng.standard_normal((rows, cols)).astype(np.float32)",
            """
def reference(x):
    return np.minimum.accumulate(x, axis=1)
""",
            "y_ref = reference(x)  # min is exact: no float64 needed",
        ),
    )


def specs() -> list[OpSpec]:
    return [
        # train: two ops at two sizes, the second one no block or tile size divides
        row_inclusive_scan(2048, 1024, "2048x1024"),
        row_inclusive_scan(1500, 1531, "1500x1531"),
        counts_exclusive_scan(1 << 20, "1048576"),
        counts_exclusive_scan(1_000_003, "1000003"),
        row_exclusive_scan(2048, 2000),
        row_cumulative_max(4099, 1000),
        row_running_mean(4096, 1000),
        vector_inclusive_scan(2_000_000),
        # eval
        segmented_inclusive_scan(1 << 20),
        stream_compact_positive(1_500_000),
        row_cumulative_product(2050, 1024),
        # pretrain
        row_suffix_sum(2048, 1000),
        row_cumulative_min(3001, 1000),
    ]
