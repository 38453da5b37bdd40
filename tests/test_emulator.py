"""The CPU emulation backend on tiny programs: the translator (harness/emulate.py) on launch syntax,
templates, shared memory, macros, comments and strings; the runtime (harness/emu/cuda_runtime.h) on
barriers, warp intrinsics, atomics, events, launch limits, poisoned memory, the race-revealing
schedule and texture reads (harness/emu/textures.h). Every program is really built with g++ and run;
the texture program also with nvcc on a GPU, where one is."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from harness.emulate import EMU_INCLUDE, Unsupported, gxx_command, mask, translate

PRELUDE = "#include <cuda_runtime.h>\n#include <cstdio>\n"


def run(
    tmp_path: Path, source: str, checks: bool = False, env: dict | None = None
) -> subprocess.CompletedProcess:
    (tmp_path / "prog_emu.cpp").write_text(translate(PRELUDE + source))
    build = subprocess.run(
        gxx_command("prog_emu.cpp", "prog", str(EMU_INCLUDE), checks),
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    return subprocess.run(["./prog"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


def output(tmp_path: Path, source: str, env: dict | None = None) -> str:
    r = run(tmp_path, source, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


# ---------------------------------------------------------------------------------------
# Translator
# ---------------------------------------------------------------------------------------


def test_mask_blanks_comments_and_strings_but_keeps_length_and_lines():
    src = "a<<<1,1>>>(); // k<<<2,2>>>()\n/* x<<<3,3>>>() */ puts(\"<<<\"); char c = '<'; int n = 1'000;\n"
    m = mask(src)
    assert len(m) == len(src) and m.count("\n") == src.count("\n")
    assert m.count("<<<") == 1 and "1'000" in m


# The CUDA programs below keep their own lines (noqa: E501): wrapping them would change the programs.
LAUNCHES = r"""
namespace ns {
template <typename T, int K>
__global__ void scale(T* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= K; }
}
__global__ void add_one(int* x) { x[blockIdx.y * gridDim.x * blockDim.x + blockIdx.x * blockDim.x + threadIdx.x] += 1; }
__global__ void nothing() {}
template <typename T>
__global__ void fill(T* x, T v) { x[threadIdx.x] = v; }
#define LAUNCH_ADD(ptr, blocks) \
    add_one<<<(blocks), 32>>>( \
        ptr)
typedef void (*Kernel)(int*);

int main() {
    int* d; cudaMalloc(&d, 256 * sizeof(int)); cudaMemset(d, 0, 256 * sizeof(int));
    cudaStream_t s; cudaStreamCreate(&s);
    const char* text = "a string with k<<<1, 1>>>() inside";  // and a comment: k<<<1, 1>>>()
    /* a block comment: add_one<<<8, 32>>>(d); */
    add_one<<<8, 32>>>(d);                              // plain
    add_one <<< dim3(4, 2), dim3(32), 0 >>> (d);         // dim3, spaces, shared-memory size
    add_one<<<8, 32, 0, s>>>(
        d);                                              // stream, arguments on the next line
    LAUNCH_ADD(d, 8);                                    // a macro that expands to a launch
    Kernel table[1] = {add_one};
    table[0]<<<8, 32>>>(d);                              // through a function pointer
    ns::scale<int, 3><<<(256 + 127) / 128, 128>>>(d, 256);  // template arguments, a qualified name
    fill<<<1, 1>>>(d + 255, 7);                          // template arguments deduced
    nothing<<<1, 1>>>();                                 // no arguments
    int h[256]; cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    printf("%d %d %s\n", h[0], h[255], text);
    return 0;
}
"""  # noqa: E501


def test_launch_syntax_variants_templates_macros_and_pointers(tmp_path):
    # five launches add 1 to each of 256 ints, then *3; the last element is set to 7
    assert output(tmp_path, LAUNCHES).strip() == "15 7 a string with k<<<1, 1>>>() inside"


def test_translation_keeps_line_numbers():
    src = (
        "__global__ void k(int* p) {}\nint main() {\n  k<<<1,\n    1>>>(\n nullptr);\n  return __LINE__;\n}\n"
    )
    out = translate(src)
    lines = out.splitlines()
    assert (
        lines[:2] == ["#include <cuda_runtime.h>", '#line 1 "prog.cu"']
        and lines[2:][5].strip() == "return __LINE__;"
    )


SHARED = r"""
#define N 64
__shared__ int file_scope[N];
__global__ void k(int* out) {
    __shared__ __align__(16) float a[N], b[N];
    __shared__ int grid2[4][N / 4];
    __shared__ volatile int flag;
    extern __shared__ double dyn[];
    int t = threadIdx.x;
    a[t] = t; b[t] = 2 * t; grid2[t / 16][t % 16] = 3 * t; dyn[t] = 4.0 * t; file_scope[t] = 5 * t;
    if (t == 0) flag = 1;
    __syncthreads();
    int u = N - 1 - t;
    out[t] = int(a[u] + b[u]) + grid2[u / 16][u % 16] + int(dyn[u]) + file_scope[u] + flag
             + (sizeof(a) == N * sizeof(float)) + (sizeof(grid2) == N * sizeof(int));
}
template <typename T>
__global__ void reverse(T* out) {  // typed view of raw dynamic shared memory, aligned for T
    extern __shared__ __align__(sizeof(T)) unsigned char raw[];
    T* s = reinterpret_cast<T*>(raw);
    s[threadIdx.x] = T(threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}
int main() {
    int* d; cudaMalloc(&d, N * sizeof(int));
    k<<<3, N, N * sizeof(double)>>>(d);
    int h[N]; cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int t = 0; t < N; ++t) bad += h[t] != 15 * (N - 1 - t) + 3;
    double* r; cudaMalloc(&r, N * sizeof(double));
    reverse<double><<<1, N, N * sizeof(double)>>>(r);
    double hr[N]; cudaMemcpy(hr, r, sizeof hr, cudaMemcpyDeviceToHost);
    for (int t = 0; t < N; ++t) bad += hr[t] != N - 1 - t;
    printf("bad=%d\n", bad);
}
"""


def test_static_dynamic_and_file_scope_shared_memory(tmp_path):
    assert output(tmp_path, SHARED).strip() == "bad=0"


@pytest.mark.parametrize(
    "snippet,reason",
    [
        ("#include <thrust/device_vector.h>\n", "C++ library thrust"),
        ('#include "cuda_fp16.h"\n', "half precision"),
        ('__device__ void f() { asm volatile("trap;"); }\n', "inline PTX"),
        ("#include <mma.h>\nusing namespace nvcuda;\n", "tensor cores"),
        ("__global__ void k(cudaSurfaceObject_t s) {}\n", "textures beyond 1D and 2D texture objects"),
        (
            "__global__ void k(cudaTextureObject_t t, float* y) { y[0] = tex3D<float>(t, 0, 0, 0); }\n",
            "tex3D",
        ),
    ],
)
def test_unsupported_features_are_refused_with_a_reason(snippet, reason):
    with pytest.raises(Unsupported, match=re.escape(reason)):
        translate(snippet + "int main() { return 0; }\n")


def test_comments_about_half_warps_and_variables_named_half_are_not_half_precision(tmp_path):
    """`half` in a comment or as a variable's name is not cuda_fp16's type: the program is translated, not
    refused as half precision, and runs as written."""
    source = (
        "// a half-warp reads one address\n"
        '/* half */ int main() { int half = 8 >> 1; printf("%d\\n", half); }\n'
    )
    assert output(tmp_path, source) == "4\n"


# ---------------------------------------------------------------------------------------
# Runtime
# ---------------------------------------------------------------------------------------

BARRIER = r"""
__global__ void k(int* out, int* counts) {
    __shared__ int s[1024];
    int t = threadIdx.x, n = blockDim.x;
    for (int round = 0; round < 3; ++round) {
        s[t] = t + round;
        __syncthreads();
        out[blockIdx.x * n + t] = s[(t + 1) % n] - round;  // the neighbour's value, after the barrier
        __syncthreads();
    }
    int c = __syncthreads_count(t % 3 == 0);
    int all = __syncthreads_and(t < n), none = __syncthreads_or(t < 0);
    if (t == 0) { counts[0] = c; counts[1] = all; counts[2] = none; }
}
int main() {
    int *out, *counts; cudaMalloc(&out, 2 * 1024 * sizeof(int)); cudaMalloc(&counts, 3 * sizeof(int));
    k<<<2, 1024>>>(out, counts);
    static int h[2048]; int c[3];
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost); cudaMemcpy(c, counts, sizeof c, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < 2048; ++i) bad += h[i] != (i % 1024 + 1) % 1024;
    printf("bad=%d count=%d and=%d or=%d\n", bad, c[0], c[1], c[2]);
}
"""  # noqa: E501


def test_barrier_semantics_on_a_1024_thread_block(tmp_path):
    assert output(tmp_path, BARRIER).strip() == "bad=0 count=342 and=1 or=0"


RACE = r"""
__global__ void k(int* out) {
    __shared__ int s[256];
    int t = threadIdx.x;
    s[t] = t;                                   // no __syncthreads() before reading a neighbour
    out[t] = s[(t + 1) % 256] + s[(t + 255) % 256];
}
int main() {
    int* d; cudaMalloc(&d, 256 * sizeof(int));
    k<<<1, 256>>>(d);
    int h[256]; cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int t = 0; t < 256; ++t) bad += h[t] != (t + 1) % 256 + (t + 255) % 256;
    printf("%d\n", bad);
}
"""


def test_the_schedule_makes_a_missing_barrier_visible_in_both_directions(tmp_path):
    bad = int(output(tmp_path, RACE))
    assert 64 < bad <= 256  # about 2/3 of the threads run before one of their neighbours and read poison


WARP = r"""
__global__ void k(int* out) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int* o = out + threadIdx.x * 8;
    o[0] = __shfl_sync(0xffffffff, lane * 10, 3);            // broadcast lane 3
    o[1] = __shfl_up_sync(0xffffffff, lane, 2);              // lanes 0, 1 keep their own
    o[2] = __shfl_down_sync(0xffffffff, lane, 5);            // lanes 27.. keep their own
    o[3] = __shfl_xor_sync(0xffffffff, lane, 1);             // swap pairs
    o[4] = __shfl_down_sync(0xffffffff, lane, 4, 8);         // within groups of 8
    o[5] = __ballot_sync(0xffffffff, lane % 2 == 0) == 0x55555555u;
    o[6] = __any_sync(0xffffffff, lane == 31 && w == 1) + 2 * __all_sync(0xffffffff, lane < 32);
    float v = lane + 0.5f;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);  // butterfly sum
    __syncwarp();
    o[7] = int(v) == 512 && __activemask() == 0xffffffffu;
}
int main() {
    int* d; cudaMalloc(&d, 64 * 8 * sizeof(int));
    k<<<1, 64>>>(d);
    int h[64 * 8]; cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int t = 0; t < 64; ++t) {
        int l = t & 31, w = t >> 5, *o = h + t * 8;
        int want[8] = {30, l >= 2 ? l - 2 : l, l + 5 < 32 ? l + 5 : l, l ^ 1, l % 8 + 4 < 8 ? l + 4 : l, 1,
                       (w == 1) + 2, 1};
        for (int j = 0; j < 8; ++j) if (o[j] != want[j]) { ++bad; printf("thread %d item %d: %d\n", t, j, o[j]); }
    }
    printf("bad=%d\n", bad);
}
"""  # noqa: E501


def test_warp_shuffles_ballots_and_votes(tmp_path):
    out = output(tmp_path, WARP)
    assert out.strip().endswith("bad=0"), out


ATOMICS = r"""
__device__ int i_add, i_sub, i_min = 1 << 30, i_max = -1, i_cas, i_and = -1, i_or, i_xor;
__device__ unsigned u_inc, u_dec = 0;
__device__ unsigned long long ull_add;
__device__ float f_add;
__device__ double d_add;
__global__ void k() {
    int t = blockIdx.x * blockDim.x + threadIdx.x;      // 0 .. 4095
    atomicAdd(&i_add, t); atomicSub(&i_sub, 1); atomicMin(&i_min, t - 7); atomicMax(&i_max, t);
    atomicAnd(&i_and, ~(1 << (t % 31))); atomicOr(&i_or, 1 << (t % 31)); atomicXor(&i_xor, t);
    atomicInc(&u_inc, 999u); atomicDec(&u_dec, 9u);
    atomicAdd(&ull_add, 1ull << 32); atomicAdd(&f_add, 0.5f); atomicAdd(&d_add, 0.25);
    int old;
    do { old = i_cas; } while (atomicCAS(&i_cas, old, old + 2) != old);  // a CAS loop from every thread
}
int main() {
    k<<<16, 256>>>();
    cudaDeviceSynchronize();
    int ia, is, imin, imax, icas, iand, ior, ixor; unsigned uinc, udec; unsigned long long ull; float f; double d;
    cudaMemcpyFromSymbol(&ia, i_add, 4); cudaMemcpyFromSymbol(&is, i_sub, 4); cudaMemcpyFromSymbol(&imin, i_min, 4);
    cudaMemcpyFromSymbol(&imax, i_max, 4); cudaMemcpyFromSymbol(&icas, i_cas, 4); cudaMemcpyFromSymbol(&iand, i_and, 4);
    cudaMemcpyFromSymbol(&ior, i_or, 4); cudaMemcpyFromSymbol(&ixor, i_xor, 4); cudaMemcpyFromSymbol(&uinc, u_inc, 4);
    cudaMemcpyFromSymbol(&udec, u_dec, 4); cudaMemcpyFromSymbol(&ull, ull_add, 8); cudaMemcpyFromSymbol(&f, f_add, 4);
    cudaMemcpyFromSymbol(&d, d_add, 8);
    printf("%d %d %d %d %d %d %d %d %u %u %llu %g %g\n", ia, is, imin, imax, icas, iand, ior, ixor, uinc, udec,
           ull >> 32, f, d);
}
"""  # noqa: E501


def test_atomics_from_4096_threads_on_several_os_threads(tmp_path):
    # inc wraps at 999 (4096 = 4 * 1000 + 96), dec cycles 0 -> 9 -> 8 ... (4096 % 10 = 6 steps: 9 8 7 6 5 4)
    assert output(tmp_path, ATOMICS).split() == [
        "8386560",
        "-4096",
        "-7",
        "4095",
        "8192",
        "-2147483648",
        "2147483647",
        "0",
        "96",
        "4",
        "4096",
        "2048",
        "1024",
    ]


LIMITS = r"""
#include <unistd.h>
__global__ void k(float* x) { extern __shared__ float s[]; s[threadIdx.x] = 1; x[threadIdx.x] = s[threadIdx.x]; }
__global__ void reads(const float* x, float* y) { y[threadIdx.x] = x[threadIdx.x] + 1.0f; }
int main() {
    float *x, *y; cudaMalloc(&x, 1024 * sizeof(float)); cudaMalloc(&y, 1024 * sizeof(float));
    k<<<1, 1025>>>(x);                     printf("%s\n", cudaGetErrorString(cudaGetLastError()));
    k<<<1, dim3(8, 8, 65)>>>(x);           printf("%s\n", cudaGetErrorName(cudaGetLastError()));
    k<<<1, 32, 100 << 10>>>(x);            printf("%s\n", cudaGetErrorName(cudaGetLastError()));
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10);
    k<<<1, 32, 100 << 10>>>(x);            printf("%s\n", cudaGetErrorName(cudaGetLastError()));
    reads<<<1, 64>>>(x + 64, y);           // x[64..127] was never written: poisoned, so NaN
    float h[2]; cudaMemcpy(h, y, sizeof h, cudaMemcpyDeviceToHost);
    printf("%s\n", h[0] != h[0] ? "nan" : "number");
    float host[4];
    printf("%s\n", cudaGetErrorName(cudaMemcpy(host, host, 16, cudaMemcpyHostToDevice)));  // not device memory
    cudaDeviceProp p; cudaGetDeviceProperties(&p, 0);
    printf("%d %d %d\n", p.warpSize, p.maxThreadsPerBlock, p.multiProcessorCount > 0);
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a); usleep(30000); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms = 0; cudaEventElapsedTime(&ms, a, b);
    printf("%d\n", ms >= 29.0f && ms < 1000.0f);
    printf("%s\n", cudaGetErrorName(cudaSetDevice(1)));
    int min_grid = 0, block = 0;
    cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, reads, 0, 256);
    printf("%d %d %g\n", block, int(min(size_t(5), 3)), max(2.5f, 3));  // CUDA's mixed-type min/max
}
"""  # noqa: E501


def test_launch_limits_poison_copies_properties_and_events(tmp_path):
    assert output(tmp_path, LIMITS).splitlines() == [
        "invalid configuration argument",
        "cudaErrorInvalidConfiguration",
        "cudaErrorInvalidValue",
        "cudaSuccess",
        "nan",
        "cudaErrorInvalidValue",
        "32 1024 1",
        "1",
        "cudaErrorInvalidDevice",
        "256 3 3",
    ]


OUT_OF_BOUNDS = r"""
__global__ void k(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; x[i] = i; }  // no guard
int main() {
    float* d; cudaMalloc(&d, 1000 * sizeof(float));
    k<<<4, 256>>>(d, 1000);
    printf("%s\n", cudaGetErrorName(cudaDeviceSynchronize()));
}
"""


SHARED_OUT_OF_BOUNDS = r"""
__global__ void k(float* out) {
    __shared__ float s[64];
    extern __shared__ float d[];
    s[threadIdx.x] = 1.0f; d[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = STATIC ? s[threadIdx.x + 1] : d[threadIdx.x + 1];  // thread 63 reads past the end
}
int main() {
    float* d; cudaMalloc(&d, 64 * sizeof(float));
    k<<<2, 64, 64 * sizeof(float)>>>(d);
    printf("%s\n", cudaGetErrorName(cudaDeviceSynchronize()));
}
"""


def test_address_sanitizer_build_reports_out_of_bounds_device_writes(tmp_path):
    r = run(tmp_path, OUT_OF_BOUNDS, checks=True)
    assert r.returncode != 0 and "heap-buffer-overflow" in r.stderr, r.stderr[-2000:]
    assert re.search(r"prog\.cu:\d+", r.stderr)  # reported against the program's own lines


@pytest.mark.parametrize("static", [1, 0], ids=["static", "dynamic"])
def test_address_sanitizer_build_reports_shared_memory_overruns(tmp_path, static):
    r = run(tmp_path, f"#define STATIC {static}\n" + SHARED_OUT_OF_BOUNDS, checks=True)
    assert r.returncode != 0 and "AddressSanitizer" in r.stderr, r.stdout + r.stderr[-2000:]


def test_a_warp_intrinsic_outside_a_kernel_is_a_named_error(tmp_path):
    # a shuffle outside any kernel is a programming error the runtime names
    r = run(tmp_path, "int main() { return __shfl_sync(0xffffffff, 1, 0); }\n")
    assert r.returncode != 0 and "warp intrinsic called outside a kernel" in r.stderr


THREADS = r"""
#include <cstring>
__global__ void k(int* x) { atomicAdd(x, 1); }
int main() {
    int* d; cudaMalloc(&d, sizeof(int)); cudaMemset(d, 0, sizeof(int));
    k<<<64, 32>>>(d);
    int h; cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    char line[256]; FILE* f = fopen("/proc/self/status", "r");
    while (fgets(line, sizeof line, f)) if (!strncmp(line, "Threads:", 8)) printf("%d %s", h, line + 8);
}
"""


@pytest.mark.parametrize("threads", [1, 3])
def test_blocks_run_on_as_many_os_threads_as_stage_04_allows(tmp_path, threads):
    assert output(tmp_path, THREADS, env={"CUSET_EMU_THREADS": str(threads)}).split() == [
        "2048",
        str(threads),
    ]


# Each line: what the CUDA programming guide's texture fetching appendix gives for these reads.
TEXTURES = r"""
#include <cstring>
cudaTextureObject_t make(cudaResourceDesc res, cudaTextureFilterMode filter, cudaTextureAddressMode mode,
                         cudaTextureReadMode read, int normalized) {
    cudaTextureDesc how; memset(&how, 0, sizeof how);
    how.addressMode[0] = how.addressMode[1] = mode;
    how.filterMode = filter; how.readMode = read; how.normalizedCoords = normalized;
    cudaTextureObject_t t = 0; cudaCreateTextureObject(&t, &res, &how, NULL);
    return t;
}
cudaResourceDesc array_resource(cudaArray_t a) {
    cudaResourceDesc res; memset(&res, 0, sizeof res);
    res.resType = cudaResourceTypeArray; res.res.array.array = a;
    return res;
}
__global__ void reads(cudaTextureObject_t px, cudaTextureObject_t px_border, cudaTextureObject_t px_unit,
                      cudaTextureObject_t lin, cudaTextureObject_t wrap, cudaTextureObject_t ints, float* out) {
    uchar4 a = tex2D<uchar4>(px, -2.5f, 1.2f), b = tex2D<uchar4>(px, 7.9f, 5.0f);
    uchar4 c = tex2D<uchar4>(px_border, -1.0f, 0.5f);
    float4 d = tex2D<float4>(px_unit, 3.5f, 2.5f);
    float v[] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, c.x, c.w, d.x, d.y, d.z, d.w,
                 tex2D<float>(lin, 1.0f, 0.5f), tex2D<float>(lin, 2.5f, 0.5f), tex2D<float>(lin, 0.25f, 0.5f),
                 tex2D<float>(lin, 3.9f, 0.5f), tex2D<float>(wrap, 1.1f, 0.5f), tex2D<float>(wrap, -0.3f, 0.5f),
                 (float)tex1Dfetch<int>(ints, 5), (float)tex1Dfetch<int>(ints, 100)};
    for (int i = 0; i < 22; ++i) out[i] = v[i];
}
int main() {
    uchar4 pixels[3][4];
    for (int j = 0; j < 3; ++j)
        for (int i = 0; i < 4; ++i) pixels[j][i] = make_uchar4(i, j, i + j, 51 * (i + j));
    cudaChannelFormatDesc px_desc = cudaCreateChannelDesc<uchar4>();
    cudaArray_t px; cudaMallocArray(&px, &px_desc, 4, 3);
    cudaMemcpy2DToArray(px, 0, 0, pixels, 4 * sizeof(uchar4), 4 * sizeof(uchar4), 3, cudaMemcpyHostToDevice);
    float row[4] = {0, 10, 20, 30};
    cudaChannelFormatDesc f_desc = cudaCreateChannelDesc<float>();
    cudaArray_t fa; cudaMallocArray(&fa, &f_desc, 4, 1);
    cudaMemcpy2DToArray(fa, 0, 0, row, sizeof row, sizeof row, 1, cudaMemcpyHostToDevice);
    int* d_ints; int h_ints[16];
    for (int i = 0; i < 16; ++i) h_ints[i] = 3 * i;
    cudaMalloc(&d_ints, sizeof h_ints); cudaMemcpy(d_ints, h_ints, sizeof h_ints, cudaMemcpyHostToDevice);
    cudaResourceDesc linear; memset(&linear, 0, sizeof linear);
    linear.resType = cudaResourceTypeLinear; linear.res.linear.devPtr = d_ints;
    linear.res.linear.desc = cudaCreateChannelDesc<int>(); linear.res.linear.sizeInBytes = sizeof h_ints;
    cudaTextureObject_t px_t = make(array_resource(px), cudaFilterModePoint, cudaAddressModeClamp,
                                    cudaReadModeElementType, 0);
    cudaTextureObject_t border = make(array_resource(px), cudaFilterModePoint, cudaAddressModeBorder,
                                      cudaReadModeElementType, 0);
    cudaTextureObject_t unit = make(array_resource(px), cudaFilterModePoint, cudaAddressModeClamp,
                                    cudaReadModeNormalizedFloat, 0);
    cudaTextureObject_t lin = make(array_resource(fa), cudaFilterModeLinear, cudaAddressModeClamp,
                                   cudaReadModeElementType, 0);
    cudaTextureObject_t wrap = make(array_resource(fa), cudaFilterModePoint, cudaAddressModeWrap,
                                    cudaReadModeElementType, 1);
    cudaTextureObject_t ints = make(linear, cudaFilterModePoint, cudaAddressModeClamp, cudaReadModeElementType, 0);
    float* d_out; float out[22]; cudaMalloc(&d_out, sizeof out);
    reads<<<1, 1>>>(px_t, border, unit, lin, wrap, ints, d_out);
    cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 22; ++i) printf("%g ", out[i]);
    printf("\n");
    cudaDestroyTextureObject(px_t); cudaFreeArray(px); cudaFreeArray(fa);
}
"""  # noqa: E501
# clamp (0, 1) and (3, 2); border: zeros; texel (3, 2) as unit floats (51 * 5 = 255); linear blends of
# 0 10 20 30 around x - 0.5; wrapped normalized coordinates 1.1 -> texel 0, -0.3 -> texel 2; fetches 15, 0
TEXTURE_READS = "0 1 1 51 3 2 5 255 0 0 0.0117647 0.00784314 0.0196078 1 5 20 0 30 0 20 15 0"


def test_texture_objects_read_as_the_programming_guide_says(tmp_path):
    assert output(tmp_path, TEXTURES).split() == TEXTURE_READS.split()


@pytest.mark.gpu
def test_texture_reads_match_the_gpu(tmp_path):
    (tmp_path / "tex.cu").write_text(PRELUDE + TEXTURES)
    subprocess.run(["nvcc", "-arch=native", "tex.cu", "-o", "tex"], cwd=tmp_path, check=True)
    gpu = subprocess.run(["./tex"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    assert [float(x) for x in gpu] == pytest.approx([float(x) for x in TEXTURE_READS.split()], abs=0.02)
