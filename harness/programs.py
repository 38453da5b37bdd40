"""Stage 04's machinery for running generated code, apart from the protocol in 04_eval_kernels.py:
a Runner that puts every compile and run through the sandbox (harness/sandbox.py) and waits, a
bounded time, while the sandbox cannot start for want of processes or uids; the emulation
backend's build step (translate with harness/emulate.py, then g++ against the runtime header in
harness/emu/); finding the GPU, the backend, and choosing the sandbox (refusing to run unisolated
unless asked); the limit on what a program may write; clipping logs for the results; and the
run's work folder, which a killed run leaves behind for the next run to remove. The kernel-mode
harness's timings: harness/timing.py.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cuset_common.cli import UserError
from cuset_common.device import nvidia_smi
from cuset_common.tasks import buffer_bytes
from harness.emulate import EMU_INCLUDE, Unsupported, gxx_command, pch_command, translate
from harness.sandbox import HOST_DEV, SandboxBusy, SandboxError, probe_isolation, run_sandboxed

if TYPE_CHECKING:  # harness/gpu_probe.py imports this module
    from harness.gpu_probe import GpuWatch

LOG_KEEP = 4000  # characters of each log kept in results (head and tail)


@dataclass(frozen=True)
class Runner:
    """How this run executes code: the sandbox on or off (--no-sandbox), the backend label."""

    sandbox: bool
    backend: str  # "gpu" | "emulated"
    gpu: str = "0"  # the GPU backend's GPU, as the programs' CUDA_VISIBLE_DEVICES (program_gpu)
    watch: GpuWatch | None = None  # the GPU probe again after a failed program (backend_choice.py)

    def untrusted(
        self, cmd: list[str], folder: Path, timeout: float, env: dict | None = None, **kw
    ) -> tuple[int | None, str]:
        """nvcc/g++ on generated source, or the generated program: whitelist sandbox (on the GPU backend
        with the GPU, and only the one --device names visible); as root, a uid of its own for this call,
        which gets `folder`."""
        gpu_dev, env = None, env or {}
        if self.backend == "gpu":
            gpu_dev, env = HOST_DEV, {"CUDA_VISIBLE_DEVICES": self.gpu, **env}
        return self._run(
            cmd, folder, timeout, untrusted=True, cpu_s=int(timeout) + 5, gpu_dev=gpu_dev, env=env, **kw
        )

    def task_script(self, script: str, folder: Path, timeout: float) -> tuple[int | None, str]:
        """The task author's gen.py/compare.py: our file system view, no network, generous limits."""
        return self._run(
            [sys.executable, script],
            folder,
            timeout,
            untrusted=False,
            cpu_s=int(timeout * (os.cpu_count() or 1)) + 5,
            file_mb=1 << 20,
            nproc=4096,
        )

    def _run(self, cmd: list[str], folder: Path, timeout: float, **kw) -> tuple[int | None, str]:
        """run_sandboxed, retried for up to `timeout` seconds while the sandbox cannot start for want of
        a resource (SandboxBusy: every sandbox uid held, or the machine or this user out of processes,
        e.g. while a neighbour's fork loop lives to its own timeout).

        Past that, the call is a timeout (exit status None, the reason in its log): it did not finish
        within its wall-clock budget, which is all a timeout says, on a busy machine too. Each step
        then keeps its own outcome for a timeout (nvcc: compile_error; the emulator's g++:
        unsupported; the program: timeout; gen.py: task_error; compare.py: wrong_output); the run goes
        on and the row counts, so the machine's state cannot drop a job from pass@k unseen. A sandbox
        that cannot start for another reason is a broken setup: it stops the run with one line."""
        try:
            return run_sandboxed(
                cmd, folder, timeout, isolate=self.sandbox, log_keep=LOG_KEEP // 2, wait_s=timeout, **kw
            )
        except SandboxBusy as e:
            return None, f"the sandbox could not start within {timeout:g} s, for want of a resource: {e}"
        except SandboxError as e:
            why = " ".join(str(e).split())  # bwrap's lines, as one
            raise UserError(f"the sandbox could not start {cmd[0]} in {folder}: {why}") from None


def choose_runner(no_sandbox: bool, backend: str, gpu: str = "0") -> Runner:
    """Isolation is required for untrusted code: say what is used, or why none is possible and refuse
    unless --no-sandbox. `gpu`: the programs' GPU on the GPU backend (program_gpu)."""
    isolation = probe_isolation()
    if isolation.available and not no_sandbox:
        print(f"sandbox: {isolation.how}")
        return Runner(True, backend, gpu)
    if not no_sandbox:
        raise UserError(
            f"cannot isolate generated code here: {isolation.how}. Stage 04 runs untrusted programs "
            f"and refuses to do so unisolated; fix that, or pass --no-sandbox (only for code you trust)"
        )
    print(
        f"WARNING: --no-sandbox: generated code runs with your rights and sees your files "
        f"(isolation {'available but ' if isolation.available else ''}off: {isolation.how})",
        file=sys.stderr,
    )
    return Runner(False, backend, gpu)


DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")  # the loaded driver's GPUs, a folder each, in any container


@dataclass(frozen=True)
class ListedGpu:
    """A GPU as nvidia-smi lists it (--query-gpu, LISTED_FIELDS)."""

    index: str  # nvidia-smi's index: PCI bus order
    uuid: str  # "GPU-8f7c...": what CUDA_VISIBLE_DEVICES may name too
    name: str
    capability: str | None  # "9.0"; None where the driver is too old for the query
    compute_mode: str | None  # "Default", "Exclusive_Process", "Prohibited"


LISTED_FIELDS = "index,uuid,name,compute_cap,compute_mode"


def listed_gpus() -> list[ListedGpu]:
    """The GPUs nvidia-smi lists (a hung nvidia-smi is a UserError: cuset_common/device.py); [] without
    nvidia-smi, a driver or a GPU. A driver too old to know a field answers "[N/A]" or fails the whole query:
    then the names alone."""
    listing = nvidia_smi(f"--query-gpu={LISTED_FIELDS}", "--format=csv,noheader")
    if listing is None:
        names = nvidia_smi("--query-gpu=index,uuid,name", "--format=csv,noheader") or ""
        return [ListedGpu(*row, None, None) for row in parse_csv(names, 3)]
    return [
        ListedGpu(index, uuid, name, cap if CAPABILITY.fullmatch(cap) else None, mode or None)
        for index, uuid, name, cap, mode in parse_csv(listing, 5)
    ]


CAPABILITY = re.compile(r"(\d+)\.(\d+)")  # a compute capability as the driver writes it: "9.0"


def parse_csv(listing: str, fields: int) -> list[list[str]]:
    """nvidia-smi's csv,noheader rows of `fields` fields each (a GPU name holds no comma); other lines are
    left out."""
    rows = [[f.strip() for f in line.split(",")] for line in listing.splitlines()]
    return [row for row in rows if len(row) == fields]


def program_gpu(device: str) -> str:
    """The CUDA_VISIBLE_DEVICES that stage 04's programs get on the GPU backend: the one GPU that --device
    names (cuda:N: the N-th GPU this process sees; auto, cuda or cpu: the first), written as this process's
    CUDA_VISIBLE_DEVICES writes it (an index, or a GPU-/MIG- UUID), so that the programs, the GPU probe and
    generation agree on which GPU is meant."""
    index = int(device.split(":")[1]) if device.startswith("cuda:") and device[5:].isdigit() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(index)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if index >= len(entries):
        shown = f"CUDA_VISIBLE_DEVICES={visible!r} makes {len(entries)} GPU(s) visible"
        raise UserError(
            f"--device {device}: {shown}, so there is no GPU {index} for the programs; name a visible GPU "
            f"(--device cuda:0), change CUDA_VISIBLE_DEVICES, or pass --backend emulate"
        )
    return entries[index]


def select_listed(gpus: list[ListedGpu], selection: str) -> ListedGpu | None:
    """The listed GPU that a CUDA_VISIBLE_DEVICES entry names: by UUID (CUDA takes any unique prefix), or by
    index. An index is CUDA's, which follows nvidia-smi's PCI order only under CUDA_DEVICE_ORDER=PCI_BUS_ID
    or among GPUs of one model: the GPU probe reports the GPU its program really ran on and corrects this
    guess (harness/gpu_probe.py). None for a MIG instance (nvidia-smi lists the GPUs that hold them)."""
    if selection.startswith("GPU-"):
        return next((g for g in gpus if g.uuid.startswith(selection)), None)
    return next((g for g in gpus if g.index == selection), None)


def gpu_name(selection: str | None = None) -> str | None:
    """The GPU the driver lists that `selection` (a CUDA_VISIBLE_DEVICES entry: program_gpu) names, or the
    first one: nvidia-smi's, else (a container without nvidia-smi) the driver's own list (driver_gpu_name);
    None without a driver or a GPU. A GPU listed is not yet one CUDA can use: stage 04 runs its GPU probe
    (harness/gpu_probe.py) before it trusts one."""
    gpus = listed_gpus()
    if gpus:
        chosen = select_listed(gpus, selection) if selection is not None else None
        return (chosen or gpus[0]).name
    return driver_gpu_name(DRIVER_GPUS)


def driver_gpu_name(gpus: Path) -> str | None:
    """The model of the first GPU in the driver's list `gpus` (each GPU's folder has an `information` file
    with a line `Model: <name>`), or None."""
    for information in sorted(gpus.glob("*/information")):
        model = re.search(r"^Model:\s*(.+)$", information.read_text(), re.M)
        if model:
            return model.group(1).strip()
    return None


def resolve_backend(choice: str, gpu: str | None) -> str:
    """The backend label of a run's rows (--backend auto | gpu | emulate): "gpu" or "emulated"."""
    if choice == "gpu" and gpu is None:
        raise UserError(
            "--backend gpu: no GPU found (neither nvidia-smi nor /proc/driver/nvidia lists one); use "
            "--backend emulate"
        )
    return "gpu" if choice == "gpu" or (choice == "auto" and gpu) else "emulated"


def require_tools(backend: str) -> None:
    """nvcc (every backend decides compile errors with it) and, to emulate, g++ on PATH."""
    for tool, what in (("nvcc", "the CUDA toolkit"), *([("g++", "g++")] if backend == "emulated" else [])):
        if shutil.which(tool) is None:
            raise UserError(f"{tool} not found on PATH; install {what}")


WORK_PREFIX = "cuset-eval-"  # + <pid>-<random>: a folder of the run whose process has that id


def make_work_dir() -> Path:
    """A fresh folder under the system temp dir for this run's builds, task data and runs (the sandbox
    uid passes through it to its own folders and lists nothing), after removing the folders that
    killed runs left behind: a SIGKILL skips stage 04's clean-up, and a task's data may take GBs.
    A folder is stale when it is ours and the process its name carries no longer exists."""
    for old in Path(tempfile.gettempdir()).glob(f"{WORK_PREFIX}*-*"):
        pid = old.name[len(WORK_PREFIX) :].split("-", 1)[0]
        if (
            pid.isdigit()
            and old.is_dir()
            and not old.is_symlink()
            and old.lstat().st_uid == os.geteuid()
            and not process_exists(int(pid))
        ):
            shutil.rmtree(old, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-"))
    os.chmod(work, 0o711)
    return work


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's process
        pass
    return True


def built_file(folder: Path, name: str) -> bool:
    """True when the sandboxed compiler (dead by now) left `name` as a regular file, not a link."""
    try:
        return stat.S_ISREG(os.lstat(folder / name).st_mode)
    except FileNotFoundError:
        return False


@dataclass(frozen=True)
class Emulator:
    """The emulation backend of one run: a copy of harness/emu with the header precompiled for the
    run's g++ flags (plain or AddressSanitizer)."""

    include: Path
    checks: bool


def prepare_emulator(work: Path, checks: bool) -> Emulator:
    include = work / "emu"
    shutil.copytree(EMU_INCLUDE, include)
    r = subprocess.run(pch_command(str(include), checks), capture_output=True, text=True)
    if r.returncode != 0:  # our own header: a failure here is a bug or a broken g++, not the candidate's
        raise UserError(f"g++ cannot build the emulator's runtime header:\n{r.stderr[-2000:]}")
    return Emulator(include, checks)


def build_emulated(
    source: str, workdir: Path, timeout: float, emulator: Emulator, runner: Runner
) -> tuple[Path | None, str]:
    """Rebuild a program nvcc accepted for the CPU emulator: translate, then g++ against the runtime
    header, linked into the build folder (the sandbox sees nothing else). Returns
    (executable, "") or (None, why the emulator cannot run it)."""
    try:
        translated = translate(source)
    except Unsupported as e:
        return None, f"emulator: {e}"
    (workdir / "prog_emu.cpp").write_text(translated)
    # Links, so shared: the sandbox's uid gets their folder, not them (ours, read-only to it).
    shutil.copytree(emulator.include, workdir / "emu", copy_function=os.link)
    code, log = runner.untrusted(
        gxx_command("prog_emu.cpp", "prog_emu", "emu", emulator.checks), workdir, timeout, nproc=512
    )
    if code == 0 and built_file(workdir, "prog_emu"):
        return workdir / "prog_emu", ""
    why = f"timeout\n{log}" if code is None else log
    return None, f"emulator: g++ cannot build the translated program (nvcc could):\n{why}"


# The candidate's per-file size limit: 1.5x the task's largest declared buffer, and at least this
# (a task may write files it does not declare; CUDABench buffers run from KB to several GB).
MIN_OUTPUT_MB = 512


def output_limit_mb(task: dict) -> int:
    """The candidate's per-file size limit: 1.5x the largest declared buffer, at least MIN_OUTPUT_MB (a task
    as load_tasks checked it: each buffer at most MAX_BUFFER_BYTES, so the limit fits setrlimit)."""
    largest = max((buffer_bytes(buf) for buf in [*task["inputs"], *task["outputs"]]), default=0)
    return max(MIN_OUTPUT_MB, math.ceil(1.5 * largest / (1 << 20)))


def clip(text: str) -> str:
    """A log as kept in results: whole, or its head and tail, LOG_KEEP characters in all."""
    if len(text) <= LOG_KEEP:
        return text
    half = LOG_KEEP // 2
    return text[:half] + f"\n[... {len(text) - 2 * half} characters cut ...]\n" + text[-half:]
