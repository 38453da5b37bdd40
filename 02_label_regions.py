"""Stage 02: low-confidence CUDA-sensitive regions and region-aware sample weights.

CuSeT's second level of CUDA sensitivity: the few sensitive tokens the base model predicts with LOW
confidence cluster into regions (index arithmetic, guards, shared-memory staging, synchronization,
write-back). This stage finds those regions in the stage-01 profile and weights each sample by its region
mass, in the order the data flows (the rules are our reconstruction; notation and formulas:
docs/method.md "Regions"):

  threshold  tau_i of each sample (cuset_common.method.sample_threshold); a token is low when p0_it < tau_i
  seeds      the low-confidence CUDA-sensitive tokens
  growth     low tokens chain across at most --gap confident tokens; a chain that holds a seed is a region
  snapping   a region extends to the whole source lines it touches; overlapping regions merge
  category   a region's category is the majority one of its sensitive tokens
  mass       m_i, the missing confidence (1 - p0_it) summed over sample i's region tokens, per token
  weight     w_i, rising with m_i, clipped, at token-weighted mean 1 (stage 03 scales the loss with it)

It then tests the paper's observation on the data against three permutation nulls (does low confidence
come in runs at all? do SENSITIVE low tokens cluster more than other low tokens? the same on untagged
tokens), says in one sentence what the data supports (cuset_common/labeling/observation.py), and draws samples
as an HTML page (cuset_common/labeling/report.py).

Inputs -> outputs:
  profile artifact (01_profile.py; default data/artifacts/profile)
  -> regions artifact (default data/artifacts/regions):
     tensors.safetensors  region_id int32 [T] (-1 = none), region_category uint8 [R],
                          region_start / region_end int64 [R] (flat token index, end exclusive),
                          tau / m / w float32 [S] (tau_i, m_i, w_i), sample_offsets int64 [S+1]
     meta.json            stage, args, model, tokenizer_fingerprint, data, max_length, categories,
                          profile {path (absolute), meta_sha256, tensors_sha256}, counts,
                          finding (the report's figures)
     report.md            the finding (also printed)
     regions.html         self-contained page: tokens shaded by p0, regions outlined

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

from cuset_common.artifacts import path_text, write_artifact
from cuset_common.cli import run_main
from cuset_common.labeling.artifact import STAGE, regions_meta, regions_tensors, room_needed
from cuset_common.labeling.inputs import load_profile
from cuset_common.labeling.labels import RegionLabels
from cuset_common.labeling.observation import compute_finding
from cuset_common.labeling.options import parse_args
from cuset_common.labeling.report import render_html, render_report
from cuset_common.method import CODES, sample_threshold
from cuset_common.out_dir import check_out_dir, finishes_out

THRESHOLD_ROWS = 256  # samples padded into one [rows, longest] block for sample_threshold


# ---------------------------------------------------------------------------------------
# The region rule (docs/method.md "Regions", our reconstruction), on flat arrays over all T response tokens
# ---------------------------------------------------------------------------------------


def adaptive_thresholds(p0: np.ndarray, offsets: np.ndarray, rho: float, tau_max: float) -> np.ndarray:
    """tau_i of every sample -> [S] float64: sample_threshold (stage 03's kappa_i; 0 for a sample without
    response tokens) of the samples' p0, padded into rows, THRESHOLD_ROWS samples at a time."""
    n, tau = np.diff(offsets), np.zeros(len(offsets) - 1)  # n_i [S], tau_i [S]
    for lo in range(0, len(n), THRESHOLD_ROWS):
        n_block = n[lo : lo + THRESHOLD_ROWS]  # [b]
        valid = np.arange(max(int(n_block.max()), 1)) < n_block[:, None]  # [b, W]
        rows = np.zeros(valid.shape)  # [b, W]; row-major True entries are the block's tokens in order
        rows[valid] = p0[offsets[lo] : offsets[lo + len(n_block)]]
        block = sample_threshold(torch.from_numpy(rows), torch.from_numpy(valid), rho, tau_max)  # [b]
        tau[lo : lo + len(n_block)] = block.numpy()
    return tau


def seed_tokens(low: np.ndarray, c: np.ndarray) -> np.ndarray:
    """bool [T]: the seeds of regions, the tokens both low-confidence and CUDA-sensitive (c_it > 0)."""
    return low & (c > 0)


def low_chains(low: np.ndarray, sample_of: np.ndarray, gap: int) -> tuple[np.ndarray, np.ndarray]:
    """The chaining rule: two consecutive low-confidence tokens chain when they are in the same sample and at
    most gap + 1 positions apart (at most `gap` confident tokens between them).

    Returns (positions [L] of the low tokens, chain [L] of each, numbered 0, 1, ... in order). Regions grow
    along these chains (grow_regions), and the observation's run statistic counts on them.
    """
    idx = np.flatnonzero(low)  # [L]
    new_chain = np.ones(len(idx), dtype=bool)  # [L] the token does not chain to the low token before it
    new_chain[1:] = (np.diff(idx) > gap + 1) | (sample_of[idx[1:]] != sample_of[idx[:-1]])
    return idx, np.cumsum(new_chain) - 1


def grow_regions(
    low: np.ndarray, seed: np.ndarray, sample_of: np.ndarray, gap: int
) -> tuple[np.ndarray, np.ndarray]:
    """Grow each seed over its chain of low-confidence tokens (low_chains): a chain that holds a seed is a
    region [its first low token, its last low token + 1). Returns (starts, ends) int64 [R], sorted and
    disjoint.

    Without seeds there is no region: in a sample (then m_i = 0), or in the whole profile (no low token at
    all, e.g. --rho 0; then every w_i is 1: docs/method.md "Regions", Sample weight)."""
    if not seed.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    idx, chain = low_chains(low, sample_of, gap)  # [L], [L]
    first = np.flatnonzero(np.diff(chain, prepend=-1))  # [C] first low token of each chain
    last = np.r_[first[1:], len(idx)] - 1  # [C] last low token of each chain
    has_seed = np.bincount(chain, weights=seed[idx], minlength=len(first)) > 0  # [C]
    return idx[first][has_seed].astype(np.int64), idx[last][has_seed].astype(np.int64) + 1


def snap_to_lines(starts: np.ndarray, ends: np.ndarray, line_index: np.ndarray, sample_of: np.ndarray):
    """Extend [start, end) to every token on a line the region touches (a token's line: that of its first
    char).

    The key (sample, line) never decreases along the flat arrays, so a sorted search finds a
    line's first and last token without crossing into another sample.
    """
    key = sample_of.astype(np.int64) * (int(line_index.max()) + 1) + line_index  # [T]
    return (
        np.searchsorted(key, key[starts], side="left").astype(np.int64),
        np.searchsorted(key, key[ends - 1], side="right").astype(np.int64),
    )


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


def region_categories(region_id: np.ndarray, c: np.ndarray, n_regions: int) -> np.ndarray:
    """Majority category of each region's sensitive tokens, uint8 [R]; a tie: the lower code (assumption)."""
    inside = (region_id >= 0) & (c > 0)
    counts = np.bincount(
        region_id[inside].astype(np.int64) * CODES + c[inside], minlength=n_regions * CODES
    ).reshape(n_regions, CODES)
    return (np.argmax(counts[:, 1:], axis=1) + 1).astype(np.uint8)  # argmax picks the first maximum


def region_mass(p0: np.ndarray, region_id: np.ndarray, sample_of: np.ndarray, n: np.ndarray) -> np.ndarray:
    """m_i = sum over sample i's region tokens of (1 - p0), divided by n_i; [S] (0 for an empty sample)."""
    summed = np.bincount(sample_of, weights=(1.0 - p0) * (region_id >= 0), minlength=len(n))
    return summed / np.maximum(n, 1)


def sample_weights(
    m: np.ndarray, n: np.ndarray, alpha: float, w_max: float, norm: str = "token-mean"
) -> np.ndarray:
    """w_i of every sample from its region mass m_i [S] and token count n_i [S] (the rule, why its
    token-weighted mean is 1 and its assumptions: docs/method.md "Regions", Sample weight). norm
    "token-mean" rescales the clipped weights to that mean, "none" keeps them. The rescale divides by a
    mean >= 1, so w stays <= w_max.

    Finite for any finite alpha and w_max (cuset_common/labeling/options.py bounds --w-max by float32's
    largest, the dtype w is stored in): the raw weight past the largest float is infinite, which the clip
    takes to w_max as it takes any value above it; and sum_i n_i w_i, which overflows for w_max near
    float64's largest, is summed in units of 2^k where it would (k = 0 otherwise). Scaling by a power of 2
    rounds nothing: the weights are those of the plain formula.
    """
    mean_m = m[n > 0].mean()
    with np.errstate(over="ignore"):
        raw = np.clip(1.0 + alpha * m / mean_m, 1.0, w_max) if mean_m > 0 else np.ones_like(m)
    if norm != "token-mean":
        return raw
    k = max(0, int(np.frexp(raw.max())[1]) + int(n.sum()).bit_length() - 1000)  # raw.max() n.sum() < 2^1000
    scaled = np.ldexp(raw, -k)  # [S] raw / 2^k
    return scaled * n.sum() / (n * scaled).sum()


def label_regions(t: dict, args: argparse.Namespace) -> RegionLabels:
    """The region rule on the profile's tensors t, step by step: thresholds, seeds, growth, snapping and
    merging, categories, region mass, sample weights."""
    p0, c = t["p0"].astype(np.float64), t["c"]  # p0_it [T], c_it [T]
    line_index, offsets = t["line_index"].astype(np.int64), t["sample_offsets"]
    n = np.diff(offsets)  # n_i [S]
    sample_of = np.repeat(np.arange(len(n)), n)  # [T] sample of each token

    tau = adaptive_thresholds(p0, offsets, args.rho, args.tau_max)  # tau_i [S]
    low = p0 < tau[sample_of]  # [T]
    starts, ends = grow_regions(low, seed_tokens(low, c), sample_of, args.gap)  # [R]
    if args.snap_lines:
        starts, ends = merge_overlaps(*snap_to_lines(starts, ends, line_index, sample_of))
    region_id = label_tokens(starts, ends, len(p0))  # [T]
    m = region_mass(p0, region_id, sample_of, n)  # m_i [S]
    return RegionLabels(
        sample_offsets=offsets,
        n=n,
        sample_of=sample_of,
        p0=p0,
        entropy=t["entropy"].astype(np.float64),
        c=c,
        line_index=line_index,
        char_start=t["char_start"],
        char_end=t["char_end"],
        tau=tau,
        low=low,
        region_id=region_id,
        region_start=starts,
        region_end=ends,
        region_category=region_categories(region_id, c, len(starts)),
        m=m,
        w=sample_weights(m, n, args.alpha, args.w_max, args.weight_norm),
    )


# ---------------------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------------------


@finishes_out  # releases the lock on --out that check_out_dir takes
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)  # cuset_common/labeling/options.py
    # refused when foreign, inconsistent or made from other inputs (cuset_common/labeling/inputs.py)
    tensors, profile_meta, samples, names, profile_sha = load_profile(args)
    inputs = {"--profile": args.profile, "--data": args.data, "--model": Path(args.model)}
    check_out_dir(args.out, STAGE, inputs, args.force, room_needed(tensors, samples, args.html_samples))

    labels = label_regions(tensors, args)
    finding = compute_finding(labels, names, args, chain_rule=low_chains)
    report = render_report(finding, args, len(samples))
    page = render_html(labels, samples, finding, args, names)

    seeds = int(seed_tokens(labels.low, labels.c).sum())
    meta = regions_meta(args, profile_meta, profile_sha, labels, finding, seeds)
    write_artifact(args.out, regions_tensors(labels), meta, {"report.md": report, "regions.html": page})
    print(report)
    print(f"wrote {path_text(args.out)} ({len(labels.region_start)} regions; report.md, regions.html)")
    return 0


if __name__ == "__main__":
    sys.exit(
        run_main(
            main,
            interrupted=(
                "--out is as it was (stage 02 writes its artifact only once it is complete); "
                "run the command again"
            ),
        )
    )
