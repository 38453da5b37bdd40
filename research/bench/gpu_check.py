"""The GPU check: the project's risky GPU paths end to end, with the bundled tiny model, in at most 8 minutes.
Nothing else here has a GPU, so the CPU tests check these paths' logic and this script is their first
contact with hardware (docs/tests.md, "The GPU check").

Each step runs the real stage commands as subprocesses, so a crash in one is reported and the next runs. It
prints PASS, PARTIAL, FAIL or SKIP (with the reason) per step, then a summary line. PARTIAL: the step ran and
passed, but this machine cannot exercise all it checks; the reason says what went unchecked. The exit status
is 1 when a step failed, 2 (one line, `error: ...`) on a machine without a GPU or where nvidia-smi does not
answer (cuset_common/device.py: nvidia_smi), else 0.

  preflight        nvcc's CUDA release against the driver's (nvidia-smi's "CUDA Version"): a driver of an
                   older major release starts none of the programs nvcc builds, so this step names both and
                   the stage-04 steps are skipped ("needs preflight") instead of failing alike
  sandbox          stage 04's sandbox starts (harness/sandbox.py: probe_isolation) with the bwrap of
                   --bwrap-deb, else PATH's, which the stage-04 steps then take with --bwrap; without
                   bwrap it is SKIPPED and they run with --no-sandbox
  gpu-probe        stage 04 --backend gpu starts (its probe: harness/gpu_probe.py), says it builds with
                   -gencode for this GPU's compute capability, and passes one reference program
  reference-timing 10 tasks' references timed against themselves in kernel mode: every row passes, and
                   every speedup lies within SPEEDUP_WINDOW
  profile, regions stages 01 and 02 on CUDA in bf16 (01) on the bundled held-out SFT file (40 records), at
                   --max-length TRAIN_MAX_LENGTH, which every sample fills (those whose prompt fills it
                   have no response token and are skipped)
  train            stage 03 on CUDA in bf16, TRAIN_STEPS steps; every micro-batch holds TRAIN_MICRO_BATCH
                   samples of exactly TRAIN_MAX_LENGTH tokens, the shape stage 03's memory plan counts
  train-resume     the same run killed (SIGKILL) after a logged step, then --resume: as many steps as
                   `train`, and the same final loss within BF16_LOSS_RTOL
  memory-plan      `train`'s meta.json: torch.cuda.max_memory_allocated within the plan's bounds, at most
                   PLAN_MARGIN_BELOW under it and PLAN_MARGIN_ABOVE (+ PLAN_SLACK_BYTES) over it
  torchrun-fsdp    torchrun of stage 03 with --fsdp (NCCL) finishes: 2 processes where there are 2 GPUs;
                   with one, 1 process, whose collectives cross no GPU, and the step is PARTIAL
  torchrun-ddp     the same without --fsdp (DDP; with one process stage 03 makes no process group)
  generate-hf      stage 04 generating with its own loop on CUDA (3 tasks, greedy) and judging the replies
  generate-vllm    the same with vLLM, where it is installed (SKIPPED otherwise)

Output (--out, default runs/gpu-check; replaced on each run): one folder per step's stage outputs,
logs/<step>.log with every command and its output, bwrap/ (the unpacked --bwrap-deb), and gpu_check.json: the
GPU, the sandbox, and per step its status, reason, seconds and figures (timing ratios, plan against peak),
rewritten after every step.

    python research/bench/gpu_check.py                                 # every step, results in runs/gpu-check
    python research/bench/gpu_check.py --bwrap-deb debs/bubblewrap_*.deb      # with the sandbox from a .deb

A GPU machine lent for minutes may have no bubblewrap and no network. Fetch the .deb where apt works and
carry it along (debs/ is git-ignored): `mkdir -p debs && (cd debs && apt-get download bubblewrap)`.
--bwrap-deb unpacks it with dpkg-deb (or, without dpkg-deb, by reading the ar and tar archives in Python)
beside --out, so that a package that cannot be unpacked is refused before a previous check's results are
replaced, then moves it to <--out>/bwrap and prints where its bwrap is: it stays there after the check, for
stage 04 runs of your own (04_eval_kernels.py --bwrap PATH).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import io
import json
import math
import os
import queue
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, whose packages it imports
from cuset_common.cli import ArgumentParser, UserError, run_main
from cuset_common.device import BF16_LOSS_RTOL, nvidia_smi
from cuset_common.files import read_jsonl, write_text_atomic
from cuset_common.paths import EVAL_SFT_KERNEL_FILE, ROOT, TINY_MODEL
from harness.gpu_probe import gencode_flags
from harness.programs import gpu_name
from harness.sandbox import kill_tree

BUDGET_S = 8 * 60  # the whole check; a command never runs past it (each gets what is left at most)
MIN_STEP_S = 15  # a step is not started with less of the budget left: it could not finish
# After a command is killed, its output is read on for at most this long: a killed process closes the pipe
# as it exits, and only a process outside the command's tree (its parent exited before the kill, so the walk
# could not find it) holds it longer. Each command's limit leaves this much of the budget.
DRAIN_S = 5
# A reference timed against itself runs the same kernel twice: its speedup is 1 up to timing noise. The
# window is symmetric on a log scale (0.8 = 1 / 1.25).
SPEEDUP_WINDOW = (0.8, 1.25)
# The memory plan (cuset_common/training/scale.py: memory_plan) counts the tensors stage 03 makes; the CUDA
# caching allocator's peak also holds what the plan leaves out: cuBLAS's workspaces (tens of MiB on recent
# GPUs, taken from the same allocator), small allocations and rounding to its block sizes. A peak beyond
# plan x (1 + margin) + slack means the plan misses a term.
PLAN_MARGIN_ABOVE = 0.10
PLAN_SLACK_BYTES = 128 * 2**20
# Below the plan: the plan is a sum of worst moments, so it may lie above the peak of live tensors, but only
# by what it counts twice or in vain. Backward frees activations as gradients arrive, so at most the smaller
# of the gradients and the activations with the head is counted twice (tests/test_fsdp.py: check_plan); and
# an unpadded micro-batch keeps neither SDPA's float mask nor k, v repeated to every head, which the plan
# counts (cuset_common/training/scale.py: layer_bytes). At `train`'s shape (TRAIN_MAX_LENGTH,
# TRAIN_MICRO_BATCH, bf16 autocast) these are 20.0 + 4.8 MiB of the plan's 163.3: 15.2%, rounded up to a whole
# percent; a peak further below means the plan counts more than the run holds. tests/test_gpu_check.py
# recomputes the share.
PLAN_MARGIN_BELOW = 0.16
MIB = 2**20

TRAIN_DATA = EVAL_SFT_KERNEL_FILE  # 40 records: the smallest SFT file that travels with the checkout
# The shortest sample of TRAIN_DATA is 289 tokens (the tiny model's tokenizer), so every sample fills this
# --max-length: no micro-batch is padded, each is the micro-batch x max_length tokens the memory plan counts.
# 23 samples have response tokens within it (the other prompts fill it; stage 03 skips them).
TRAIN_MAX_LENGTH = 289
TRAIN_MICRO_BATCH = 4  # stage 03's default on a GPU, explicit: the plan's shape depends on it
# The output layer scores the response positions in chunks of --chunk-rows, and the plan counts a full chunk.
# A micro-batch here holds at least 36 response positions (the four samples with the fewest have 36), so a
# chunk of 32 is full in every one; stage 03's default, 1024, is more than any micro-batch here holds.
TRAIN_CHUNK_ROWS = 32
TRAIN_STEPS = 8  # 4 epochs of 2 batches (23 samples, batches of 8): the resumed run crosses epoch boundaries
TORCHRUN_STEPS = 2
TIMEOUT_S = {  # per command; each step's share of the budget, with room (the tiny model is quick on a GPU)
    "preflight": 30,
    "sandbox": 60,
    "gpu-probe": 90,
    "reference-timing": 150,
    "profile": 90,
    "regions": 60,
    "train": 90,
    "train-resume": 90,  # each of its two commands
    "torchrun-fsdp": 90,
    "torchrun-ddp": 90,
    "generate-hf": 120,
    "generate-vllm": 180,
}
# The sandbox as stage 04 probes it before any run (harness/programs.py: choose_runner), with the bwrap its
# --bwrap names (harness/sandbox.py: use_bwrap), the command's one argument.
PROBE_SANDBOX = (
    "import sys; from harness.sandbox import probe_isolation, use_bwrap; use_bwrap(sys.argv[1]); "
    "i = probe_isolation(); print(i.how); sys.exit(0 if i.available else 1)"
)


# ---------------------------------------------------------------------------------------
# The verdicts on a step's figures (pure: tested on the CPU)
# ---------------------------------------------------------------------------------------


def speedup_problems(rows: list[dict], window: tuple[float, float] = SPEEDUP_WINDOW) -> list[str]:
    """What is wrong with rows of references timed against themselves: a row that did not pass, a timing
    missing, a speedup outside `window`; no rows at all. [] when all is well."""
    if not rows:
        return ["results.jsonl has no rows"]
    low, high = window
    problems = []
    for row in rows:
        name, speedup = f"{row.get('task_id')} level {row.get('level')}", row.get("speedup")
        if row.get("outcome") != "pass":
            problems.append(f"{name}: outcome {row.get('outcome')}, not pass")
        elif not isinstance(speedup, (int, float)) or not math.isfinite(speedup):
            problems.append(f"{name}: no speedup ({row.get('timing_void', 'no timing line')})")
        elif not low <= speedup <= high:
            problems.append(f"{name}: speedup {speedup:.3f} outside [{low}, {high}]")
    return problems


def plan_figures(memory: dict) -> dict:
    """meta.json's "memory" of stage 03 as the check reports it: plan, peak (MiB) and peak / plan."""
    plan, peak = memory["plan_bytes"], memory["peak_allocated_bytes"]
    return {
        "plan_mib": round(plan / MIB, 1),
        "peak_allocated_mib": round(peak / MIB, 1),
        "peak_over_plan": round(peak / plan, 3) if plan > 0 else None,
    }


def plan_mismatch(memory: dict) -> str | None:
    """Why the peak does not fit the plan, or None: above it by more than PLAN_MARGIN_ABOVE and
    PLAN_SLACK_BYTES (the plan misses a term), or below it by more than PLAN_MARGIN_BELOW (it counts one
    the run does not hold)."""
    plan, peak = memory["plan_bytes"], memory["peak_allocated_bytes"]
    allowed = plan * (1 + PLAN_MARGIN_ABOVE) + PLAN_SLACK_BYTES
    if peak > allowed:
        return (
            f"peak allocated {peak / MIB:,.1f} MiB exceeds the plan's {plan / MIB:,.1f} MiB by more than "
            f"{PLAN_MARGIN_ABOVE:.0%} + {PLAN_SLACK_BYTES // MIB} MiB (allowed {allowed / MIB:,.1f} MiB)"
        )
    least = plan * (1 - PLAN_MARGIN_BELOW)
    if peak < least:
        return (
            f"peak allocated {peak / MIB:,.1f} MiB is under the plan's {plan / MIB:,.1f} MiB by more than "
            f"{PLAN_MARGIN_BELOW:.0%} (at least {least / MIB:,.1f} MiB): the plan counts more than the run "
            "holds"
        )
    return None


CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*(\d+)\.(\d+)")  # nvidia-smi's header: the driver's CUDA
NVCC_RELEASE = re.compile(r"\brelease (\d+)\.(\d+)")  # nvcc --version: "Cuda compilation tools, release 13.0"


def driver_cuda(header: str) -> tuple[int, int] | None:
    """The newest CUDA the driver runs, (major, minor), from nvidia-smi's header; None where it says none."""
    found = CUDA_VERSION.search(header)
    return (int(found.group(1)), int(found.group(2))) if found else None


def nvcc_release(version: str) -> tuple[int, int] | None:
    """The CUDA release of an nvcc, (major, minor), from `nvcc --version`; None where it names none."""
    found = NVCC_RELEASE.search(version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def toolkit_mismatch(driver: tuple[int, int] | None, nvcc: tuple[int, int] | None) -> str | None:
    """Why the programs nvcc builds cannot run on this driver, or None.

    A program built by nvcc of release X.Y starts where the driver runs CUDA X.0 or later: within a major
    release CUDA's minor version compatibility lets an older driver run it, provided no PTX is left to that
    driver to compile, and stage 04 builds machine code for the GPU (harness/gpu_probe.py: gencode_flags).
    A driver of an older major release refuses every such program at its first CUDA call, while torch,
    built for the driver's CUDA, works: one failure, reported here instead of by every stage-04 step.
    """
    if nvcc is None:
        return "nvcc --version names no release; stage 04 builds every program with nvcc"
    if driver is None:
        return "neither nvidia-smi nor libcuda tells the driver's CUDA version, so nvcc's cannot be checked"
    if driver[0] >= nvcc[0]:
        return None
    have, need = ".".join(map(str, driver)), ".".join(map(str, nvcc))
    return (
        f"the driver runs CUDA {have} at most but nvcc is release {need}: none of the programs it builds "
        f"can start; install a driver for CUDA {nvcc[0]} (nvidia-smi's header then says CUDA Version: "
        f"{nvcc[0]}.0 or more), or put the nvcc of a CUDA {driver[0]}.x toolkit first on PATH"
    )


# What the torchrun steps leave unchecked with one process (cuset_common/training/scale.py): without --fsdp
# stage 03 makes no process group at all (setup_distributed), and with it a group of one, whose collectives
# move nothing between GPUs; nor is the gloo group made that the processes wait in while rank 0 writes
# (checkpoint_wait_group).
ONE_PROCESS = (
    "one GPU, so torchrun ran 1 process: no collective crossed GPUs and no gloo checkpoint wait was made "
    "(they need 2 GPUs)"
)


def torchrun_processes(gpus: int) -> tuple[int, str | None]:
    """The processes the torchrun steps start on a machine of `gpus` GPUs, one per GPU up to 2, and what
    goes unchecked (None: nothing). Two make every collective a third would; more would add only time."""
    return (2, None) if gpus >= 2 else (1, ONE_PROCESS)


# ---------------------------------------------------------------------------------------
# The sandbox's bwrap from a Debian package
# ---------------------------------------------------------------------------------------


def extract_deb(deb: Path, dest: Path) -> None:
    """Unpack the files of a Debian package into `dest`: with dpkg-deb where it is installed, else by
    reading the package's ar archive and its data.tar in Python (gzip, xz, bzip2 or none)."""
    if shutil.which("dpkg-deb"):
        r = subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], capture_output=True, text=True)
        if r.returncode != 0:
            raise UserError(f"--bwrap-deb {deb}: dpkg-deb cannot unpack it: {' '.join(r.stderr.split())}")
        return
    name, data = deb_data_member(deb)
    if name.endswith(".zst"):
        raise UserError(
            f"--bwrap-deb {deb}: its {name} is zstd-compressed, which Python's tarfile cannot read; "
            f"unpack it where dpkg-deb is installed, or use a Debian (xz) package"
        )
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        extract_tar(tar, dest, f"--bwrap-deb {deb}")


def extract_tar(tar: tarfile.TarFile, dest: Path, what: str) -> None:
    """Extract `tar` into `dest` (an empty folder) with nothing written outside it: tarfile's "data" filter
    where this Python has it (3.11.4 and later; Debian 12's python3 is 3.11.2), else rules of the same
    intent checked here on every member before anything is extracted. A UserError names the first member
    that breaks them."""
    if hasattr(tarfile, "data_filter"):
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as e:
            raise UserError(f"{what}: refused: {e}") from None
        return
    members = tar.getmembers()
    links = {"/".join(path_parts(m.name)) for m in members if m.issym()}
    for member in members:
        if problem := unsafe_member(member, links):
            raise UserError(f"{what}: refused: {member.name!r} {problem}")
        member.mode &= 0o755  # as the data filter: no setuid, setgid or sticky bit, no write for others
    tar.extractall(dest)


def unsafe_member(member: tarfile.TarInfo, links: set[str]) -> str | None:
    """What makes `member` write outside the destination or make what is not plain data, or None. `links`:
    the archive's symbolic links, which no path may pass through: a link pointing inside and a path relative
    to it can lead outside although each looks inside on its own."""
    parts = path_parts(member.name)
    if member.name.startswith("/") or ".." in parts:
        return "has an absolute path or a '..'"
    if not (member.isfile() or member.isdir() or member.issym()):
        return "is not a file, a folder or a symbolic link (a device, a pipe or a hard link)"
    if problem := walk_problem(parts, links):
        return problem
    if member.issym():
        if member.linkname.startswith("/"):
            return f"links to an absolute path ({member.linkname})"
        if problem := walk_problem(parts[:-1] + member.linkname.split("/"), links):
            return f"links to {member.linkname}, which {problem}"
    return None


def path_parts(name: str) -> list[str]:
    """A member's path as its parts, "." and empty ones left out ("./usr/bin/bwrap": usr, bin, bwrap)."""
    return [part for part in name.split("/") if part not in ("", ".")]


def walk_problem(parts: list[str], links: set[str]) -> str | None:
    """Walk the relative path `parts` down from the destination without following links: why it leads
    outside, or passes through one of `links` (where it could lead anywhere); None when it does neither."""
    at: list[str] = []
    for part in parts:
        if at and "/".join(at) in links:
            return "passes through a symbolic link of the archive"
        if part == "..":
            if not at:
                return "leads outside the destination"
            at.pop()
        elif part not in ("", "."):
            at.append(part)
    return None


AR_MAGIC = b"!<arch>\n"
AR_HEADER = 60  # bytes: name 16, mtime 12, owner 6, group 6, mode 8, size 10, magic 2 (ar(5))


def deb_data_member(deb: Path) -> tuple[str, bytes]:
    """(name, bytes) of the data.tar.* member of a .deb, an ar archive (deb(5))."""
    blob = deb.read_bytes()
    if not blob.startswith(AR_MAGIC):
        raise UserError(f"--bwrap-deb {deb}: not a Debian package (no ar header); name a .deb file")
    at = len(AR_MAGIC)
    while at + AR_HEADER <= len(blob):
        header = blob[at : at + AR_HEADER]
        name, size = header[:16].decode("ascii").strip().rstrip("/"), int(header[48:58])
        at += AR_HEADER
        if name.startswith("data.tar"):
            return name, blob[at : at + size]
        at += size + size % 2  # members start on even offsets
    raise UserError(f"--bwrap-deb {deb}: the package holds no data.tar member; name a bubblewrap .deb")


def bwrap_folder(deb: Path, dest: Path) -> Path:
    """usr/bin of the bubblewrap package `deb` unpacked into `dest`: the folder that holds its bwrap."""
    if not deb.is_file():
        raise UserError(f"--bwrap-deb {deb}: no such file; see --help for how to download it")
    extract_deb(deb, dest)
    folder = dest / "usr" / "bin"
    if not (folder / "bwrap").is_file():
        raise UserError(f"--bwrap-deb {deb}: the package has no usr/bin/bwrap; name the bubblewrap .deb")
    return folder


BWRAP_OUT = "bwrap"  # the folder of --out that holds the unpacked --bwrap-deb


def prepare(out: Path, deb: Path | None) -> Path | None:
    """--out ready (prepare_out), and the bwrap the stage-04 steps take (--bwrap): --bwrap-deb's, else the
    one on PATH, else None (no sandbox here). The package is unpacked beside --out first, so that one that
    cannot be unpacked is refused before a previous check's results are replaced, then moved to
    <out>/bwrap: there it outlives the check, for stage 04 runs of one's own (README's GPU commands)."""
    if deb is None:
        prepare_out(out)
        found = shutil.which("bwrap")
        return Path(found) if found else None
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}-bwrap-", dir=out.parent))
    try:
        bwrap_folder(deb, scratch)
        prepare_out(out)
        scratch.rename(out / BWRAP_OUT)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # gone already where it was moved
    return out / BWRAP_OUT / "usr" / "bin" / "bwrap"


# ---------------------------------------------------------------------------------------
# Running the stages: one command, with its output in the step's log and a time limit
# ---------------------------------------------------------------------------------------


class StepVerdict(Exception):
    """The step ran and this is its verdict, other than PASS: the reason, and the figures that show it."""

    def __init__(self, reason: str, figures: dict | None = None):
        super().__init__(reason)
        self.figures = figures or {}


class StepFailed(StepVerdict):
    """Something is wrong: FAIL."""


class StepPartial(StepVerdict):
    """All that ran passed, but this machine could not exercise all that the step checks: PARTIAL, the
    reason saying what went unchecked."""


class StepSkipped(Exception):
    """The step could not or need not run here: SKIP with this reason."""


@dataclass
class Finished:
    """How a command ended: its exit status (None after the time limit) and output; kill_line is the line
    at which run_command killed it on purpose (kill_at), else None."""

    code: int | None
    output: str
    kill_line: str | None = None

    def cause(self) -> str:
        """The line that says why it failed: the last `error: ...` of a stage or Python exception with a
        message (a torchrun worker's, prefixed [rankN]:, not the launcher's bare ChildFailedError), else
        the last line."""
        lines = [ln.strip() for ln in self.output.splitlines() if ln.strip()]
        causes = [ln for ln in lines if CAUSE_LINE.match(ln)]
        return (causes or lines or ["(no output)"])[-1]


CAUSE_LINE = re.compile(r"^(\[rank\d+\]:\s*)?(error: |[\w.]*(Error|Exception)\b: \S)")


@dataclass
class Check:
    """One run of the check: where it writes, the children's environment, the GPU (describe_gpu), the bwrap
    to try (prepare), the deadline, the stage-04 sandbox flags and the steps' results so far."""

    out: Path
    env: dict[str, str]
    gpu: dict
    bwrap: Path | None
    deadline: float
    sandbox_flags: list[str] = field(default_factory=lambda: ["--no-sandbox"])
    results: dict[str, dict] = field(default_factory=dict)

    def log(self, step: str) -> Path:
        return self.out / "logs" / f"{step}.log"

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, step: str, cmd: list[str], kill_at: re.Pattern | None = None) -> Finished:
        """Run `cmd` for `step` within its timeout and the budget left (less DRAIN_S, the most the reading
        of its output may go on after a kill); kill_at: SIGKILL the command at the first line of its output
        that matches (a run stopped the hard way)."""
        timeout = min(TIMEOUT_S[step], self.time_left() - DRAIN_S)
        return run_command(cmd, self.log(step), timeout, self.env, kill_at)

    def stage(self, step: str, script: str, argv: list[str], kill_at: re.Pattern | None = None) -> Finished:
        """A stage script with this Python."""
        return self.run(step, [sys.executable, script, *argv], kill_at)


def run_command(
    cmd: list[str], log: Path, timeout: float, env: dict[str, str], kill_at: re.Pattern | None
) -> Finished:
    """Run `cmd` from the repository root, appending its output to `log` as it comes; after `timeout`
    seconds it is killed with every process under it (kill_tree) and its exit status is None. Output is read
    line by line, so that kill_at stops the command within a line of the match, not at the next poll."""
    with log.open("a", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # a group of its own: kill_tree kills it too, walk or no walk
        )
        limit = time.monotonic() + max(timeout, 0)
        lines, kill_line, expired = read_output(proc, f, limit, kill_at)
        if not (expired or kill_line is not None or exited(proc, limit)):  # its output ended, but it ran on
            expired = True
        code = reap(proc)
        if expired:
            f.write(f"[gpu_check: killed after the time limit of {timeout:.0f} s]\n")
    return Finished(None if expired else code, "".join(lines), kill_line)


def read_output(
    proc: subprocess.Popen, f, limit: float, kill_at: re.Pattern | None
) -> tuple[list[str], str | None, bool]:
    """(lines, kill_line, expired): the command's output, each line written to `f` as it comes, up to its
    end. The command is killed (kill_tree) at the first line that matches kill_at (kill_line) or at `limit`
    (expired); after a kill the output is read for DRAIN_S at most, so that a process the kill missed,
    holding the pipe open, cannot keep the check waiting."""
    output = OutputLines(proc.stdout)
    lines, kill_line, expired, until = [], None, False, limit
    while True:
        try:
            line = output.next(until)
        except TimeoutError:
            if expired or kill_line is not None:
                f.write("[gpu_check: output left unread: a process outside the killed tree holds it open]\n")
                break
            expired, until = True, time.monotonic() + DRAIN_S
            kill_tree(proc)
            continue
        if line is None:
            break
        f.write(line)
        lines.append(line)
        if kill_at is not None and kill_line is None and not expired and kill_at.search(line):
            kill_line, until = line.strip(), time.monotonic() + DRAIN_S
            kill_tree(proc)
    return lines, kill_line, expired


class OutputLines:
    """The lines of a pipe, read by a thread of their own so that the reader can stop waiting at a deadline:
    a pipe stays open while any process holds it, and one that escaped a kill may live on."""

    def __init__(self, stream):
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        try:
            for line in stream:
                self.lines.put(line)
        finally:
            self.lines.put(None)  # the end of the output

    def next(self, until: float) -> str | None:
        """The next line, or None at the end of the output; TimeoutError when none came by `until`
        (time.monotonic())."""
        try:
            return self.lines.get(timeout=max(until - time.monotonic(), 0))
        except queue.Empty:
            raise TimeoutError from None


def exited(proc: subprocess.Popen, limit: float) -> bool:
    """Whether the command exits by `limit`; if not, it is killed (kill_tree)."""
    try:
        proc.wait(timeout=max(limit - time.monotonic(), 0))
        return True
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        return False


def reap(proc: subprocess.Popen) -> int | None:
    """The command's exit status, waiting DRAIN_S at most: None where a killed one still has not exited (a
    process stuck in a hung driver dies only when the driver lets go)."""
    try:
        return proc.wait(timeout=DRAIN_S)
    except subprocess.TimeoutExpired:
        return None


def require_success(done: Finished, what: str) -> None:
    """StepFailed unless the command exited 0, naming how it ended and its last line of output."""
    if done.code == 0:
        return
    how = "ran past its time limit" if done.code is None else f"exit status {done.code}"
    raise StepFailed(f"{what}: {how}: {done.cause()}")


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise StepFailed(f"{path} was not written")
    return json.loads(path.read_text(encoding="utf-8"))


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise StepFailed(f"{path} was not written")
    return [row for _, row in read_jsonl(path)]


# ---------------------------------------------------------------------------------------
# The steps, in the order they run; each returns its figures or raises StepFailed / StepSkipped
# ---------------------------------------------------------------------------------------


def check_preflight(check: Check) -> dict:
    """nvcc's CUDA release against the driver's (toolkit_mismatch), before a stage-04 step builds with it."""
    nvcc = shutil.which("nvcc", path=check.env.get("PATH"))
    if nvcc is None:
        raise StepFailed("no nvcc on PATH: stage 04 builds every program with it; install the CUDA toolkit")
    done = check.run("preflight", [nvcc, "--version"])
    require_success(done, "nvcc --version")
    release, driver = nvcc_release(done.output), check.gpu["driver_cuda"]
    figures = {"nvcc": nvcc, "nvcc_release": release and ".".join(map(str, release)), "driver_cuda": driver}
    if problem := toolkit_mismatch(driver and tuple(map(int, driver.split("."))), release):
        raise StepFailed(problem, figures)
    return figures


def check_sandbox(check: Check) -> dict:
    """Stage 04's own probe of the sandbox; the stage-04 steps run sandboxed only when it passes."""
    if check.bwrap is None:
        raise StepSkipped(
            "no bwrap on PATH and no --bwrap-deb: the stage-04 steps run with --no-sandbox "
            "(see --help for how to bring the .deb)"
        )
    done = check.run("sandbox", [sys.executable, "-c", PROBE_SANDBOX, str(check.bwrap)])
    if done.code != 0:
        raise StepFailed(
            f"stage 04 cannot isolate programs here (its steps run with --no-sandbox): {done.cause()}"
        )
    check.sandbox_flags = ["--bwrap", str(check.bwrap)]
    return {"bwrap": str(check.bwrap), "isolation": done.output.strip()}


def check_gpu_probe(check: Check) -> dict:
    """Stage 04 with --backend gpu starts (nvcc for this GPU's architecture) and judges one reference."""
    out = check.out / "gpu-probe"
    argv = ["--reference", "--mode", "standalone", "--backend", "gpu", "--limit", "1", "--levels", "1"]
    done = check.stage("gpu-probe", "04_eval_kernels.py", [*argv, "--out", str(out), *check.sandbox_flags])
    require_success(done, "stage 04 --backend gpu")
    said = next((ln for ln in done.output.splitlines() if ln.startswith("GPU:")), None)
    expected = " ".join(gencode_flags(check.gpu["capability"]))
    figures = {"stage04_says": said, "expected_arch": expected}
    if said is None or expected not in said:
        raise StepFailed(f"stage 04 did not say it built for this GPU ({expected})", figures)
    rows = read_rows(out / "results.jsonl")
    if [r.get("outcome") for r in rows] != ["pass"]:
        raise StepFailed(f"one reference on the GPU: outcomes {[r.get('outcome') for r in rows]}, not [pass]")
    return figures


def check_reference_timing(check: Check) -> dict:
    """Ten tasks' references against themselves in kernel mode: all pass, speedups near 1."""
    out = check.out / "reference-timing"
    argv = ["--reference", "--mode", "kernel", "--backend", "gpu", "--limit", "10", "--levels", "1"]
    done = check.stage(
        "reference-timing", "04_eval_kernels.py", [*argv, "--out", str(out), *check.sandbox_flags]
    )
    require_success(done, "stage 04 --reference --mode kernel")
    rows = read_rows(out / "results.jsonl")
    speedups = {r.get("task_id"): [r.get("speedup"), r.get("speedup_interval")] for r in rows}
    figures = {"rows": len(rows), "speedup_and_interval": speedups, "window": list(SPEEDUP_WINDOW)}
    if problems := speedup_problems(rows):
        raise StepFailed(f"{len(problems)} of {len(rows)} rows: " + "; ".join(problems), figures)
    return figures


def check_profile(check: Check) -> dict:
    """Stage 01 profiles the training data on the GPU under bf16 autocast, at training's --max-length (the
    regions stage 03 reads must have been made at its own)."""
    argv = ["--data", str(TRAIN_DATA), "--max-length", str(TRAIN_MAX_LENGTH), "--device", "cuda"]
    argv += ["--precision", "bf16"]
    done = check.stage("profile", "01_profile.py", [*argv, "--out", str(check.out / "profile")])
    require_success(done, "stage 01 --device cuda --precision bf16")
    return {}


def check_regions(check: Check) -> dict:
    """Stage 02 labels regions on that profile (a CPU stage: here it makes stage 03's input)."""
    argv = ["--data", str(TRAIN_DATA), "--profile", str(check.out / "profile"), "--permutations", "20"]
    done = check.stage("regions", "02_label_regions.py", [*argv, "--out", str(check.out / "regions")])
    require_success(done, "stage 02")
    return {}


def train_argv(check: Check, steps: int, out: str) -> list[str]:
    """Stage 03's arguments shared by every training step: the data, stage 02's regions, CUDA in bf16, and
    the shape the memory plan counts (TRAIN_MAX_LENGTH, TRAIN_MICRO_BATCH, TRAIN_CHUNK_ROWS)."""
    return [
        *("--data", str(TRAIN_DATA), "--regions", str(check.out / "regions")),
        *("--device", "cuda", "--precision", "bf16", "--batch-size", "8", "--max-steps", str(steps)),
        *("--max-length", str(TRAIN_MAX_LENGTH), "--micro-batch-size", str(TRAIN_MICRO_BATCH)),
        *("--chunk-rows", str(TRAIN_CHUNK_ROWS), "--out", str(check.out / out)),
    ]


def finished_training(folder: Path, steps: int) -> tuple[dict, list[dict]]:
    """(meta.json, log.jsonl rows) of a stage-03 run that must have reached `steps` in bf16."""
    meta, log = read_json(folder / "meta.json"), read_rows(folder / "log.jsonl")
    if meta.get("final_step") != steps or len(log) != steps:
        raise StepFailed(
            f"{folder.name}: final_step {meta.get('final_step')} and {len(log)} log rows, not {steps}"
        )
    if meta.get("precision") != "bf16":
        raise StepFailed(f"{folder.name}: trained in {meta.get('precision')}, not bf16")
    return meta, log


def check_train(check: Check) -> dict:
    """Stage 03 trains TRAIN_STEPS steps on the GPU under bf16 autocast, uninterrupted; its figures say how
    well it used the GPU (the medians of its log's rows after the first step, a warm-up: compiling kernels,
    the allocator growing). The tiny model's matrices are small: a low MFU here is no verdict."""
    done = check.stage("train", "03_train_cuset.py", train_argv(check, TRAIN_STEPS, "train"))
    require_success(done, "stage 03 --device cuda --precision bf16")
    _, log = finished_training(check.out / "train", TRAIN_STEPS)
    after_warmup = log[1:]

    def median_of(key: str) -> float | None:
        values = [r[key] for r in after_warmup if isinstance(r.get(key), int | float)]
        return statistics.median(values) if values else None

    return {
        "steps": TRAIN_STEPS,
        "final_loss": log[-1]["loss"],
        "tokens_per_s": median_of("tokens_per_s"),
        "mfu": median_of("mfu"),  # null where cuset_common/training/mfu.py's table does not name the GPU
    }


# A step's progress line (cuset_common/training/step_log.py: StepLog). The kill waits for the second: the
# resume state of the first (--save-every 1) is then complete, since it is written before the second step
# starts.
SECOND_STEP_LINE = re.compile(r"^train \(steps\): 2/")


def check_train_resume(check: Check) -> dict:
    """`train` killed with SIGKILL after a logged step and continued with --resume: the same run, so as many
    steps and the same final loss. The resumed run repeats the same arithmetic from the saved state; only
    the order of the GPU's reductions may differ, which moves the loss far less than BF16_LOSS_RTOL, the
    bound on one step's bf16 rounding."""
    argv = train_argv(check, TRAIN_STEPS, "train-resume")
    every_step = ["--save-every", "1", "--log-every", "0"]  # a progress line each step, off a terminal
    killed = check.stage("train-resume", "03_train_cuset.py", [*argv, *every_step], SECOND_STEP_LINE)
    if killed.kill_line is None:
        require_success(killed, "stage 03 before the kill")
        raise StepFailed("stage 03 finished before it logged step 2, so it was never killed")
    if "done at step" in killed.output:
        raise StepFailed(f"stage 03 finished before the kill landed; raise TRAIN_STEPS ({TRAIN_STEPS})")
    resumed = check.stage("train-resume", "03_train_cuset.py", [*argv, "--resume"])
    require_success(resumed, "stage 03 --resume")
    _, log = finished_training(check.out / "train-resume", TRAIN_STEPS)
    found = re.search(r"resumed at step (\d+)", resumed.output)
    whole = check.results["train"]["figures"]["final_loss"]
    gap = abs(log[-1]["loss"] - whole) / abs(whole)
    figures = {
        "resumed_at_step": int(found.group(1)) if found else None,
        "final_loss": log[-1]["loss"],
        "uninterrupted_final_loss": whole,
        "relative_gap": gap,
    }
    if found is None:
        raise StepFailed("stage 03 --resume printed no 'resumed at step': it started over", figures)
    if gap > BF16_LOSS_RTOL:
        raise StepFailed(f"final loss relative gap {gap:.2e} > BF16_LOSS_RTOL {BF16_LOSS_RTOL:.2e}", figures)
    return figures


def check_memory_plan(check: Check) -> dict:
    """Stage 03's memory plan against the CUDA allocator's peak, both from `train`'s meta.json, whose every
    micro-batch had the plan's shape: so the peak must come near the plan, from either side."""
    meta = read_json(check.out / "train" / "meta.json")
    memory = meta.get("memory")
    if not isinstance(memory, dict) or not {"plan_bytes", "peak_allocated_bytes"} <= set(memory):
        raise StepFailed(
            'train/meta.json has no "memory": {"plan_bytes", "peak_allocated_bytes"} (stage 03 records it)'
        )
    if memory["peak_allocated_bytes"] is None:
        raise StepFailed("train/meta.json's peak_allocated_bytes is null: stage 03 measured no CUDA peak")
    figures = plan_figures(memory)
    if problem := plan_mismatch(memory):
        raise StepFailed(problem, figures)
    return figures


def check_torchrun(check: Check, step: str, extra: list[str]) -> dict:
    """Stage 03 under `torchrun --standalone` (a single machine, no rendezvous server), a process per GPU up
    to 2 (torchrun_processes); with one GPU it passes as PARTIAL, what it leaves unchecked said."""
    processes, unchecked = torchrun_processes(check.gpu["count"])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc_per_node", str(processes), "03_train_cuset.py", *extra]
    done = check.run(step, [*torchrun, *train_argv(check, TORCHRUN_STEPS, step)])
    require_success(done, f"torchrun stage 03 {' '.join(extra)}".rstrip())
    finished_training(check.out / step, TORCHRUN_STEPS)
    figures = {"steps": TORCHRUN_STEPS, "processes": processes}
    if unchecked:
        raise StepPartial(unchecked, figures)
    return figures


def check_generation(check: Check, step: str, engine: str) -> dict:
    """Stage 04 generating with `engine` on CUDA for 3 tasks, greedy, then judging: the tiny model's kernels
    do not compile, and that is fine; the rows and the generation record must be there."""
    out = check.out / step
    model = ["--model", str(TINY_MODEL), "--engine", engine, "--device", "cuda", "--backend", "gpu"]
    small = "--mode kernel --limit 3 --levels 1 --temperature 0 --max-new-tokens 256".split()
    done = check.stage(step, "04_eval_kernels.py", [*model, *small, "--out", str(out), *check.sandbox_flags])
    require_success(done, f"stage 04 --engine {engine}")
    rows = read_rows(out / "results.jsonl")
    generation = read_json(out / "summary.json").get("generation") or {}
    if len(rows) != 3 or not str(generation.get("device", "")).startswith("cuda"):
        raise StepFailed(f"{len(rows)} rows (not 3), generation on {generation.get('device')} (not cuda)")
    outcomes = Counter(r.get("outcome") for r in rows)
    return {
        "outcomes": dict(outcomes),
        "dtype": generation.get("dtype"),
        "tokens_per_s": generation.get("tokens_per_s"),
    }


def check_vllm(check: Check) -> dict:
    if importlib.util.find_spec("vllm") is None:
        raise StepSkipped("vLLM is not installed here (pip install vllm); generate-hf checked the own loop")
    return check_generation(check, "generate-vllm", "vllm")


@dataclass(frozen=True)
class Step:
    """A step of the check: its name (in the output, the record and its log's name) and what it runs."""

    name: str
    run: Callable[[Check], dict]
    needs: tuple[str, ...] = ()  # steps whose output this one reads: it is skipped unless they passed


NEEDS_NVCC = ("preflight",)  # the stage-04 steps: every one builds programs with nvcc
STEPS = (
    Step("preflight", check_preflight),
    Step("sandbox", check_sandbox),
    Step("gpu-probe", check_gpu_probe, NEEDS_NVCC),
    Step("reference-timing", check_reference_timing, NEEDS_NVCC),
    Step("profile", check_profile),
    Step("regions", check_regions, ("profile",)),
    Step("train", check_train, ("regions",)),
    Step("train-resume", check_train_resume, ("train",)),
    Step("memory-plan", check_memory_plan, ("train",)),
    Step("torchrun-fsdp", partial(check_torchrun, step="torchrun-fsdp", extra=["--fsdp"]), ("regions",)),
    Step("torchrun-ddp", partial(check_torchrun, step="torchrun-ddp", extra=[]), ("regions",)),
    Step("generate-hf", partial(check_generation, step="generate-hf", engine="hf"), NEEDS_NVCC),
    Step("generate-vllm", check_vllm, NEEDS_NVCC),
)


# ---------------------------------------------------------------------------------------
# The run: the GPU, the output folder, the steps, the record and the summary
# ---------------------------------------------------------------------------------------


def missing_gpu() -> str | None:
    """Why this machine cannot run the check, or None: torch must see a CUDA device (stages 01-03) and
    the driver list one (stage 04's --backend gpu: nvidia-smi or /proc/driver/nvidia)."""
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return f"torch {torch.__version__} is a CPU build; run this on a machine with an NVIDIA GPU"
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no device; run this on a GPU"
    if gpu_name() is None:
        return (
            "torch sees a GPU but neither nvidia-smi nor /proc/driver/nvidia lists one, where stage 04's "
            "--backend gpu looks"
        )
    return None


def describe_gpu() -> dict:
    """The GPU as the record gives it: torch's first device (name, compute capability, sm_ arch), how many
    torch sees (the torchrun steps' processes), and the newest CUDA the driver runs (preflight's)."""
    major, minor = torch.cuda.get_device_capability(0)
    return {
        "name": torch.cuda.get_device_name(0),
        "capability": f"{major}.{minor}",
        "arch": f"sm_{major}{minor}",
        "count": torch.cuda.device_count(),
        "driver_cuda": driver_cuda_version(),
    }


def driver_cuda_version() -> str | None:
    """The newest CUDA the driver runs, "X.Y": nvidia-smi's header says it, else, in a container without
    nvidia-smi, libcuda; None where neither does. A hung nvidia-smi is a UserError at its time limit
    (cuset_common/device.py: nvidia_smi)."""
    cuda = driver_cuda(nvidia_smi() or "") or libcuda_cuda()
    return cuda and ".".join(map(str, cuda))


def libcuda_cuda() -> tuple[int, int] | None:
    """The newest CUDA the driver runs, (major, minor), as its libcuda says (cuDriverGetVersion: 1000 x
    major + 10 x minor); None without libcuda."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int()
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value // 1000, version.value % 1000 // 10


RAN = ("PASS", "PARTIAL")  # a step that needs one of these finds its output there


def run_step(check: Check, step: Step) -> dict:
    """One step's record: status, reason, seconds, figures. A step whose inputs are not there (a step it
    needs neither passed nor was PARTIAL), or that would start with under MIN_STEP_S of the budget left, is
    skipped; an error of the check's own code in a step is reported as its FAIL, and the next step runs."""
    t0 = time.monotonic()
    failed_needs = [n for n in step.needs if check.results[n]["status"] not in RAN]
    try:
        if failed_needs:
            raise StepSkipped(f"needs {', '.join(failed_needs)}, which did not pass")
        if check.time_left() < MIN_STEP_S:
            raise StepSkipped(f"the {BUDGET_S // 60}-minute budget is spent")
        status, reason, figures = "PASS", "", step.run(check)
    except StepSkipped as e:
        status, reason, figures = "SKIP", str(e), {}
    except StepPartial as e:
        status, reason, figures = "PARTIAL", str(e), e.figures
    except StepFailed as e:
        status, reason, figures = "FAIL", str(e), e.figures
    except Exception as e:  # the check's own bug, or a stage output it cannot read: reported, not fatal
        status, reason, figures = "FAIL", f"the check itself raised {type(e).__name__}: {e}", {}
    return {
        "status": status,
        "reason": reason,
        "seconds": round(time.monotonic() - t0, 1),
        "figures": figures,
        "log": str(check.log(step.name).relative_to(check.out)),
    }


def prepare_out(out: Path) -> None:
    """--out empty and ready: a previous check's folder is replaced; anything else is refused."""
    if out.exists() and any(out.iterdir()) and not (out / "gpu_check.json").is_file():
        raise UserError(f"--out {out}: holds files that are not a GPU check's; name a new or empty folder")
    shutil.rmtree(out, ignore_errors=True)
    (out / "logs").mkdir(parents=True)


def summary_line(results: dict[str, dict], seconds: float) -> str:
    """The check in one line: the steps counted by status, then what the PARTIAL steps left unchecked and
    whether stage 04 ran without the sandbox, so that neither hides behind an exit status of 0."""
    counts = Counter(r["status"] for r in results.values())
    line = (
        f"gpu check: {counts['PASS']} passed, {counts['PARTIAL']} partial, {counts['FAIL']} failed, "
        f"{counts['SKIP']} skipped in {seconds:,.0f} s (budget {BUDGET_S} s)"
    )
    unchecked: dict[str, list[str]] = {}  # reason -> the PARTIAL steps that give it
    for name, result in results.items():
        if result["status"] == "PARTIAL":
            unchecked.setdefault(result["reason"], []).append(name)
    notes = [f"{', '.join(names)} PARTIAL: {reason}" for reason, names in unchecked.items()]
    sandbox = {"SKIP": "was SKIPPED", "FAIL": "FAILED"}.get(results["sandbox"]["status"])
    notes += [f"the sandbox step {sandbox}: stage 04 ran with --no-sandbox"] if sandbox else []
    return "; ".join([line, *notes])


def exit_status(results: dict[str, dict]) -> int:
    """1 when a step failed, else 0: a PARTIAL step passed all it could check here, and says what it could
    not in the summary line."""
    return 1 if any(r["status"] == "FAIL" for r in results.values()) else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", type=Path, default=ROOT / "runs" / "gpu-check", help="results (default: runs/gpu-check)"
    )
    ap.add_argument("--bwrap-deb", type=Path, help="a Debian bubblewrap .deb: stage 04's sandbox from it")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()  # the stages run from the repository root
    args.bwrap_deb = args.bwrap_deb and args.bwrap_deb.resolve()
    return args


def child_env() -> dict[str, str]:
    """The stages' environment: this one, with output unbuffered (a kill at a line must see it when it is
    printed)."""
    return os.environ | {"PYTHONUNBUFFERED": "1"}


def save_record(out: Path, record: dict) -> None:
    write_text_atomic(out / "gpu_check.json", json.dumps(record, indent=2) + "\n")


def bwrap_said(bwrap: Path) -> str:
    """Where the unpacked --bwrap-deb's bwrap is, and how stage 04 runs of one's own take it."""
    return f"bwrap {bwrap}: from --bwrap-deb, kept after the check; stage 04 takes it with --bwrap {bwrap}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if reason := missing_gpu():
        raise UserError(f"no CUDA GPU: {reason}")
    start = time.monotonic()
    gpu = describe_gpu()
    bwrap = prepare(args.out, args.bwrap_deb)
    check = Check(args.out, child_env(), gpu, bwrap, start + BUDGET_S)
    record = {"gpu": gpu, "budget_s": BUDGET_S, "steps": check.results}
    print(f"GPU {gpu['name']} ({gpu['arch']}, {gpu['count']} visible); results in {args.out}", flush=True)
    if args.bwrap_deb:
        print(bwrap_said(bwrap), flush=True)
    for step in STEPS:
        save_record(args.out, record)  # before each step: a check killed midway leaves what it did
        result = check.results[step.name] = run_step(check, step)
        print(f"{result['status']:7} {step.name:17} {result['seconds']:6.1f} s  {result['reason']}")
        if result["figures"]:
            print(f"        {json.dumps(result['figures'])}", flush=True)
    seconds = time.monotonic() - start
    save_record(
        args.out,
        record | {"seconds": round(seconds, 1), "sandboxed": "--no-sandbox" not in check.sandbox_flags},
    )
    print(summary_line(check.results, seconds))
    if seconds > BUDGET_S:
        print(f"WARNING: the check took {seconds:,.0f} s, over its {BUDGET_S // 60}-minute budget")
    return exit_status(check.results)


if __name__ == "__main__":
    sys.exit(run_main(main))
