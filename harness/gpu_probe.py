"""Stage 04's GPU probe (docs/evaluation.md, "The GPU probe"): before any candidate, a tiny CUDA program,
built the way candidates are and run in the same sandbox, reports from a kernel the architecture it
was built for. The GPU backend is used only when it ran, so a machine whose driver lists a GPU that
CUDA cannot use from the sandbox (its nodes closed to the sandbox's uid, the driver's libraries out
of sight, a toolkit too old for the GPU) stops with one line naming what failed, instead of ending
every row `runtime_error`, or emulating unseen on a GPU machine.

The architecture is explicit: -gencode for the compute capability of the GPU the programs run on (the
one --device names: harness/programs.py, program_gpu), never -arch=native, which asks the GPU the
compiler sees; inside a sandbox that sees none it silently builds for nvcc's default. nvidia-smi's
capability is a first guess; the probe reports the GPU it ran on and is built again where that differs.
Candidates are compiled with the same flags. Afterwards GpuWatch runs the probe again after each program
that failed on the GPU, so that a broken GPU stops the run instead of failing every candidate after it.

    runner = choose_runner(no_sandbox, "gpu", program_gpu(args.device))
    probe = open_gpu(runner, compile_program, generates_on_gpu)  # Probe(arch flags, failure or None, ...)
    backend = decide_backend(args.backend, gpu_name(), probe.failure)
    runner = replace(runner, watch=GpuWatch(runner, probe))
"""

from __future__ import annotations

import atexit
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cuset_common.cli import UserError
from harness.programs import (
    CAPABILITY,
    ListedGpu,
    Runner,
    listed_gpus,
    make_work_dir,
    resolve_backend,
    select_listed,
)
from harness.sandbox import HOST_DEV, gpu_access_problem

COMPILE_S, RUN_S = 120, 60  # the probe's budgets: a compile, and CUDA's start-up on a large machine
SAID_MAX = 400  # characters of a log kept in the one line of a refusal

# The host says which CUDA it has (driver and runtime versions: these calls work without a usable GPU) and
# which GPU it runs on (CUDA_VISIBLE_DEVICES decides that, not nvidia-smi's order); then the kernel writes the
# architecture it was compiled for, and the host prints it, or the CUDA error that stopped it (0 would mean
# the kernel never wrote: no image for this GPU).
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
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    printf("cuda driver %d runtime %d\n", driver, runtime);
    cudaDeviceProp prop;
    cudaError_t error = cudaGetDeviceProperties(&prop, 0);
    if (error != cudaSuccess) return failed("cudaGetDeviceProperties", error);
    const unsigned char* u = (const unsigned char*)prop.uuid.bytes;
    printf("device %d.%d GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x %s\n",
           prop.major, prop.minor, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
           u[12], u[13], u[14], u[15], prop.name);
    int* arch = nullptr;
    int reported = 0;
    if ((error = cudaMalloc(&arch, sizeof(int))) != cudaSuccess) return failed("cudaMalloc", error);
    if ((error = cudaMemset(arch, 0, sizeof(int))) != cudaSuccess) return failed("cudaMemset", error);
    report_arch<<<1, 1>>>(arch);
    if ((error = cudaGetLastError()) != cudaSuccess) return failed("kernel launch", error);
    error = cudaMemcpy(&reported, arch, sizeof(int), cudaMemcpyDeviceToHost);
    if (error != cudaSuccess) return failed("cudaMemcpy", error);
    printf("__CUDA_ARCH__ %d\n", reported);
    return 0;
}
"""
# What the probe prints before its kernel runs.
VERSIONS_LINE = re.compile(r"^cuda driver (\d+) runtime (\d+)$", re.M)
DEVICE_LINE = re.compile(r"^device (\d+\.\d+) (GPU-[0-9a-f-]+) (.+)$", re.M)

# compile_program of 04_eval_kernels.py: (source, folder, arch flags, timeout, runner) -> (executable or
# None, nvcc's log). The probe is built by the very function that builds candidates.
Build = Callable[[str, Path, list[str], float, Runner], tuple[Path | None, str]]


@dataclass(frozen=True)
class Probe:
    arch: list[str]  # nvcc's architecture flags for the GPU (empty when its capability is unknown)
    failure: str | None  # what failed, in one line; None: the probe's kernel ran on the GPU
    gpu: str | None = None  # the GPU the probe's program ran on, as CUDA names it, and its capability
    exe: Path | None = None  # the probe's program, kept for GpuWatch (None where it was not built)


def compute_capability(selection: str | None = None) -> str | None:
    """The compute capability ("9.0") of the GPU that `selection` (a CUDA_VISIBLE_DEVICES entry:
    harness/programs.py, program_gpu) names, else of the first GPU nvidia-smi lists, else torch's where it
    has CUDA (a container without nvidia-smi, or a driver too old for the query); None when none tells.
    A first guess: the probe reports the GPU its program really runs on, and probe_gpu corrects it."""
    gpus = listed_gpus()
    chosen = (select_listed(gpus, selection) if selection is not None else None) or next(iter(gpus), None)
    if chosen and chosen.capability:
        return chosen.capability
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


def probe_gpu(runner: Runner, capability: str | None, build: Build, folder: Path | None = None) -> Probe:
    """Build PROBE_SOURCE for `capability` with `build` and run it through `runner` (a GPU backend's, so in
    the candidates' sandbox with the GPU bound); the Probe says whether its kernel ran. Where the program
    reports another capability than the guess (CUDA_VISIBLE_DEVICES selects another GPU than nvidia-smi's
    order suggests), it is built again for the GPU it ran on. `folder`: where the program is kept (for
    GpuWatch); a temporary one by default."""
    if capability is None:
        return Probe(
            [], "cannot tell the GPU's compute capability (neither nvidia-smi nor torch.cuda reports it)"
        )
    closed = gpu_access_problem(HOST_DEV) if runner.sandbox else None
    if closed:
        return Probe(gencode_flags(capability), closed)
    with tempfile.TemporaryDirectory(prefix="cuset-gpu-probe-") as tmp:
        probe, ran_on = build_and_run(runner, capability, build, folder or Path(tmp))
        if ran_on not in (None, capability):
            probe, _ = build_and_run(runner, ran_on, build, folder or Path(tmp))
    return probe if folder else Probe(probe.arch, probe.failure, probe.gpu)


def build_and_run(runner: Runner, capability: str, build: Build, folder: Path) -> tuple[Probe, str | None]:
    """One build of the probe for `capability` in `folder`, and its sandboxed run: the Probe, and the
    capability of the GPU the program reported it ran on (None where it did not get that far)."""
    arch = gencode_flags(capability)
    exe, log = build(PROBE_SOURCE, folder / f"build-{capability}", arch, COMPILE_S, runner)
    if exe is None:
        return Probe(arch, f"nvcc {' '.join(arch)} cannot build it: {one_line(log)}"), None
    create_uvm_node(exe)
    code, log = runner.untrusted([f"./{exe.name}"], exe.parent, RUN_S, nproc=64)
    device = DEVICE_LINE.search(log)
    gpu = f"{device.group(3)} (compute capability {device.group(1)})" if device else None
    return Probe(arch, run_failure(code, log, capability), gpu, exe), device and device.group(1)


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
    for, else what failed (in one line), with the cause where the log shows it: a driver older than the
    CUDA that nvcc builds for (every program would fail while torch works), a missing uvm node."""
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
    return (
        failure
        + (old_driver(log) or "")
        + ("; /dev/nvidia-uvm does not exist: run nvidia-modprobe -u -c=0 as root" if missing_uvm else "")
    )


def cuda_version(number: int) -> str:
    """CUDA's version number as people write it: 12040 -> "12.4"."""
    return f"{number // 1000}.{number % 1000 // 10}"


def old_driver(log: str) -> str | None:
    """Where the probe's versions line shows a driver older than the runtime nvcc built it with, what to do
    (None otherwise, and where no driver library answered: driver 0)."""
    versions = VERSIONS_LINE.search(log)
    if versions is None:
        return None
    driver, runtime = map(int, versions.groups())
    if not 0 < driver < runtime:
        return None
    return (
        f"; the driver supports CUDA {cuda_version(driver)}, older than nvcc's CUDA {cuda_version(runtime)}: "
        f"install a driver for CUDA {cuda_version(runtime)} or newer, or put an nvcc of CUDA "
        f"{cuda_version(driver)} or older first on PATH"
    )


# After a program failed on the GPU, how long the GPU may take to work again (a killed kernel's context is
# torn down by the driver, which can take longer than the sandbox's own wait), and how often to try.
RECOVER_S, RECOVER_EVERY_S = 60, 5
GPU_FAILURES = ("runtime_error", "timeout")  # the outcomes after which the GPU is probed again


@dataclass
class GpuWatch:
    """The GPU probe again after each program that failed on the GPU: a failure is the candidate's only
    while the GPU still works after it. A GPU that does not recover within RECOVER_S (left in an error
    state, or taken by another process in exclusive-process compute mode) stops the run with one line,
    before the failing row is recorded, so that a rerun judges that program again and no model is charged
    for a broken GPU."""

    runner: Runner
    probe: Probe  # the probe that ran (backend_choice.py: start_runner): its program and architecture
    lock: threading.Lock = field(default_factory=threading.Lock)

    def after(self, outcome: str, what: str) -> None:
        """Raise UserError when `what` ended `outcome` (one of GPU_FAILURES) and the GPU no longer works."""
        if outcome not in GPU_FAILURES or self.probe.exe is None:
            return
        with self.lock:  # one probe at a time, as the programs run on the GPU
            failure, give_up = self.run_probe(), time.monotonic() + RECOVER_S
            while failure and time.monotonic() < give_up:
                time.sleep(RECOVER_EVERY_S)
                failure = self.run_probe()
        if failure:
            raise UserError(
                f"the GPU stopped working after {what} ended {outcome}: the GPU probe now fails "
                f"({failure}) and did not recover within {RECOVER_S} s. The rows judged before are kept "
                f"(this one is not); fix or reset the GPU (nvidia-smi -r), then rerun the same command"
            )

    def run_probe(self) -> str | None:
        exe = self.probe.exe
        code, log = self.runner.untrusted([f"./{exe.name}"], exe.parent, RUN_S, nproc=64)
        capability = DEVICE_LINE.search(log)
        return run_failure(code, log, capability.group(1) if capability else "0.0")


def open_gpu(runner: Runner, build: Build, generates_on_gpu: bool) -> Probe:
    """The GPU backend's start, on the GPU `runner` runs programs on: refuse what could never judge there
    (exclusive_gpu_problem), then the probe, its program kept in a folder of the run (removed at exit, or by
    the next run where this one is killed: harness/programs.py, make_work_dir) for GpuWatch."""
    if problem := exclusive_gpu_problem(select_listed(listed_gpus(), runner.gpu), generates_on_gpu):
        raise UserError(problem)
    folder = make_work_dir()
    atexit.register(shutil.rmtree, folder, True)
    return probe_gpu(runner, compute_capability(runner.gpu), build, folder)


def exclusive_gpu_problem(gpu: ListedGpu | None, generates_on_gpu: bool) -> str | None:
    """Why stage 04 cannot judge on `gpu` after generating on a GPU in this process, or None: in
    exclusive-process compute mode a GPU takes one process's context, and the generating process keeps
    its context to the end, so every program would fail to start."""
    if gpu is None or gpu.compute_mode != "Exclusive_Process" or not generates_on_gpu:
        return None
    return (
        f"{gpu.name} is in exclusive-process compute mode, and generating here would hold it, so no program "
        f"could then run on it: generate first with --generate-only, then judge in a second run with "
        f"--solutions <its --out>/completions.jsonl, or set the mode to Default (nvidia-smi -c DEFAULT)"
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
