"""Where stage 04's programs run: the backend the driver's GPU and --backend point to (choose_backend), and
the runner that runs them, started in the sandbox with the GPU probe where the GPU is planned (start_runner).
"""

from __future__ import annotations

from dataclasses import replace

from cuset_common.cli import UserError
from cuset_common.paths import NVCC_DEFAULT_ARCH
from harness.gpu_probe import Build, GpuWatch, decide_backend, open_gpu
from harness.programs import Runner, choose_runner, gpu_name, program_gpu, resolve_backend
from harness.run_folder import generation_settings
from harness.sandbox import use_bwrap


def choose_backend(args) -> tuple[str | None, str]:
    """(the GPU the driver lists, or None; the rows' backend that points to, "gpu" or "emulated"). The GPU
    holds only once the GPU probe ran on it (start_runner), or the run stops."""
    gpu = gpu_name()
    backend = resolve_backend(args.backend, gpu)
    if args.emulate_checks and backend == "gpu":
        raise UserError("--emulate-checks applies to emulated runs; add --backend emulate")
    return gpu, backend


def generates_on_gpu(args) -> bool:
    """Whether this process generates on a GPU before the programs run (the GPU's compute mode matters)."""
    if args.reference or args.solutions or args.generate_only:
        return False
    return generation_settings(args).get("device") == "cuda"


def start_runner(args, gpu: str | None, planned: str, compile_program: Build) -> tuple[Runner, list[str]]:
    """Choose the sandbox (or refuse to run unisolated); where the GPU is planned, run the GPU probe in it
    (harness/gpu_probe.py: built by `compile_program`, the stage's own nvcc step; the run stops with one
    line unless it ran); say where programs run. Returns the runner and nvcc's architecture flags: the
    probe's -gencode on the GPU, else NVCC_DEFAULT_ARCH."""
    use_bwrap(args.bwrap)  # None: the one on PATH
    runner = choose_runner(args.no_sandbox, planned, program_gpu(args.device) if planned == "gpu" else "0")
    probe = open_gpu(runner, compile_program, generates_on_gpu(args)) if planned == "gpu" else None
    backend = decide_backend(args.backend, gpu, probe.failure if probe else None)
    arch = probe.arch if backend == "gpu" else NVCC_DEFAULT_ARCH
    runner = replace(runner, watch=GpuWatch(runner, probe)) if backend == "gpu" else runner
    print(
        f"GPU: {probe.gpu if probe else gpu} (CUDA_VISIBLE_DEVICES={runner.gpu} for the programs; the probe "
        f"ran on it {'in the sandbox' if runner.sandbox else 'unsandboxed'}; "
        f"nvcc {' '.join(arch)}: compile for it, run, "
        f"compare, time)"
        if backend == "gpu"
        else f"backend: emulated (nvcc {' '.join(arch)} decides compile errors; programs run under CPU "
        f"emulation{' with AddressSanitizer' if args.emulate_checks else ''}: functional verdicts "
        f"only, no timings)"
    )
    return runner, arch
