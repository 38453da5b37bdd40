"""Stage 04's schedule, apart from the protocol in 04_eval_kernels.py: when each build and run happens, how
many at once, in which folder, and how long a program may run.

Every job's program is built first, --jobs compiles at a time, then the references of the task check. The
tasks are then judged one at a time on the GPU, so that timings stay meaningful, and --jobs at a time
emulated, where each program gets its share of the cores. Each task has a folder of its own in the run's
work folder (harness/programs.py: make_work_dir) for its data and its programs' folders, removed once its
programs have run; each program's folder is removed once it has run. A progress line counts the runs.
Ctrl-C or SIGTERM (raised in the main thread: cuset_common/cli.py, sigterm_exits) ends the programs that run
at once and starts no other (harness/sandbox.py, stop_programs); what they would have recorded is not
recorded, so a resumed run does it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cuset_common.progress import Progress
from harness.sandbox import allow_programs, stop_programs

# Run budgets. Emulated, a task built for a GPU can take minutes: a reference (its task check, or
# --reference) may run REFERENCE_ALLOWANCE x --run-timeout, once per task, and a candidate as long
# as CANDIDATE_ALLOWANCE x its reference's run here when that is more than --run-timeout, so that
# `timeout` means slow for the task on this backend, not slow for the backend.
REFERENCE_ALLOWANCE, CANDIDATE_ALLOWANCE = 10, 4


def run_budget(check: dict | None, run_timeout: float) -> float:
    """Seconds a program of a task may run, given its task check (None: the program is a reference)."""
    if check is None:
        return REFERENCE_ALLOWANCE * run_timeout
    reference_s = check.get("run_s", 0) if check["outcome"] == "pass" else 0
    return max(run_timeout, CANDIDATE_ALLOWANCE * reference_s)


def mapped(what: str, fn: Callable, items: list, jobs: int) -> list:
    """[fn(x) for x in items], `jobs` at a time, with a progress line."""
    progress = Progress(what, len(items))

    def one(x):
        out = fn(x)
        progress()
        return out

    return pooled(one, items, jobs)


def pooled(fn: Callable, items: list, jobs: int) -> list:
    """[fn(x) for x in items], `jobs` at a time; stopped (the module's docstring), at once."""
    pool = ThreadPoolExecutor(jobs)
    try:
        return list(pool.map(fn, items))
    except BaseException:  # KeyboardInterrupt, SystemExit: only the main thread waits here
        stop_programs()
        raise
    finally:
        pool.shutdown(cancel_futures=True)  # the running calls end, those not started never start
        allow_programs()


class Schedule:
    """The folders, concurrency and progress of one run's builds and runs (the module's docstring)."""

    def __init__(self, work: Path, task_ids: list[str], jobs: int, backend: str):
        self.jobs, self.one_at_a_time = jobs, backend == "gpu"
        self.task_dirs = {tid: work / f"task-{i}" for i, tid in enumerate(sorted(set(task_ids)))}
        for folder in self.task_dirs.values():
            folder.mkdir(mode=0o711)  # the sandbox uid passes through to its own folders, lists nothing
        # Emulated programs run --jobs at a time and share the cores out (this also keeps the sandbox
        # uid's threads under its process limit).
        self.run_env = {"CUSET_EMU_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))}
        self.runs: Progress | None = None

    def folder(self, task_id: str) -> Path:
        """The task's folder: its data (gen.py's) and the folders of its programs."""
        return self.task_dirs[task_id]

    def build(self, what: str, build_one: Callable, items: list) -> list:
        """[build_one(x) for x in items], --jobs at a time (compiles), with a progress line."""
        return mapped(what, build_one, items, self.jobs)

    def judge_tasks(self, judge_task: Callable[[str], None], task_ids: list[str], runs: int) -> None:
        """judge_task(task id) for each task, one at a time on the GPU, else --jobs at a time; a task's
        folder is removed once it is judged. `runs`: the programs the tasks will run (or skip)."""
        self.runs = Progress("run", runs)

        def judge(task_id: str) -> None:
            judge_task(task_id)
            shutil.rmtree(self.task_dirs[task_id], ignore_errors=True)

        pooled(judge, task_ids, 1 if self.one_at_a_time else self.jobs)

    def finished(self, program_dir: Path | None = None) -> None:
        """One program has run (or will not: its task cannot judge it); its folder is removed."""
        if program_dir is not None:
            shutil.rmtree(program_dir, ignore_errors=True)
        self.runs()
