"""The paper's observation, tested on the data: do low-confidence CUDA-sensitive tokens cluster into regions?

Each claim is tested against the permutation null that tests it (docs/method.md "Regions"). The statistic:
the share of low-confidence tokens of a kind (category code; 0 = not sensitive) that sit in a multi-token
run, i.e. whose chain under the region rule's chaining (02_label_regions.py, low_chains, passed in as
`chain_rule`) holds another low token. Three nulls (NULLS), Holm's adjustment over the categories, and one
plain sentence of what the data supports (conclusion) at level LEVEL.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from cuset_common.labeling.labels import RegionLabels
from cuset_common.labeling.report import num, pct
from cuset_common.method import CODES

LEVEL = 0.05  # significance level the plain sentence reads its tests at (per category: after Holm)

# (low [T], sample_of [T], gap) -> (positions [L] of the low tokens, chain [L] of each): the region rule's
# chaining, 02_label_regions.low_chains
ChainRule = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]

NULLS = {  # name: (tokens the statistic is on, what the null moves, what a rejection shows)
    "a": ("sensitive", "confidences shuffled within each sample", "low confidence comes in runs"),
    "b": (
        "sensitive",
        "tags rotated within each sample",
        "sensitive low tokens cluster more than other low tokens",
    ),
    "c": (
        "non-sensitive",
        "confidences shuffled within each sample",
        "the same without tags (control for a)",
    ),
}


# ---------------------------------------------------------------------------------------
# The run statistic
# ---------------------------------------------------------------------------------------


def in_multi_token_run(low: np.ndarray, sample_of: np.ndarray, gap: int, chain_rule: ChainRule) -> np.ndarray:
    """bool [T]: the low tokens whose chain (chain_rule, the one regions grow along) holds >= 2 low tokens,
    i.e. another low token of the same sample lies within gap + 1 positions."""
    idx, chain = chain_rule(low, sample_of, gap)  # [L], [L]
    out = np.zeros(len(low), dtype=bool)
    out[idx[np.bincount(chain)[chain] >= 2]] = True
    return out


def run_counts(low: np.ndarray, multi: np.ndarray, c: np.ndarray) -> np.ndarray:
    """int64 [2, CODES]: per category code c_it (0 = not sensitive), low tokens in multi-token runs and low
    tokens."""
    return np.stack([np.bincount(c[multi], minlength=CODES), np.bincount(c[low], minlength=CODES)])


def run_shares(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Share of low tokens in runs from run_counts [..., 2, CODES]: (all sensitive [...], per code
    [..., CODES]); NaN where a kind has no low token."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts[..., 0, 1:].sum(-1) / counts[..., 1, 1:].sum(-1), counts[..., 0, :] / counts[..., 1, :]


def low_share_gap(counts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Low-confidence share of sensitive tokens minus that of other tokens, from run_counts [..., 2, CODES]
    and the tokens per code [CODES]. Either share alone is about rho by construction; their difference is
    not."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts[..., 1, 1:].sum(-1) / tokens[1:].sum() - counts[..., 1, 0] / tokens[0]


# ---------------------------------------------------------------------------------------
# The three nulls
# ---------------------------------------------------------------------------------------


def shuffled_confidence_null(
    p0, token_tau, c, sample_of, gap: int, n_perm: int, rng, chain_rule: ChainRule
) -> np.ndarray:
    """Nulls (a) and (c): run_counts [n_perm, 2, CODES] with each sample's confidences shuffled over its
    positions (token_tau [T]: tau_i of each token's sample).

    Tags, positions and each sample's tau stay fixed and low confidence may land anywhere, so a
    rejection says low confidence comes in runs, for whatever tokens the statistic is on; it says
    nothing about CUDA sensitivity unless (c), the same test on untagged tokens, does not reject.
    """
    out = np.zeros((n_perm, 2, CODES), np.int64)
    for k in range(n_perm):
        low = p0[np.argsort(sample_of + rng.random(len(p0)))] < token_tau  # [T] a shuffle within each sample
        out[k] = run_counts(low, in_multi_token_run(low, sample_of, gap, chain_rule), c)
    return out


def rotated_tags_null(low, multi, c, offsets, sample_of, n_perm: int, rng) -> np.ndarray:
    """Null (b): run_counts [n_perm, 2, CODES] with each sample's tags rotated (cyclically) by a random
    offset.

    Confidences and runs stay fixed, and the tags keep their own spacing (a lexeme of several
    tokens stays whole), so a rejection says sensitive low tokens sit in runs more than the other
    low tokens of the same samples: the CUDA-specific claim.
    """
    n, start = np.diff(offsets)[sample_of], offsets[sample_of]  # [T] length and first token of its sample
    pos = np.arange(len(c)) - start  # [T] position within the sample
    out = np.zeros((n_perm, 2, CODES), np.int64)
    for k in range(n_perm):
        shift = rng.integers(np.maximum(np.diff(offsets), 1))[sample_of]  # [T] one offset per sample
        out[k] = run_counts(low, multi, c[start + (pos + shift) % n])
    return out


def draw_nulls(
    labels: RegionLabels, args: argparse.Namespace, chain_rule: ChainRule
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """run_counts observed [2, CODES], under null (a) and (c) [n_perm, 2, CODES] and under null (b)
    [n_perm, 2, CODES], the draws in this order from one generator seeded with --seed."""
    low, c, sample_of = labels.low, labels.c, labels.sample_of
    multi = in_multi_token_run(low, sample_of, args.gap, chain_rule)
    rng = np.random.default_rng(args.seed)
    token_tau = labels.tau[sample_of]  # [T]
    null_a = shuffled_confidence_null(
        labels.p0, token_tau, c, sample_of, args.gap, args.permutations, rng, chain_rule
    )
    null_b = rotated_tags_null(low, multi, c, labels.sample_offsets, sample_of, args.permutations, rng)
    return run_counts(low, multi, c), null_a, null_b


# ---------------------------------------------------------------------------------------
# p-values and summaries
# ---------------------------------------------------------------------------------------


def p_value(observed: float, null: np.ndarray, side: str = "greater") -> float:
    """Permutation p-value (1 + #{draws at least as extreme}) / (1 + #draws) over the draws where the
    statistic is defined; side "greater", "less" or "two" (twice the smaller one-sided p, at most 1)."""
    null = null[~np.isnan(null)]
    if np.isnan(observed) or len(null) == 0:
        return float("nan")
    if side == "two":
        return min(1.0, 2 * min(p_value(observed, null), p_value(observed, null, "less")))
    hits = null >= observed - 1e-12 if side == "greater" else null <= observed + 1e-12
    return float((1 + hits.sum()) / (1 + len(null)))


def holm(p) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values; NaN (untested) stays NaN, outside the family."""
    p = np.asarray(p, dtype=np.float64)
    order = np.flatnonzero(~np.isnan(p))
    order = order[np.argsort(p[order], kind="stable")]
    out = np.full(len(p), np.nan)
    out[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * (len(order) - np.arange(len(order)))))
    return out


def mean(x) -> float:
    """Mean over the values that are not NaN (NaN when none is)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    return float(x.mean()) if len(x) else float("nan")


def spread(x) -> dict[str, float]:
    """mean, sd and quantiles of x (NaN when x is empty)."""
    q = np.quantile(x, [0, 0.1, 0.5, 0.9, 1]) if len(x) else [float("nan")] * 5
    return {
        "mean": mean(x),
        "sd": float(np.std(x)) if len(x) else float("nan"),
        **{k: float(v) for k, v in zip(("min", "p10", "median", "p90", "max"), q)},
    }


def against(observed: float, null: np.ndarray, side: str = "greater") -> dict[str, float]:
    """A statistic against its null draws: observed, null mean and sd, permutation p."""
    return {
        "observed": float(observed),
        "null_mean": mean(null),
        "null_sd": spread(null[~np.isnan(null)])["sd"],
        "p": p_value(observed, null, side),
    }


# ---------------------------------------------------------------------------------------
# The finding: every figure of the report, and the sentence
# ---------------------------------------------------------------------------------------


def compute_finding(
    labels: RegionLabels, names: dict[int, str], args: argparse.Namespace, chain_rule: ChainRule
) -> dict:
    """Every figure of the report (also stored in meta.json); low confidence means p0_it < tau_i."""
    p0, c, low = labels.p0, labels.c, labels.low
    sensitive, tokens = c > 0, np.bincount(c, minlength=CODES)  # [T], [CODES] tokens per code
    observed, null_a, null_b = draw_nulls(labels, args, chain_rule)
    (obs_s, obs_c), (a_s, a_c), (b_s, b_c) = run_shares(observed), run_shares(null_a), run_shares(null_b)
    nulls = {
        k: {**dict(zip(("tokens", "moves", "rejection_shows"), NULLS[k])), **against(o, null)}
        for k, o, null in (("a", obs_s, a_s), ("b", obs_s, b_s), ("c", obs_c[0], a_c[:, 0]))
    }
    low_share = {
        "sensitive": mean(low[sensitive]),
        "other": mean(low[~sensitive]),
        **against(low_share_gap(observed, tokens), low_share_gap(null_b, tokens), "two"),
        "test": "sensitive minus other, against the tag rotations of null (b), two-sided",
    }
    finding = {
        "tokens": len(p0),
        "sensitive_tokens": int(sensitive.sum()),
        "low_conf_tokens": int(low.sum()),
        "permutations": args.permutations,
        "seed": args.seed,
        "level": LEVEL,
        "nulls": nulls,
        "low_share": low_share,
        "above_tau_max_sensitive": mean(p0[sensitive] >= args.tau_max),
        "above_tau_max_other": mean(p0[~sensitive] >= args.tau_max),
        "mean_entropy_sensitive": mean(labels.entropy[sensitive]),
        "mean_entropy_other": mean(labels.entropy[~sensitive]),
        "per_category": category_figures(labels, names, observed, obs_c, a_c, b_c),
        "regions": region_figures(labels),
        "weights": weight_figures(labels, args.weight_norm),
    }
    finding["conclusion"] = conclusion(finding)
    return finding


def category_figures(labels: RegionLabels, names: dict[int, str], observed, obs_c, a_c, b_c) -> dict:
    """Per category: its tokens and low ones, its share in runs against nulls (a) and (b) (shares per code:
    obs_c [CODES], a_c and b_c [n_perm, CODES]), p raw and Holm-adjusted over the categories, its regions."""
    p0, c, low = labels.p0, labels.c, labels.low
    p_a, p_b = ([p_value(obs_c[code], null[:, code]) for code in names] for null in (a_c, b_c))
    return {
        name: {
            "code": code,
            "tokens": int((c == code).sum()),
            "low_conf_tokens": int(observed[1, code]),
            "low_conf_share": mean(low[c == code]),
            "mean_p": mean(p0[c == code]),
            "clustered_share": float(obs_c[code]),
            "null_a_mean": mean(a_c[:, code]),
            "p_a": pa,
            "p_a_holm": ha,
            "null_b_mean": mean(b_c[:, code]),
            "p_b": pb,
            "p_b_holm": hb,
            "regions": int((labels.region_category == code).sum()),
        }
        for (code, name), pa, ha, pb, hb in zip(names.items(), p_a, holm(p_a), p_b, holm(p_b))
    }


def region_figures(labels: RegionLabels) -> dict:
    """How many regions, over how many tokens and samples, how long (in tokens and in lines)."""
    in_region, starts, ends, line = (
        labels.region_id >= 0,
        labels.region_start,
        labels.region_end,
        labels.line_index,
    )
    return {
        "count": len(starts),
        "tokens": int(in_region.sum()),
        "samples_with_regions": int(np.unique(labels.sample_of[in_region]).size),
        "length_tokens": spread(ends - starts),
        "length_lines": spread(line[ends - 1] - line[starts] + 1),
    }


def weight_figures(labels: RegionLabels, norm: str) -> dict:
    """The sample weights w_i over the samples with response tokens: spread, how many end above and below 1,
    mean region mass, the token-weighted mean."""
    has, w = labels.n > 0, labels.w
    return {
        "norm": norm,
        "samples": int(has.sum()),
        **spread(w[has]),
        "samples_above_1": int(np.sum(w[has] > 1.0)),
        "samples_below_1": int(np.sum(w[has] < 1.0)),
        "mean_mass": mean(labels.m[has]),
        "token_weighted_mean": float((w * labels.n).sum() / len(labels.p0)),
    }


def conclusion(f: dict) -> str:
    """One plain sentence of what the data does and does not support, read off the tests at LEVEL:
    (a) and (c) for runs at all, (b) for the CUDA-specific claim (per category after Holm), the low share."""
    a, b, c, ls = f["nulls"]["a"], f["nulls"]["b"], f["nulls"]["c"], f["low_share"]
    if b["p"] != b["p"]:  # NaN: no draws
        return (
            "No permutation test was run (--permutations 0), so this data supports no claim about clustering."
        )
    sa, sb, sc, sl = (q < LEVEL for q in (a["p"], b["p"], c["p"], ls["p"]))
    runs = (
        "low confidence comes in runs, for sensitive and non-sensitive tokens alike"
        if sa and sc
        else "low-confidence sensitive tokens come in runs, non-sensitive ones do not"
        if sa
        else "low-confidence non-sensitive tokens come in runs, sensitive ones do not"
        if sc
        else "low confidence does not come in runs"
    )
    vs = f"{pct(b['observed'])} in runs vs {pct(b['null_mean'])}, b: p = {num(b['p'], 4)}"
    cats = ", ".join(n for n, cat in f["per_category"].items() if cat["p_b_holm"] < LEVEL) or "none"
    spec = (
        f"low-confidence sensitive tokens {'sit' if sb else 'do not sit'} in runs "
        f"{'' if sb else 'significantly '}more than their tags rotated over the same confidences "
        f"({vs}), so it {'supports' if sb else 'does not support'} that CUDA-sensitive low-confidence "
        f"tokens cluster specially (categories that do after Holm: {cats})"
    )
    how = ("more" if ls["observed"] > 0 else "less") if sl else "neither more nor less"
    return (
        f"At level {LEVEL}: {runs} (a: p = {num(a['p'], 4)}, c: p = {num(c['p'], 4)}); {spec}; and "
        f"sensitive tokens are {how} often low-confidence than other tokens ({pct(ls['sensitive'])} vs "
        f"{pct(ls['other'])}, p = {num(ls['p'], 4)})."
    )
