/* Kernel launches of a standalone program on the GPU backend, counted for stage 04 (docs/evaluation.md,
 * "A kernel must run"; harness/launch_count.py builds and reads this).
 *
 * Stage 04 builds standalone programs with `-cudart shared`, so every launch goes through the CUDA runtime
 * library's exported functions, and starts each one with this library in LD_PRELOAD: its functions of
 * the same names come first, count the call, and hand it to the runtime's own (dlsym RTLD_NEXT). `<<<>>>`
 * compiles to __cudaLaunchKernel in CUDA 13 (crt/device_functions.h), to cudaLaunchKernel before, each
 * with a _ptsz twin for a per-thread default stream; the extended and cooperative launches are counted
 * too. A launch captured into a CUDA graph is counted when captured.
 *
 * At exit, after the program's own exit handlers (registered before any of the program's constructors
 * ran, so run after them) and with its stdio flushed, one line goes to stderr:
 *     CUSET_LAUNCHES nonce=<the nonce of CUSET_LAUNCH_NONCE> count=<calls>
 * The nonce is fresh for every run and erased from the environment (and from /proc/self/environ) before
 * the program's code runs, so that a line the program prints itself lacks it; its children inherit no
 * nonce and report nothing. Trust: the program shares this process, so code written to find the nonce in
 * memory, or to call the driver API directly, can get around the count; launching a kernel that does
 * nothing is cheaper still, and no count can tell that from real work (the fresh input sets can).
 *
 * Untested on a GPU: built here against the toolkit's headers and run on a CPU-only machine, where the
 * runtime refuses every launch but the calls are counted all the same (tests/test_judge.py).
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_ullong launches;
static char nonce[80];

#define COUNTED(name, params, args)                                                     \
    cudaError_t name params {                                                          \
        static cudaError_t(*real) params;                                              \
        if (real == NULL) *(void**)&real = dlsym(RTLD_NEXT, #name);                     \
        atomic_fetch_add(&launches, 1);                                                \
        return real != NULL ? real args : cudaErrorInitializationError;                 \
    }

#define LAUNCH_PARAMS (const void* f, dim3 grid, dim3 block, void** args, size_t smem, cudaStream_t stream)
#define LAUNCH_ARGS (f, grid, block, args, smem, stream)
#define HANDLE_PARAMS (cudaKernel_t k, dim3 grid, dim3 block, void** args, size_t smem, cudaStream_t stream)
#define HANDLE_ARGS (k, grid, block, args, smem, stream)
#define EX_PARAMS (const cudaLaunchConfig_t* config, const void* f, void** args)
#define EX_ARGS (config, f, args)

COUNTED(__cudaLaunchKernel, HANDLE_PARAMS, HANDLE_ARGS)
COUNTED(__cudaLaunchKernel_ptsz, HANDLE_PARAMS, HANDLE_ARGS)
COUNTED(cudaLaunchKernel, LAUNCH_PARAMS, LAUNCH_ARGS)
COUNTED(cudaLaunchKernel_ptsz, LAUNCH_PARAMS, LAUNCH_ARGS)
COUNTED(cudaLaunchCooperativeKernel, LAUNCH_PARAMS, LAUNCH_ARGS)
COUNTED(cudaLaunchCooperativeKernel_ptsz, LAUNCH_PARAMS, LAUNCH_ARGS)
COUNTED(cudaLaunchKernelExC, EX_PARAMS, EX_ARGS)
COUNTED(cudaLaunchKernelExC_ptsz, EX_PARAMS, EX_ARGS)

static void report(void) {
    fflush(NULL);
    fprintf(stderr, "\nCUSET_LAUNCHES nonce=%s count=%llu\n", nonce, (unsigned long long)atomic_load(&launches));
    fflush(stderr);
}

/* Runs before the program's constructors: a preloaded library is initialised before the executable. */
__attribute__((constructor)) static void take_nonce(void) {
    char* given = getenv("CUSET_LAUNCH_NONCE");
    if (given == NULL || given[0] == '\0' || strlen(given) >= sizeof nonce) return;
    strcpy(nonce, given);
    memset(given, 0, strlen(given)); /* the environment block itself: /proc/self/environ shows it */
    unsetenv("CUSET_LAUNCH_NONCE");
    atexit(report);
}
