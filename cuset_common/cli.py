"""A stage's entry point: user errors as one line (exit status 2), argument checks, the device."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from .paths import ROOT


class UserError(Exception):
    """Bad input from the user: printed without a traceback, exit status 2."""


# Whether a progress line is on stderr without its newline yet (harness/report.py: Progress redraws it in
# place): run_main's last line then starts on a line of its own.
PROGRESS_LINE = {"open": False}


def say_last(text: str) -> None:
    """run_main's closing line on stderr, below a progress line left open."""
    if PROGRESS_LINE["open"]:
        print(file=sys.stderr)
        PROGRESS_LINE["open"] = False
    print(text, file=sys.stderr)


# What a script that names nothing else keeps when Ctrl-C stops it (run_main's `interrupted`).
INTERRUPTED = "stopped before it finished; run the command again"


def run_main(main_fn, argv: list[str] | None = None, interrupted: str = INTERRUPTED) -> int:
    """Run a stage's main; a UserError prints `error: ...` to stderr and exits with status 2 (as do
    the argument parser's refusals, which exit through SystemExit).

    Ctrl-C prints one line, `interrupted: ` and then `interrupted`: what the stage keeps of the stopped
    run and how to go on from it; the exit status is the shell's for a command that SIGINT ended, 130
    (128 + signal 2). A traceback there would read as a crash, though stopping is the user's choice."""
    try:
        return main_fn(argv) or 0
    except UserError as e:
        say_last(f"error: {e}")
        return 2
    except SystemExit as e:
        return e.code
    except KeyboardInterrupt:
        # Ctrl-C reaches every process of the terminal's foreground group, so under torchrun every rank
        # stops here: rank 0 alone (torchrun's RANK; a plain run has none) says so.
        if os.environ.get("RANK", "0") == "0":
            say_last(f"interrupted: {interrupted}")
        return 130


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose refusals are one line in our form (`error: ...`, exit status 2): the usage block
    argparse prints first would bury the line that says what is wrong."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; see --help\n")


def check_ranges(ap: argparse.ArgumentParser, args: argparse.Namespace, ranges: dict[str, str]) -> None:
    """Refuse each numeric argument outside its interval, before any work (ap.error: one line, exit 2).

    ranges: {dest: interval as written in mathematics}, e.g. "[1, inf)", "(0, 1]". An unset argument
    (None) passes. NaN lies in no interval, and no interval here holds infinity (it is open there).
    """
    for dest, interval in ranges.items():
        value = getattr(args, dest)
        if value is not None and not within(value, interval):
            kind = "an integer" if isinstance(value, int) else "a finite number"
            unset = ", or unset" if ap.get_default(dest) is None else ""
            ap.error(f"--{dest.replace('_', '-')} {value:g}: must be {kind} {describe(interval)}{unset}")


def within(value: float, interval: str) -> bool:
    lo, hi = (float(x) for x in interval[1:-1].split(","))
    above = value > lo if interval[0] == "(" else value >= lo
    return above and (value < hi if interval[-1] == ")" else value <= hi)


def describe(interval: str) -> str:
    """An interval in words: [1, inf) is ">= 1", (0, inf) is "> 0", [0, 1] is "in [0, 1]"."""
    lo, hi = (x.strip() for x in interval[1:-1].split(","))
    if hi == "inf":
        return f"{'>' if interval[0] == '(' else '>='} {lo}"
    return f"in {interval}"


def load_script(relpath: str):
    """Import a stage script by path, for tests and benchmarks (a stage's file name starts with a digit,
    so `import` cannot name it; the stages themselves never import each other)."""
    # named by its path (integrations/trl.py: integrations.trl), so as not to shadow a library of its stem
    name = ".".join(Path(relpath).with_suffix("").parts).replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def pick_device(name: str = "auto") -> str:
    """--device as torch names it: auto (the first GPU if there is one, else the CPU), cpu, cuda or cuda:N;
    anything else, or a GPU that is not there, is a UserError before any work."""
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        check_no_unusable_gpu()
        return "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UserError(f"--device {name}: not a device the stages run on; use auto, cpu, cuda or cuda:N")
    if device.type == "cpu":
        return "cpu"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise UserError(f"--device {name}: no CUDA device is available here; use --device cpu (or auto)")
    if device.index is not None and device.index >= count:
        raise UserError(
            f"--device {name}: there is no GPU {device.index} (this machine has {count}, "
            f"cuda:0 to cuda:{count - 1}); name one of them, or use --device cuda"
        )
    return name


def check_no_unusable_gpu() -> None:
    """Refuse --device auto where nvidia-smi lists a GPU that this torch cannot use (a CPU-only wheel
    installed by mistake, or a driver older than torch's CUDA): running on the CPU is then no one's choice."""
    if not nvidia_smi_lists_a_gpu():
        return
    why = (
        f"this torch ({torch.__version__}) is built without CUDA; install a CUDA build "
        "(https://pytorch.org/get-started/locally/)"
        if torch.version.cuda is None
        else f"this torch (CUDA {torch.version.cuda}) cannot reach it; update the driver to one for that CUDA"
    )
    raise UserError(f"--device auto: nvidia-smi lists a GPU, but {why}; or pass --device cpu to use the CPU")


def nvidia_smi_lists_a_gpu() -> bool:
    """Whether `nvidia-smi -L` (on PATH) runs and lists a GPU ("GPU 0: NVIDIA ...")."""

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        listing = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listing.returncode == 0 and any(line.startswith("GPU ") for line in listing.stdout.splitlines())


# CPU flags that mean native bfloat16 arithmetic (Linux /proc/cpuinfo names): AVX512-BF16's dot products, or
# AMX's bf16 tiles. Without them torch emulates bf16 and runs slower than fp32 (docs/performance.md, "Building
# the models", measures it), so `auto` must not pick it there.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def bf16_supported(device: str) -> bool:
    """Whether `device` ("cpu", "cuda", "cuda:1", ...) computes bfloat16 natively: a CUDA device of compute
    capability 8.0 or more (computes_bf16), or a CPU whose /proc/cpuinfo flags hold one of BF16_CPU_FLAGS.
    Where /proc/cpuinfo cannot be read (not Linux) the answer is False: fp32 is never wrong, only slower."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and computes_bf16(torch.cuda.get_device_capability(device))
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split()}
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def computes_bf16(capability: tuple[int, int]) -> bool:
    """Whether a CUDA device of this compute capability has bf16 arithmetic: Ampere (8.0) and later. Older
    GPUs emulate it, which torch.cuda.is_bf16_supported() counts by default (and it asks the current
    device, not the one named)."""
    return tuple(capability) >= (8, 0)


def resolve_precision(choice: str, device: str) -> str:
    """--precision {auto,fp32,bf16} as "fp32" or "bf16": auto takes bf16 where bf16_supported(device);
    an explicit choice is kept (bf16 on a CPU without it is emulated: correct, slower)."""
    if choice not in ("auto", "fp32", "bf16"):
        raise UserError(f"--precision {choice}: must be one of auto, fp32, bf16")
    if choice == "auto":
        return "bf16" if bf16_supported(device) else "fp32"
    return choice


# How close a training step's loss under bf16 autocast stays to fp32's, relative: bf16 keeps 8 significant
# bits (machine epsilon 2^-7); autocast rounds the matrix products' inputs to it and accumulates, takes the
# log-probs and the loss in float32, so a step's loss carries the error of a few such roundings.
# torch.testing's default rtol for bfloat16 is two epsilons, 2^-6, and so is this bound. The weights then
# drift apart by as much per step; docs/performance.md shows the drift over a few steps stays inside it.
BF16_LOSS_RTOL = 2.0**-6
