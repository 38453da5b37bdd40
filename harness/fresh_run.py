"""A program run the way stage 04 runs every candidate (04_eval_kernels.py, execute): in a fresh folder that
holds a copy of it and the task's inputs and nothing else, so that it cannot read the reference outputs, as
untrusted code (harness/programs.py: Runner.untrusted) within a timeout (run_fresh); and so kernel mode's
timing run on the GPU (time_kernels; its line read by harness/timing.py).
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

from harness.launch_count import LaunchCount
from harness.programs import Runner, clip, output_limit_mb
from harness.timing import CHECK_FOLDER, TIMING_ARGUMENT, output_check_void, read_timing

# compare_outputs of 04_eval_kernels.py: (task, folder of the references, the program's folder, runner,
# timeout, run=the run's folder name) -> (compare.py judged T, its log).
Compare = Callable[..., tuple[bool, str]]


def run_fresh(
    task: dict,
    exe: Path,
    gen_dir: Path,
    run_dir: Path,
    timeout: float,
    runner: Runner,
    env: dict[str, str] | None,
    *argv: str,
    stdin: str | None = None,
    count: LaunchCount | None = None,
) -> tuple[int | None, str]:
    """The program with `argv` in a fresh `run_dir` (fresh_run_folder), as untrusted code, within
    `timeout`, its launches counted where `count` is given: (exit status or None, its log)."""
    folder, cmd = fresh_run_folder(task, exe, gen_dir, run_dir), ["./prog", *argv]
    return runner.untrusted(
        count.command(cmd, folder) if count else cmd,
        folder,
        timeout,
        file_mb=output_limit_mb(task),
        nproc=64,
        env=(env or {}) | (count.env() if count else {}),
        stdin=None if stdin is None else stdin.encode(),
    )


def fresh_run_folder(task: dict, exe: Path, gen_dir: Path, run_dir: Path) -> Path:
    """`run_dir` holding a copy of the program and data/ with the task's inputs, and nothing else: the
    program cannot read the reference outputs."""
    copy_inputs(task, gen_dir, run_dir / "data")
    shutil.copy(exe, run_dir / "prog")
    return run_dir


def copy_inputs(task: dict, gen_dir: Path, folder: Path) -> None:
    """The task's input files of gen.py's data/ in `gen_dir`, copied into `folder` (made here)."""
    folder.mkdir(parents=True, exist_ok=True)
    for buf in task["inputs"]:
        shutil.copy(gen_dir / "data" / f"{buf['name']}.bin", folder)


def time_kernels(
    compare: Compare,
    task: dict,
    exe: Path,
    gen_dir: Path,
    workdir: Path,
    timeout: float,
    runner: Runner,
    env: dict[str, str] | None,
    check_dir: Path | None = None,
    compare_timeout: float = 900.0,
) -> dict:
    """The timing run of a kernel-mode program that passed: the harness with TIMING_ARGUMENT, in a fresh
    folder, within its own `timeout` (--timing-timeout). Returns the row's timing fields (harness/timing.py:
    read_timing), or {"timing_void": why} when it gives none; a fresh random nonce on stdin, which the
    timing line must carry, tells the harness's line from one forged by candidate code. After the timed
    launches the harness launches the candidate once more, on the inputs of `check_dir` (another input
    set; by default `gen_dir`'s), and writes its outputs: compare.py must judge them T against that set's
    references (`compare`: the stage's compare_outputs), or the timing is void (output_check_void)."""
    nonce, run_dir, check_dir = secrets.token_hex(16), workdir / "timing", check_dir or gen_dir
    if check_dir != gen_dir:
        copy_inputs(task, check_dir, run_dir / CHECK_FOLDER)
    argv, stdin = [TIMING_ARGUMENT], f"{nonce}\n"
    code, log = run_fresh(task, exe, gen_dir, run_dir, timeout, runner, env, *argv, stdin=stdin)
    if code is None:
        return {"timing_void": f"the timing run did not exit within {timeout:g} s (--timing-timeout)"}
    if code != 0:
        return {"timing_void": f"the timing run ended with exit status {code}:\n{clip(log)}"}
    passed, judged = compare(task, check_dir, workdir, runner, compare_timeout, run="timing")
    return read_timing(log, nonce) if passed else output_check_void(clip(judged))
