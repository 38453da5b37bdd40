"""A kernel must run (docs/evaluation.md, "A kernel must run"), apart from the protocol in 04_eval_kernels.py:
counting the kernel launches of a standalone program, so that one which computes its outputs on the host
(with a `__global__` function declared and never launched) ends `no_kernel`, not `pass`.

Who counts. Under emulation, the runtime header (harness/emu/cuda_runtime.h: report_launches) counts every
grid it runs. On the GPU backend, standalone programs are built with `-cudart shared` (nvcc_flags) and run
with harness/launch_count_shim.c in LD_PRELOAD, whose functions of the runtime's launch names count each
call and pass it on; it is built once per run (build_shim). In kernel mode the task's own harness launches
the candidate's kernels, so a kernel runs by construction and nothing is counted on the GPU.

How the count comes back. Each run gets a fresh random nonce in the environment (NONCE_ENV); the counter
takes it, erases it from the environment before any code of the program runs, and at exit, after the
program's own exit handlers and with its output flushed, prints one line on stderr carrying it (REPORT).
A line the program prints itself lacks the nonce and is ignored; no line (a program that ends with
_exit or abort) gives no count. Trust model: the count is a check against programs that do their work
on the host, not a security boundary. The program shares the counter's process: code that searches its
memory for the nonce can forge the line, but launching a kernel that does nothing is cheaper, and no
count can tell that from real work; the fresh input sets (harness/input_sets.py) judge what it wrote.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from cuset_common.cli import UserError

NONCE_ENV = "CUSET_LAUNCH_NONCE"
REPORT = re.compile(r"CUSET_LAUNCHES nonce=(\w*) count=(\d+)")  # a whole line
SHIM_SOURCE = Path(__file__).resolve().parent / "launch_count_shim.c"
SHIM_NAME = "launch_count.so"


@dataclass(frozen=True)
class LaunchCounter:
    """How this run counts launches: `shim` is the GPU backend's LD_PRELOAD library (None under emulation,
    where the runtime header counts) and `nvcc_flags` what the programs are built with for it."""

    shim: Path | None = None
    nvcc_flags: list[str] = field(default_factory=list)

    def start(self) -> LaunchCount:
        """The counting of one run, with its own nonce."""
        return LaunchCount(secrets.token_hex(16), self.shim)


@dataclass(frozen=True)
class LaunchCount:
    """One run's count: the nonce it must report with, and the shim to preload (None: emulated)."""

    nonce: str
    shim: Path | None

    def env(self) -> dict[str, str]:
        return {NONCE_ENV: self.nonce}

    def command(self, cmd: list[str], run_dir: Path) -> list[str]:
        """`cmd` started with the shim preloaded, copied into `run_dir` (all the sandbox shows the program).
        Through env(1), inside the sandbox: the sandbox's own tools must not load it."""
        if self.shim is None:
            return cmd
        shutil.copy(self.shim, run_dir / SHIM_NAME)
        return ["/usr/bin/env", f"LD_PRELOAD={run_dir / SHIM_NAME}", *cmd]

    def read(self, log: str) -> tuple[int | None, str]:
        """(the launches the run reported, or None without a report carrying the nonce; the log without
        those lines). The largest count when there are several: a child forked after a launch reports the
        launches it inherited."""
        lines = log.split("\n")
        found = [REPORT.fullmatch(line) for line in lines]
        ours = [i for i, m in enumerate(found) if m is not None and m.group(1) == self.nonce]
        counts = [int(found[i].group(2)) for i in ours]
        # each report, and the empty line its leading line break made (the program's last line may lack one)
        dropped = set(ours) | {i - 1 for i in ours if i > 0 and lines[i - 1] == ""}
        kept = "\n".join(line for i, line in enumerate(lines) if i not in dropped)
        return (max(counts) if counts else None), kept


def no_kernel_reason(launches: int | None) -> str | None:
    """Why a run that wrote the right outputs is `no_kernel` (None: it launched a kernel)."""
    if launches is None:
        return (
            "no launch report: the program ended without running its exit handlers (_exit, abort), so "
            "nothing shows that a kernel ran"
        )
    if launches == 0:
        return "the program launched no kernel: its outputs were computed on the host"
    return None


def launch_counter(backend: str, mode: str, work: Path) -> LaunchCounter | None:
    """The run's counter: the emulator's runtime, or on the GPU in standalone mode the shim built into
    `work`; None on the GPU in kernel mode (the harness launches the kernels)."""
    if backend == "emulated":
        return LaunchCounter()
    if mode == "kernel":
        return None
    toolkit = toolkit_root()
    return LaunchCounter(build_shim(work, toolkit), nvcc_flags(toolkit))


def toolkit_root() -> Path:
    """The CUDA toolkit nvcc belongs to, as nvcc reports it (`TOP` of --dryrun): nvcc on PATH may be a
    link or a wrapper script elsewhere."""
    r = subprocess.run(
        ["nvcc", "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"], capture_output=True, text=True
    )
    top = re.search(r"^#\$ TOP=(.+)$", r.stdout + r.stderr, re.M)
    if top is None:
        raise UserError(f"cannot find the CUDA toolkit from nvcc --dryrun:\n{(r.stdout + r.stderr)[-1000:]}")
    return Path(top.group(1).strip()).resolve()


def runtime_library_dir(toolkit: Path) -> Path:
    """The folder of the toolkit's libcudart.so."""
    for folder in (toolkit / "lib64", *sorted(toolkit.glob("targets/*/lib"))):
        if any(folder.glob("libcudart.so*")):
            return folder.resolve()
    raise UserError(f"no libcudart.so under {toolkit} (lib64, targets/*/lib)")


def nvcc_flags(toolkit: Path) -> list[str]:
    """Build against the shared runtime, found at run time where the toolkit lies (the sandbox shows it)."""
    return ["-cudart", "shared", "-Xlinker", f"-rpath,{runtime_library_dir(toolkit)}"]


def build_shim(work: Path, toolkit: Path) -> Path:
    """harness/launch_count_shim.c built into `work` with the host C compiler against the toolkit's headers
    (our own code: a failure is a broken setup, which stops the run)."""
    shim = work / SHIM_NAME
    cmd = ["gcc", "-shared", "-fPIC", "-O2", "-I", str(toolkit / "include"), str(SHIM_SOURCE)]
    r = subprocess.run([*cmd, "-o", str(shim), "-ldl"], capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"cannot build the launch counter {SHIM_SOURCE.name}:\n{r.stderr[-2000:]}")
    shim.chmod(0o755)
    return shim
