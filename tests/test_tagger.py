"""The CUDA-sensitivity tagger (cuset_common/profiler/tagger.py), taught by examples.

Read top to bottom, the cases are the rules of docs/method.md "CUDA sensitivity": what is code at all
(the code view), then each category's lexemes, then the structural rules inside __global__/__device__
bodies (indexing, guard, write-back, grid-size arithmetic), then how a token that overlaps several
categories is tagged, and last a whole SFT answer tagged token by token. Each case names the code, the
piece of it a token spans and the category that token gets ("none" for 0).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from cuset_common.profiler.cuda_source import code_view
from cuset_common.profiler.tagger import CATEGORIES, PRIORITY, tag_tokens

NAMES = {0: "none", **CATEGORIES}


def category(text: str, needle: str, nth: int = 0) -> str:
    """Category the tagger gives to a token spanning the nth occurrence of needle in text."""
    starts = [m.start() for m in re.finditer(re.escape(needle), text)]
    assert len(starts) > nth, f"{needle!r} occurs {len(starts)} times"
    a = starts[nth]
    return NAMES[int(tag_tokens(text, [(a, a + len(needle))])[0])]


def char_categories(text: str, needle: str, nth: int = 0) -> set[str]:
    """Categories the tagger gives to the non-blank characters of the nth occurrence of needle, one
    character per token."""
    a = [m.start() for m in re.finditer(re.escape(needle), text)][nth]
    spans = [(a + k, a + k + 1) for k, c in enumerate(needle) if not c.isspace()]
    return {NAMES[c] for c in tag_tokens(text, spans).tolist()}


def kernel(
    body: str, params: str = "const float* __restrict__ x, float* __restrict__ y, int rows, int cols"
) -> str:
    """A kernel with the given body, fenced like an SFT answer."""
    return f"```cpp\n__global__ void k({params}) {{\n{body}\n}}\n```\n"


def short_id(value) -> str | None:
    """Test ids: the needle, not the kernel body."""
    return None if "\n" in value or len(value) > 40 else value


ROW = "    int row = blockIdx.x;\n    int j = threadIdx.x;\n"


# ---------------------------------------------------------------------------------------
# What is code: prose outside ``` fences, comments and literals are blanked before any rule runs
# ---------------------------------------------------------------------------------------


def test_the_code_view_blanks_prose_comments_and_literals_and_keeps_offsets():
    text = (
        "Call __syncthreads() here.\n```cpp\n__syncthreads(); // __syncwarp\n"
        'printf("__threadfence"); /* atomicAdd */\n```\nThen atomicAdd.\n'
    )
    view = code_view(text)
    assert len(view) == len(text) and view.count("\n") == text.count("\n")  # token offsets stay valid
    assert view.split() == ["__syncthreads();", "printf(", ");"]


@pytest.mark.parametrize(
    "text, needle, nth, expected",
    [
        ("It calls __syncthreads().\n```cpp\n__syncthreads();\n```\n", "__syncthreads", 0, "none"),  # prose
        ("It calls __syncthreads().\n```cpp\n__syncthreads();\n```\n", "__syncthreads", 1, "synchronization"),
        ("__syncthreads();  // then __syncwarp\n", "__syncwarp", 0, "none"),  # a line comment
        ("/* __syncwarp */ __syncwarp();\n", "__syncwarp", 0, "none"),  # a block comment
        ("/* __syncwarp */ __syncwarp();\n", "__syncwarp", 1, "synchronization"),
        ('printf("__threadfence"); __threadfence();\n', "__threadfence", 0, "none"),  # a string literal
        ('printf("__threadfence"); __threadfence();\n', "__threadfence", 1, "synchronization"),
        # no fence at all: the whole answer is code
        ("__global__ void k() { __syncthreads(); }", "__syncthreads", 0, "synchronization"),
    ],
)
def test_only_code_is_tagged(text, needle, nth, expected):
    assert category(text, needle, nth) == expected


def test_quotes_and_slashes_do_not_confuse_the_blanking():
    """A quote in a char literal or a comment, `//` in a string, and digit separators (1'000'000) do not
    open or close a literal or comment where there is none."""
    text = (
        "__global__ void k(int* out) {\n"
        "    char q = '\"'; // it's a quote: __syncthreads\n"
        '    printf("// not a comment \\" __syncwarp"); __syncthreads();\n'
        "    /* a ' and a \" */ __syncwarp();\n"
        "    int big = 1'000'000; __threadfence();\n}\n"
    )
    assert (
        category(text, "__syncthreads", 0) == "none"
        and category(text, "__syncthreads", 1) == "synchronization"
    )
    assert category(text, "__syncwarp", 0) == "none" and category(text, "__syncwarp", 1) == "synchronization"
    assert category(text, "__threadfence", 0) == "synchronization"


# ---------------------------------------------------------------------------------------
# Lexemes: named CUDA words and operators, anywhere in the code
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, needle, expected",
    [
        # signature: function qualifiers
        ("__global__ void k(float* y) {}", "__global__", "signature"),
        ("__device__ float f(float v) { return v; }", "__device__", "signature"),
        ("__host__ __device__ int g() { return 0; }", "__host__", "signature"),
        ("__global__ void __launch_bounds__(256) k() {}", "__launch_bounds__", "signature"),
        ("void k(const float* __restrict__ x);", "__restrict__", "signature"),
        ("void k(const float* __restrict x);", "__restrict", "signature"),
        ("__forceinline__ __device__ float f();", "__forceinline__", "signature"),
        # indexing: the thread builtins, with the .x/.y/.z after them
        ("int i = threadIdx.x;", "threadIdx.x", "indexing"),
        ("int b = blockIdx . y;", "blockIdx . y", "indexing"),
        ("int n = blockDim.z;", "blockDim.z", "indexing"),
        ("int g = gridDim.x;", "gridDim.x", "indexing"),
        ("int lane = threadIdx.x % warpSize;", "warpSize", "indexing"),
        # shared_memory
        ("__shared__ float tile[32][33];", "__shared__", "shared_memory"),
        ("extern __shared__ float buf[];", "extern __shared__", "shared_memory"),
        # synchronization: barriers, fences, host-side waits, cooperative groups
        ("__syncthreads();", "__syncthreads", "synchronization"),
        ("int c = __syncthreads_count(p);", "__syncthreads_count", "synchronization"),
        ("__syncwarp();", "__syncwarp", "synchronization"),
        ("__threadfence_block();", "__threadfence_block", "synchronization"),
        ("cudaDeviceSynchronize();", "cudaDeviceSynchronize", "synchronization"),
        ("cudaStreamSynchronize(stream);", "cudaStreamSynchronize", "synchronization"),
        ("cg::sync(block);", "cg::sync", "synchronization"),
        ("block.sync();", ".sync()", "synchronization"),
        # warp_atomic: shuffles, votes, atomics
        ("v += __shfl_down_sync(0xffffffff, v, 16);", "__shfl_down_sync", "warp_atomic"),
        ("v = __shfl_sync(mask, v, 0);", "__shfl_sync", "warp_atomic"),
        ("unsigned b = __ballot_sync(~0u, p);", "__ballot_sync", "warp_atomic"),
        ("unsigned m = __activemask();", "__activemask", "warp_atomic"),
        ("atomicAdd(out, v);", "atomicAdd", "warp_atomic"),
        ("atomicCAS(lock, 0, 1);", "atomicCAS", "warp_atomic"),
        ("atomicMax_block(best, v);", "atomicMax_block", "warp_atomic"),
        # launch: the whole launch configuration, dim3
        ("k<<<grid, block, smem>>>(x, y);", "<<<grid, block, smem>>>", "launch"),
        ("dim3 grid(8, 8);", "dim3", "launch"),
        # memory_api: the runtime's allocation and copies
        ("cudaMalloc(&d_x, bytes);", "cudaMalloc", "memory_api"),
        ("cudaMallocManaged(&p, bytes);", "cudaMallocManaged", "memory_api"),
        ("cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s);", "cudaMemcpyAsync", "memory_api"),
        ("cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s);", "cudaMemcpyHostToDevice", "memory_api"),
        ("cudaFree(d_x);", "cudaFree", "memory_api"),
        ("cudaMemset(d_y, 0, bytes);", "cudaMemset", "memory_api"),
    ],
    ids=lambda v: v if " " not in v else None,
)
def test_lexemes(code, needle, expected):
    assert category(code, needle) == expected


@pytest.mark.parametrize(
    "code, needle",
    [
        ("int threads = 256;", "threads"),  # a whole word only: `threads` is not threadIdx
        ("int index_count = 3;", "index_count"),
        ("float my_atomicAdd = 0;", "my_atomicAdd"),
        ("int syncthreads_done = 1;", "syncthreads_done"),
        ("int gridDims = 2;", "gridDims"),
        ('printf("%d\\n", i);', "printf"),
        ("#include <cstdio>", "#include <cstdio>"),
    ],
)
def test_look_alikes_are_not_lexemes(code, needle):
    assert category(code, needle) == "none"


# ---------------------------------------------------------------------------------------
# Structure, indexing: integer variables derived from the builtins, and pointer arithmetic with an index
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, assignment",
    [
        ("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    y[i] = x[i];", "int i = blockIdx.x"),
        ("    int tid = threadIdx.x;\n    int i = blockIdx.x * 256 + tid;\n    y[i] = 0.0f;", "+ tid"),
        # derived in steps: idx -> row -> offset, and a compound update of an index
        (ROW + "    int off = row * cols + j;\n    y[off] = 0.0f;", "int off = row * cols + j"),
        (
            ROW + "    size_t off = (size_t)row * cols;\n    y[off + j] = 0.0f;",
            "size_t off = (size_t)row * cols",
        ),
        (ROW + "    j += blockDim.x;\n    y[j] = 0.0f;", "j += blockDim.x"),
        # several names in one declaration
        ("    int r = blockIdx.y, c = threadIdx.x;\n    y[r * cols + c] = 0.0f;", "c = threadIdx.x"),
        # a for header's initialisation and step
        ("    for (int s = blockDim.x / 2; s > 0; s >>= 1) y[s] = 0.0f;", "int s = blockDim.x / 2"),
        ("    for (int s = blockDim.x / 2; s > 0; s >>= 1) y[s] = 0.0f;", "s >>= 1"),
    ],
    ids=short_id,
)
def test_index_assignments_are_indexing(body, assignment):
    assert char_categories(kernel(body), assignment) == {"indexing"}


@pytest.mark.parametrize(
    "body, assignment",
    [
        (
            "    int i = threadIdx.x;\n    float v = x[i];\n    y[i] = v;",
            "float v = x[i]",
        ),  # a value read at i
        ("    int i = threadIdx.x;\n    int v = (int)x[i];\n    y[i] = v;", "int v = (int)x[i]"),
        ("    float t = threadIdx.x * 0.5f;\n    y[0] = t;", "float t ="),  # declared float: not an index
        ("    int k = 3;\n    y[k] = 0.0f;", "int k = 3"),  # an integer, but not from a builtin
    ],
    ids=short_id,
)
def test_values_and_plain_integers_are_not_indexing(body, assignment):
    assert char_categories(kernel(body), assignment) == {"none"}


@pytest.mark.parametrize(
    "body, expr",
    [
        (
            ROW + "    const float* xr = x + row * cols;\n    y[j] = xr[j];",
            "const float* xr = x + row * cols;",
        ),
        (
            ROW + "    const float* __restrict__ xr = x + (size_t)row * cols;\n    y[j] = xr[j];",
            "x + (size_t)row * cols",
        ),
        (ROW + "    float* yr = y + row * cols + j;\n    *yr = 0.0f;", "float* yr = y + row * cols + j;"),
        (ROW + "    x += row * cols;\n    y[j] = x[j];", "x += row * cols"),
        (
            "    float v = load(x + blockIdx.x * blockDim.x + threadIdx.x, 4);\n    y[0] = v;",
            "x + blockIdx.x * blockDim.x + threadIdx.x",
        ),
        ("    int i = threadIdx.x;\n    atomicAdd(y + i, x[i]);", "y + i"),
    ],
    ids=short_id,
)
def test_pointer_offset_arithmetic_is_indexing_in_full(body, expr):
    assert char_categories(kernel(body), expr) - {"signature"} == {
        "indexing"
    }  # `__restrict__` stays signature


def test_a_member_named_like_a_pointer_is_not_pointer_arithmetic():
    text = kernel(
        "    __shared__ float buf[64];\n    int s = 1;\n    buf[threadIdx.x] = buf[threadIdx.x + s];\n"
        "    y[threadIdx.x] = buf[0];"
    )
    assert char_categories(text, ".x + s") == {"none", "indexing"} and char_categories(text, "+ s") == {
        "none"
    }


def test_structure_is_only_read_inside_device_functions():
    """Host code computes sizes, not indices: the same assignment is indexing in a kernel only."""
    host = "```cpp\nint main() {\n    int i = blockIdx.x;\n    return 0;\n}\n```\n"
    assert char_categories(host, "int i =") == {"none"}
    assert char_categories(kernel("    int i = blockIdx.x;\n    y[i] = 0.0f;"), "int i =") == {"indexing"}


# ---------------------------------------------------------------------------------------
# Structure, guard: a bounds check on an index, and a kernel's early `return;`
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, cond",
    [
        (
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < cols) y[i] = x[i];",
            "if (i < cols)",
        ),
        (
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    while (i < cols) { y[i] = x[i]; i += blockDim.x * gridDim.x; }",
            "while (i < cols)",
        ),
        (
            "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < cols; i += blockDim.x * gridDim.x)"
            " y[i] = x[i];",
            "i < cols",
        ),
        (ROW + "    for (int c = j; c < cols; c += blockDim.x) y[row * cols + c] = x[c];", "c < cols"),
        (
            "    int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (r < rows && c < cols) y[r * cols + c] = 0.0f;",
            "if (r < rows && c < cols)",
        ),
        ("    int tid = threadIdx.x;\n    if (tid < 32) y[tid] = 0.0f;", "if (tid < 32)"),
        ("    int tid = threadIdx.x;\n    if (tid == 0) y[0] = 0.0f;", "if (tid == 0)"),
    ],
    ids=short_id,
)
def test_bounds_checks_on_index_variables_are_guards(body, cond):
    text = kernel(body)
    assert char_categories(text, cond) - {"indexing"} == {"guard"}, text  # builtins inside stay indexing


@pytest.mark.parametrize(
    "body, cond",
    [
        (ROW + "    float v = j < cols ? x[row * cols + j] : 0.0f;\n    y[j] = v;", "j < cols"),
        (ROW + "    y[j] = j < cols && row < rows ? x[j] : 0.0f;", "j < cols && row < rows"),
        (
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    y[i] = i + 1 < cols ? x[i + 1] - x[i] : 0.0f;",
            "i + 1 < cols",
        ),
        (
            "    int i = threadIdx.x;\n    float v = fmaxf(i >= rows ? 0.0f : x[i], 1.0f);\n    y[i] = v;",
            "i >= rows",
        ),
        ("    int i = threadIdx.x;\n    y[i] = (i < cols) ? x[i] : 0.0f;", "(i < cols)"),
    ],
    ids=short_id,
)
def test_ternary_bounds_checks_are_guards_with_or_without_parentheses(body, cond):
    assert char_categories(kernel(body), cond) == {"guard"}


@pytest.mark.parametrize(
    "body, cond",
    [
        ("    int i = threadIdx.x;\n    float v = x[i] > 0.0f ? x[i] : 0.0f;\n    y[i] = v;", "x[i] > 0.0f"),
        ("    int i = threadIdx.x;\n    float a = x[i];\n    y[i] = a < 1.0f ? a : 1.0f;", "a < 1.0f"),
        ("    int i = threadIdx.x;\n    if (x[i] > 0.0f) y[i] = 1.0f;", "if (x[i] > 0.0f)"),
    ],
    ids=short_id,
)
def test_comparisons_of_values_are_not_guards(body, cond):
    """`x[i] > 0` compares a value read at an index, not the index: what is in brackets does not count."""
    assert char_categories(kernel(body), cond) == {"none"}


SHFL = (
    "    float v = x[threadIdx.x];\n    for ({}) v += __shfl_xor_sync(~0u, v, offset);\n"
    "    y[threadIdx.x] = v;"
)
LOOPS = [  # (kernel body, loop termination test): never a guard, whatever the loop variable derives from
    (
        "    int tid = threadIdx.x;\n    for (int s = blockDim.x / 2; s > 0; s >>= 1) {\n"
        "        if (tid < s) y[tid] += y[tid + s];\n    }",
        "s > 0",
    ),
    (
        "    for (unsigned int stride = blockDim.x / 2; stride > 0; stride >>= 1) { __syncthreads(); }",
        "stride > 0",
    ),
    ("    for (int stride = rows / 2; stride > 0; stride /= 2) { __syncthreads(); }", "stride > 0"),
    (SHFL.format("int offset = 16; offset > 0; offset /= 2"), "offset > 0"),
    (SHFL.format("int offset = 1; offset < 32; offset <<= 1"), "offset < 32"),
    (SHFL.format("int offset = warpSize / 2; offset > 0; offset >>= 1"), "offset > 0"),
    (
        "    int stride = blockDim.x / 2;\n    while (stride > 0) { __syncthreads(); stride >>= 1; }",
        "stride > 0",
    ),
    ("    int stride = 128;\n    while (stride > 0) { __syncthreads(); stride >>= 1; }", "stride > 0"),
    (
        "    for (int s = 1; s < blockDim.x; s *= 2) {\n        int k = 2 * s * threadIdx.x;\n"
        "        if (k < blockDim.x) y[k] += y[k + s];\n    }",
        "s < blockDim.x",
    ),
    ("    int lane = threadIdx.x % 32;\n    for (int k = 0; k < cols; ++k) y[lane] += x[k];", "k < cols"),
]


@pytest.mark.parametrize("body, test", LOOPS, ids=short_id)
def test_loop_termination_tests_are_not_guards(body, test):
    """A halving or doubling loop stops at a constant (0, 32, warpSize), a counting loop runs a plain
    counter: neither bounds an index by a size."""
    text = kernel(body)
    assert "guard" not in char_categories(text, test), text


def test_loop_termination_is_tagged_the_same_in_every_kernel():
    """All the loops in one answer, several kernels: the same test gets the same (non-guard) tag
    everywhere."""
    text = "".join(kernel(body).replace("void k(", f"void k{n}(") for n, (body, _) in enumerate(LOOPS))
    for test in {t for _, t in LOOPS}:
        for nth in range(text.count(test)):
            assert "guard" not in char_categories(text, test, nth), (test, nth)


def test_an_early_return_is_a_guard_in_a_kernel_only():
    body = "    int i = threadIdx.x;\n    if (i >= cols) return;\n    y[i] = x[i];"
    assert category(kernel(body), "return;") == "guard"
    helper = "```cpp\n__device__ void f(float* y) {\n    if (y == 0) return;\n    y[0] = 1.0f;\n}\n```\n"
    assert category(helper, "return;") == "none"


# ---------------------------------------------------------------------------------------
# Structure, write_back: a kernel's stores through an output pointer
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, store",
    [
        (ROW + "    y[row * cols + j] = x[j];", "y[row * cols + j] ="),  # a non-const pointer parameter
        (
            ROW + "    float* yr = y + row * cols;\n    if (j < cols) yr[j] = x[j];",
            "yr[j] =",
        ),  # derived from one
        (ROW + "    float *yr = y + row * cols;\n    yr[j] += 1.0f;", "yr[j] +="),
        (ROW + "    float* __restrict__ yr = y + row * cols;\n    yr[j] = 0.0f;", "yr[j] ="),
        (ROW + "    float* const yr = y + row * cols;\n    yr[j] *= 2.0f;", "yr[j] *="),
        (ROW + "    float* yr = &y[row * cols];\n    yr[j] = 1.0f;", "yr[j] ="),
        (
            ROW
            + "    float* yr = y + row * cols;\n    float* p = yr + 1;\n    float* q = p;\n    q[j] = 1.0f;",
            "q[j] =",
        ),
        (
            ROW + "    float4* y4 = reinterpret_cast<float4*>(y + row * cols);\n"
            "    y4[j] = make_float4(0, 0, 0, 0);",
            "y4[j] =",
        ),
        (ROW + "    float* yr = y + row * cols;\n    *(yr + j) = 1.0f;", "*(yr + j) ="),
        (ROW + "    float* yr = y + row * cols + j;\n    if (j < cols) *yr = 1.0f;", "*yr ="),
    ],
    ids=short_id,
)
def test_stores_through_an_output_pointer_are_write_back(body, store):
    text = kernel(body)
    assert char_categories(text, store) - {"indexing"} == {"write_back"}, text  # the index inside: indexing


@pytest.mark.parametrize(
    "body, access",
    [
        (
            ROW + "    const float* xr = x + row * cols;\n    float v = xr[j];\n    y[j] = v;",
            "xr[j]",
        ),  # a read
        (ROW + "    float const* yc = y + row * cols;\n    float v = yc[j];\n    y[j] = v;", "yc[j]"),
        (
            ROW
            + "    __shared__ float buf[32];\n    float* s = buf + j;\n    s[0] = x[j];\n    y[j] = buf[0];",
            "s[0] =",
        ),
        (ROW + "    float acc[4];\n    float* a = acc;\n    a[0] = x[j];\n    y[j] = acc[0];", "a[0] ="),
    ],
    ids=short_id,
)
def test_reads_and_stores_to_non_outputs_are_not_write_back(body, access):
    assert "write_back" not in char_categories(kernel(body), access)


# ---------------------------------------------------------------------------------------
# Structure, launch: the grid-size arithmetic, anywhere in the code
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, expr, expected",
    [
        ("int blocks = (n + threads - 1) / threads;", "(n + threads - 1) / threads", "launch"),
        ("int blocks = (n + 255) / 256;", "(n + 255) / 256", "launch"),
        ("int blocks = (rows * cols + b - 1) / b;", "(rows * cols + b - 1) / b", "launch"),
        ("int half = (n + 3) / 2;", "(n + 3) / 2", "none"),  # not a ceiling division
        ("int m = (a + b) / c;", "(a + b) / c", "none"),
    ],
    ids=short_id,
)
def test_ceiling_divisions_are_launch_arithmetic(code, expr, expected):
    assert char_categories(code, expr) == {expected}


# ---------------------------------------------------------------------------------------
# Tokens: the first category in PRIORITY whose matches the token's span overlaps
# ---------------------------------------------------------------------------------------


def test_priority_decides_between_overlapping_categories_and_empty_spans_get_none():
    text = "__global__ void k(float* y) { if (threadIdx.x < 32) y[threadIdx.x] = 0.f; }"
    a = text.index("(threadIdx.x < 32)")
    # threadIdx inside a guard: the named lexeme (indexing) beats the structural guard
    tags = tag_tokens(text, [(a, a + 1), (a + 1, a + 10), (a + 12, a + 17)]).tolist()
    assert [NAMES[t] for t in tags] == ["guard", "indexing", "guard"]
    assert tag_tokens(text, [(5, 5)]).tolist() == [0]  # a zero-width span overlaps nothing
    assert tag_tokens(text, []).dtype == np.uint8
    assert sorted(PRIORITY) == list(CATEGORIES)  # every category has its place


# ---------------------------------------------------------------------------------------
# A whole SFT answer: prose, a fenced kernel with its launch, comments and strings
# ---------------------------------------------------------------------------------------

SNIPPET = r"""Here is the kernel; it calls __syncthreads() between the phases and uses threadIdx.

```cpp
// Block sum: threadIdx and __syncthreads in this comment are not code
#include <cstdio>
__device__ float square(float v) { return v * v; }

__global__ void __launch_bounds__(256) block_sum(const float* __restrict__ x, float* out, int n) {
    extern __shared__ float buf[];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + tid;
    float v = (i < n) ? square(x[i]) : 0.0f;
    buf[tid] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 32; s >>= 1) {
        if (tid < s) buf[tid] += buf[tid + s];
        __syncthreads();
    }
    if (tid >= 32) return;
    float threads = buf[tid] + buf[tid + 32];
    int index_count = 3;
    for (int k = 0; k < index_count; ++k) threads *= 1.0f;
    threads += __shfl_down_sync(0xffffffff, threads, 16);
    if (tid == 0) atomicAdd(out + gridDim.x, threads);
    if (tid == 0) out[blockIdx.x] = threads;
}

int main() {
    const char* msg = "call __syncthreads() and cudaMalloc here";
    int n = 1000, threads = 256;
    int blocks = (n + threads - 1) / threads;
    float *d_x, *d_out;
    cudaMalloc(&d_x, n * sizeof(float));
    cudaMemcpy(d_x, h_x, n * sizeof(float), cudaMemcpyHostToDevice);
    dim3 grid(blocks);
    block_sum<<<grid, threads, threads * sizeof(float)>>>(d_x, d_out, n);
    cudaDeviceSynchronize();
    /* block comment: atomicAdd blockIdx cudaFree */
    for (int i = 0; i < n; ++i) printf("%d\n", i);
    cudaFree(d_x);
    return 0;
}
```
The launch uses one block per 256 elements; atomicAdd combines the blocks.
"""


@pytest.mark.parametrize(
    "needle, nth, expected",
    [
        ("__global__", 0, "signature"),
        ("__launch_bounds__", 0, "signature"),
        ("__restrict__", 0, "signature"),
        ("__device__", 0, "signature"),
        ("threadIdx", 2, "indexing"),
        ("blockDim", 0, "indexing"),
        ("gridDim", 0, "indexing"),
        ("int tid", 0, "indexing"),
        ("int i =", 0, "indexing"),
        ("+ tid;", 0, "indexing"),
        ("int s =", 0, "indexing"),
        ("s >>= 1", 0, "indexing"),
        ("(i < n)", 0, "guard"),
        ("if (tid < s)", 0, "guard"),
        ("return;", 0, "guard"),
        ("tid == 0", 0, "guard"),
        ("extern __shared__", 0, "shared_memory"),
        ("__syncthreads", 2, "synchronization"),
        ("__syncthreads", 3, "synchronization"),
        ("cudaDeviceSynchronize", 0, "synchronization"),
        ("__shfl_down_sync", 0, "warp_atomic"),
        ("atomicAdd", 0, "warp_atomic"),
        ("<<<", 0, "launch"),
        (">>>", 0, "launch"),
        ("grid, threads", 0, "launch"),
        ("dim3", 0, "launch"),
        ("(n + threads - 1) / threads", 0, "launch"),
        ("cudaMalloc", 1, "memory_api"),
        ("cudaMemcpy", 0, "memory_api"),
        ("cudaMemcpyHostToDevice", 0, "memory_api"),
        ("cudaFree", 1, "memory_api"),
        ("out[", 0, "write_back"),
        ("] =", 1, "write_back"),
    ],
)
def test_a_whole_answer_gets_each_category(needle, nth, expected):
    assert category(SNIPPET, needle, nth) == expected


@pytest.mark.parametrize(
    "needle, nth",
    [
        ("__syncthreads", 0),  # prose before the fence
        ("threadIdx", 0),
        ("threadIdx", 1),  # a line comment
        ("__syncthreads", 1),
        ("__syncthreads", 4),  # a string literal
        ("cudaMalloc", 0),
        ("atomicAdd", 1),  # a block comment
        ("blockIdx", 2),
        ("atomicAdd", 2),  # prose after the fence
        ("float threads", 0),  # ordinary code
        ("threads *= 1.0f", 0),
        ("int index_count", 0),
        ("k < index_count", 0),
        ("s > 32", 0),  # a halving loop's termination test, not a bounds check
        ("int n = 1000, threads", 0),
        ("buf[tid] = v", 0),  # a store to shared memory, not to an output
        ("return v * v", 0),
        ("i < n; ++i", 0),
        ("printf", 0),
        ("#include <cstdio>", 0),
    ],
)
def test_a_whole_answer_leaves_ordinary_code_comments_and_strings_alone(needle, nth):
    assert category(SNIPPET, needle, nth) == "none"


def test_the_code_view_of_a_whole_answer():
    view = code_view(SNIPPET)
    assert len(view) == len(SNIPPET) and view.count("\n") == SNIPPET.count("\n")
    assert "__syncthreads" not in view[: SNIPPET.index("```")] and "call __syncthreads" not in view
    assert "extern __shared__ float buf[];" in view
