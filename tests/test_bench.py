"""The bench scripts in --quick mode, as CI runs them: they run and print their tables.

Only that: --quick sizes are too small (and CI machines too shared) for the figures to mean anything,
so nothing here asserts a speed or a memory figure. The full-mode tables are in docs/performance.md.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_quick(script: str) -> str:
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.mark.parametrize("script", ["profile.py", "train.py", "generate.py"])
def test_help(script):
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--help"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "--quick" in r.stdout and "--threads" in r.stdout


def test_profile_bench_quick_prints_both_tables():
    out = run_quick("profile.py")
    assert out.startswith("# bench/profile.py --quick") and "machine: " in out
    assert "### tiny:" in out and "### wide:" in out
    assert out.count("| variant | tokens per CPU s | speed vs naive | peak extra memory (MiB) |") == 2
    assert out.count("| naive |") == 2 and out.count("| stage 01 default (--batch-size auto) |") == 2


def test_train_bench_quick_prints_its_tables():
    out = run_quick("train.py")
    assert out.startswith("# bench/train.py --quick") and "machine: " in out
    assert "| objective | step (CPU s) | time vs sft | peak extra memory (MiB) | memory vs sft |" in out
    for objective in ("sft", "dft", "profit", "cuset", "cuset-mask", "cuset-weight"):
        assert f"| {objective} |" in out
    assert (
        "| vocabulary | variant | step (CPU s) | speed vs plain | peak extra memory (MiB) | memory vs plain |"
        in out
    )
    assert "| plain model(labels=...) |" in out and "| stage 03 chunked head |" in out
    assert "limits on 1 thread(s): GEMM fp32 " in out and "ceiling: " in out
    header = "| precision | step (CPU s, median after the 1st) | tokens per CPU s | vs fp32 | of ceiling |"
    assert header in out
    assert "| fp32 |" in out and "| bf16 |" in out and "| step | loss fp32 | loss bf16 |" in out


def test_eval_bench_quick_prints_its_table():
    out = run_quick("eval.py")
    assert out.startswith("# bench/eval.py --quick") and "machine: " in out
    assert "| variant | wall s | programs per minute | speed vs anchor | ideal |" in out
    for variant in ("plain nvcc, one at a time (anchor)", "stage 04, sandboxed, one at a time"):
        assert f"| {variant} |" in out
    assert "sandbox cost per compile" in out and "s per row" in out


def test_generate_bench_quick_prints_the_limits_and_its_table():
    out = run_quick("generate.py")
    assert out.startswith("# bench/generate.py --quick") and "machine: " in out
    assert "GEMM fp32" in out and "memory read" in out and "ceiling: 5.2M parameters" in out
    assert (
        "| machine | variant | engine | dtype | tokens | load s | generation s | tokens per s "
        "| speed vs anchor | of the ceiling |"
    ) in out
    for variant in ("model.generate, fp32, 8 prompts per call (anchor)", "stage 04, own loop, fp32"):
        assert f"| as it is | {variant} |" in out
