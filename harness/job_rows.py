"""Rows of stage 04's results.jsonl before their verdict: the fields every row of a job holds (job_row), and
the rows of the jobs the server gave no reply (record_generation_errors).
"""

from __future__ import annotations

from harness.outcomes import GENERATION_ERROR
from harness.programs import Runner


def job_row(task: dict, job: tuple, args, runner: Runner) -> dict:
    """The fields every row of a job holds before its outcome."""
    tid, level, sample = job
    return {
        "task_id": tid,
        "level": level,
        "sample": sample,
        "mode": args.mode,
        "category": task.get("category", "uncategorized"),
        "backend": runner.backend,
        "emulate_checks": runner.backend == "emulated" and args.emulate_checks,
    }


def record_generation_errors(args, by_id: dict, generation: dict | None, runner: Runner, run) -> None:
    """Rows `generation_error` for the jobs the server gave no reply (the openai engine's record: `errors`),
    the error in their `generation_error` field and log: not the model's failure, so outside pass@k
    (harness/outcomes.py: APART); a resumed run asks again."""
    for error in (generation or {}).get("errors", []):
        job = (error["task_id"], error["level"], error["sample"])
        row = job_row(by_id[job[0]], job, args, runner)
        failed = {"outcome": GENERATION_ERROR, "generation_error": error["error"], "log": error["error"]}
        run.record(job, row | failed)
