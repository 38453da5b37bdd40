"""Atomic-operation tasks: histograms, bincounts, scatter-add and atomic max/min.

Every task here accumulates into a small output with atomics, so every launch first resets
what it accumulates into (cudaMemset, or an init kernel when the start value is not a byte
pattern). Integer outputs (counts, indices, integer min) are exact because integer atomics
are order-independent; float sums into buckets get a tolerance that absorbs the arbitrary
order in which atomicAdd applies the values. The kernels show the usual atomic patterns:
one global atomic per element, shared-memory privatization (count in a per-block copy,
merge once per bin), one atomic per warp after a shuffle reduction or a ballot, a
compare-and-swap loop for an operation the hardware lacks, and a packed 64-bit atomicMax.
"""

from __future__ import annotations

from taskgen.core import Buffer, OpSpec

CATEGORY = "atomics"
SIZES = {"1048576": 1 << 20, "1500007": 1_500_007}  # a power of two and a size that no block divides
N = 1 << 20  # size of the single-size tasks


def _spec(level1: str, level2: str, **fields) -> OpSpec:
    # Prompts are written as indented paragraphs here; the task holds them as one line each.
    return OpSpec(
        category=CATEGORY, level1=" ".join(level1.split()), level2=" ".join(level2.split()), **fields
    )


# ---------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------


def byte_histogram_global(tag: str) -> OpSpec:
    n = SIZES[tag]
    return _spec(
        op="byte_histogram_global_atomics",
        name="Byte_Histogram_Global_Atomics",
        split="train",
        variant=tag,
        description=f"Count how often each byte value 0..255 occurs in a uint8 array of {n} elements.",
        level1=f"""
            Write a CUDA kernel that computes the 256-bin histogram of a uint8 array `data` of n = {n}
            elements: hist[b] = number of i with data[i] == b, stored as int32. Use one thread per element
            with a bounds check i < n, and let each thread add 1 to hist[data[i]] with atomicAdd on global
            memory. The histogram must be zeroed before the kernel runs (cudaMemset). Launch with 256 threads
            per block.
            """,
        level2=f"Compute the 256-bin histogram (int32 counts) of a uint8 array of {n} elements.",
        inputs=[Buffer("data", "uint8", (n,))],
        outputs=[Buffer("hist", "int32", (256,))],
        constants=f"const int n = {n};",
        kernels="""
            // One thread per byte; the atomic makes concurrent increments of the same bin safe.
            __global__ void byte_histogram_global_kernel(const unsigned char* __restrict__ data,
                                                         int* __restrict__ hist, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) atomicAdd(&hist[data[i]], 1);
            }
            """,
        signatures=[
            "__global__ void byte_histogram_global_kernel(const unsigned char* __restrict__ data, "
            "int* __restrict__ hist, int n)"
        ],
        launch="""
            CUDA_CHECK(cudaMemset(d_hist, 0, 256 * sizeof(int)));
            {k}byte_histogram_global_kernel<<<(n + 255) / 256, 256>>>(d_data, d_hist, n);
            """,
        launch_note="The host zeroes hist with cudaMemset, then launches byte_histogram_global_kernel once with "
        "(n + 255) / 256 blocks of 256 threads, one thread per byte; the last block is partly used.",
        gen=f"""
            n = {n}
            # A clipped normal: a skewed histogram with hot bins (heavy atomic contention), like image data.
            data = np.clip(rng.normal(110.0, 45.0, n), 0, 255).astype(np.uint8)


            def reference(data):
                return np.bincount(data, minlength=256)


            hist_ref = reference(data).astype(np.int32)
            """,
    )


def byte_histogram_shared() -> OpSpec:
    n = N
    return _spec(
        op="byte_histogram_shared_privatized",
        name="Byte_Histogram_Shared_Privatized",
        split="train",
        description=f"Count how often each byte value 0..255 occurs in a uint8 array of {n} elements, "
        "using per-block shared-memory histograms.",
        level1=f"""
            Write a CUDA kernel that computes the 256-bin histogram of a uint8 array `data` of n = {n}
            elements (hist[b] = number of i with data[i] == b, int32). Privatize the histogram: each block
            zeroes a __shared__ int array of 256 bins, __syncthreads(), walks the input with a grid-stride
            loop adding 1 to its shared bins with atomicAdd, __syncthreads(), and finally adds each nonzero
            shared bin to the global histogram with one atomicAdd. Launch a fixed grid of 240 blocks of 256
            threads; hist is zeroed with cudaMemset before the kernel.
            """,
        level2=f"Compute the 256-bin histogram (int32 counts) of a uint8 array of {n} elements.",
        inputs=[Buffer("data", "uint8", (n,))],
        outputs=[Buffer("hist", "int32", (256,))],
        constants=f"const int n = {n};",
        kernels="""
            constexpr int HIST_BINS = 256;

            // Shared-memory atomics are far cheaper than global ones, and the global histogram then sees
            // at most 256 atomics per block instead of one per element.
            __global__ void byte_histogram_shared_kernel(const unsigned char* __restrict__ data,
                                                         int* __restrict__ hist, int n) {
                __shared__ int local[HIST_BINS];
                for (int b = threadIdx.x; b < HIST_BINS; b += blockDim.x) local[b] = 0;
                __syncthreads();
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
                    atomicAdd(&local[data[i]], 1);
                __syncthreads();  // all shared counts are final before the merge
                for (int b = threadIdx.x; b < HIST_BINS; b += blockDim.x)
                    if (local[b] != 0) atomicAdd(&hist[b], local[b]);
            }
            """,
        signatures=[
            "__global__ void byte_histogram_shared_kernel(const unsigned char* __restrict__ data, "
            "int* __restrict__ hist, int n)"
        ],
        launch="""
            CUDA_CHECK(cudaMemset(d_hist, 0, 256 * sizeof(int)));
            {k}byte_histogram_shared_kernel<<<240, 256>>>(d_data, d_hist, n);
            """,
        launch_note="The host zeroes hist with cudaMemset, then launches byte_histogram_shared_kernel once with "
        "a fixed grid of 240 blocks of 256 threads (far fewer threads than elements), so each "
        "thread must loop over the input with a grid stride.",
        gen=f"""
            n = {n}
            # Two overlapping bumps of byte values: uneven bins, some of them empty.
            bumps = np.where(rng.random(n) < 0.7, rng.normal(70.0, 20.0, n), rng.normal(190.0, 12.0, n))
            data = np.clip(bumps, 0, 255).astype(np.uint8)


            def reference(data):
                return np.bincount(data, minlength=256)


            hist_ref = reference(data).astype(np.int32)
            """,
    )


def label_bincount() -> OpSpec:
    n, classes = N, 1000
    return _spec(
        op="label_bincount",
        name="Label_Bincount",
        split="train",
        description=f"Count the occurrences of each class label 0..{classes - 1} in an int32 array of {n} labels.",
        level1=f"""
            Write a CUDA kernel that counts, for each class c in 0..{classes - 1}, how many of the n = {n}
            int32 labels equal c (counts is an int32 array of {classes}). Each block keeps a private count
            array of {classes} ints in shared memory: zero it with a loop over the bins (there are more bins
            than threads), __syncthreads(), accumulate its part of the labels with shared atomicAdd in a
            grid-stride loop, __syncthreads(), then add its nonzero bins to the global counts with atomicAdd.
            Launch a fixed grid of 256 blocks of 256 threads; counts is zeroed with cudaMemset first.
            """,
        level2=f"Count the occurrences of each label value 0..{classes - 1} (bincount, int32) in an array of "
        f"{n} int32 labels.",
        inputs=[Buffer("labels", "int32", (n,))],
        outputs=[Buffer("counts", "int32", (classes,))],
        constants=f"const int n = {n};\nconst int num_classes = {classes};",
        kernels=f"""
            constexpr int MAX_CLASSES = 1024;  // shared capacity; the task uses num_classes = {classes}

            // Privatized bincount: more bins than threads, so every bin loop strides by blockDim.x.
            __global__ void label_bincount_kernel(const int* __restrict__ labels, int* __restrict__ counts,
                                                  int n, int num_classes) {{
                __shared__ int local[MAX_CLASSES];
                for (int c = threadIdx.x; c < num_classes; c += blockDim.x) local[c] = 0;
                __syncthreads();
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
                    atomicAdd(&local[labels[i]], 1);
                __syncthreads();
                for (int c = threadIdx.x; c < num_classes; c += blockDim.x)
                    if (local[c] != 0) atomicAdd(&counts[c], local[c]);
            }}
            """,
        signatures=[
            "__global__ void label_bincount_kernel(const int* __restrict__ labels, "
            "int* __restrict__ counts, int n, int num_classes)"
        ],
        launch="""
            CUDA_CHECK(cudaMemset(d_counts, 0, num_classes * sizeof(int)));
            {k}label_bincount_kernel<<<256, 256>>>(d_labels, d_counts, n, num_classes);
            """,
        launch_note=f"The host zeroes counts with cudaMemset, then launches label_bincount_kernel once with a "
        f"fixed grid of 256 blocks of 256 threads (grid-stride over the labels); num_classes = "
        f"{classes}.",
        gen=f"""
            n, num_classes = {n}, {classes}
            # Power-law class frequencies (low labels are common), every class present.
            labels = (rng.power(0.5, n) * num_classes).astype(np.int32)
            labels[:num_classes] = np.arange(num_classes)
            rng.shuffle(labels)


            def reference(labels):
                return np.bincount(labels, minlength=num_classes)


            counts_ref = reference(labels).astype(np.int32)
            """,
    )


def float_max_atomic() -> OpSpec:
    n = N
    return _spec(
        op="float_array_max_atomic",
        name="Float_Array_Max_Atomic",
        split="train",
        description=f"Find the maximum of a float32 array of {n} elements with integer atomics on the float bits.",
        level1=f"""
            Write a CUDA kernel that computes max_val[0] = max_i x[i] over a float32 array of n = {n}
            elements (the values are negative). Each thread takes the max of its elements in a grid-stride
            loop (start at -FLT_MAX), the warp combines them with __shfl_xor_sync, and lane 0 of each warp
            applies its value with a single atomic. CUDA has no float atomicMax, so use the IEEE bit order:
            for v >= 0 use atomicMax on the bits as int; for v < 0 use atomicMin on the bits as unsigned
            int (negative floats order in reverse). The host presets max_val to the bit pattern 0xFFFFFFFF,
            which both rules treat as smaller than every float. Launch 256 blocks of 256 threads.
            """,
        level2=f"Compute the maximum of {n} float32 values (all negative) into a one-element output.",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("max_val", "float32", (1,))],
        constants=f"const int n = {n};",
        kernels="""
            // Float max with integer atomics. Non-negative floats order like their bits as signed ints;
            // negative floats order in reverse of their bits as unsigned ints. The start value 0xFFFFFFFF
            // is -1 as an int (below any v >= 0) and the largest unsigned (above any v < 0), so either
            // branch replaces it.
            __device__ __forceinline__ void atomic_max_float(float* addr, float v) {
                if (v >= 0.0f)
                    atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
                else
                    atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
            }

            __global__ void float_max_atomic_kernel(const float* __restrict__ x, float* __restrict__ max_val,
                                                    int n) {
                float m = -FLT_MAX;
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
                    m = fmaxf(m, x[i]);
                // Every lane reaches the shuffles (the loop is over), so the full mask is valid.
                for (int offset = 16; offset > 0; offset >>= 1)
                    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, offset));
                if ((threadIdx.x & 31) == 0) atomic_max_float(max_val, m);
            }
            """,
        signatures=[
            "__global__ void float_max_atomic_kernel(const float* __restrict__ x, "
            "float* __restrict__ max_val, int n)"
        ],
        launch="""
            CUDA_CHECK(cudaMemset(d_max_val, 0xFF, sizeof(float)));  // 0xFFFFFFFF: the "empty" start value
            {k}float_max_atomic_kernel<<<256, 256>>>(d_x, d_max_val, n);
            """,
        launch_note="The host first fills max_val with the byte 0xFF (bit pattern 0xFFFFFFFF, a NaN, meaning "
        "'no value yet'), then launches float_max_atomic_kernel once with a fixed grid of 256 "
        "blocks of 256 threads (grid-stride over x).",
        gen=f"""
            n = {n}
            # All negative: an atomicMax on the raw bits as int would pick the smallest value instead.
            x = (-0.5 - rng.gamma(2.0, 10.0, n)).astype(np.float32)


            def reference(x):
                return np.array([x.max()])


            max_val_ref = reference(x.astype(np.float64)).astype(np.float32)
            """,
    )


def segment_max_cas() -> OpSpec:
    n, segs = N, 4096
    return _spec(
        op="segment_max_atomic_cas",
        name="Segment_Max_AtomicCAS",
        split="train",
        description=f"Scatter-max {n} float32 values into {segs} segments given by an int32 segment id per value.",
        level1=f"""
            Compute seg_max[s] = max of values[i] over all i with segment_ids[i] == s, for n = {n} values
            and {segs} segments (every segment has at least one value). Use two kernels. The first sets
            every seg_max entry to -FLT_MAX (one thread per segment). The second uses one thread per value
            (bounds check i < n) and implements a float atomic max with an atomicCAS loop on the bits as
            int: read the current value, stop if it is already >= v, otherwise try to swap in v and retry
            with the value atomicCAS returned. Launch both with 256 threads per block.
            """,
        level2=f"Compute the maximum value per segment (scatter-max) of {n} float32 values with int32 segment "
        f"ids in [0, {segs}).",
        inputs=[Buffer("values", "float32", (n,)), Buffer("segment_ids", "int32", (n,))],
        outputs=[Buffer("seg_max", "float32", (segs,))],
        constants=f"const int n = {n};\nconst int num_segments = {segs};",
        kernels="""
            __global__ void segment_max_init_kernel(float* __restrict__ seg_max, int num_segments) {
                int s = blockIdx.x * blockDim.x + threadIdx.x;
                if (s < num_segments) seg_max[s] = -FLT_MAX;
            }

            // Float atomic max as a compare-and-swap loop: retry until our value is in place or a
            // larger one already is. atomicCAS returns the word it found, which feeds the next try.
            __device__ __forceinline__ void atomic_max_cas(float* addr, float v) {
                int* bits = reinterpret_cast<int*>(addr);
                int old = *bits;
                while (__int_as_float(old) < v) {
                    int assumed = old;
                    old = atomicCAS(bits, assumed, __float_as_int(v));
                    if (old == assumed) break;
                }
            }

            __global__ void segment_max_kernel(const float* __restrict__ values, const int* __restrict__ segment_ids,
                                               float* __restrict__ seg_max, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) atomic_max_cas(&seg_max[segment_ids[i]], values[i]);
            }
            """,
        signatures=[
            "__global__ void segment_max_init_kernel(float* __restrict__ seg_max, int num_segments)",
            "__global__ void segment_max_kernel(const float* __restrict__ values, const int* __restrict__ "
            "segment_ids, float* __restrict__ seg_max, int n)",
        ],
        launch="""
            {k}segment_max_init_kernel<<<(num_segments + 255) / 256, 256>>>(d_seg_max, num_segments);
            {k}segment_max_kernel<<<(n + 255) / 256, 256>>>(d_values, d_segment_ids, d_seg_max, n);
            """,
        launch_note="segment_max_init_kernel runs first with (num_segments + 255) / 256 blocks of 256 threads "
        "(one thread per segment, it must reset every entry), then segment_max_kernel with "
        "(n + 255) / 256 blocks of 256 threads, one thread per value.",
        gen=f"""
            n, num_segments = {n}, {segs}
            values = (rng.standard_normal(n) * 5.0).astype(np.float32)
            segment_ids = rng.integers(0, num_segments, n).astype(np.int32)
            segment_ids[:num_segments] = np.arange(num_segments)  # no segment is empty


            def reference(values, segment_ids):
                out = np.full(num_segments, -np.inf)
                np.maximum.at(out, segment_ids, values)
                return out


            seg_max_ref = reference(values.astype(np.float64), segment_ids).astype(np.float32)
            """,
    )


def scatter_add_buckets() -> OpSpec:
    n, buckets = N, 1024
    return _spec(
        op="scatter_add_buckets",
        name="Scatter_Add_Into_Buckets",
        split="train",
        description=f"Add {n} float32 values into {buckets} buckets given by an int32 bucket index per value.",
        level1=f"""
            Compute sums[b] = sum of values[i] over all i with bucket[i] == b, for n = {n} float32 values
            and {buckets} buckets. Use one thread per value with a bounds check i < n that does
            atomicAdd(&sums[bucket[i]], values[i]) on global memory; sums is zeroed with cudaMemset first.
            The order of the float additions is not fixed, so results match the reference only within a
            small tolerance. Launch with 256 threads per block.
            """,
        level2=f"Scatter-add {n} float32 values into {buckets} buckets given by an int32 bucket index per value.",
        inputs=[Buffer("values", "float32", (n,)), Buffer("bucket", "int32", (n,))],
        outputs=[Buffer("sums", "float32", (buckets,))],
        constants=f"const int n = {n};",
        kernels="""
            // One float atomicAdd per value: the hardware serializes colliding adds in arbitrary order.
            __global__ void scatter_add_buckets_kernel(const float* __restrict__ values, const int* __restrict__ bucket,
                                                       float* __restrict__ sums, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) atomicAdd(&sums[bucket[i]], values[i]);
            }
            """,
        signatures=[
            "__global__ void scatter_add_buckets_kernel(const float* __restrict__ values, "
            "const int* __restrict__ bucket, float* __restrict__ sums, int n)"
        ],
        launch=f"""
            CUDA_CHECK(cudaMemset(d_sums, 0, {buckets} * sizeof(float)));
            {{k}}scatter_add_buckets_kernel<<<(n + 255) / 256, 256>>>(d_values, d_bucket, d_sums, n);
            """,
        launch_note="The host zeroes sums with cudaMemset, then launches scatter_add_buckets_kernel once with "
        "(n + 255) / 256 blocks of 256 threads, one thread per value.",
        gen=f"""
            n, buckets = {n}, {buckets}
            values = rng.uniform(-1.0, 1.0, n).astype(np.float32)
            bucket = rng.integers(0, buckets, n).astype(np.int32)


            def reference(values, bucket):
                return np.bincount(bucket, weights=values, minlength=buckets)


            sums_ref = reference(values.astype(np.float64), bucket).astype(np.float32)
            """,
        # ~1024 adds per bucket, partial sums |s| <~ 60: float32 rounding ~1e-4 typical, a few 1e-3 worst.
        atol=1e-3,
        rtol=1e-4,
    )


def count_above_threshold(tag: str) -> OpSpec:
    n = SIZES[tag]
    return _spec(
        op="count_above_threshold",
        name="Count_Above_Threshold",
        split="train",
        variant=tag,
        description=f"Count the elements of a float32 array of {n} elements that are greater than 0.75.",
        level1=f"""
            Write a CUDA kernel that counts the elements x[i] > threshold (threshold = 0.75) of a float32
            array of n = {n} elements into count[0] (int32). Use warp votes: loop over the array in
            warp-sized chunks with a warp-uniform grid-stride loop so that all 32 lanes stay active, let
            each lane vote with __ballot_sync(0xffffffff, i < n && x[i] > threshold), add __popc of the
            ballot to a per-warp total, and have lane 0 do one atomicAdd of that total. count is zeroed
            with cudaMemset first. Launch a fixed grid of 1024 blocks of 256 threads.
            """,
        level2=f"Count how many of {n} float32 values are strictly greater than 0.75 (int32 result).",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("count", "int32", (1,))],
        constants=f"const int n = {n};\nconst float threshold = 0.75f;",
        kernels="""
            // Warp-vote count. The loop bound depends only on the warp's base index, so all 32 lanes run
            // the same iterations and __ballot_sync sees a full warp; lanes past n vote 0.
            __global__ void count_above_threshold_kernel(const float* __restrict__ x, int* __restrict__ count,
                                                         int n, float threshold) {
                int lane = threadIdx.x & 31;
                int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
                int num_warps = (gridDim.x * blockDim.x) >> 5;
                int total = 0;
                for (int base = warp * 32; base < n; base += num_warps * 32) {
                    int i = base + lane;
                    bool above = i < n && x[i] > threshold;
                    total += __popc(__ballot_sync(0xffffffff, above));
                }
                if (lane == 0 && total > 0) atomicAdd(count, total);
            }
            """,
        signatures=[
            "__global__ void count_above_threshold_kernel(const float* __restrict__ x, "
            "int* __restrict__ count, int n, float threshold)"
        ],
        launch="""
            CUDA_CHECK(cudaMemset(d_count, 0, sizeof(int)));
            {k}count_above_threshold_kernel<<<1024, 256>>>(d_x, d_count, n, threshold);
            """,
        launch_note="The host zeroes count with cudaMemset, then launches count_above_threshold_kernel once "
        "with a fixed grid of 1024 blocks of 256 threads (grid-stride over x); threshold = 0.75f.",
        gen=f"""
            n = {n}
            x = rng.standard_normal(n).astype(np.float32)
            threshold = np.float32(0.75)


            def reference(x):
                return np.array([np.count_nonzero(x > threshold)])


            count_ref = reference(x).astype(np.int32)  # compared in float32, exactly like the kernel
            """,
    )


def row_nonzero_count() -> OpSpec:
    rows, cols = 2048, 1000
    return _spec(
        op="row_nonzero_count",
        name="Row_Nonzero_Count",
        split="train",
        description=f"Count the nonzero entries of each row of a {rows}x{cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that computes counts[r] = number of nonzero entries in row r of a row-major
            float32 matrix a of {rows} rows and {cols} columns (int32 result, -0.0 counts as zero). Use a 2-D
            grid: blockIdx.y is the row, blockIdx.x a chunk of 256 columns, one thread per element with a
            bounds check col < cols. Count the block's nonzeros in a __shared__ int with shared atomicAdd
            (zero it and __syncthreads() first), __syncthreads(), then thread 0 adds the block count to
            counts[row] with one global atomicAdd. counts is zeroed with cudaMemset first.
            """,
        level2=f"Count the nonzero entries of each row of a {rows}x{cols} float32 matrix (int32 per row).",
        inputs=[Buffer("a", "float32", (rows, cols))],
        outputs=[Buffer("counts", "int32", (rows,))],
        constants=f"const int rows = {rows};\nconst int cols = {cols};",
        kernels="""
            // Two-level counting: shared atomics inside the block, one global atomic per block.
            __global__ void row_nonzero_count_kernel(const float* __restrict__ a, int* __restrict__ counts,
                                                     int rows, int cols) {
                __shared__ int block_count;
                if (threadIdx.x == 0) block_count = 0;
                __syncthreads();
                int row = blockIdx.y;
                int col = blockIdx.x * blockDim.x + threadIdx.x;
                if (row < rows && col < cols && a[(size_t)row * cols + col] != 0.0f) atomicAdd(&block_count, 1);
                __syncthreads();
                if (threadIdx.x == 0 && block_count > 0) atomicAdd(&counts[row], block_count);
            }
            """,
        signatures=[
            "__global__ void row_nonzero_count_kernel(const float* __restrict__ a, "
            "int* __restrict__ counts, int rows, int cols)"
        ],
        launch="""
            CUDA_CHECK(cudaMemset(d_counts, 0, rows * sizeof(int)));
            {k}row_nonzero_count_kernel<<<dim3((cols + 255) / 256, rows), 256>>>(d_a, d_counts, rows, cols);
            """,
        launch_note="The host zeroes counts with cudaMemset, then launches row_nonzero_count_kernel once with "
        "grid dim3((cols + 255) / 256, rows) and 256 threads per block: blockIdx.y is the row, "
        "blockIdx.x a chunk of 256 columns (the last chunk is partly used).",
        gen=f"""
            rows, cols = {rows}, {cols}
            # Sparse rows with a different density per row; the zeros are exact (some are -0.0).
            density = rng.uniform(0.05, 0.6, (rows, 1))
            a = (rng.standard_normal((rows, cols)) * (rng.random((rows, cols)) < density)).astype(np.float32)


            def reference(a):
                return np.count_nonzero(a, axis=1)


            counts_ref = reference(a).astype(np.int32)
            """,
    )


# ---------------------------------------------------------------------------------------
# eval (held-out operations)
# ---------------------------------------------------------------------------------------


def float_range_histogram() -> OpSpec:
    n, bins = N, 64
    return _spec(
        op="float_range_histogram_64",
        name="Float_Range_Histogram",
        split="eval",
        description=f"Histogram {n} float32 values into {bins} equal-width bins over [-4, 4), ignoring values "
        "outside the range.",
        level1=f"""
            Write a CUDA kernel that histograms a float32 array x of n = {n} values into {bins} equal-width
            bins over [lo, hi) = [-4, 4): a value v with lo <= v < hi goes to bin floor((v - lo) * {bins} /
            (hi - lo)); values outside the range are not counted. Privatize the histogram in shared memory
            ({bins} ints per block: zero, __syncthreads(), shared atomicAdd in a grid-stride loop,
            __syncthreads(), merge nonzero bins into the global int32 hist with atomicAdd). hist is zeroed
            with cudaMemset first. Launch 256 blocks of 256 threads.
            """,
        level2=f"Histogram {n} float32 values into {bins} equal-width bins over [-4, 4) (int32 counts; values "
        "outside the range are ignored).",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("hist", "int32", (bins,))],
        constants=f"const int n = {n};\nconst float lo = -4.0f;\nconst float hi = 4.0f;",
        kernels=f"""
            constexpr int RANGE_BINS = {bins};

            __global__ void float_range_histogram_kernel(const float* __restrict__ x, int* __restrict__ hist,
                                                         int n, float lo, float hi) {{
                __shared__ int local[RANGE_BINS];
                for (int b = threadIdx.x; b < RANGE_BINS; b += blockDim.x) local[b] = 0;
                __syncthreads();
                float scale = RANGE_BINS / (hi - lo);
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {{
                    float t = (x[i] - lo) * scale;
                    // Test t before the cast: (int) truncates toward zero, so t in (-1, 0) would become bin 0.
                    if (t >= 0.0f && t < RANGE_BINS) atomicAdd(&local[(int)t], 1);
                }}
                __syncthreads();
                for (int b = threadIdx.x; b < RANGE_BINS; b += blockDim.x)
                    if (local[b] != 0) atomicAdd(&hist[b], local[b]);
            }}
            """,
        signatures=[
            "__global__ void float_range_histogram_kernel(const float* __restrict__ x, "
            "int* __restrict__ hist, int n, float lo, float hi)"
        ],
        launch=f"""
            CUDA_CHECK(cudaMemset(d_hist, 0, {bins} * sizeof(int)));
            {{k}}float_range_histogram_kernel<<<256, 256>>>(d_x, d_hist, n, lo, hi);
            """,
        launch_note="The host zeroes hist with cudaMemset, then launches float_range_histogram_kernel once "
        "with a fixed grid of 256 blocks of 256 threads (grid-stride over x); lo = -4.0f, hi = 4.0f.",
        gen=f"""
            n, bins, lo, hi = {n}, {bins}, -4.0, 4.0
            # Multiples of 1/1024: (x - lo) * 8 is exact in float32, so the bin of every value (including
            # the ones on a bin edge) is the same on the GPU as here. About 5% fall outside [-4, 4).
            x = (np.round(rng.normal(0.0, 2.0, n) * 1024.0) / 1024.0).astype(np.float32)


            def reference(x):
                t = (x - lo) * (bins / (hi - lo))
                inside = (t >= 0) & (t < bins)
                return np.bincount(np.floor(t[inside]).astype(np.int64), minlength=bins)


            hist_ref = reference(x.astype(np.float64)).astype(np.int32)
            """,
    )


def argmax_packed() -> OpSpec:
    n = N
    return _spec(
        op="argmax_packed_atomic",
        name="Argmax_Packed_Atomic_Max",
        split="eval",
        description=f"Find the index of the largest element of a float32 array of {n} elements (first index on "
        "ties).",
        level1=f"""
            Find index[0] = the index of the maximum of a float32 array x of n = {n} elements (the smallest
            such index on ties) with a single 64-bit atomicMax. Map each float to an unsigned key that orders
            like the float (bits ^ 0x80000000 for v >= 0, ~bits for v < 0), pack (key << 32) | ~i (so a
            smaller index wins a tie), reduce each thread's grid-stride elements and then the warp
            (__shfl_down_sync of the 64-bit value), and let lane 0 atomicMax it into a 64-bit scratch word
            (zeroed with cudaMemset, 0 is below every packed value). A second kernel with one thread unpacks
            the index. Launch the first kernel with 256 blocks of 256 threads.
            """,
        level2=f"Compute the index (int32) of the maximum of {n} float32 values; on ties the smallest index.",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("index", "int32", (1,))],
        scratch=[Buffer("packed", "int64", (1,))],
        constants=f"const int n = {n};",
        kernels="""
            // Order-preserving map float -> uint32: flip the sign bit of non-negatives, all bits of negatives.
            __device__ __forceinline__ unsigned int ordered_bits(float v) {
                unsigned int u = __float_as_uint(v);
                return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
            }

            // (value key, ~index) packed in 64 bits: one atomicMax picks the largest value and, among
            // equal values, the smallest index.
            __global__ void argmax_packed_kernel(const float* __restrict__ x, long long* __restrict__ packed, int n) {
                unsigned long long best = 0;  // below every packed element
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
                    unsigned long long p = ((unsigned long long)ordered_bits(x[i]) << 32) | (unsigned int)(~i);
                    best = p > best ? p : best;
                }
                for (int offset = 16; offset > 0; offset >>= 1) {
                    unsigned long long other = __shfl_down_sync(0xffffffff, best, offset);
                    best = other > best ? other : best;
                }
                if ((threadIdx.x & 31) == 0) atomicMax(reinterpret_cast<unsigned long long*>(packed), best);
            }

            __global__ void argmax_unpack_kernel(const long long* __restrict__ packed, int* __restrict__ index) {
                index[0] = (int)(~(unsigned int)(packed[0] & 0xffffffffLL));
            }
            """,
        signatures=[
            "__global__ void argmax_packed_kernel(const float* __restrict__ x, long long* __restrict__ packed, "
            "int n)",
            "__global__ void argmax_unpack_kernel(const long long* __restrict__ packed, int* __restrict__ index)",
        ],
        launch="""
            CUDA_CHECK(cudaMemset(d_packed, 0, sizeof(long long)));
            {k}argmax_packed_kernel<<<256, 256>>>(d_x, d_packed, n);
            {k}argmax_unpack_kernel<<<1, 1>>>(d_packed, d_index);
            """,
        launch_note="The host zeroes the 64-bit scratch word packed with cudaMemset, launches "
        "argmax_packed_kernel with a fixed grid of 256 blocks of 256 threads (grid-stride over x), "
        "then argmax_unpack_kernel with 1 block of 1 thread, which writes index[0] from packed.",
        gen=f"""
            n = {n}
            x = (rng.standard_normal(n) * 10.0).astype(np.float32)


            def reference(x):
                return np.array([np.argmax(x)])  # first occurrence on ties


            index_ref = reference(x).astype(np.int32)
            assert index_ref[0] != 0  # an all-zero output would be rejected
            """,
    )


def per_class_mean() -> OpSpec:
    n, classes = N, 512
    return _spec(
        op="per_class_mean",
        name="Per_Class_Mean",
        split="eval",
        description=f"Compute the mean of the float32 values of each of {classes} classes, given {n} values "
        "with an int32 class label each.",
        level1=f"""
            Compute means[c] = (sum of values[i] with labels[i] == c) / (number of such i) for {classes}
            classes and n = {n} values (every class occurs). First kernel: each block accumulates per-class
            sums (float) and counts (int) in shared memory ({classes} of each; zero, __syncthreads(), shared
            atomicAdd over a grid-stride loop, __syncthreads()) and merges them into the scratch arrays
            class_sums and class_counts with global atomicAdd. Second kernel: one thread per class divides.
            The host zeroes both scratch arrays first. Launch 256 blocks of 256 threads, then
            ({classes} + 255) / 256 blocks of 256 threads.
            """,
        level2=f"Compute the per-class mean of {n} float32 values with int32 class labels in [0, {classes}).",
        inputs=[Buffer("values", "float32", (n,)), Buffer("labels", "int32", (n,))],
        outputs=[Buffer("means", "float32", (classes,))],
        scratch=[Buffer("class_sums", "float32", (classes,)), Buffer("class_counts", "int32", (classes,))],
        constants=f"const int n = {n};\nconst int num_classes = {classes};",
        kernels=f"""
            constexpr int MEAN_CLASSES = {classes};

            __global__ void class_sum_count_kernel(const float* __restrict__ values, const int* __restrict__ labels,
                                                   float* __restrict__ class_sums, int* __restrict__ class_counts,
                                                   int n) {{
                __shared__ float local_sum[MEAN_CLASSES];
                __shared__ int local_count[MEAN_CLASSES];
                for (int c = threadIdx.x; c < MEAN_CLASSES; c += blockDim.x) {{
                    local_sum[c] = 0.0f;
                    local_count[c] = 0;
                }}
                __syncthreads();
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {{
                    int c = labels[i];
                    atomicAdd(&local_sum[c], values[i]);
                    atomicAdd(&local_count[c], 1);
                }}
                __syncthreads();
                for (int c = threadIdx.x; c < MEAN_CLASSES; c += blockDim.x) {{
                    if (local_count[c] != 0) {{
                        atomicAdd(&class_sums[c], local_sum[c]);
                        atomicAdd(&class_counts[c], local_count[c]);
                    }}
                }}
            }}

            __global__ void class_mean_kernel(const float* __restrict__ class_sums,
                                              const int* __restrict__ class_counts, float* __restrict__ means,
                                              int num_classes) {{
                int c = blockIdx.x * blockDim.x + threadIdx.x;
                if (c < num_classes) means[c] = class_sums[c] / (float)class_counts[c];
            }}
            """,
        signatures=[
            "__global__ void class_sum_count_kernel(const float* __restrict__ values, const int* __restrict__ "
            "labels, float* __restrict__ class_sums, int* __restrict__ class_counts, int n)",
            "__global__ void class_mean_kernel(const float* __restrict__ class_sums, const int* __restrict__ "
            "class_counts, float* __restrict__ means, int num_classes)",
        ],
        launch="""
            CUDA_CHECK(cudaMemset(d_class_sums, 0, num_classes * sizeof(float)));
            CUDA_CHECK(cudaMemset(d_class_counts, 0, num_classes * sizeof(int)));
            {k}class_sum_count_kernel<<<256, 256>>>(d_values, d_labels, d_class_sums, d_class_counts, n);
            {k}class_mean_kernel<<<(num_classes + 255) / 256, 256>>>(d_class_sums, d_class_counts, d_means,
                                                                     num_classes);
            """,
        launch_note=f"The host zeroes the scratch arrays class_sums (float, {classes}) and class_counts (int, "
        f"{classes}) with cudaMemset, launches class_sum_count_kernel with a fixed grid of 256 blocks "
        "of 256 threads (grid-stride over the values), then class_mean_kernel with "
        "(num_classes + 255) / 256 blocks of 256 threads, one thread per class.",
        gen=f"""
            n, num_classes = {n}, {classes}
            labels = rng.integers(0, num_classes, n).astype(np.int32)
            labels[:num_classes] = np.arange(num_classes)  # every class occurs
            rng.shuffle(labels)
            values = (rng.uniform(0.0, 4.0, n) + labels * 0.01).astype(np.float32)


            def reference(values, labels):
                sums = np.bincount(labels, weights=values, minlength=num_classes)
                return sums / np.bincount(labels, minlength=num_classes)


            means_ref = reference(values.astype(np.float64), labels).astype(np.float32)
            """,
        # ~2048 values per class, sums ~4e3 accumulated in float32 in arbitrary order: relative error
        # ~1e-6 typical, < 1e-4 even for one global atomic per value.
        atol=1e-4,
        rtol=1e-4,
    )


# ---------------------------------------------------------------------------------------
# pretrain
# ---------------------------------------------------------------------------------------


def int_min_atomic() -> OpSpec:
    n = N
    return _spec(
        op="int_array_min_atomic",
        name="Int_Array_Min_Atomic",
        split="pretrain",
        description=f"Find the minimum of an int32 array of {n} elements with atomicMin.",
        level1=f"""
            Compute min_val[0] = min_i x[i] over an int32 array of n = {n} elements. Each thread takes the
            min of its grid-stride elements (start at 0x7fffffff), the warp reduces with __shfl_down_sync,
            and lane 0 applies atomicMin to min_val, which the host presets to 0x7F7F7F7F (cudaMemset with
            byte 0x7F, larger than every input). Launch 256 blocks of 256 threads.
            """,
        level2=f"Compute the minimum of {n} int32 values.",
        inputs=[Buffer("x", "int32", (n,))],
        outputs=[Buffer("min_val", "int32", (1,))],
        constants=f"const int n = {n};",
        kernels="""
            __global__ void int_min_atomic_kernel(const int* __restrict__ x, int* __restrict__ min_val, int n) {
                int m = 0x7fffffff;
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
                    m = min(m, x[i]);
                for (int offset = 16; offset > 0; offset >>= 1)
                    m = min(m, __shfl_down_sync(0xffffffff, m, offset));
                if ((threadIdx.x & 31) == 0) atomicMin(min_val, m);  // lane 0 holds the warp minimum
            }
            """,
        signatures=[
            "__global__ void int_min_atomic_kernel(const int* __restrict__ x, int* __restrict__ min_val, "
            "int n)"
        ],
        launch="""
            CUDA_CHECK(cudaMemset(d_min_val, 0x7F, sizeof(int)));  // 0x7F7F7F7F, above every input
            {k}int_min_atomic_kernel<<<256, 256>>>(d_x, d_min_val, n);
            """,
        launch_note="The host fills min_val with the byte 0x7F (0x7F7F7F7F, above every input), then launches "
        "int_min_atomic_kernel once with a fixed grid of 256 blocks of 256 threads (grid-stride).",
        gen=f"""
            n = {n}
            x = rng.integers(-1_000_000_000, 1_000_000_000, n).astype(np.int32)


            def reference(x):
                return np.array([x.min()])


            min_val_ref = reference(x).astype(np.int32)
            """,
    )


def even_odd_count() -> OpSpec:
    n = N
    return _spec(
        op="even_odd_count",
        name="Even_Odd_Count",
        split="pretrain",
        description=f"Count the even and the odd values of an int32 array of {n} elements.",
        level1=f"""
            Compute counts[0] = number of even values and counts[1] = number of odd values of an int32 array
            of n = {n} elements (negative values included; use x & 1). One thread per element with a bounds
            check; count into two __shared__ ints with shared atomicAdd, then threads 0 and 1 add them to
            counts with global atomicAdd. counts is zeroed with cudaMemset first. 256 threads per block.
            """,
        level2=f"Count the even and the odd values among {n} int32 values (two int32 counts).",
        inputs=[Buffer("x", "int32", (n,))],
        outputs=[Buffer("counts", "int32", (2,))],
        constants=f"const int n = {n};",
        kernels="""
            __global__ void even_odd_count_kernel(const int* __restrict__ x, int* __restrict__ counts, int n) {
                __shared__ int local[2];
                if (threadIdx.x < 2) local[threadIdx.x] = 0;
                __syncthreads();
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) atomicAdd(&local[x[i] & 1], 1);  // & 1 is also right for negative odd values
                __syncthreads();
                if (threadIdx.x < 2) atomicAdd(&counts[threadIdx.x], local[threadIdx.x]);
            }
            """,
        signatures=[
            "__global__ void even_odd_count_kernel(const int* __restrict__ x, int* __restrict__ counts, "
            "int n)"
        ],
        launch="""
            CUDA_CHECK(cudaMemset(d_counts, 0, 2 * sizeof(int)));
            {k}even_odd_count_kernel<<<(n + 255) / 256, 256>>>(d_x, d_counts, n);
            """,
        launch_note="The host zeroes counts with cudaMemset, then launches even_odd_count_kernel once with "
        "(n + 255) / 256 blocks of 256 threads, one thread per element.",
        gen=f"""
            n = {n}
            x = rng.integers(-1_000_000, 1_000_000, n).astype(np.int32)
            x[rng.random(n) < 0.2] *= 2  # more even than odd values


            def reference(x):
                odd = np.count_nonzero(x & 1)
                return np.array([x.size - odd, odd])


            counts_ref = reference(x).astype(np.int32)
            """,
    )


def specs() -> list[OpSpec]:
    sized = [byte_histogram_global(t) for t in SIZES] + [count_above_threshold(t) for t in SIZES]
    single = [
        byte_histogram_shared(),
        label_bincount(),
        float_max_atomic(),
        segment_max_cas(),
        scatter_add_buckets(),
        row_nonzero_count(),
        float_range_histogram(),
        argmax_packed(),
        per_class_mean(),
        int_min_atomic(),
        even_odd_count(),
    ]
    return sized + single
