"""Running the plan: each step not finished is one stage subprocess, its output in <group>/log.txt and its
time in <group>/timings.json, with progress and an ETA on stdout. A stage dies with this command, so a
rerun never races one left running, and continues what it left (steps.continuation)."""

from __future__ import annotations

import ctypes
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from cuset_common.cli import UserError, redact, register_secret
from cuset_common.files import write_text_atomic
from cuset_common.progress import Progress, duration
from harness.programs import gpu_name
from research.comparison.plan import plan, seeds_text, step_groups
from research.comparison.stages import STAGES, command, shown
from research.comparison.steps import (
    continuation,
    finished,
    group_done,
    record_diverged,
    stage_diverged,
    training_diverged,
)

# The environment variables that hold a secret a stage reads (stage 04's --engine openai key:
# harness/openai_generation.py, API_KEY_VARIABLE), which the stage inherits and the log must not show.
SECRET_VARIABLES = ("OPENAI_API_KEY",)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def die_with_parent() -> None:
    """In the stage's process before it starts (Linux): SIGTERM when this command dies, even by SIGKILL, so
    that a rerun never races a stage left running (the stages write atomically; a rerun continues what it
    left)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: a killed comparison leaves its current stage running to the end


def say(text: str) -> None:
    print(f"[compare] {text}", flush=True)


def execute(args) -> tuple[list[dict], list[dict], int, bool]:
    """Run what is not finished; returns (base steps, runs, stage calls made, stopped by --stop-after)."""
    base_steps, runs = plan(args)
    groups = [
        g for g in step_groups(args, base_steps, runs) if g[0] == "base" or not args.runs or g[0] in args.runs
    ]
    pending = [g for g in groups if not group_done(g[1])]
    say(
        f"{len(runs)} runs ({', '.join(args.objectives)} x {seeds_text(args)}) + base stages; "
        f"{len(groups) - len(pending)} of {len(groups)} groups finished earlier; out {args.out}"
    )
    if pending and args.preset == "full" and gpu_name() is None:
        say(
            "note: the full preset is sized for a real model on a GPU and none is listed here; "
            "presets cpu-quick, cpu-real and cpu-power are the CPU ones"
        )
    calls, t0, done_now = 0, time.time(), 0
    progress = Progress("compare (groups to do)", len(pending), stream=sys.stdout)
    for i, (name, steps, folder) in enumerate(groups):
        label = "base stages 01+02" if name == "base" else f"run {i}/{len(runs)} {name}"
        if group_done(steps):
            say(f"{label}: {'diverged' if training_diverged(steps) else 'finished'}, skipped")
            continue
        say(f"{label} ({done_now + 1}/{len(pending)} to do)")
        folder.mkdir(parents=True, exist_ok=True)
        timings_path = folder / "timings.json"
        timings = json.loads(timings_path.read_text()) if timings_path.exists() else {}
        for step in steps:
            key = f"{STAGES[step['stage']]} -> {step['out'].name}"
            if finished(step):
                say(f"  {key}: finished, skipped")
                continue
            if args.stop_after is not None and calls >= args.stop_after:
                say(f"stopped after {calls} stage calls (--stop-after); rerun the same command to continue")
                return base_steps, runs, calls, True
            t = time.time()
            cmd, rc = run_step(step, folder)
            calls += 1
            timings[key] = round(time.time() - t, 1)
            write_text_atomic(timings_path, json.dumps(timings, indent=2) + "\n")
            if after_step(step, cmd, rc, folder):
                break  # its training diverged: nothing to profile or evaluate
        done_now += 1
        progress(1, detail=f" | {label} done")
    say(f"{calls} stage calls in {duration(time.time() - t0)}")
    return base_steps, runs, calls, False


def run_step(step: dict, folder: Path) -> tuple[list[str], int]:
    """One stage call, continued where it was interrupted, its output appended to <folder>/log.txt
    (run_logged: no secret in it); returns (the command, its exit status)."""
    for name in SECRET_VARIABLES:
        register_secret(os.environ.get(name))  # redact() in the log, and in the error quoting its tail
    with open(folder / "log.txt", "a", encoding="utf-8", errors="replace") as log:
        cmd = command(step, continuation(step, lambda msg: print(f"[compare]   {msg}", file=log, flush=True)))
        say(f"  {shown(cmd)}   (log: {folder / 'log.txt'})")
        print(f"\n$ {shown(cmd)}", file=log, flush=True)
        rc = run_logged(cmd, log)
    return cmd, rc


def run_logged(cmd: list[str], log) -> int:
    """Run `cmd`, its stdout and stderr written to `log` line by line with every registered secret redacted
    (cli.redact); returns its exit status. The stages keep the key they inherit out of what they print
    (harness/openai_generation.py), and the log is kept in --save-record's copy, which is meant to be
    committed: this keeps it out whatever a library of theirs prints. A line ends at a line end or at a \r
    (a progress line redrawn in place), so the log holds each as it comes."""
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
    ) as p:
        for line in io.TextIOWrapper(p.stdout, encoding="utf-8", errors="replace", newline=""):
            log.write(redact(line))
            log.flush()
    return p.returncode


def after_step(step: dict, cmd: list[str], rc: int, folder: Path) -> bool:
    """A failed stage call is a UserError that quotes the last lines of its log, but for a training that
    diverged: recorded (record_diverged), said, and True, the run's other steps skipped and the comparison
    going on; a finished training's resume state is deleted."""
    if rc != 0:
        tail = "".join((folder / "log.txt").read_text().splitlines(keepends=True)[-15:])
        if step["stage"] == "03" and (message := stage_diverged(tail)):
            record_diverged(step, message)
            say(f"  diverged: {message}")
            return True
        raise UserError(f"{shown(cmd)} failed (exit {rc}); last lines of {folder / 'log.txt'}:\n{tail}")
    if step["stage"] == "03" and finished(step):
        # its resume state (weights and optimizer moments, several times the checkpoint's size) is of no
        # use once the checkpoint is written
        for old in ("resume", ".resume.old"):
            shutil.rmtree(step["out"] / old, ignore_errors=True)
    return False
