"""The paired statistics: each objective minus sft on the same units (held-out samples for token metrics,
prompts for pass@1), a bootstrap over seeds and units, and the smallest difference the design resolves."""

from __future__ import annotations

import math
import warnings
from statistics import NormalDist

import numpy as np

# The power statement: a two-sided test at the 5% level (z_0.975) with 80% power (z_0.8) detects a true
# difference of (z_0.975 + z_0.8) x SE four times in five (normal approximation, the SE the bootstrap's).
POWER_Z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)  # 1.960 + 0.842
BOOTSTRAP_CHUNK = 250  # resamples at a time: [250, seeds, units] float64 is a few MB at 200 prompts


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int = 0) -> dict:
    """The objective minus sft from a [Sa, U] and b [Sb, U] (seeds x units, the same units in the same
    order; nan where a run has no value for a unit). A resample draws U units with replacement, one draw
    for both sides (paired by unit), and Sa seeds of a and Sb seeds of b with replacement, each side apart
    (independent trainings; one seed: a no-op); its statistic is the mean over the drawn units of a's mean
    over its drawn seeds minus b's (nan-aware). Returns the point estimate, units and seeds used, the 95%
    percentile interval, the standard error (the resamples' standard deviation) and the smallest
    difference resolved at 80% power and a 5% two-sided level, POWER_Z x SE."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a unit (or a draw) without a value is nan
        keep = ~np.isnan(np.nanmean(a, 0) - np.nanmean(b, 0))  # units with a value on both sides
        a, b = a[:, keep], b[:, keep]
        (sa, units), sb = a.shape, b.shape[0]
        out = {
            "diff": math.nan,
            "units": int(units),
            "seeds": [int(sa), int(sb)],
            "ci95": [math.nan] * 2,
            "se": math.nan,
            "resolves": math.nan,
        }
        if not units:
            return out
        rng, stats = np.random.default_rng(seed), []
        for start in range(0, n_boot, BOOTSTRAP_CHUNK):
            r = min(BOOTSTRAP_CHUNK, n_boot - start)
            drawn = rng.integers(0, units, (r, 1, units))  # [R, 1, U]: the units, one draw for both sides
            mean_a = np.nanmean(a[rng.integers(0, sa, (r, sa, 1)), drawn], 1)  # [R, Sa, U] -> [R, U]
            mean_b = np.nanmean(b[rng.integers(0, sb, (r, sb, 1)), drawn], 1)  # [R, Sb, U] -> [R, U]
            stats.append(np.nanmean(mean_a - mean_b, 1))  # [R]
        stats = np.concatenate(stats)  # [n_boot]
        se = float(np.nanstd(stats, ddof=1)) if n_boot > 1 else math.nan
        out |= {
            "diff": float(np.nanmean(np.nanmean(a, 0) - np.nanmean(b, 0))),
            "se": se,
            "ci95": [float(x) for x in np.nanpercentile(stats, [2.5, 97.5])],
            "resolves": POWER_Z * se,
        }
    return out


def trained(per_run: dict, objective: str) -> list[dict]:
    """The runs of an objective whose training did not diverge: the only ones with values."""
    return [v for v in per_run.values() if v["objective"] == objective and not v.get("diverged")]


def unit_matrices(per_run: dict, objectives: list[str], key: str) -> list[np.ndarray]:
    """Each objective's values of `key` as a matrix [seeds, units] over the same units in the same order:
    held-out samples (arrays, aligned by the profiles) or prompts (task/level -> value; nan where a run has
    no verdict for a prompt). The seeds are those that trained (a diverged run has no values)."""
    runs = [[v["units"][key] for v in trained(per_run, o)] for o in objectives]
    if not isinstance(runs[0][0], dict):
        return [np.stack(r).astype(np.float64) for r in runs]
    prompts = sorted(set().union(*(u for r in runs for u in r)))
    return [np.array([[u.get(p, math.nan) for p in prompts] for u in r], dtype=np.float64) for r in runs]


def paired(args, per_run: dict) -> dict:
    """Every objective (and the base model, when evaluated) against sft, per paired metric: the bootstrap
    over seeds and units of paired_bootstrap, over the seeds that trained. An objective all of whose seeds
    diverged has no row; none has one when all of sft's did."""
    if not trained(per_run, "sft"):
        return {}
    keys = list(trained(per_run, "sft")[0]["units"])
    others = [o for o in args.objectives if o != "sft"] + (["base"] if args.eval_base else [])
    return {
        o: {key: paired_bootstrap(*unit_matrices(per_run, [o, "sft"], key), args.bootstrap) for key in keys}
        for o in others
        if trained(per_run, o)
    }
