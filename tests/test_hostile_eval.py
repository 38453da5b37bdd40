"""Stage 04's summary and --solutions against what a run can really hold (harness/report.py,
harness/run_folder.py, 04_eval_kernels.py: summarize): a rate over no judged row is null ("n/a" in
summary.md), never 0; a solutions file none of whose answers names a job of the run is refused like an empty
one; a null completion, as stage 04's own completions.jsonl writes for a missing answer, is read back."""

from __future__ import annotations

import json

import pytest
from conftest import eval_stage

from cuset_common.cli import UserError
from harness.report import summary_markdown
from harness.run_folder import load_solutions


def row(outcome: str, task: str = "t1", level: int = 1) -> dict:
    return {"task_id": task, "level": level, "sample": 0, "category": "c", "outcome": outcome}


def test_rates_over_no_judged_row_are_null_and_shown_as_such():
    summary = eval_stage().summarize(
        [row("generation_error"), row("generation_error", level=2)], 1, "emulated"
    )
    assert summary["overall"]["pass@1"] is None and summary["overall"]["compile_rate"] is None
    assert summary["by_level"]["L1"]["pass@1"] is None
    table = summary_markdown(summary, "# t")
    assert "| **all** | 2 | n/a |" in table and "None" not in table


def test_rates_over_judged_rows_stay_numbers():
    summary = eval_stage().summarize(
        [row("pass"), row("wrong_output", level=2), row("task_error", "t2")], 2, "emulated"
    )
    assert summary["overall"]["pass@1"] == 0.5 and summary["overall"]["pass@2"] == 0.5
    assert summary["overall"]["compile_rate"] == 1.0


def solutions(tmp_path, rows: list[dict]):
    path = tmp_path / "solutions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_solutions_file_that_names_no_job_of_the_run_is_refused(tmp_path):
    path = solutions(tmp_path, [{"task_id": "t1", "level": 3, "sample": 0, "completion": "x"}])
    with pytest.raises(
        UserError, match=r"none of its 1 answer\(s\) names a job of this run \(e.g. line 1: t1 level 3"
    ):
        load_solutions(path, {("t1", 1, 0)}, {"t1"})


def test_a_null_completion_is_read_back_as_no_answer(tmp_path):
    rows = [
        {"task_id": "t1", "level": 1, "sample": 0, "completion": None},
        {"task_id": "t1", "level": 2, "sample": 0, "completion": "```cuda\n```"},
    ]
    found = load_solutions(solutions(tmp_path, rows), {("t1", 1, 0), ("t1", 2, 0)}, {"t1"})
    assert found == {("t1", 1, 0): None, ("t1", 2, 0): "```cuda\n```"}
    with pytest.raises(UserError, match="completion must be a string or null"):
        load_solutions(solutions(tmp_path, [rows[0] | {"completion": 3}]), {("t1", 1, 0)}, {"t1"})
