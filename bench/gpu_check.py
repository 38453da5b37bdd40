"""The GPU check: the project's risky GPU paths end to end, on one GPU, with the bundled tiny model, in at
most 8 minutes. Nothing else here has a GPU, so the CPU tests check these paths' logic and this script is
their first contact with hardware (docs/tests.md, "The GPU check").

Each step runs the real stage commands as subprocesses, so a crash in one is reported and the next runs. It
prints PASS, FAIL or SKIP (with the reason) per step, then a summary line; the exit status is 1 when a step
failed, 2 (one line, `error: no CUDA GPU: ...`) on a machine without a GPU, else 0.

  sandbox          stage 04's sandbox starts (harness/sandbox.py: probe_isolation), with bwrap from
                   --bwrap-deb or PATH; without bwrap it is SKIPPED and the stage-04 steps run with
                   --no-sandbox
  gpu-probe        stage 04 --backend gpu starts (its probe: harness/gpu_probe.py), says it builds with
                   -gencode for this GPU's compute capability, and passes one reference program
  reference-timing 10 tasks' references timed against themselves in kernel mode: every row passes, and
                   every speedup lies within SPEEDUP_WINDOW
  profile, regions stages 01 and 02 on CUDA in bf16 (01) on the bundled held-out SFT file (40 records)
  train            stage 03 on CUDA in bf16, TRAIN_STEPS steps
  train-resume     the same run killed (SIGKILL) after a logged step, then --resume: as many steps as
                   `train`, and the same final loss within BF16_LOSS_RTOL
  memory-plan      `train`'s meta.json: stage 03's memory plan beside torch.cuda.max_memory_allocated
  torchrun-fsdp    torchrun --nproc_per_node 1 of stage 03 with --fsdp (NCCL) finishes
  torchrun-ddp     the same without --fsdp (with one process stage 03 makes no process group and no DDP
                   wrapper: this checks the launcher's path only)
  generate-hf      stage 04 generating with its own loop on CUDA (3 tasks, greedy) and judging the replies
  generate-vllm    the same with vLLM, where it is installed (SKIPPED otherwise)

Output (--out, default runs/gpu-check; replaced on each run): one folder per step's stage outputs,
logs/<step>.log with every command and its output, and gpu_check.json: the GPU, the sandbox, and per step
its status, reason, seconds and figures (timing ratios, plan against peak), rewritten after every step.

    python bench/gpu_check.py                                        # every step, results in runs/gpu-check
    python bench/gpu_check.py --bwrap-deb debs/bubblewrap_*.deb      # with the sandbox from a .deb

A GPU machine lent for minutes may have no bubblewrap and no network. Fetch the .deb where apt works and
carry it along (debs/ is git-ignored): `mkdir -p debs && (cd debs && apt-get download bubblewrap)`.
--bwrap-deb unpacks it with dpkg-deb (or, without dpkg-deb, by reading the ar and tar archives in Python)
into a temporary folder and puts its usr/bin first on the stages' PATH.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cuset_common.cli import ArgumentParser, UserError, run_main
from cuset_common.device import BF16_LOSS_RTOL
from cuset_common.files import read_jsonl, write_text_atomic
from cuset_common.paths import EVAL_SFT_KERNEL_FILE, TINY_MODEL
from harness.gpu_probe import gencode_flags
from harness.programs import gpu_name

BUDGET_S = 8 * 60  # the whole check; a command never runs past it (each gets what is left at most)
MIN_STEP_S = 15  # a step is not started with less of the budget left: it could not finish
# A reference timed against itself runs the same kernel twice: its speedup is 1 up to timing noise. The
# window is symmetric on a log scale (0.8 = 1 / 1.25).
SPEEDUP_WINDOW = (0.8, 1.25)
# The memory plan (training/scale.py: memory_plan) counts the tensors stage 03 makes; the CUDA caching
# allocator's peak also holds what the plan leaves out: cuBLAS's workspaces (tens of MiB on recent GPUs, taken
# from the same allocator), small allocations and rounding to its block sizes. A peak beyond
# plan x (1 + margin) + slack means the plan misses a term.
PLAN_MARGIN = 0.10
PLAN_SLACK_BYTES = 128 * 2**20
MIB = 2**20

TRAIN_DATA = EVAL_SFT_KERNEL_FILE  # 40 records: the smallest SFT file that travels with the checkout
TRAIN_STEPS = 8  # 1.6 epochs of 5 batches: the resumed run crosses an epoch boundary
TORCHRUN_STEPS = 2
TIMEOUT_S = {  # per command; each step's share of the budget, with room (the tiny model is quick on a GPU)
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
PROBE_SANDBOX = (  # the sandbox as stage 04 probes it before any run (harness/programs.py: choose_runner)
    "import sys; from harness.sandbox import probe_isolation as p; i = p(); print(i.how); "
    "sys.exit(0 if i.available else 1)"
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


def plan_exceeded(memory: dict) -> str | None:
    """Why the peak is more than the plan allows (PLAN_MARGIN and PLAN_SLACK_BYTES), or None."""
    plan, peak = memory["plan_bytes"], memory["peak_allocated_bytes"]
    allowed = plan * (1 + PLAN_MARGIN) + PLAN_SLACK_BYTES
    if peak <= allowed:
        return None
    return (
        f"peak allocated {peak / MIB:,.1f} MiB exceeds the plan's {plan / MIB:,.1f} MiB by more than "
        f"{PLAN_MARGIN:.0%} + {PLAN_SLACK_BYTES // MIB} MiB (allowed {allowed / MIB:,.1f} MiB)"
    )


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
        tar.extractall(dest, filter="data")  # no absolute paths, no links out of dest


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


def bwrap_folder(deb: Path | None, scratch: Path) -> Path | None:
    """The folder whose bwrap the stages use: usr/bin of the unpacked --bwrap-deb, else the one on PATH,
    else None (no sandbox here)."""
    if deb is None:
        found = shutil.which("bwrap")
        return Path(found).parent if found else None
    if not deb.is_file():
        raise UserError(f"--bwrap-deb {deb}: no such file; see --help for how to download it")
    extract_deb(deb, scratch)
    folder = scratch / "usr" / "bin"
    if not (folder / "bwrap").is_file():
        raise UserError(f"--bwrap-deb {deb}: the package has no usr/bin/bwrap; name the bubblewrap .deb")
    return folder


# ---------------------------------------------------------------------------------------
# Running the stages: one command, with its output in the step's log and a time limit
# ---------------------------------------------------------------------------------------


class StepFailed(Exception):
    """The step ran and something is wrong: FAIL with this reason, and the figures that show it."""

    def __init__(self, reason: str, figures: dict | None = None):
        super().__init__(reason)
        self.figures = figures or {}


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
    """One run of the check: where it writes, the children's environment, the GPU (describe_gpu), bwrap's
    folder, the deadline, the stage-04 sandbox flags and the steps' results so far."""

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
        """Run `cmd` for `step` within its timeout and the budget left; kill_at: SIGKILL the command at the
        first line of its output that matches (a run stopped the hard way)."""
        timeout = min(TIMEOUT_S[step], self.time_left())
        return run_command(cmd, self.log(step), timeout, self.env, kill_at)

    def stage(self, step: str, script: str, argv: list[str], kill_at: re.Pattern | None = None) -> Finished:
        """A stage script with this Python."""
        return self.run(step, [sys.executable, script, *argv], kill_at)


def run_command(
    cmd: list[str], log: Path, timeout: float, env: dict[str, str], kill_at: re.Pattern | None
) -> Finished:
    """Run `cmd` from the repository root in a session of its own (so that a kill reaches its children:
    torchrun's workers, stage 04's compilers), appending its output to `log` as it comes; after `timeout`
    seconds the whole session is killed. Output is read line by line, so that kill_at stops the command
    within a line of the match, not at the next poll."""
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
            start_new_session=True,
        )
        expired = threading.Event()
        watchdog = threading.Timer(max(timeout, 0), lambda: (expired.set(), kill_session(proc)))
        watchdog.start()
        lines, kill_line = [], None
        try:
            for line in proc.stdout:
                f.write(line)
                lines.append(line)
                if kill_at is not None and kill_line is None and kill_at.search(line):
                    kill_session(proc)
                    kill_line = line.strip()
            code = proc.wait()
        finally:
            watchdog.cancel()
        if expired.is_set():
            f.write(f"[gpu_check: killed after the time limit of {timeout:.0f} s]\n")
    return Finished(None if expired.is_set() else code, "".join(lines), kill_line)


def kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # it has ended meanwhile
        pass


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


def check_sandbox(check: Check) -> dict:
    """Stage 04's own probe of the sandbox; the stage-04 steps run sandboxed only when it passes."""
    if check.bwrap is None:
        raise StepSkipped(
            "no bwrap on PATH and no --bwrap-deb: the stage-04 steps run with --no-sandbox "
            "(see --help for how to bring the .deb)"
        )
    done = check.run("sandbox", [sys.executable, "-c", PROBE_SANDBOX])
    if done.code != 0:
        raise StepFailed(
            f"stage 04 cannot isolate programs here (its steps run with --no-sandbox): {done.cause()}"
        )
    check.sandbox_flags = []
    return {"bwrap": str(check.bwrap / "bwrap"), "isolation": done.output.strip()}


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
    """Stage 01 profiles the training data on the GPU under bf16 autocast."""
    argv = ["--data", str(TRAIN_DATA), "--device", "cuda", "--precision", "bf16"]
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
    """Stage 03's arguments shared by every training step: the data, stage 02's regions, CUDA in bf16."""
    return [
        *("--data", str(TRAIN_DATA), "--regions", str(check.out / "regions")),
        *("--device", "cuda", "--precision", "bf16", "--batch-size", "8", "--max-steps", str(steps)),
        *("--out", str(check.out / out)),
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
    """Stage 03 trains TRAIN_STEPS steps on the GPU under bf16 autocast, uninterrupted."""
    done = check.stage("train", "03_train_cuset.py", train_argv(check, TRAIN_STEPS, "train"))
    require_success(done, "stage 03 --device cuda --precision bf16")
    _, log = finished_training(check.out / "train", TRAIN_STEPS)
    return {"steps": TRAIN_STEPS, "final_loss": log[-1]["loss"]}


# A step's progress line (03_train_cuset.py: log_step). The kill waits for the second: the resume state of
# the first (--save-every 1) is then complete, since it is written before the second step starts.
SECOND_STEP_LINE = re.compile(r"^step\s+2/")


def check_train_resume(check: Check) -> dict:
    """`train` killed with SIGKILL after a logged step and continued with --resume: the same run, so as many
    steps and the same final loss. The resumed run repeats the same arithmetic from the saved state; only
    the order of the GPU's reductions may differ, which moves the loss far less than BF16_LOSS_RTOL, the
    bound on one step's bf16 rounding."""
    argv = train_argv(check, TRAIN_STEPS, "train-resume")
    killed = check.stage("train-resume", "03_train_cuset.py", [*argv, "--save-every", "1"], SECOND_STEP_LINE)
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
    """Stage 03's memory plan against the CUDA allocator's peak, both from `train`'s meta.json."""
    meta = read_json(check.out / "train" / "meta.json")
    memory = meta.get("memory")
    if not isinstance(memory, dict) or not {"plan_bytes", "peak_allocated_bytes"} <= set(memory):
        raise StepFailed(
            'train/meta.json has no "memory": {"plan_bytes", "peak_allocated_bytes"} (stage 03 records it)'
        )
    if memory["peak_allocated_bytes"] is None:
        raise StepFailed("train/meta.json's peak_allocated_bytes is null: stage 03 measured no CUDA peak")
    figures = plan_figures(memory)
    if problem := plan_exceeded(memory):
        raise StepFailed(problem, figures)
    return figures


def check_torchrun(check: Check, step: str, extra: list[str]) -> dict:
    """Stage 03 under `torchrun --standalone --nproc_per_node 1` (a single machine, no rendezvous server)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    done = check.run(step, [*torchrun, "03_train_cuset.py", *extra, *train_argv(check, TORCHRUN_STEPS, step)])
    require_success(done, f"torchrun stage 03 {' '.join(extra)}".rstrip())
    finished_training(check.out / step, TORCHRUN_STEPS)
    return {"steps": TORCHRUN_STEPS}


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


STEPS = (
    Step("sandbox", check_sandbox),
    Step("gpu-probe", check_gpu_probe),
    Step("reference-timing", check_reference_timing),
    Step("profile", check_profile),
    Step("regions", check_regions, ("profile",)),
    Step("train", check_train, ("regions",)),
    Step("train-resume", check_train_resume, ("train",)),
    Step("memory-plan", check_memory_plan, ("train",)),
    Step("torchrun-fsdp", partial(check_torchrun, step="torchrun-fsdp", extra=["--fsdp"]), ("regions",)),
    Step("torchrun-ddp", partial(check_torchrun, step="torchrun-ddp", extra=[]), ("regions",)),
    Step("generate-hf", partial(check_generation, step="generate-hf", engine="hf")),
    Step("generate-vllm", check_vllm),
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
    major, minor = torch.cuda.get_device_capability(0)
    return {
        "name": torch.cuda.get_device_name(0),
        "capability": f"{major}.{minor}",
        "arch": f"sm_{major}{minor}",
    }


def run_step(check: Check, step: Step) -> dict:
    """One step's record: status, reason, seconds, figures. A step whose inputs did not pass, or that would
    start with under MIN_STEP_S of the budget left, is skipped; an error of the check's own code in a
    step is reported as its FAIL, and the next step runs."""
    t0 = time.monotonic()
    failed_needs = [n for n in step.needs if check.results[n]["status"] != "PASS"]
    try:
        if failed_needs:
            raise StepSkipped(f"needs {', '.join(failed_needs)}, which did not pass")
        if check.time_left() < MIN_STEP_S:
            raise StepSkipped(f"the {BUDGET_S // 60}-minute budget is spent")
        status, reason, figures = "PASS", "", step.run(check)
    except StepSkipped as e:
        status, reason, figures = "SKIP", str(e), {}
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
    counts = Counter(r["status"] for r in results.values())
    line = (
        f"gpu check: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped in "
        f"{seconds:,.0f} s (budget {BUDGET_S} s)"
    )
    sandbox = {"SKIP": "was SKIPPED", "FAIL": "FAILED"}.get(results["sandbox"]["status"])
    return line + (f"; the sandbox step {sandbox}: stage 04 ran with --no-sandbox" if sandbox else "")


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


def child_env(bwrap: Path | None) -> dict[str, str]:
    """The stages' environment: this one, with the sandbox's bwrap first on PATH and output unbuffered (a
    kill at a line must see it when it is printed)."""
    path = os.pathsep.join([*([str(bwrap)] if bwrap else []), os.environ.get("PATH", "")])
    return os.environ | {"PATH": path, "PYTHONUNBUFFERED": "1"}


def save_record(out: Path, record: dict) -> None:
    write_text_atomic(out / "gpu_check.json", json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if reason := missing_gpu():
        raise UserError(f"no CUDA GPU: {reason}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-check-bwrap-") as scratch:
        bwrap = bwrap_folder(args.bwrap_deb, Path(scratch))
        check = Check(args.out, child_env(bwrap), describe_gpu(), bwrap, start + BUDGET_S)
        record = {"gpu": check.gpu, "budget_s": BUDGET_S, "steps": check.results}
        prepare_out(args.out)
        print(f"GPU {record['gpu']['name']} ({record['gpu']['arch']}); results in {args.out}", flush=True)
        for step in STEPS:
            save_record(args.out, record)  # before each step: a check killed midway leaves what it did
            result = check.results[step.name] = run_step(check, step)
            print(f"{result['status']:4} {step.name:17} {result['seconds']:6.1f} s  {result['reason']}")
            if result["figures"]:
                print(f"     {json.dumps(result['figures'])}", flush=True)
    seconds = time.monotonic() - start
    save_record(args.out, record | {"seconds": round(seconds, 1), "sandboxed": not check.sandbox_flags})
    print(summary_line(check.results, seconds))
    if seconds > BUDGET_S:
        print(f"WARNING: the check took {seconds:,.0f} s, over its {BUDGET_S // 60}-minute budget")
    return 1 if any(r["status"] == "FAIL" for r in check.results.values()) else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
