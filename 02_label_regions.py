"""Stage 02: low-confidence CUDA-sensitive regions and region-aware sample weights.

CuSeT's second level of CUDA sensitivity: the few sensitive tokens the base model predicts
with LOW confidence cluster into regions (index arithmetic, guards, shared-memory staging,
synchronization, write-back). This stage finds those regions in the stage-01 profile,
gives each sample a weight from its region mass, tests the finding on the data against
three permutation nulls (does low confidence come in runs at all? do SENSITIVE low tokens
cluster more than other low tokens? the same on untagged tokens) and says in one sentence
what the data supports, and draws samples as an HTML page. The rules are our
reconstruction (docs/method.md "Regions").

Inputs -> outputs:
  profile artifact (01_profile.py; default data/artifacts/profile)
  -> regions artifact (default data/artifacts/regions):
     tensors.safetensors  region_id int32 [T] (-1 = none), region_category uint8 [R],
                          region_start / region_end int64 [R] (flat token index, end exclusive),
                          tau / sample_mass / sample_weight float32 [S], sample_offsets int64 [S+1]
     meta.json            stage, args, model, tokenizer_fingerprint, data, max_length, categories,
                          profile {path (absolute), meta_sha256, tensors_sha256}, counts, finding \
(the report's figures)
     report.md            the finding (also printed)
     regions.html         self-contained page: tokens shaded by confidence, regions outlined

Commands:
  python 02_label_regions.py                                   # bundled tiny model + data
  python 02_label_regions.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --data my_sft.jsonl \\
      --profile runs/profile --out runs/regions --rho 0.2 --tau-max 0.5 --gap 2
  python 02_label_regions.py --no-snap-lines --html-samples 20
--model and --data (with its --data-fields and --data-where) must name what 01_profile.py was run with,
or the profile is refused.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from cuset_common import (DATA, RHO, TAU_MAX, TINY_MODEL, ArgumentParser, UserError,
                          args_to_json, check_meta_matches, check_out_dir, check_ranges, json_safe,
                          load_tokenizer, num, pct, read_artifact, read_jsonl, render_html, render_report,
                          render_sample, run_main, sample_threshold, sha256_file, tokenizer_fingerprint,
                          write_artifact)
from cuset_common.data_sources import add_data_arguments, data_checks, data_flags, load_data

STAGE = "02_label_regions"
PROFILE_TENSORS = {"token_ids": np.int32, "confidence": np.float32, "entropy": np.float16,
                   "sensitive": np.uint8, "char_start": np.int32, "char_end": np.int32,
                   "line_index": np.int32}  # all [T]
LEVEL = 0.05  # significance level the report's plain sentence reads its tests at (per category: after Holm)
THRESHOLD_ROWS = 256  # samples padded into one [rows, longest] block for sample_threshold


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    ap = ArgumentParser(description=__doc__, formatter_class=Formatter)
    ap.add_argument("--profile", type=Path, default=DATA / "artifacts" / "profile",
                    help="stage-01 artifact folder")
    ap.add_argument("--out", type=Path, default=DATA / "artifacts" / "regions",
                    help="regions artifact folder")
    ap.add_argument("--model", type=str, default=str(TINY_MODEL),
                    help="model of the profile (hub id or folder)")
    add_data_arguments(ap, "SFT data the profile was made from")
    ap.add_argument("--rho", type=float, default=RHO,
                    help="quantile of a sample's p0 for its threshold tau_i")
    ap.add_argument("--tau-max", type=float, default=TAU_MAX, help="upper bound on tau_i")
    ap.add_argument("--gap", type=int, default=2, help="confident tokens a region may bridge")
    ap.add_argument("--alpha", type=float, default=1.0, help="weight slope: w = 1 + alpha * m / mean(m)")
    ap.add_argument("--w-max", type=float, default=3.0, help="upper clip of the sample weight")
    ap.add_argument("--weight-norm", choices=("token-mean", "none"), default="token-mean",
                    help="token-mean: rescale w to token-weighted mean 1 (the sft "
                         "loss scale); none: keep clipped w")
    ap.add_argument("--snap-lines", action=argparse.BooleanOptionalAction, default=True,
                    help="extend regions to whole source lines")
    ap.add_argument("--permutations", type=int, default=200, help="draws of each permutation null")
    ap.add_argument("--seed", type=int, default=0, help="seed of the permutation nulls")
    ap.add_argument("--html-samples", type=int, default=8,
                    help="samples on the HTML page (highest region mass)")
    ap.add_argument("--force", action="store_true",
                    help="use a profile made from other inputs anyway; replace "
                         "another stage's artifact in --out")
    args = ap.parse_args(argv)
    check_ranges(ap, args, {"rho": "[0, 1]", "tau_max": "(0, 1]", "gap": "[0, inf)", "alpha": "[0, inf)",
                            "w_max": "[1, inf)", "permutations": "[0, inf)", "seed": "[0, inf)",
                            "html_samples": "[0, inf)"})
    return args


# ---------------------------------------------------------------------------------------
# Load and validate the profile (docs/method.md "Artifacts": refuse foreign inputs before any work)
# ---------------------------------------------------------------------------------------


def same_model(a: str, b: str) -> bool:
    """Model names match: equal strings, or two spellings of the same local folder."""
    return a == b or (Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve())


def load_profile(args: argparse.Namespace) -> tuple[dict, dict, list[dict], dict[int, str]]:
    """(tensors, meta, samples, category names) of the profile; refused when foreign, inconsistent or made
    from other inputs."""
    hint = f"python 01_profile.py --model {args.model} {data_flags(args)} --out {args.profile}"
    tensors, meta = read_artifact(args.profile, "01_profile", hint, token_tensors=PROFILE_TENSORS)
    fingerprint = tokenizer_fingerprint(load_tokenizer(args.model))
    seen = {"model": args.model if same_model(meta.get("model", ""), args.model) else meta.get("model"),
            **data_checks(meta.get("data")),
            "tokenizer_fingerprint": meta.get("tokenizer_fingerprint")}
    expected = {"model": args.model, **data_checks(load_data(args)[1]),
                "tokenizer_fingerprint": fingerprint}
    check_meta_matches(seen, expected, args.profile, hint, args.force)
    try:
        samples = [s for _, s in read_jsonl(args.profile / "samples.jsonl")]
    except UserError as e:
        raise UserError(f"{e}; rerun {hint}") from None
    if not all(isinstance(s.get("response_text"), str) for s in samples):
        raise UserError(f"{args.profile}/samples.jsonl: a sample lacks its response_text; rerun {hint}")
    check_profile_tensors(tensors, len(samples), args.profile, hint)
    names = {int(k): v for k, v in sorted((meta.get("categories") or {}).items(), key=lambda kv: int(kv[0]))}
    if not set(np.unique(tensors["sensitive"]).tolist()) <= {0, *names}:
        raise UserError(f"{args.profile}: meta.json 'categories' lacks a code "
                        f"used in 'sensitive'; rerun {hint}")
    return tensors, meta, samples, names


def check_profile_tensors(t: dict, n_samples: int, where: Path, hint: str) -> None:
    """What read_artifact's generic check leaves: one offset per sample of samples.jsonl, lines in order."""
    def bad(msg: str) -> UserError:
        return UserError(f"{where}: {msg}; rerun {hint}")

    off, n_tok = t["sample_offsets"], len(t["confidence"])
    if len(off) != n_samples + 1:
        raise bad(f"sample_offsets cover {len(off) - 1} samples but samples.jsonl holds {n_samples}")
    if n_tok == 0:
        raise bad("the profile holds no response tokens")
    sample_of = np.repeat(np.arange(n_samples), np.diff(off))
    line_steps = np.diff(t["line_index"].astype(np.int64))[sample_of[1:] == sample_of[:-1]]
    if np.any(line_steps < 0):
        raise bad("line_index decreases within a sample")


# ---------------------------------------------------------------------------------------
# Regions (docs/method.md "Regions", our reconstruction), on flat arrays over all T response tokens
# ---------------------------------------------------------------------------------------


def adaptive_thresholds(p: np.ndarray, offsets: np.ndarray, rho: float, tau_max: float) -> np.ndarray:
    """tau_i = min(tau_max, quantile_rho(p0 over sample i's tokens)) -> [S] float64: sample_threshold, the
    kappa_i of stage 03, on the samples padded into rows, THRESHOLD_ROWS samples at a time.

    Assumption: a sample without response tokens gets tau = 0 (no token can be below it).
    """
    n_tok, tau = np.diff(offsets), np.zeros(len(offsets) - 1)  # [S], [S]
    for lo in range(0, len(n_tok), THRESHOLD_ROWS):
        n = n_tok[lo:lo + THRESHOLD_ROWS]  # [b]
        valid = np.arange(max(int(n.max()), 1)) < n[:, None]  # [b, W]
        rows = np.zeros(valid.shape)  # [b, W]; row-major True entries are the block's tokens in order
        rows[valid] = p[offsets[lo]:offsets[lo + len(n)]]
        block = sample_threshold(torch.from_numpy(rows), torch.from_numpy(valid), rho, tau_max)  # [b]
        tau[lo:lo + len(n)] = block.numpy()
    return np.where(n_tok > 0, tau, 0.0)


def grow_regions(low: np.ndarray, seed: np.ndarray, sample_of: np.ndarray,
                 gap: int) -> tuple[np.ndarray, np.ndarray]:
    """Grow each seed over low-confidence neighbours (p0 < tau_i), bridging <= gap confident tokens.

    Low tokens chain when they are in the same sample and at most gap + 1 positions apart; a
    chain holding a seed is a region [first low token, last low token + 1). Returns (starts,
    ends) int64 [R], sorted and disjoint.
    """
    idx = np.flatnonzero(low)  # [L] positions of low-confidence tokens
    if len(idx) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    new_chain = np.ones(len(idx), dtype=bool)
    new_chain[1:] = (np.diff(idx) > gap + 1) | (sample_of[idx[1:]] != sample_of[idx[:-1]])
    chain = np.cumsum(new_chain) - 1  # [L] chain of each low token
    first = np.flatnonzero(new_chain)
    last = np.r_[first[1:], len(idx)] - 1
    has_seed = np.bincount(chain, weights=seed[idx], minlength=len(first)) > 0
    return idx[first][has_seed].astype(np.int64), idx[last][has_seed].astype(np.int64) + 1


def snap_to_lines(starts: np.ndarray, ends: np.ndarray, line_index: np.ndarray, sample_of: np.ndarray):
    """Extend [start, end) to every token on a line the region touches (a token's line: that of its first
    char).

    The key (sample, line) never decreases along the flat arrays, so a sorted search finds a
    line's first and last token without crossing into another sample.
    """
    key = sample_of.astype(np.int64) * (int(line_index.max()) + 1) + line_index  # [T]
    return (np.searchsorted(key, key[starts], side="left").astype(np.int64),
            np.searchsorted(key, key[ends - 1], side="right").astype(np.int64))


def merge_overlaps(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of overlapping spans (sorted by start); spans that only touch stay apart."""
    if len(starts) == 0:
        return starts, ends
    reach = np.maximum.accumulate(ends)  # furthest end so far
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] >= reach[:-1]
    return starts[new], np.maximum.reduceat(ends, np.flatnonzero(new))


def label_tokens(starts: np.ndarray, ends: np.ndarray, n_tokens: int) -> np.ndarray:
    """region_id int32 [T]: r for tokens in [starts[r], ends[r]), -1 elsewhere (spans disjoint)."""
    depth, opened = np.zeros(n_tokens + 1, np.int64), np.zeros(n_tokens + 1, np.int64)
    np.add.at(depth, starts, 1)
    np.add.at(depth, ends, -1)
    np.add.at(opened, starts, 1)
    inside = np.cumsum(depth)[:n_tokens] > 0
    return np.where(inside, np.cumsum(opened)[:n_tokens] - 1, -1).astype(np.int32)


def region_categories(region_id: np.ndarray, sensitive: np.ndarray, n_regions: int) -> np.ndarray:
    """Majority category of each region's sensitive tokens, uint8 [R]; a tie: the lower code (assumption)."""
    inside = (region_id >= 0) & (sensitive > 0)
    counts = np.bincount(region_id[inside].astype(np.int64) * 10 + sensitive[inside],
                         minlength=n_regions * 10).reshape(n_regions, 10)
    return (np.argmax(counts[:, 1:], axis=1) + 1).astype(np.uint8)  # argmax picks the first maximum


def region_mass(p: np.ndarray, region_id: np.ndarray, sample_of: np.ndarray,
                n_tok: np.ndarray) -> np.ndarray:
    """m_i = sum over sample i's region tokens of (1 - p0), divided by n_i; [S] (0 for an empty sample)."""
    summed = np.bincount(sample_of, weights=(1.0 - p) * (region_id >= 0), minlength=len(n_tok))
    return summed / np.maximum(n_tok, 1)


def sample_weights(mass: np.ndarray, n_tok: np.ndarray, alpha: float, w_max: float,
                   norm: str = "token-mean") -> np.ndarray:
    """w_i = clip(1 + alpha * m_i / mean(m), 1, w_max); norm "token-mean" then divides by the token-weighted
    mean so that sum_i n_i w_i / sum_i n_i = 1, norm "none" keeps the clipped weights.

    Why token-mean 1: the cuset loss is sum_i w_i sum_t m_it l_it / N, so a mean weight of 1 per token keeps
    it on the sft scale and one learning rate serves both. The price: once any sample has a region the
    divisor exceeds 1, so samples with little or no region mass end below 1, down-weighted against sft
    (the report gives how many and how far). Assumption: mean(m) is over samples with response tokens;
    with no region anywhere every weight is 1. The rescale only divides, so w stays <= w_max.
    """
    mean_m = mass[n_tok > 0].mean()
    raw = np.clip(1.0 + alpha * mass / mean_m, 1.0, w_max) if mean_m > 0 else np.ones_like(mass)
    return raw * n_tok.sum() / (n_tok * raw).sum() if norm == "token-mean" else raw


# ---------------------------------------------------------------------------------------
# The finding, each claim tested against the null that tests it (docs/method.md "Regions").
# Clustering statistic: the share of low-confidence tokens of a kind (tag code; 0 = not sensitive)
# in multi-token runs, i.e. with another low token of their sample within gap + 1 positions.
# ---------------------------------------------------------------------------------------

NULLS = {  # name: (tokens the statistic is on, what the null moves, what a rejection shows)
    "a": ("sensitive", "confidences shuffled within each sample", "low confidence comes in runs"),
    "b": ("sensitive", "tags rotated within each sample",
          "sensitive low tokens cluster more than other low tokens"),
    "c": ("non-sensitive", "confidences shuffled within each sample",
          "the same without tags (control for a)"),
}


def in_multi_token_run(low: np.ndarray, sample_of: np.ndarray, gap: int) -> np.ndarray:
    """bool [T]: the token is low and another low token of its sample lies within gap + 1 positions,
    i.e. exactly the low tokens whose chain in grow_regions holds >= 2 low tokens."""
    idx = np.flatnonzero(low)  # [L] positions of low tokens
    out = np.zeros(len(low), dtype=bool)
    if len(idx) < 2:
        return out
    chained = (np.diff(idx) <= gap + 1) & (sample_of[idx[1:]] == sample_of[idx[:-1]])  # [L-1] low j and j+1
    out[idx[np.r_[False, chained] | np.r_[chained, False]]] = True
    return out


def run_counts(low: np.ndarray, multi: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """int64 [2, 10]: per tag code (0 = not sensitive), low tokens in multi-token runs and low tokens."""
    return np.stack([np.bincount(codes[multi], minlength=10), np.bincount(codes[low], minlength=10)])


def run_shares(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Share of low tokens in runs from run_counts [..., 2, 10]: (all sensitive [...], per code [..., 10]);
    NaN where a kind has no low token."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts[..., 0, 1:].sum(-1) / counts[..., 1, 1:].sum(-1), counts[..., 0, :] / counts[..., 1, :]


def low_share_gap(counts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Low-confidence share of sensitive tokens minus that of other tokens, from run_counts [..., 2, 10] and
    the tokens per code [10]. Either share alone is about rho by construction; their difference is not."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts[..., 1, 1:].sum(-1) / tokens[1:].sum() - counts[..., 1, 0] / tokens[0]


def shuffled_confidence_null(p, tau_t, codes, sample_of, gap: int, n_perm: int, rng) -> np.ndarray:
    """Nulls (a) and (c): run_counts [n_perm, 2, 10] with each sample's confidences shuffled over its
    positions.

    Tags, positions and each sample's tau stay fixed and low confidence may land anywhere, so a
    rejection says low confidence comes in runs, for whatever tokens the statistic is on; it says
    nothing about CUDA sensitivity unless (c), the same test on untagged tokens, does not reject.
    """
    out = np.zeros((n_perm, 2, 10), np.int64)
    for k in range(n_perm):
        low = p[np.argsort(sample_of + rng.random(len(p)))] < tau_t  # [T] a shuffle within each sample
        out[k] = run_counts(low, in_multi_token_run(low, sample_of, gap), codes)
    return out


def rotated_tags_null(low, multi, codes, off, sample_of, n_perm: int, rng) -> np.ndarray:
    """Null (b): run_counts [n_perm, 2, 10] with each sample's tags rotated (cyclically) by a random offset.

    Confidences and runs stay fixed, and the tags keep their own spacing (a lexeme of several
    tokens stays whole), so a rejection says sensitive low tokens sit in runs more than the other
    low tokens of the same samples: the CUDA-specific claim.
    """
    n, start = np.diff(off)[sample_of], off[sample_of]  # [T] length and first token of each token's sample
    pos = np.arange(len(codes)) - start  # [T] position within the sample
    out = np.zeros((n_perm, 2, 10), np.int64)
    for k in range(n_perm):
        shift = rng.integers(np.maximum(np.diff(off), 1))[sample_of]  # [T] one offset per sample
        out[k] = run_counts(low, multi, codes[start + (pos + shift) % n])
    return out


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
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    return float(x.mean()) if len(x) else float("nan")


def spread(x) -> dict[str, float]:
    """mean, sd and quantiles of x (NaN when x is empty)."""
    q = np.quantile(x, [0, 0.1, 0.5, 0.9, 1]) if len(x) else [float("nan")] * 5
    return {"mean": mean(x), "sd": float(np.std(x)) if len(x) else float("nan"),
            **{k: float(v) for k, v in zip(("min", "p10", "median", "p90", "max"), q)}}


def against(observed: float, null: np.ndarray, side: str = "greater") -> dict[str, float]:
    """A statistic against its null draws: observed, null mean and sd, permutation p."""
    return {"observed": float(observed), "null_mean": mean(null),
            "null_sd": spread(null[~np.isnan(null)])["sd"], "p": p_value(observed, null, side)}


def compute_finding(v: dict, names: dict[int, str], args) -> dict:
    """Every figure of the report (also stored in meta.json). v holds the arrays of main():
    [T] per token, [R] per region, [S] per sample; low confidence means p0 < tau of the sample."""
    p, codes, tau_t, sample_of = v["p"], v["sensitive"], v["tau_t"], v["sample_of"]
    low, sens, in_region, has, w = p < tau_t, codes > 0, v["region_id"] >= 0, v["n_tok"] > 0, v["weight"]
    multi, tokens = in_multi_token_run(low, sample_of, args.gap), np.bincount(codes, minlength=10)
    rng = np.random.default_rng(args.seed)
    obs = run_counts(low, multi, codes)  # [2, 10]
    null_a = shuffled_confidence_null(p, tau_t, codes, sample_of, args.gap, args.permutations, rng)
    null_b = rotated_tags_null(low, multi, codes, v["off"], sample_of, args.permutations, rng)
    (obs_s, obs_c), (a_s, a_c), (b_s, b_c) = run_shares(obs), run_shares(null_a), run_shares(null_b)
    p_a, p_b = ([p_value(obs_c[c], null[:, c]) for c in names] for null in (a_c, b_c))
    per_cat = {name: {"code": c, "tokens": int(tokens[c]), "low_conf_tokens": int(obs[1, c]),
                      "low_conf_share": mean(low[codes == c]), "mean_p": mean(p[codes == c]),
                      "clustered_share": float(obs_c[c]), "null_a_mean": mean(a_c[:, c]), "p_a": pa,
                      "p_a_holm": ha, "null_b_mean": mean(b_c[:, c]), "p_b": pb, "p_b_holm": hb,
                      "regions": int((v["cats"] == c).sum())}
               for (c, name), pa, ha, pb, hb in zip(names.items(), p_a, holm(p_a), p_b, holm(p_b))}
    nulls = {k: {**dict(zip(("tokens", "moves", "rejection_shows"), NULLS[k])), **against(o, null)}
             for k, o, null in (("a", obs_s, a_s), ("b", obs_s, b_s), ("c", obs_c[0], a_c[:, 0]))}
    starts, ends, line = v["starts"], v["ends"], v["line"]
    f = {
        "tokens": len(p), "sensitive_tokens": int(sens.sum()), "low_conf_tokens": int(low.sum()),
        "permutations": args.permutations, "seed": args.seed, "level": LEVEL, "nulls": nulls,
        "low_share": {"sensitive": mean(low[sens]), "other": mean(low[~sens]),
                      **against(low_share_gap(obs, tokens), low_share_gap(null_b, tokens), "two"),
                      "test": "sensitive minus other, against the tag rotations of null (b), two-sided"},
        "above_tau_max_sensitive": mean(p[sens] >= args.tau_max),
        "above_tau_max_other": mean(p[~sens] >= args.tau_max),
        "mean_entropy_sensitive": mean(v["entropy"][sens]), "mean_entropy_other": mean(v["entropy"][~sens]),
        "per_category": per_cat,
        "regions": {"count": len(starts), "tokens": int(in_region.sum()),
                    "samples_with_regions": int(np.unique(sample_of[in_region]).size),
                    "length_tokens": spread(ends - starts),
                    "length_lines": spread(line[ends - 1] - line[starts] + 1)},
        "weights": {"norm": args.weight_norm, "samples": int(has.sum()), **spread(w[has]),
                    "samples_above_1": int(np.sum(w[has] > 1.0)),
                    "samples_below_1": int(np.sum(w[has] < 1.0)), "mean_mass": mean(v["mass"][has]),
                    "token_weighted_mean": float((w * v["n_tok"]).sum() / len(p))},
    }
    f["conclusion"] = conclusion(f)
    return f


def conclusion(f: dict) -> str:
    """One plain sentence of what the data does and does not support, read off the tests at LEVEL:
    (a) and (c) for runs at all, (b) for the CUDA-specific claim (per category after Holm), the low share."""
    a, b, c, ls = f["nulls"]["a"], f["nulls"]["b"], f["nulls"]["c"], f["low_share"]
    if b["p"] != b["p"]:  # NaN: no draws
        return ("No permutation test was run (--permutations 0), so this data "
                "supports no claim about clustering.")
    sa, sb, sc, sl = (q < LEVEL for q in (a["p"], b["p"], c["p"], ls["p"]))
    runs = ("low confidence comes in runs, for sensitive and non-sensitive tokens alike" if sa and sc else
            "low-confidence sensitive tokens come in runs, non-sensitive ones do not" if sa else
            "low-confidence non-sensitive tokens come in runs, sensitive ones do not" if sc else
            "low confidence does not come in runs")
    vs = f"{pct(b['observed'])} in runs vs {pct(b['null_mean'])}, b: p = {num(b['p'], 4)}"
    cats = ", ".join(n for n, cat in f["per_category"].items() if cat["p_b_holm"] < LEVEL) or "none"
    spec = (f"low-confidence sensitive tokens {'sit' if sb else 'do not sit'} in runs "
            f"{'' if sb else 'significantly '}more than their tags rotated over the same confidences "
            f"({vs}), so it {'supports' if sb else 'does not support'} that CUDA-sensitive low-confidence "
            f"tokens cluster specially (categories that do after Holm: {cats})")
    how = ("more" if ls["observed"] > 0 else "less") if sl else "neither more nor less"
    return (f"At level {LEVEL}: {runs} (a: p = {num(a['p'], 4)}, c: p = {num(c['p'], 4)}); {spec}; and "
            f"sensitive tokens are {how} often low-confidence than other tokens ({pct(ls['sensitive'])} vs "
            f"{pct(ls['other'])}, p = {num(ls['p'], 4)}).")


# ---------------------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t, meta, samples, names = load_profile(args)
    # room: the profile's tensors are more than the regions artifact needs (24 bytes per token against 4)
    inputs = {"--profile": args.profile, "--data": args.data, "--model": Path(args.model)}
    check_out_dir(args.out, STAGE, inputs, args.force, (args.profile / "tensors.safetensors").stat().st_size)
    p = t["confidence"].astype(np.float64)  # [T]
    sensitive, line_index, off = t["sensitive"], t["line_index"].astype(np.int64), t["sample_offsets"]
    n_tok = np.diff(off)  # [S]
    sample_of = np.repeat(np.arange(len(n_tok)), n_tok)  # [T] sample of each token

    tau = adaptive_thresholds(p, off, args.rho, args.tau_max)  # [S]
    low = p < tau[sample_of]  # [T]
    starts, ends = grow_regions(low, low & (sensitive > 0), sample_of, args.gap)  # [R]
    if args.snap_lines:
        starts, ends = merge_overlaps(*snap_to_lines(starts, ends, line_index, sample_of))
    region_id = label_tokens(starts, ends, len(p))  # [T]
    cats = region_categories(region_id, sensitive, len(starts))  # [R]
    mass = region_mass(p, region_id, sample_of, n_tok)  # [S]
    weight = sample_weights(mass, n_tok, args.alpha, args.w_max, args.weight_norm)  # [S]

    v = {"off": off, "n_tok": n_tok, "sample_of": sample_of, "p": p,
         "entropy": t["entropy"].astype(np.float64), "sensitive": sensitive, "line": line_index,
         "cs": t["char_start"], "ce": t["char_end"], "tau": tau, "tau_t": tau[sample_of],
         "region_id": region_id, "starts": starts, "ends": ends, "cats": cats, "mass": mass,
         "weight": weight}
    finding = compute_finding(v, names, args)
    report = render_report(finding, args, len(samples))
    shown = np.argsort(-mass, kind="stable")[: args.html_samples].tolist()  # highest region mass first
    page = render_html([render_sample(i, samples[i], v, names) for i in shown], finding, args, names)

    tensors = {"region_id": region_id, "region_category": cats, "region_start": starts, "region_end": ends,
               "tau": tau.astype(np.float32), "sample_mass": mass.astype(np.float32),
               "sample_weight": weight.astype(np.float32), "sample_offsets": off.astype(np.int64)}
    out_meta = {"stage": STAGE, "args": args_to_json(args),
                **{k: meta.get(k)
                   for k in ("model", "tokenizer_fingerprint", "data", "max_length", "categories")},
                "profile": {"path": str(args.profile.resolve()),
                            "meta_sha256": sha256_file(args.profile / "meta.json"),
                            "tensors_sha256": sha256_file(args.profile / "tensors.safetensors")},
                "counts": {"samples": len(n_tok), "response_tokens": len(p), "regions": len(starts),
                           "region_tokens": int((region_id >= 0).sum()),
                           "seeds": int((low & (sensitive > 0)).sum())},
                "finding": json_safe(finding)}
    write_artifact(args.out, tensors, out_meta, {"report.md": report, "regions.html": page})
    print(report)
    print(f"wrote {args.out} ({len(starts)} regions; report.md, regions.html)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
