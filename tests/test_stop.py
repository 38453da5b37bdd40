"""Stopping stage 04 while programs run (harness/schedule.py, harness/sandbox.py: stop_programs): Ctrl-C and
SIGTERM end the running programs at once, whatever their budget, start no other, and record nothing for
them, so that the resumed run does them again. First run_sandboxed alone, then stage 04 end to end on a
program that never ends (emulated; slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import eval_stage

from cuset_common.paths import TASKS_FILE
from cuset_common.tasks import load_tasks
from harness.sandbox import (
    Interrupted,
    _descendants,
    allow_programs,
    probe_isolation,
    run_sandboxed,
    stop_programs,
)

SANDBOXED = pytest.mark.skipif(not probe_isolation().available, reason="no sandbox here")
STOP_S = 15  # a stop is at once: the kill and the wait for the end, far below the programs' budgets
SPIN = """
__global__ void array_sum_kernel(const float* x, float* out, int n) {}
int main() { volatile unsigned long spins = 0; for (;;) ++spins; }
"""


def wait_for(condition, seconds: float):
    deadline = time.monotonic() + seconds
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def named(pid: int, name: str) -> list[int]:
    """The live processes below `pid` whose command name is `name`."""
    found = []
    for p in _descendants(pid):
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() == name:
                found.append(p)
        except OSError:
            continue
    return found


@pytest.mark.parametrize("isolate", [False, pytest.param(True, marks=SANDBOXED)])
def test_stop_programs_kills_a_running_command_and_refuses_new_ones_until_allowed(tmp_path, isolate):
    ended: list = []

    def call():
        try:
            ended.append(run_sandboxed(["sleep", "300"], tmp_path, 300, untrusted=True, isolate=isolate))
        except Interrupted as e:
            ended.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    try:
        assert wait_for(lambda: named(os.getpid(), "sleep"), 30), "the command never started"
        started = time.monotonic()
        stop_programs()
        caller.join(STOP_S)
        assert not caller.is_alive() and time.monotonic() - started < STOP_S
        assert isinstance(ended[0], Interrupted), ended
        assert not named(os.getpid(), "sleep")
        with pytest.raises(Interrupted):
            run_sandboxed(["true"], tmp_path, 30, untrusted=True, isolate=isolate)
    finally:
        allow_programs()
    assert run_sandboxed(["true"], tmp_path, 30, untrusted=True, isolate=isolate)[0] == 0


def stage_04(tmp_path: Path, *extra: str) -> list[str]:
    """Stage 04's command line: one bundled task, a program that never ends, a budget of an hour."""
    task = next(t for t in load_tasks(TASKS_FILE) if t["id"] == "array_sum_1048576")
    tasks, sols = tmp_path / "tasks.jsonl", tmp_path / "sols.jsonl"
    tasks.write_text(json.dumps(task) + "\n")
    sols.write_text(json.dumps({"task_id": task["id"], "level": 1, "completion": SPIN}) + "\n")
    argv = ["--tasks", tasks, "--split", "all", "--levels", "1", "--backend", "emulate", "--no-task-check"]
    argv += ["--solutions", sols, "--run-timeout", "3600", "--out", tmp_path / "ev", *extra]
    return [sys.executable, eval_stage().__file__, *map(str, argv)]


def stopped_while_the_program_runs(cmd: list[str], sig: signal.Signals, log: Path) -> int:
    """Start stage 04, send it `sig` once its program spins, and return its exit status; no process of
    the program is left."""
    with log.open("w") as out:
        stage = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: named(stage.pid, "prog"), 300), log.read_text()[-2000:]
        spinning = set(named(stage.pid, "prog"))
        started = time.monotonic()
        stage.send_signal(sig)
        code = stage.wait(timeout=STOP_S)
        assert time.monotonic() - started < STOP_S
    finally:
        stage.kill()
    assert wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in spinning), 5)
    return code


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", [pytest.param([], marks=SANDBOXED), ["--no-sandbox"]])
def test_ctrl_c_and_sigterm_end_the_running_program_at_once_and_resume_does_it_again(tmp_path, sandbox):
    cmd, log = stage_04(tmp_path, *sandbox), tmp_path / "log.txt"
    assert stopped_while_the_program_runs(cmd, signal.SIGINT, log) == 128 + signal.SIGINT
    assert log.read_text().strip().splitlines()[-1].startswith("interrupted: "), log.read_text()
    results = tmp_path / "ev" / "results.jsonl"
    assert not results.exists() or results.read_text() == ""  # nothing recorded for the killed program
    assert stopped_while_the_program_runs(cmd, signal.SIGTERM, log) == 128 + signal.SIGTERM
    assert "0 rows already done" in log.read_text() and "1 to do" in log.read_text()  # resumed, redone
    assert not results.exists() or results.read_text() == ""
