"""Gather/scatter tasks: data movement by index, plus sorts and compaction that reorder data.

Indexed reads (gather, embedding lookup and bag sum, take-along-rows, index_select) and indexed writes
(scatter by a permutation, inverse permutation), dense expansions (one-hot, masked fill),
and reorderings whose result is fully determined: bitonic sort of independent 1024-element
tiles in shared memory, odd-even transposition sort of 32-element segments inside a warp,
and compaction of the indices of nonzero elements that keeps them in increasing order (block
counts, a scan of them, then a scatter with in-block ranks from warp ballots) and pads the
rest with a stated fill value. All outputs are exact copies of input values, indices or
constants, so the default tight tolerance applies; indices are int32.
"""

from __future__ import annotations

from taskgen.core import Buffer, OpSpec

CATEGORY = "gather_scatter"
SIZES = {"1048576": 1 << 20, "1500007": 1_500_007}  # a power of two and a size that no block divides


def _spec(level1: str, level2: str, **fields) -> OpSpec:
    # Prompts are written as indented paragraphs here; the task holds them as one line each.
    return OpSpec(
        category=CATEGORY, level1=" ".join(level1.split()), level2=" ".join(level2.split()), **fields
    )


# ---------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------


def gather_by_index(tag: str) -> OpSpec:
    n = SIZES[tag]
    return _spec(
        op="gather_by_index",
        name="Gather_By_Index",
        split="train",
        variant=tag,
        description=f"Gather y[i] = x[idx[i]] from a float32 array of {n} elements with an int32 index array.",
        level1=f"""
            Write a CUDA kernel that computes y[i] = x[idx[i]] for i < n = {n}, where x and y are float32
            arrays of n elements and idx is an int32 array of n random indices in [0, n) (with repeats).
            Use one thread per output element with a bounds check i < n; the idx reads and y writes are
            coalesced, the reads of x are random. Launch with 256 threads per block.
            """,
        level2=f"Gather y[i] = x[idx[i]] for float32 arrays of {n} elements and int32 indices in [0, {n}).",
        inputs=[Buffer("x", "float32", (n,)), Buffer("idx", "int32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels="""
            // One thread per output: coalesced index read and output write, random read of x.
            __global__ void gather_by_index_kernel(const float* __restrict__ x, const int* __restrict__ idx,
                                                   float* __restrict__ y, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) y[i] = x[idx[i]];
            }
            """,
        signatures=[
            "__global__ void gather_by_index_kernel(const float* __restrict__ x, const int* __restrict__ "
            "idx, float* __restrict__ y, int n)"
        ],
        launch="{k}gather_by_index_kernel<<<(n + 255) / 256, 256>>>(d_x, d_idx, d_y, n);",
        launch_note="gather_by_index_kernel is launched once with (n + 255) / 256 blocks of 256 threads, one "
        "thread per output element; the last block is only partly used.",
        gen=f"""
            n = {n}
            x = rng.standard_normal(n).astype(np.float32)
            idx = rng.integers(0, n, n).astype(np.int32)


            def reference(x, idx):
                return x[idx]


            y_ref = reference(x, idx)
            """,
    )


def scatter_by_permutation(tag: str) -> OpSpec:
    n = SIZES[tag]
    return _spec(
        op="scatter_by_permutation",
        name="Scatter_By_Permutation",
        split="train",
        variant=tag,
        description=f"Scatter y[perm[i]] = x[i] for a float32 array of {n} elements and a random permutation.",
        level1=f"""
            Write a CUDA kernel that scatters a float32 array x of n = {n} elements to y with y[perm[i]] =
            x[i], where perm is an int32 random permutation of 0..n-1 (so every y element is written exactly
            once). Use a grid-stride loop over i: the kernel is launched with a fixed grid of 1024 blocks of
            256 threads, fewer threads than elements.
            """,
        level2=f"Scatter y[perm[i]] = x[i] for {n} float32 values and an int32 permutation of 0..{n - 1}.",
        inputs=[Buffer("x", "float32", (n,)), Buffer("perm", "int32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels="""
            // Grid-stride scatter: coalesced reads, random writes; a permutation never writes a slot twice.
            __global__ void scatter_by_permutation_kernel(const float* __restrict__ x, const int* __restrict__ perm,
                                                          float* __restrict__ y, int n) {
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
                    y[perm[i]] = x[i];
            }
            """,
        signatures=[
            "__global__ void scatter_by_permutation_kernel(const float* __restrict__ x, "
            "const int* __restrict__ perm, float* __restrict__ y, int n)"
        ],
        launch="{k}scatter_by_permutation_kernel<<<1024, 256>>>(d_x, d_perm, d_y, n);",
        launch_note="scatter_by_permutation_kernel is launched once with a fixed grid of 1024 blocks of 256 "
        "threads (fewer threads than elements), so each thread must loop with a grid stride.",
        gen=f"""
            n = {n}
            x = rng.standard_normal(n).astype(np.float32)
            perm = rng.permutation(n).astype(np.int32)


            def reference(x, perm):
                y = np.empty_like(x)
                y[perm] = x
                return y


            y_ref = reference(x, perm)
            """,
    )


def embedding_lookup() -> OpSpec:
    vocab, dim, num_ids = 32768, 128, 8200
    return _spec(
        op="embedding_lookup",
        name="Embedding_Lookup",
        split="train",
        description=f"Look up {num_ids} rows of a {vocab}x{dim} float32 embedding table by int32 token id.",
        level1=f"""
            Write a CUDA kernel that copies embedding rows: out[t, :] = table[ids[t], :] for t < num_ids =
            {num_ids}, where table is a row-major float32 [{vocab}, {dim}] matrix and ids are int32 in
            [0, {vocab}). Use 2-D blocks of dim3(32, 8): threadIdx.y selects one of 8 tokens of the block
            (token = blockIdx.x * 8 + threadIdx.y, skip tokens >= num_ids), and the 32 threads along x copy
            the row as float4 (dim = {dim} floats = 32 float4, one 512-byte row per warp). Launch
            (num_ids + 7) / 8 blocks.
            """,
        level2=f"Embedding lookup: out[t] = table[ids[t]] for {num_ids} int32 ids and a {vocab}x{dim} float32 "
        "table.",
        inputs=[Buffer("table", "float32", (vocab, dim)), Buffer("ids", "int32", (num_ids,))],
        outputs=[Buffer("out", "float32", (num_ids, dim))],
        constants=f"const int num_ids = {num_ids};\nconst int dim = {dim};",
        kernels="""
            // float4 copies: dim is a multiple of 4 and rows start on 16-byte boundaries (cudaMalloc
            // alignment, dim * 4 bytes per row), so each warp moves a whole row in one wide access.
            __global__ void embedding_lookup_kernel(const float* __restrict__ table, const int* __restrict__ ids,
                                                    float* __restrict__ out, int num_ids, int dim) {
                int token = blockIdx.x * blockDim.y + threadIdx.y;
                if (token >= num_ids) return;
                const float4* src = reinterpret_cast<const float4*>(table + (size_t)ids[token] * dim);
                float4* dst = reinterpret_cast<float4*>(out + (size_t)token * dim);
                for (int c = threadIdx.x; c < dim / 4; c += blockDim.x) dst[c] = src[c];
            }
            """,
        signatures=[
            "__global__ void embedding_lookup_kernel(const float* __restrict__ table, "
            "const int* __restrict__ ids, float* __restrict__ out, int num_ids, int dim)"
        ],
        launch="{k}embedding_lookup_kernel<<<(num_ids + 7) / 8, dim3(32, 8)>>>(d_table, d_ids, d_out, num_ids, dim);",
        launch_note="embedding_lookup_kernel is launched once with (num_ids + 7) / 8 blocks of dim3(32, 8) "
        "threads: threadIdx.y picks one of the block's 8 tokens (the last block has tokens past "
        "num_ids), threadIdx.x walks the row.",
        gen=f"""
            vocab, dim, num_ids = {vocab}, {dim}, {num_ids}
            table = rng.standard_normal((vocab, dim)).astype(np.float32)
            ids = rng.integers(0, vocab, num_ids).astype(np.int32)


            def reference(table, ids):
                return table[ids]


            out_ref = reference(table, ids)
            """,
    )


def one_hot() -> OpSpec:
    rows, classes = 10486, 100
    return _spec(
        op="one_hot_encode",
        name="One_Hot_Encoding",
        split="train",
        description=f"Expand {rows} int32 class labels into a {rows}x{classes} float32 one-hot matrix.",
        level1=f"""
            Write a CUDA kernel that writes out[r, c] = 1.0f if labels[r] == c else 0.0f for r < rows =
            {rows} and c < num_classes = {classes} (row-major float32 output; every element is written).
            Use a 2-D grid of 2-D blocks dim3(32, 8): x runs over classes, y over rows, one thread per
            output element with bounds checks on both (neither size is a multiple of the block size).
            """,
        level2=f"One-hot encode {rows} int32 labels in [0, {classes}) into a {rows}x{classes} float32 matrix.",
        inputs=[Buffer("labels", "int32", (rows,))],
        outputs=[Buffer("out", "float32", (rows, classes))],
        constants=f"const int rows = {rows};\nconst int num_classes = {classes};",
        kernels="""
            // threadIdx.x runs along a row of the output, so consecutive threads write consecutive floats.
            __global__ void one_hot_kernel(const int* __restrict__ labels, float* __restrict__ out, int rows,
                                           int num_classes) {
                int c = blockIdx.x * blockDim.x + threadIdx.x;
                int r = blockIdx.y * blockDim.y + threadIdx.y;
                if (r < rows && c < num_classes)
                    out[(size_t)r * num_classes + c] = labels[r] == c ? 1.0f : 0.0f;
            }
            """,
        signatures=[
            "__global__ void one_hot_kernel(const int* __restrict__ labels, float* __restrict__ out, "
            "int rows, int num_classes)"
        ],
        launch="""
            {k}one_hot_kernel<<<dim3((num_classes + 31) / 32, (rows + 7) / 8), dim3(32, 8)>>>(d_labels, d_out, rows,
                                                                                       num_classes);
            """,
        launch_note="one_hot_kernel is launched once with grid dim3((num_classes + 31) / 32, (rows + 7) / 8) "
        "and blocks dim3(32, 8): x indexes the class (column), y the row; edge blocks are partly "
        "outside the matrix.",
        gen=f"""
            rows, num_classes = {rows}, {classes}
            labels = rng.integers(0, num_classes, rows).astype(np.int32)


            def reference(labels):
                return labels[:, None] == np.arange(num_classes)[None, :]


            out_ref = reference(labels).astype(np.float32)
            """,
    )


def bitonic_sort_tiles() -> OpSpec:
    n = 1_000_000  # 976 full tiles and a last tile of 576 elements
    return _spec(
        op="bitonic_sort_tiles_1024",
        name="Bitonic_Sort_Tiles_1024",
        split="train",
        description=f"Sort each consecutive tile of 1024 elements of a float32 array of {n} elements "
        "independently, ascending.",
        level1=f"""
            Split a float32 array x of n = {n} elements into consecutive tiles of 1024 (the last tile has
            only {n % 1024} elements) and sort every tile independently in ascending order into y. Use one
            block of 512 threads per tile: load the tile into a __shared__ float[1024] (pad missing elements
            of the last tile with +INFINITY so they sort to the end), run a bitonic sorting network in which
            each thread performs one compare-exchange per step, with __syncthreads() after every step, and
            write back only the elements with index < n.
            """,
        level2=f"Sort each consecutive 1024-element tile of a float32 array of {n} elements ascending "
        f"(independently; the last tile has {n % 1024} elements).",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels="""
            constexpr int SORT_TILE = 1024;

            // Bitonic sort of one tile in shared memory; blockDim.x == SORT_TILE / 2, so each of the 512
            // threads owns exactly one compare-exchange pair in every step.
            __global__ void bitonic_sort_tiles_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
                __shared__ float tile[SORT_TILE];
                int base = blockIdx.x * SORT_TILE;
                for (int t = threadIdx.x; t < SORT_TILE; t += blockDim.x) {
                    int i = base + t;
                    tile[t] = i < n ? x[i] : INFINITY;  // padding sorts to the end and is never written
                }
                __syncthreads();
                for (int size = 2; size <= SORT_TILE; size <<= 1) {
                    for (int stride = size >> 1; stride > 0; stride >>= 1) {
                        // Pair (lo, lo + stride): insert a 0 bit into the thread index at bit `stride`.
                        int t = threadIdx.x;
                        int lo = 2 * t - (t & (stride - 1));
                        int hi = lo + stride;
                        bool ascending = (lo & size) == 0;  // direction of the bitonic run being merged
                        float a = tile[lo], b = tile[hi];
                        if ((a > b) == ascending) {
                            tile[lo] = b;
                            tile[hi] = a;
                        }
                        __syncthreads();
                    }
                }
                for (int t = threadIdx.x; t < SORT_TILE; t += blockDim.x) {
                    int i = base + t;
                    if (i < n) y[i] = tile[t];
                }
            }
            """,
        signatures=[
            "__global__ void bitonic_sort_tiles_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int n)"
        ],
        launch="{k}bitonic_sort_tiles_kernel<<<(n + 1023) / 1024, 512>>>(d_x, d_y, n);",
        launch_note="bitonic_sort_tiles_kernel is launched once with (n + 1023) / 1024 blocks of 512 threads, "
        "one block per 1024-element tile; the last tile is partial.",
        gen=f"""
            n, tile = {n}, 1024
            x = (rng.standard_normal(n) * 100.0).astype(np.float32)


            def reference(x):
                padded = np.full(-(-n // tile) * tile, np.inf, dtype=x.dtype)
                padded[:n] = x
                return np.sort(padded.reshape(-1, tile), axis=1).reshape(-1)[:n]


            y_ref = reference(x)
            """,
    )


def odd_even_sort_segments() -> OpSpec:
    n = 1_000_003  # the last 32-element segment holds only 3 elements
    return _spec(
        op="odd_even_sort_segments_32",
        name="Odd_Even_Sort_Segments_32",
        split="train",
        description=f"Sort each consecutive 32-element segment of a float32 array of {n} elements ascending "
        "with odd-even transposition.",
        level1=f"""
            Split a float32 array x of n = {n} elements into consecutive segments of 32 (the last one has
            only {n % 32} elements) and sort each segment ascending into y. Map one segment to one warp (one
            thread per element, 256 threads per block) and run 32 phases of odd-even transposition sort in
            registers: in even phases lanes (0,1), (2,3), ... compare-exchange, in odd phases lanes (1,2),
            (3,4), ...; get the partner's value with __shfl_sync(0xffffffff, v, partner) and keep the min on
            the lower lane, the max on the upper lane. All 32 lanes must take part in every shuffle, so lanes
            past n carry +INFINITY instead of returning early, and only lanes with i < n write.
            """,
        level2=f"Sort each consecutive 32-element segment of a float32 array of {n} elements ascending (the "
        f"last segment has {n % 32} elements).",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels="""
            // Odd-even transposition sort of a 32-element segment held one value per lane of a warp.
            // 32 phases sort 32 values; every lane executes every shuffle (no early exit).
            __global__ void odd_even_sort_segments_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                int lane = threadIdx.x & 31;
                float v = i < n ? x[i] : INFINITY;
                for (int phase = 0; phase < 32; ++phase) {
                    // Even phases pair (0,1), (2,3), ...; odd phases pair (1,2), ..., (29,30): 0 and 31 idle.
                    int partner = (lane & 1) == (phase & 1) ? lane + 1 : lane - 1;
                    if (partner < 0 || partner > 31) partner = lane;
                    float other = __shfl_sync(0xffffffff, v, partner);
                    if (partner > lane) v = fminf(v, other);
                    else if (partner < lane) v = fmaxf(v, other);
                }
                if (i < n) y[i] = v;
            }
            """,
        signatures=[
            "__global__ void odd_even_sort_segments_kernel(const float* __restrict__ x, "
            "float* __restrict__ y, int n)"
        ],
        launch="{k}odd_even_sort_segments_kernel<<<(n + 255) / 256, 256>>>(d_x, d_y, n);",
        launch_note="odd_even_sort_segments_kernel is launched once with (n + 255) / 256 blocks of 256 threads, "
        "one thread per element, so each warp holds one 32-element segment; the last warp is only "
        "partly inside the array.",
        gen=f"""
            n, seg = {n}, 32
            x = rng.uniform(-1000.0, 1000.0, n).astype(np.float32)


            def reference(x):
                padded = np.full(-(-n // seg) * seg, np.inf, dtype=x.dtype)
                padded[:n] = x
                return np.sort(padded.reshape(-1, seg), axis=1).reshape(-1)[:n]


            y_ref = reference(x)
            """,
    )


def nonzero_index_compaction() -> OpSpec:
    n = 1_000_001
    blocks = (n + 1023) // 1024
    return _spec(
        op="nonzero_index_compaction",
        name="Nonzero_Index_Compaction",
        split="pretrain",
        description=f"Write the indices of the nonzero elements of a float32 array of {n} elements, in increasing "
        "order, to the front of an int32 output, fill the rest with -1, and output their count.",
        level1=f"""
            Stream compaction of indices (like numpy flatnonzero): for a float32 array x of n = {n} elements,
            indices[0..count) holds, in increasing order, every i with x[i] != 0 (-0.0 counts as zero),
            indices[count..n) = -1, and count[0] is the number of nonzeros (all int32). Use three kernels with
            1024-thread blocks, one element per thread: (1) each block counts its nonzeros (e.g. with
            __syncthreads_count) into block_counts[blockIdx.x]; (2) one block of 1024 threads computes the
            exclusive prefix sum of the {blocks} block counts into block_offsets (warp scans with
            __shfl_up_sync, then a scan of the warp totals; loop in chunks of 1024 with a running carry) and
            writes the total to count[0]; (3) each block ranks its nonzeros with __ballot_sync and __popc
            (rank inside the warp plus the counts of the earlier warps), writes
            indices[block_offsets[blockIdx.x] + rank] = i, and every thread with count[0] <= i < n writes
            the fill -1.
            """,
        level2=f"Write the indices of the nonzero elements of a float32 array of {n} elements, in increasing "
        "order, to the front of an int32 array of the same length, fill the remaining positions with -1, "
        "and output the number of nonzeros (int32).",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("indices", "int32", (n,)), Buffer("count", "int32", (1,))],
        scratch=[Buffer("block_counts", "int32", (blocks,)), Buffer("block_offsets", "int32", (blocks,))],
        constants=f"const int n = {n};\nconst int num_blocks = (n + 1023) / 1024;",
        kernels="""
            // Pass 1: nonzeros per block; __syncthreads_count is a block-wide vote.
            __global__ void nonzero_count_kernel(const float* __restrict__ x, int* __restrict__ block_counts, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                int kept = __syncthreads_count(i < n && x[i] != 0.0f);
                if (threadIdx.x == 0) block_counts[blockIdx.x] = kept;
            }

            // Pass 2 (one block): exclusive scan of the block counts, 1024 at a time with a running carry.
            __global__ void nonzero_offsets_kernel(const int* __restrict__ block_counts, int* __restrict__ block_offsets,
                                                   int* __restrict__ count, int num_blocks) {
                __shared__ int warp_sums[32];
                __shared__ int carry;
                int lane = threadIdx.x & 31;
                int warp = threadIdx.x >> 5;
                if (threadIdx.x == 0) carry = 0;
                __syncthreads();
                for (int base = 0; base < num_blocks; base += blockDim.x) {
                    int i = base + threadIdx.x;
                    int v = i < num_blocks ? block_counts[i] : 0;
                    int s = v;  // inclusive scan inside the warp
                    for (int d = 1; d < 32; d <<= 1) {
                        int up = __shfl_up_sync(0xffffffff, s, d);
                        if (lane >= d) s += up;
                    }
                    if (lane == 31) warp_sums[warp] = s;
                    __syncthreads();
                    if (warp == 0) {  // inclusive scan of the warp totals by the (whole) first warp
                        int w = lane < (int)(blockDim.x >> 5) ? warp_sums[lane] : 0;
                        for (int d = 1; d < 32; d <<= 1) {
                            int up = __shfl_up_sync(0xffffffff, w, d);
                            if (lane >= d) w += up;
                        }
                        warp_sums[lane] = w;
                    }
                    __syncthreads();
                    int exclusive = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + s - v;
                    if (i < num_blocks) block_offsets[i] = exclusive;
                    __syncthreads();  // carry and warp_sums are read by all before they change
                    if (threadIdx.x == blockDim.x - 1) carry = exclusive + v;
                    __syncthreads();
                }
                if (threadIdx.x == 0) count[0] = carry;
            }

            // Pass 3: rank = nonzeros before this one in the block (earlier warps + earlier lanes), so the
            // indices come out in increasing order; positions from count on get the fill value.
            __global__ void nonzero_scatter_kernel(const float* __restrict__ x, const int* __restrict__ block_offsets,
                                                   const int* __restrict__ count, int* __restrict__ indices, int n) {
                __shared__ int warp_counts[32];
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                int lane = threadIdx.x & 31;
                int warp = threadIdx.x >> 5;
                bool keep = i < n && x[i] != 0.0f;
                unsigned int ballot = __ballot_sync(0xffffffff, keep);
                if (lane == 0) warp_counts[warp] = __popc(ballot);
                __syncthreads();
                if (keep) {
                    int offset = block_offsets[blockIdx.x];
                    for (int w = 0; w < warp; ++w) offset += warp_counts[w];
                    offset += __popc(ballot & ((1u << lane) - 1u));
                    indices[offset] = i;
                }
                if (i < n && i >= count[0]) indices[i] = -1;
            }
            """,
        signatures=[
            "__global__ void nonzero_count_kernel(const float* __restrict__ x, int* __restrict__ block_counts, "
            "int n)",
            "__global__ void nonzero_offsets_kernel(const int* __restrict__ block_counts, int* __restrict__ "
            "block_offsets, int* __restrict__ count, int num_blocks)",
            "__global__ void nonzero_scatter_kernel(const float* __restrict__ x, const int* __restrict__ "
            "block_offsets, const int* __restrict__ count, int* __restrict__ indices, int n)",
        ],
        launch="""
            {k}nonzero_count_kernel<<<num_blocks, 1024>>>(d_x, d_block_counts, n);
            {k}nonzero_offsets_kernel<<<1, 1024>>>(d_block_counts, d_block_offsets, d_count, num_blocks);
            {k}nonzero_scatter_kernel<<<num_blocks, 1024>>>(d_x, d_block_offsets, d_count, d_indices, n);
            """,
        launch_note=f"Three kernels run in order, all with 1024 threads per block: nonzero_count_kernel with "
        f"num_blocks = (n + 1023) / 1024 = {blocks} blocks (one element per thread), "
        f"nonzero_offsets_kernel with 1 block, then nonzero_scatter_kernel with num_blocks blocks. "
        f"block_counts and block_offsets are int scratch arrays of num_blocks entries; "
        f"nonzero_scatter_kernel reads the total from count.",
        gen=f"""
            n = {n}
            # About 40% nonzeros; the zeros are exact and some are -0.0, which also counts as zero.
            x = (rng.standard_normal(n) * (rng.random(n) < 0.4)).astype(np.float32)


            def reference(x):
                nonzero = np.flatnonzero(x)
                indices = np.full(n, -1, dtype=np.int32)
                indices[:nonzero.size] = nonzero
                return indices, np.array([nonzero.size], dtype=np.int32)


            indices_ref, count_ref = reference(x)
            """,
    )


# ---------------------------------------------------------------------------------------
# eval (held-out operations)
# ---------------------------------------------------------------------------------------


def take_along_rows() -> OpSpec:
    rows, src_cols, cols = 1024, 1500, 1000
    return _spec(
        op="take_along_rows",
        name="Take_Along_Rows",
        split="eval",
        description=f"Gather y[r, j] = x[r, idx[r, j]] from a {rows}x{src_cols} float32 matrix with a "
        f"{rows}x{cols} int32 index matrix.",
        level1=f"""
            Write a CUDA kernel for take-along-axis on rows: y[r, j] = x[r, idx[r, j]] where x is a row-major
            float32 [{rows}, {src_cols}] matrix, idx an int32 [{rows}, {cols}] matrix of column indices in
            [0, {src_cols}), and y a float32 [{rows}, {cols}] matrix (note the different row lengths of x and
            y). Use a 2-D grid: blockIdx.y is the row, blockIdx.x a chunk of 256 output columns, one thread
            per output element with a bounds check j < {cols}.
            """,
        level2=f"Compute y[r, j] = x[r, idx[r, j]] for a {rows}x{src_cols} float32 matrix x and a {rows}x{cols} "
        "int32 index matrix.",
        inputs=[Buffer("x", "float32", (rows, src_cols)), Buffer("idx", "int32", (rows, cols))],
        outputs=[Buffer("y", "float32", (rows, cols))],
        constants=f"const int rows = {rows};\nconst int src_cols = {src_cols};\nconst int cols = {cols};",
        kernels="""
            __global__ void take_along_rows_kernel(const float* __restrict__ x, const int* __restrict__ idx,
                                                   float* __restrict__ y, int rows, int src_cols, int cols) {
                int r = blockIdx.y;
                int j = blockIdx.x * blockDim.x + threadIdx.x;
                if (r < rows && j < cols) {
                    size_t out = (size_t)r * cols + j;  // idx and y share the [rows, cols] layout
                    y[out] = x[(size_t)r * src_cols + idx[out]];
                }
            }
            """,
        signatures=[
            "__global__ void take_along_rows_kernel(const float* __restrict__ x, const int* __restrict__ "
            "idx, float* __restrict__ y, int rows, int src_cols, int cols)"
        ],
        launch="{k}take_along_rows_kernel<<<dim3((cols + 255) / 256, rows), 256>>>(d_x, d_idx, d_y, rows, "
        "src_cols, cols);",
        launch_note="take_along_rows_kernel is launched once with grid dim3((cols + 255) / 256, rows) and 256 "
        "threads per block: blockIdx.y is the row, blockIdx.x a chunk of 256 output columns (the "
        "last chunk is partly used).",
        gen=f"""
            rows, src_cols, cols = {rows}, {src_cols}, {cols}
            x = rng.standard_normal((rows, src_cols)).astype(np.float32)
            idx = rng.integers(0, src_cols, (rows, cols)).astype(np.int32)


            def reference(x, idx):
                return np.take_along_axis(x, idx, axis=1)


            y_ref = reference(x, idx)
            """,
    )


def embedding_bag_sum() -> OpSpec:
    vocab, dim, num_bags, bag = 16384, 128, 8192, 8
    return _spec(
        op="embedding_bag_sum",
        name="Embedding_Bag_Sum",
        split="eval",
        description=f"Sum the rows of a {vocab}x{dim} float32 embedding table selected by each of {num_bags} bags "
        f"of {bag} int32 token ids.",
        level1=f"""
            Write a CUDA kernel for an embedding bag with sum pooling: out[b, d] = sum over k < {bag} of
            table[ids[b, k], d], where table is a row-major float32 [{vocab}, {dim}] matrix, ids an int32
            [{num_bags}, {bag}] matrix of row indices in [0, {vocab}) (repeats allowed), and out a float32
            [{num_bags}, {dim}] matrix. Use one block of {dim} threads per bag, one thread per column d: each
            thread adds the {bag} selected rows' values at column d in a register (k in increasing order), so
            the reads of every table row are coalesced, and writes out[b, d] once.
            """,
        level2=f"Embedding bag (sum): for each of {num_bags} bags of {bag} int32 ids, sum the selected rows of a "
        f"{vocab}x{dim} float32 table.",
        inputs=[Buffer("table", "float32", (vocab, dim)), Buffer("ids", "int32", (num_bags, bag))],
        outputs=[Buffer("out", "float32", (num_bags, dim))],
        constants=f"const int num_bags = {num_bags};\nconst int bag_size = {bag};\nconst int dim = {dim};",
        kernels="""
            // Block = bag, thread = column: the bag's ids are the same for all threads (broadcast reads),
            // and each selected row is read by consecutive threads (coalesced).
            __global__ void embedding_bag_sum_kernel(const float* __restrict__ table, const int* __restrict__ ids,
                                                     float* __restrict__ out, int bag_size, int dim) {
                int b = blockIdx.x;
                for (int d = threadIdx.x; d < dim; d += blockDim.x) {
                    float acc = 0.0f;
                    for (int k = 0; k < bag_size; ++k) acc += table[(size_t)ids[b * bag_size + k] * dim + d];
                    out[(size_t)b * dim + d] = acc;
                }
            }
            """,
        signatures=[
            "__global__ void embedding_bag_sum_kernel(const float* __restrict__ table, "
            "const int* __restrict__ ids, float* __restrict__ out, int bag_size, int dim)"
        ],
        launch="{k}embedding_bag_sum_kernel<<<num_bags, dim>>>(d_table, d_ids, d_out, bag_size, dim);",
        launch_note=f"embedding_bag_sum_kernel is launched once with one block per bag (num_bags = {num_bags} "
        f"blocks) of dim = {dim} threads, one thread per embedding column; bag_size = {bag}.",
        gen=f"""
            vocab, dim, num_bags, bag_size = {vocab}, {dim}, {num_bags}, {bag}
            table = rng.standard_normal((vocab, dim)).astype(np.float32)
            ids = rng.integers(0, vocab, (num_bags, bag_size)).astype(np.int32)


            def reference(table, ids):
                return table[ids].sum(axis=1)  # [num_bags, bag_size, dim] -> [num_bags, dim]


            out_ref = reference(table.astype(np.float64), ids).astype(np.float32)
            """,
        # 8 float32 adds of N(0, 1) values: rounding error < 4e-6.
        atol=1e-5,
        rtol=1e-5,
    )


def inverse_permutation() -> OpSpec:
    n = 1 << 20
    return _spec(
        op="inverse_permutation",
        name="Inverse_Permutation",
        split="eval",
        description=f"Invert an int32 permutation of {n} elements: inv[perm[i]] = i.",
        level1=f"""
            Write a CUDA kernel that inverts a permutation: for an int32 permutation perm of 0..n-1 with
            n = {n}, write inv[perm[i]] = i (int32). Use one thread per i with a bounds check i < n; every
            inv element is written exactly once, so no atomics are needed. Launch with 256 threads per block.
            """,
        level2=f"Compute the inverse of an int32 permutation of {n} elements (inv[perm[i]] = i).",
        inputs=[Buffer("perm", "int32", (n,))],
        outputs=[Buffer("inv", "int32", (n,))],
        constants=f"const int n = {n};",
        kernels="""
            // A scatter of the thread index: coalesced read of perm, random writes into inv.
            __global__ void inverse_permutation_kernel(const int* __restrict__ perm, int* __restrict__ inv, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) inv[perm[i]] = i;
            }
            """,
        signatures=[
            "__global__ void inverse_permutation_kernel(const int* __restrict__ perm, int* __restrict__ "
            "inv, int n)"
        ],
        launch="{k}inverse_permutation_kernel<<<(n + 255) / 256, 256>>>(d_perm, d_inv, n);",
        launch_note="inverse_permutation_kernel is launched once with (n + 255) / 256 blocks of 256 threads, one "
        "thread per element of perm.",
        gen=f"""
            n = {n}
            perm = rng.permutation(n).astype(np.int32)


            def reference(perm):
                return np.argsort(perm)


            inv_ref = reference(perm).astype(np.int32)
            """,
    )


# ---------------------------------------------------------------------------------------
# pretrain
# ---------------------------------------------------------------------------------------


def masked_fill() -> OpSpec:
    n = 1 << 20
    return _spec(
        op="masked_fill",
        name="Masked_Fill",
        split="pretrain",
        description=f"Replace the elements of a float32 array of {n} elements where a uint8 mask is nonzero "
        "with -10000.",
        level1=f"""
            Write a CUDA kernel that computes y[i] = fill if mask[i] != 0 else x[i] for float32 x and y and a
            uint8 mask of n = {n} elements, with fill = -10000.0f passed as a kernel argument. Use a
            grid-stride loop: the kernel is launched with a fixed grid of 1024 blocks of 256 threads.
            """,
        level2=f"Masked fill: y = x where mask == 0, else -10000, for {n} float32 values and a uint8 mask.",
        inputs=[Buffer("x", "float32", (n,)), Buffer("mask", "uint8", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};\nconst float fill = -10000.0f;",
        kernels="""
            __global__ void masked_fill_kernel(const float* __restrict__ x, const unsigned char* __restrict__ mask,
                                               float* __restrict__ y, int n, float fill) {
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
                    y[i] = mask[i] ? fill : x[i];
            }
            """,
        signatures=[
            "__global__ void masked_fill_kernel(const float* __restrict__ x, const unsigned char* "
            "__restrict__ mask, float* __restrict__ y, int n, float fill)"
        ],
        launch="{k}masked_fill_kernel<<<1024, 256>>>(d_x, d_mask, d_y, n, fill);",
        launch_note="masked_fill_kernel is launched once with a fixed grid of 1024 blocks of 256 threads (fewer "
        "threads than elements, so loop with a grid stride); fill = -10000.0f.",
        gen=f"""
            n = {n}
            x = rng.standard_normal(n).astype(np.float32)
            mask = (rng.random(n) < 0.3).astype(np.uint8)


            def reference(x, mask):
                return np.where(mask != 0, -10000.0, x)


            y_ref = reference(x, mask).astype(np.float32)
            """,
    )


def index_select_columns() -> OpSpec:
    rows, src_cols, cols = 1024, 2048, 1000
    return _spec(
        op="index_select_columns",
        name="Index_Select_Columns",
        split="pretrain",
        description=f"Select {cols} columns (int32 indices, repeats allowed) of a {rows}x{src_cols} float32 matrix.",
        level1=f"""
            Write a CUDA kernel that computes y[r, j] = x[r, cols[j]] for a row-major float32 matrix x of
            [{rows}, {src_cols}], an int32 array cols of {cols} column indices in [0, {src_cols}), and y of
            [{rows}, {cols}]. Use one block of 256 threads per row that loops over j with a stride of
            blockDim.x.
            """,
        level2=f"Select columns: y[r, j] = x[r, cols[j]] for a {rows}x{src_cols} float32 matrix and {cols} int32 "
        "column indices.",
        inputs=[Buffer("x", "float32", (rows, src_cols)), Buffer("cols", "int32", (cols,))],
        outputs=[Buffer("y", "float32", (rows, cols))],
        constants=f"const int rows = {rows};\nconst int src_cols = {src_cols};\nconst int num_cols = {cols};",
        kernels="""
            __global__ void index_select_columns_kernel(const float* __restrict__ x, const int* __restrict__ cols,
                                                        float* __restrict__ y, int src_cols, int num_cols) {
                const float* src = x + (size_t)blockIdx.x * src_cols;
                float* dst = y + (size_t)blockIdx.x * num_cols;
                for (int j = threadIdx.x; j < num_cols; j += blockDim.x) dst[j] = src[cols[j]];
            }
            """,
        signatures=[
            "__global__ void index_select_columns_kernel(const float* __restrict__ x, "
            "const int* __restrict__ cols, float* __restrict__ y, int src_cols, int num_cols)"
        ],
        launch="{k}index_select_columns_kernel<<<rows, 256>>>(d_x, d_cols, d_y, src_cols, num_cols);",
        launch_note="index_select_columns_kernel is launched once with one block of 256 threads per row "
        "(rows blocks); the threads stride over the selected columns.",
        gen=f"""
            rows, src_cols, num_cols = {rows}, {src_cols}, {cols}
            x = rng.standard_normal((rows, src_cols)).astype(np.float32)
            cols = rng.integers(0, src_cols, num_cols).astype(np.int32)


            def reference(x, cols):
                return x[:, cols]


            y_ref = reference(x, cols)
            """,
    )


def reverse_segments() -> OpSpec:
    n = 1_000_000  # the last segment has 576 elements
    return _spec(
        op="reverse_segments_1024",
        name="Reverse_Segments_1024",
        split="pretrain",
        description=f"Reverse each consecutive 1024-element segment of a float32 array of {n} elements.",
        level1=f"""
            Reverse every consecutive segment of 1024 elements of a float32 array of n = {n} elements (the
            last segment has {n % 1024} elements and is reversed within its own length). Use one block of 256
            threads per segment: load the segment into a __shared__ float[1024] with coalesced reads,
            __syncthreads(), then write y[base + t] = tile[len - 1 - t] with coalesced writes.
            """,
        level2=f"Reverse each consecutive 1024-element segment of a float32 array of {n} elements (the last, "
        f"shorter segment within its own length).",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels="""
            constexpr int REVERSE_TILE = 1024;

            // Reversal goes through shared memory so that both the global reads and writes are coalesced.
            __global__ void reverse_segments_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
                __shared__ float tile[REVERSE_TILE];
                int base = blockIdx.x * REVERSE_TILE;
                int len = min(REVERSE_TILE, n - base);
                for (int t = threadIdx.x; t < len; t += blockDim.x) tile[t] = x[base + t];
                __syncthreads();
                for (int t = threadIdx.x; t < len; t += blockDim.x) y[base + t] = tile[len - 1 - t];
            }
            """,
        signatures=[
            "__global__ void reverse_segments_kernel(const float* __restrict__ x, float* __restrict__ y, "
            "int n)"
        ],
        launch="{k}reverse_segments_kernel<<<(n + 1023) / 1024, 256>>>(d_x, d_y, n);",
        launch_note="reverse_segments_kernel is launched once with (n + 1023) / 1024 blocks of 256 threads, one "
        "block per 1024-element segment.",
        gen=f"""
            n, seg = {n}, 1024
            x = rng.standard_normal(n).astype(np.float32)


            def reference(x):
                i = np.arange(n)
                base = i // seg * seg
                length = np.minimum(seg, n - base)
                return x[base + length - 1 - (i - base)]


            y_ref = reference(x)
            """,
    )


def specs() -> list[OpSpec]:
    sized = [gather_by_index(t) for t in SIZES] + [scatter_by_permutation(t) for t in SIZES]
    single = [
        embedding_lookup(),
        one_hot(),
        bitonic_sort_tiles(),
        odd_even_sort_segments(),
        nonzero_index_compaction(),
        take_along_rows(),
        embedding_bag_sum(),
        inverse_permutation(),
        masked_fill(),
        index_select_columns(),
        reverse_segments(),
    ]
    return sized + single
