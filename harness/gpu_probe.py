"""Stage 04's GPU probe (docs/evaluation.md, "The GPU probe"): before any candidate, a tiny CUDA program,
built the way candidates are and run in the same sandbox, reports from a kernel the architecture it
was built for. The GPU backend is used only when it ran, so a machine whose driver lists a GPU that
CUDA cannot use from the sandbox (its nodes closed to the sandbox's uid, the driver's libraries out
of sight, a toolkit too old for the GPU) stops with one line naming what failed, instead of ending
every row `runtime_error`, or emulating unseen on a GPU machine.

The architecture is explicit: -gencode for the compute capability the driver reports, never
-arch=native, which asks the GPU the compiler sees; inside a sandbox that sees none it silently
builds for nvcc's default. Candidates are compiled with the same flags.

    capability = compute_capability()                          # "9.0", or None
    probe = probe_gpu(runner, capability, compile_program)     # Probe(arch flags, failure or None)
    backend = decide_backend(args.backend, gpu_name(), probe.failure)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from cuset_common.cli import UserError
from harness.programs import Runner, resolve_backend
from harness.sandbox import HOST_DEV, gpu_access_problem

CAPABILITY = re.compile(r"(\d+)\.(\d+)")  # a compute capability as the driver writes it: "9.0"
COMPILE_S, RUN_S = 120, 60  # the probe's budgets: a compile, and CUDA's start-up on a large machine
SAID_MAX = 400  # characters of a log kept in the one line of a refusal

# The kernel writes the architecture it was compiled for; the host prints it, or the CUDA error that
# stopped it (0 would mean the kernel never wrote: no image for this GPU).
PROBE_SOURCE = r"""#include <cstdio>

__global__ void report_arch(int* arch) {
#ifdef __CUDA_ARCH__
    *arch = __CUDA_ARCH__;
#endif
}

static int failed(const char* step, cudaError_t error) {
    printf("%s: %s\n", step, cudaGetErrorString(error));
    return 1;
}

int main() {
    int* arch = nullptr;
    int reported = 0;
    cudaError_t error = cudaMalloc(&arch, sizeof(int));
    if (error != cudaSuccess) return failed("cudaMalloc", error);
    if ((error = cudaMemset(arch, 0, sizeof(int))) != cudaSuccess) return failed("cudaMemset", error);
    report_arch<<<1, 1>>>(arch);
    if ((error = cudaGetLastError()) != cudaSuccess) return failed("kernel launch", error);
    error = cudaMemcpy(&reported, arch, sizeof(int), cudaMemcpyDeviceToHost);
    if (error != cudaSuccess) return failed("cudaMemcpy", error);
    printf("__CUDA_ARCH__ %d\n", reported);
    return 0;
}
"""

# compile_program of 04_eval_kernels.py: (source, folder, arch flags, timeout, runner) -> (executable or
# None, nvcc's log). The probe is built by the very function that builds candidates.
Build = Callable[[str, Path, list[str], float, Runner], tuple[Path | None, str]]


@dataclass(frozen=True)
class Probe:
    arch: list[str]  # nvcc's architecture flags for the GPU (empty when its capability is unknown)
    failure: str | None  # what failed, in one line; None: the probe's kernel ran on the GPU


def compute_capability() -> str | None:
    """The first GPU's compute capability ("9.0"): nvidia-smi's, else torch's where it has CUDA (a
    container without nvidia-smi, or a driver too old for the query); None when neither tells."""
    if shutil.which("nvidia-smi"):
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True
        )
        first = r.stdout.split()[0] if r.returncode == 0 and r.stdout.split() else ""
        if CAPABILITY.fullmatch(first):
            return first
    return "{}.{}".format(*torch.cuda.get_device_capability()) if torch.cuda.is_available() else None


def major_minor(capability: str) -> tuple[str, str]:
    """A compute capability's two numbers: "9.0" -> ("9", "0")."""
    found = CAPABILITY.fullmatch(capability)
    if found is None:
        raise ValueError(f"not a compute capability: {capability!r} (e.g. 9.0)")
    return found.group(1), found.group(2)


def gencode_flags(capability: str) -> list[str]:
    """nvcc's flags that build for exactly the GPU of `capability`:
    "9.0" -> -gencode arch=compute_90,code=sm_90."""
    sm = "".join(major_minor(capability))
    return ["-gencode", f"arch=compute_{sm},code=sm_{sm}"]


def cuda_arch(capability: str) -> int:
    """__CUDA_ARCH__ in code built for `capability`: "9.0" -> 900, "8.6" -> 860."""
    major, minor = major_minor(capability)
    return int(major) * 100 + int(minor) * 10


def probe_gpu(runner: Runner, capability: str | None, build: Build) -> Probe:
    """Build PROBE_SOURCE for `capability` with `build` and run it through `runner` (a GPU backend's,
    so in the candidates' sandbox with the GPU bound); the Probe says whether its kernel ran."""
    if capability is None:
        return Probe(
            [], "cannot tell the GPU's compute capability (neither nvidia-smi nor torch.cuda reports it)"
        )
    arch = gencode_flags(capability)
    closed = gpu_access_problem(HOST_DEV) if runner.sandbox else None
    if closed:
        return Probe(arch, closed)
    with tempfile.TemporaryDirectory(prefix="cuset-gpu-probe-") as tmp:
        exe, log = build(PROBE_SOURCE, Path(tmp) / "build", arch, COMPILE_S, runner)
        if exe is None:
            return Probe(arch, f"nvcc {' '.join(arch)} cannot build it: {one_line(log)}")
        create_uvm_node(exe)
        code, log = runner.untrusted([f"./{exe.name}"], exe.parent, RUN_S, nproc=64)
    return Probe(arch, run_failure(code, log, capability))


def create_uvm_node(probe: Path) -> None:
    """Make sure /dev/nvidia-uvm exists before the first sandboxed CUDA program. The driver makes it on
    CUDA's first use: its library runs nvidia-modprobe (setuid root), which loads the module and makes
    the node; in a sandbox that cannot work (a read-only /dev of its own, no new privileges). So the
    probe, our own program built from PROBE_SOURCE, runs once outside the sandbox: the node is made as
    any CUDA program would make it, with no step of our own to go wrong. Its verdict is the sandboxed
    run's."""
    if (HOST_DEV / "nvidiactl").exists() and not (HOST_DEV / "nvidia-uvm").exists():
        try:
            subprocess.run([str(probe)], capture_output=True, timeout=RUN_S)
        except subprocess.TimeoutExpired:
            pass  # the sandboxed run times out too, and says so


def run_failure(code: int | None, log: str, capability: str) -> str | None:
    """What the probe's sandboxed run says: None when its kernel reported the architecture it was built
    for, else what failed (in one line)."""
    expected = cuda_arch(capability)
    if code is None:
        failure = f"it did not finish within {RUN_S} s"
    elif code != 0:
        failure = f"it exited with status {code}: {one_line(log)}"
    elif re.search(rf"^__CUDA_ARCH__ {expected}$", log, re.M):
        return None
    else:
        failure = f"its kernel did not report __CUDA_ARCH__ {expected}: {one_line(log)}"
    missing_uvm = (HOST_DEV / "nvidiactl").exists() and not (HOST_DEV / "nvidia-uvm").exists()
    return failure + (
        "; /dev/nvidia-uvm does not exist: run nvidia-modprobe -u -c=0 as root" if missing_uvm else ""
    )


def decide_backend(choice: str, gpu: str | None, probe_failure: str | None) -> str:
    """The rows' backend, "gpu" or "emulated", from --backend (`choice`), the GPU the driver lists (`gpu`,
    None for none) and what the probe found there (`probe_failure`: None when it ran; not looked at where
    the GPU was never in question). The GPU is used only when the probe ran on it. A listed GPU on which
    it failed stops the run under `auto` too: emulating there instead would hide a broken setup on a
    machine meant to run its programs on the GPU. Without a GPU listed, `auto` emulates and `gpu` is
    refused (resolve_backend)."""
    planned = resolve_backend(choice, gpu)
    if planned == "gpu" and probe_failure is not None:
        asked = "--backend gpu: " if choice == "gpu" else ""
        raise UserError(
            f"{asked}the GPU probe failed on {gpu}: {probe_failure}. Fix that, or pass --backend emulate to "
            f"run the programs under CPU emulation"
        )
    return planned


def one_line(text: str) -> str:
    """A log as part of one line: its whitespace runs as single spaces, its last SAID_MAX characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= SAID_MAX else "..." + flat[-SAID_MAX:]
