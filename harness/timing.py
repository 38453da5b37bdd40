"""Stage 04's kernel timings (docs/evaluation.md, "Timing"), apart from the harness that measures them
(data/taskgen/core.py: TIMER): reading the harness's timing line without trusting the program, and the
statistics of timed rows. Pure functions of the samples the line carries.

The harness times the candidate and the reference in interleaved repetitions, each launch by its own pair
of events from a cold L2 cache, and prints per repetition each side's mean milliseconds per launch. Then it
launches the candidate once more on the inputs under CHECK_FOLDER/ and writes what that launch computed,
which stage 04 judges like a first run's outputs: a kernel whose later launches do less than its first
gets no timing (output_check_void). A row keeps each side's median and interquartile range, the speedup
(the median over repetitions of reference / candidate time: the two sides of one repetition ran back to
back, under the same clocks) and a confidence interval for it, and counts towards fast_p only when that
interval lies wholly above p. A speedup over SUSPECT_SPEEDUP is flagged for a look.
"""

from __future__ import annotations

import math
import re
import statistics

# The argument that makes a kernel-mode program time instead of writing outputs; the harness
# (data/taskgen/core.py: TIMING_ARGUMENT) checks for the same text.
TIMING_ARGUMENT = "--time"
CHECK_FOLDER = (
    "check"  # where the harness (data/taskgen/core.py: CHECK_FOLDER) reads the checked launch's inputs
)
TIMING_LINE = re.compile(
    r"CUSET_TIMING nonce=(\w*) candidate_ms=(\S*) reference_ms=(\S*) launches=(\d+),(\d+)"
)
CONFIDENCE = 0.95  # of the speedup's interval
FAST_P = (0.0, 1.0, 1.5)  # fast_p: the share of rows that pass with a speedup interval above p
# A speedup above this is flagged `speedup_suspect` in the row and counted in the summary: far more than a
# kernel of the same algorithm gains, it more often means work skipped in a way no check here sees.
SUSPECT_SPEEDUP = 10.0


def read_timing(log: str, nonce: str) -> dict:
    """The row's timing fields from the log of a timing run: timing_stats of the samples of its one
    CUSET_TIMING line, or {"timing_void": why} when there is none that can be trusted. The line must be
    the log's only one and carry `nonce` (written to the program's stdin, read by the harness's main):
    a forged line (a static constructor's, a kernel printf's) or a nonce taken before main voids it."""
    found = log.count("CUSET_TIMING")
    match = TIMING_LINE.search(log)
    if found != 1 or match is None or match.group(1) != nonce:
        return void(f"{found} CUSET_TIMING line(s), not one carrying this run's nonce")
    candidate, reference = parse_samples(match.group(2)), parse_samples(match.group(3))
    if not (candidate and reference and len(candidate) == len(reference) and interval_rank(len(candidate))):
        return void("its samples are not two equal lists of positive times, enough for a confidence interval")
    launches = [int(match.group(4)), int(match.group(5))]
    return timing_stats(candidate, reference) | {"launches": launches}


def output_check_void(judged: str) -> dict:
    """The timing fields of a row whose launch after the timed ones wrote outputs compare.py judges F:
    the kernel's later launches do less than its first (they skip their work, or return what the first
    left in __device__ memory), so its timings measure less than the work."""
    return {
        "timing_void": "the candidate's launch after the timed ones wrote outputs compare.py judges F, so "
        f"its later launches do less than its first: timing discarded{judged}",
        "timing_check": "wrong_output",
    }


def void(why: str) -> dict:
    """The timing fields of a row whose timing line cannot be trusted or used."""
    return {"timing_void": f"{why}: timing discarded"}


def parse_samples(text: str) -> list[float] | None:
    """Comma-separated milliseconds, or None unless every one is a finite positive number."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        return None
    return values if all(math.isfinite(v) and v > 0 for v in values) else None


def timing_stats(candidate_ms: list[float], reference_ms: list[float]) -> dict:
    """A timed row's fields from the two sides' milliseconds per launch, paired by repetition: each side's
    median and interquartile range, the speedup and its interval (speedup_interval)."""
    ratios = [ref / cand for cand, ref in zip(candidate_ms, reference_ms, strict=True)]
    suspect = {"speedup_suspect": True} if statistics.median(ratios) > SUSPECT_SPEEDUP else {}
    return suspect | {
        "candidate_ms": statistics.median(candidate_ms),
        "candidate_ms_iqr": interquartile_range(candidate_ms),
        "reference_ms": statistics.median(reference_ms),
        "reference_ms_iqr": interquartile_range(reference_ms),
        "repeats": len(ratios),
        "speedup": statistics.median(ratios),
        "speedup_interval": median_interval(ratios),
    }


def interquartile_range(values: list[float]) -> list[float]:
    """[first quartile, third quartile] (linear interpolation between the sorted values)."""
    first, _, third = statistics.quantiles(values, n=4, method="inclusive")
    return [first, third]


def interval_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """The rank k whose k-th smallest and k-th largest of n values bound the median with at least
    `confidence`: the largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2, since the median
    lies below the k-th smallest value only when fewer than k values fall below it (the sign test's
    interval; it assumes nothing about the distribution). 0 when n is too small for any."""
    tail, rank = 0.0, 0
    while rank < n and tail + math.comb(n, rank) / 2**n <= (1 - confidence) / 2:
        tail += math.comb(n, rank) / 2**n
        rank += 1
    return rank


def median_interval(values: list[float]) -> list[float]:
    """The CONFIDENCE interval for the median of `values` (interval_rank), as [low, high]."""
    rank, ordered = interval_rank(len(values)), sorted(values)
    return [ordered[rank - 1], ordered[-rank]]


def faster_than(row: dict, p: float) -> bool:
    """The row passes and its speedup interval lies above p: faster than p times the reference beyond what
    the repetitions' spread allows by chance (docs/evaluation.md, "Timing")."""
    interval = row.get("speedup_interval")
    return row["outcome"] == "pass" and interval is not None and interval[0] > p


def speed_stats(rows: list[dict]) -> dict:
    """The summary's speed figures for one group of judged rows: the geometric mean of the timed rows'
    speedups and fast_p for each p in FAST_P (over all the rows); {} when no row was timed."""
    if not any("speedup" in r or "timing_void" in r for r in rows):
        return {}
    speedups = [r["speedup"] for r in rows if r["outcome"] == "pass" and "speedup" in r]
    out = {"speedup_gmean": statistics.geometric_mean(speedups)} if speedups else {}
    return out | {f"fast_{p:g}": sum(faster_than(r, p) for r in rows) / len(rows) for p in FAST_P}
