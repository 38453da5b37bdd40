"""The bench scripts in --quick mode, as CI runs them: each prints the tables it promises, with one row per
variant it compares, the anchor of each comparison at 1.00x and every other figure a positive number.

No speed is asserted: --quick sizes are too small (and CI machines too shared) for the figures to rank the
variants. What is checked is what each bench is for, that it measured every variant and printed the
ratios a reader compares. The full-mode tables are in docs/performance.md.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from cuset_common.paths import ROOT


def run_quick(script: str) -> str:
    r = subprocess.run(
        [sys.executable, str(ROOT / "research" / "bench" / script), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def tables(out: str, header: list[str]) -> list[list[dict[str, str]]]:
    """Every markdown table in out with these column names, in order: its rows as {column: cell}
    (research/bench/common.py print_table writes them)."""
    lines, found = out.splitlines(), []
    for k, line in enumerate(lines):
        if line == "| " + " | ".join(header) + " |":
            body = []
            for row in lines[k + 2 :]:  # past the alignment line
                if not row.startswith("|"):
                    break
                body.append(
                    dict(zip(header, (cell.strip() for cell in row.strip("|").split("|")), strict=True))
                )
            found.append(body)
    assert found, f"no table with the columns {header}"
    return found


def by(rows: list[dict[str, str]], column: str) -> dict[str, dict[str, str]]:
    """The rows keyed by one column's cell, which names each row once."""
    keyed = {row[column]: row for row in rows}
    assert len(keyed) == len(rows), f"{column} names two rows alike"
    return keyed


def number(cell: str) -> float:
    """A printed figure as a float: 6,439 / 1.09x / **5.61x** / 8%."""
    return float(cell.strip("*").rstrip("x%").replace(",", ""))


def assert_compares(rows: dict[str, dict[str, str]], ratio: str, anchor: str, figures: list[str]) -> None:
    """The anchor row's `ratio` is 1.00x; every row's ratio and `figures` are finite positive numbers."""
    assert rows[anchor][ratio] == "1.00x", rows[anchor]
    for name, row in rows.items():
        for column in [ratio, *figures]:
            value = number(row[column])
            assert math.isfinite(value) and value > 0, (name, column, row[column])


@pytest.mark.parametrize("script", ["profiling.py", "train.py", "generate.py"])
def test_help(script):
    r = subprocess.run(
        [sys.executable, str(ROOT / "research" / "bench" / script), "--help"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "--quick" in r.stdout and "--threads" in r.stdout


def test_profile_bench_compares_stage_01_with_the_naive_loop_on_both_models():
    out = run_quick("profiling.py")
    assert out.startswith("# research/bench/profiling.py --quick") and "machine: " in out
    assert "### tiny:" in out and "### wide:" in out
    per_model = tables(out, ["variant", "tokens per CPU s", "speed vs naive", "peak extra memory (MiB)"])
    assert len(per_model) == 2  # the tiny model's, then the wide one's
    for table in per_model:
        rows = by(table, "variant")
        assert {"naive", "stage 01 default (--batch-size auto)"} <= rows.keys()
        assert_compares(rows, "speed vs naive", "naive", ["tokens per CPU s"])


def test_train_bench_compares_every_objective_the_chunked_head_and_bf16():
    out = run_quick("train.py")
    assert out.startswith("# research/bench/train.py --quick") and "machine: " in out
    columns = ["objective", "step (CPU s)", "time vs sft", "peak extra memory (MiB)", "memory vs sft"]
    objectives = by(*tables(out, columns), "objective")
    assert objectives.keys() == {"sft", "dft", "profit", "cuset", "cuset-mask", "cuset-weight"}
    assert_compares(objectives, "time vs sft", "sft", ["step (CPU s)"])

    columns = ["vocabulary", "variant", "step (CPU s)", "speed vs plain", "peak extra memory (MiB)"]
    (heads,) = tables(out, [*columns, "memory vs plain"])
    for vocabulary in {row["vocabulary"] for row in heads}:
        rows = by([row for row in heads if row["vocabulary"] == vocabulary], "variant")
        assert rows.keys() == {"plain model(labels=...)", "stage 03 chunked head"}
        assert_compares(
            rows, "speed vs plain", "plain model(labels=...)", ["step (CPU s)", "memory vs plain"]
        )

    assert "limits on 1 thread(s): GEMM fp32 " in out and "ceiling: " in out
    columns = ["precision", "step (CPU s, median after the 1st)", "tokens per CPU s", "vs fp32", "of ceiling"]
    precisions = by(*tables(out, columns), "precision")
    assert precisions.keys() == {"fp32", "bf16"}
    assert_compares(precisions, "vs fp32", "fp32", ["tokens per CPU s", "of ceiling"])
    # the same training in two precisions: every step's bf16 loss within the bench's bf16 tolerance
    within = "within " + re.search(r"\| within (\S+) \|", out).group(1)
    (losses,) = tables(out, ["step", "loss fp32", "loss bf16", "relative difference", within])
    assert losses and all(row[within] == "yes" and number(row["loss bf16"]) > 0 for row in losses), losses


def test_eval_bench_compares_stage_04_with_plain_nvcc():
    out = run_quick("eval.py")
    assert out.startswith("# research/bench/eval.py --quick") and "machine: " in out
    rows = by(
        *tables(out, ["variant", "wall s", "programs per minute", "speed vs anchor", "ideal"]), "variant"
    )
    anchor = "plain nvcc, one at a time (anchor)"
    assert {anchor, "stage 04, sandboxed, one at a time"} <= rows.keys()
    assert_compares(rows, "speed vs anchor", anchor, ["wall s", "programs per minute", "ideal"])
    assert "sandbox cost per compile" in out and "s per row" in out


def test_generate_bench_compares_stage_04_with_model_generate_beside_the_limits():
    out = run_quick("generate.py")
    assert out.startswith("# research/bench/generate.py --quick") and "machine: " in out
    assert "GEMM fp32" in out and "memory read" in out and "ceiling: 5.2M parameters" in out
    columns = ["machine", "variant", "engine", "dtype", "tokens", "load s", "generation s", "tokens per s"]
    (table,) = tables(out, [*columns, "speed vs anchor", "of the ceiling"])
    rows = by([row for row in table if row["machine"] == "as it is"], "variant")
    anchor = "model.generate, fp32, 8 prompts per call (anchor)"
    assert {anchor, "stage 04, own loop, fp32"} <= rows.keys()
    assert_compares(
        rows, "speed vs anchor", anchor, ["tokens", "generation s", "tokens per s", "of the ceiling"]
    )
