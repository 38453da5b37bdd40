"""The device and the precision a stage computes in: --device resolved and checked before any work (a GPU
that is listed but unusable is refused, not silently replaced by the CPU), and bf16 taken only where the
hardware computes it natively (docs/method.md, "Precision")."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import torch

from .cli import UserError


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
    listing = nvidia_smi("-L")
    return listing is not None and any(line.startswith("GPU ") for line in listing.splitlines())


# A healthy driver answers nvidia-smi within seconds, also on a machine of many GPUs without persistence mode
# (each GPU initialised in turn); one that does not answer at all is wedged, a real state of GPU machines.
NVIDIA_SMI_TIMEOUT_S = 30


def nvidia_smi(*args: str) -> str | None:
    """nvidia-smi's standard output for `args`, or None where it is not installed or fails (no driver, no
    GPU). A UserError when it does not answer within NVIDIA_SMI_TIMEOUT_S: every caller would otherwise
    wait for ever on a hung driver, so every call of nvidia-smi goes through here."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.Popen([exe, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None
    try:
        out, _ = proc.communicate(timeout=NVIDIA_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # Killed and left: a process stuck in the driver (uninterruptible sleep) dies only when the driver
        # lets go, so waiting for it, as subprocess.run does after a timeout, would hang here too.
        proc.kill()
        proc.stdout.close()
        raise UserError(
            f"nvidia-smi {' '.join(args)} did not answer within {NVIDIA_SMI_TIMEOUT_S} s: the GPU driver "
            f"seems hung; check `nvidia-smi` and the kernel log (dmesg), reset or reboot the GPU, or run "
            f"without it (--device cpu, stage 04 --backend emulate)"
        ) from None
    return out if proc.returncode == 0 else None


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
