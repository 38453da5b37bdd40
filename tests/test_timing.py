"""Stage 04's kernel timings: the statistics of harness/timing.py on samples drawn from fixed seeds (equal
kernels must not count as faster, a kernel twice as fast must), the timing line read without trusting
the program, the summary's speed figures, and the kernel-mode harness itself (data/taskgen/core.py):
nvcc compiles it, and its timing run, apart from the run that decides the outcome, prints the samples
stage 04 reads (run under the CPU emulator here, on the GPU where there is one)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script

from cuset_common.paths import NVCC_DEFAULT_ARCH, NVCC_FLAGS, NVCC_NATIVE_ARCH, ROOT
from harness.programs import gpu_name, resolve_backend
from harness.timing import (
    TIMING_ARGUMENT,
    faster_than,
    interval_rank,
    read_timing,
    speed_stats,
    timing_stats,
)

sys.path.insert(0, str(ROOT / "data"))  # the taskgen package lives in data/
from taskgen import FAMILIES  # noqa: E402
from taskgen.core import TIMING_ARGUMENT as HARNESS_TIMING_ARGUMENT  # noqa: E402
from taskgen.core import TIMING_REPEATS, render_task  # noqa: E402

ev = load_script("04_eval_kernels.py")
BACKEND = resolve_backend("auto", gpu_name())
ARCH = NVCC_NATIVE_ARCH if BACKEND == "gpu" else NVCC_DEFAULT_ARCH  # a GPU runs only what is built for it
NONCE = "0123456789abcdef0123456789abcdef"


# ---------------------------------------------------------------------------------------
# Samples as the harness prints them, from fixed seeds
# ---------------------------------------------------------------------------------------


def samples(rng: np.random.Generator, candidate_ms: float, reference_ms: float) -> tuple[list, list]:
    """One timing run's milliseconds per launch, TIMING_REPEATS per side: a drift of the clocks shared by
    the two sides of a repetition (they ran back to back), each side's own jitter, and now and then a
    slow outlier (another process, a clock step)."""
    n = TIMING_REPEATS
    drift = rng.lognormal(0.0, 0.05, n)

    def side(ms: float) -> list[float]:
        outliers = np.where(rng.random(n) < 0.08, 1.5, 1.0)
        return (ms * drift * rng.lognormal(0.0, 0.03, n) * outliers).tolist()

    return side(candidate_ms), side(reference_ms)


def timed_rows(seed: int, candidate_ms: float, reference_ms: float, count: int = 200) -> list[dict]:
    """`count` passing rows of one kernel against its reference, each from its own timing run."""
    rng = np.random.default_rng(seed)
    return [
        {"outcome": "pass"} | timing_stats(*samples(rng, candidate_ms, reference_ms)) for _ in range(count)
    ]


def line(candidate: list[float], reference: list[float], nonce: str = NONCE, launches: str = "64,32") -> str:
    """The harness's timing line (data/taskgen/core.py: time_kernels), numbers printed as %.6g."""
    candidate_ms, reference_ms = (",".join(f"{v:.6g}" for v in side) for side in (candidate, reference))
    return f"CUSET_TIMING nonce={nonce} candidate_ms={candidate_ms} reference_ms={reference_ms} " + (
        f"launches={launches}"
    )


# ---------------------------------------------------------------------------------------
# The statistics
# ---------------------------------------------------------------------------------------


def test_equally_fast_kernels_get_intervals_around_1_and_do_not_count_towards_fast_1():
    rows = timed_rows(seed=11, candidate_ms=0.012, reference_ms=0.012)
    around_1 = sum(r["speedup_interval"][0] <= 1 <= r["speedup_interval"][1] for r in rows)
    assert around_1 / len(rows) >= 0.9  # a 95% interval
    assert (
        speed_stats(rows)["fast_1"] <= 0.05
    )  # the interval's lower end: 2.5% by chance at most, in the long run
    # the old rule, a ratio of the two medians above 1, counts about half of them
    old_fast_1 = sum(
        statistics.median(r_ms) / statistics.median(c_ms) > 1
        for c_ms, r_ms in (samples(np.random.default_rng(s), 0.012, 0.012) for s in range(200))
    )
    assert 0.3 < old_fast_1 / 200 < 0.7


def test_identical_samples_give_the_interval_1_1_which_is_not_faster():
    row = {"outcome": "pass"} | timing_stats([0.5] * 25, [0.5] * 25)
    assert row["speedup"] == 1 and row["speedup_interval"] == [1, 1]
    assert not faster_than(row, 1.0) and faster_than(row, 0.0)


def test_a_kernel_twice_as_fast_counts_towards_fast_1_and_fast_1_5():
    rows = timed_rows(seed=12, candidate_ms=0.006, reference_ms=0.012)
    around_2 = sum(r["speedup_interval"][0] <= 2 <= r["speedup_interval"][1] for r in rows)
    assert around_2 / len(rows) >= 0.9  # a 95% interval
    stats = speed_stats(rows)
    assert stats["fast_1"] == stats["fast_1.5"] == 1.0
    assert stats["speedup_gmean"] == pytest.approx(2.0, rel=0.02)


def test_a_row_keeps_each_sides_median_and_interquartile_range():
    candidate = [float(v) for v in range(1, 26)]  # 1 .. 25 ms
    row = timing_stats(candidate, [2 * v for v in candidate])
    assert row["candidate_ms"] == 13 and row["candidate_ms_iqr"] == [7, 19]
    assert row["reference_ms"] == 26 and row["reference_ms_iqr"] == [14, 38]
    assert row["speedup"] == 2 and row["speedup_interval"] == [2, 2] and row["repeats"] == 25


@pytest.mark.parametrize("n, rank", [(5, 0), (6, 1), (10, 2), (25, 8)])
def test_the_interval_of_the_median_uses_the_sign_tests_order_statistics(n, rank):
    # Tables of the distribution-free 95% interval for a median: n = 10 -> 2nd and 9th value, n = 25 ->
    # 8th and 18th; below 6 values no pair of them covers the median with 95%.
    assert interval_rank(n) == rank


def test_the_summary_takes_fast_p_from_the_interval_over_every_judged_row():
    just_above = {"outcome": "pass", "speedup": 1.02, "speedup_interval": [0.97, 1.06]}
    clearly_above = {"outcome": "pass", "speedup": 1.8, "speedup_interval": [1.6, 2.0]}
    wrong = {"outcome": "wrong_output"}
    untimed = {"outcome": "pass", "timing_void": "the timing run did not exit within 1 s"}
    rows = [
        {"task_id": str(i), "level": 1, "category": "c"} | r
        for i, r in enumerate([just_above, clearly_above, wrong, untimed])
    ]
    stats = ev.group_stats(rows, 1)
    assert stats["fast_0"] == 0.5 and stats["fast_1"] == 0.25 and stats["fast_1.5"] == 0.25
    assert stats["speedup_gmean"] == pytest.approx((1.02 * 1.8) ** 0.5)
    assert "fast_1" not in ev.group_stats([rows[2]], 1)  # nothing timed: no speed figures


# ---------------------------------------------------------------------------------------
# The timing line, not trusted
# ---------------------------------------------------------------------------------------


def test_the_one_line_carrying_the_nonce_is_read():
    fast, slow = [1.0] * 6, [2.0] * 6
    got = read_timing("kernel output\n" + line(fast, slow) + "\n", NONCE)
    assert got["speedup"] == 2 and got["launches"] == [64, 32] and got["repeats"] == 6


@pytest.mark.parametrize(
    "log",
    [
        "no timing here",
        line([1.0] * 6, [2.0] * 6, nonce="forged"),
        line([1.0] * 6, [2.0] * 6) + "\n" + line([1.0] * 6, [2.0] * 6),  # one forged beside the harness's
        line([1.0] * 6, [2.0] * 5),  # unequal sides
        line([1.0] * 5, [2.0] * 5),  # too few repetitions for a 95% interval
        line([1.0] * 5 + [float("nan")], [2.0] * 6),
        line([1.0] * 5 + [0.0], [2.0] * 6),
    ],
    ids=["none", "wrong-nonce", "two-lines", "unequal", "too-few", "nan", "zero"],
)
def test_a_timing_line_that_cannot_be_trusted_or_used_voids_the_timing(log):
    assert set(read_timing(log, NONCE)) == {"timing_void"}


# ---------------------------------------------------------------------------------------
# The kernel-mode harness: nvcc compiles it; its timing run is a run of its own
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def square_task() -> dict:
    """A small eval task, rendered by data/taskgen/core.py as it stands."""
    return render_task(next(s for f in FAMILIES for s in f.specs() if s.task_id == "square_1500007"))


def reference_program(task: dict) -> str:
    """The task's kernel-mode program with its own reference kernels as the candidate's."""
    return ev.program_source(task, task["kernel_mode"]["reference_kernels"], "kernel")


@pytest.mark.slow
def test_the_kernel_mode_harness_compiles_with_nvcc(square_task, tmp_path):
    assert HARNESS_TIMING_ARGUMENT == TIMING_ARGUMENT  # the argument stage 04 passes is the one it checks
    (tmp_path / "prog.cu").write_text(reference_program(square_task))
    r = subprocess.run(
        ["nvcc", *NVCC_FLAGS, *NVCC_DEFAULT_ARCH, "prog.cu", "-o", "prog"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def timed_run(square_task, tmp_path_factory):
    """execute(**kw): stage 04's execute() with timing on, of the reference program built once the way stage
    04 builds it (nvcc, then for the emulator where there is no GPU), each call in a folder of its own."""
    work = tmp_path_factory.mktemp("timing")
    os.chmod(work, 0o711)  # the sandbox uid passes through to its own folders
    runner = ev.Runner(True, BACKEND)
    emulator = ev.prepare_emulator(work, checks=False) if BACKEND == "emulated" else None
    assert ev.prepare_task_data(square_task, work / "gen", 120, runner) is None
    outcome, exe, log = ev.build(reference_program(square_task), work / "build", ARCH, 120, emulator, runner)
    assert outcome is None, log

    def execute(**kw):
        workdir = Path(tempfile.mkdtemp(dir=work))
        os.chmod(workdir, 0o711)
        return ev.execute(square_task, exe, work / "gen", workdir, 60, runner, timed=True, **kw)

    return execute


@pytest.mark.slow
def test_a_passing_kernel_is_timed_in_a_run_of_its_own(timed_run):
    outcome, log, timing = timed_run()
    assert outcome == "pass", log
    assert "CUSET_TIMING" not in log  # the run that decided `pass` timed nothing
    assert timing["repeats"] == TIMING_REPEATS and min(timing["launches"]) >= 1, timing
    low, high = timing["speedup_interval"]
    assert 0 < low <= timing["speedup"] <= high, timing
    first, third = timing["candidate_ms_iqr"]
    assert 0 < first <= timing["candidate_ms"] <= third, timing


@pytest.mark.slow
def test_a_correct_kernel_too_slow_to_time_passes_with_its_timing_void(timed_run):
    outcome, log, timing = timed_run(timing_timeout=0.01)  # no timing run finishes in 10 ms
    assert outcome == "pass", log
    assert "speedup" not in timing and "--timing-timeout" in timing["timing_void"], timing
