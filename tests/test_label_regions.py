"""Stage 02 (02_label_regions.py): region rules, weights, the finding, the artifact and the HTML page.

Most tests run on synthetic profile artifacts written with cuset_common.artifacts.write_artifact, so
every confidence and tag is chosen by hand and the region rules can be checked exactly.
They name the bundled tiny model (data/models/tiny-cuda-lm), whose tokenizer the profile check fingerprints.
The end-to-end test runs 01_profile.py on the tiny model and tests/fixtures/sft_small.jsonl.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from cuset_common.artifacts import file_records, tokenizer_fingerprint, write_artifact
from cuset_common.cli import load_script
from cuset_common.files import sha256_file
from cuset_common.labeling import observation
from cuset_common.labeling.inputs import same_model
from cuset_common.method import CODES
from cuset_common.paths import ROOT, TINY_MODEL

CATEGORIES = {
    "1": "signature",
    "2": "indexing",
    "3": "guard",
    "4": "shared_memory",
    "5": "synchronization",
    "6": "warp_atomic",
    "7": "launch",
    "8": "memory_api",
    "9": "write_back",
}


stage = load_script("02_label_regions.py")


# ---------------------------------------------------------------------------------------
# Synthetic inputs
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tok(tiny_tokenizer) -> tuple[str, str]:
    """(model folder, tokenizer fingerprint) of the bundled tiny model, which the synthetic profiles name."""
    return str(TINY_MODEL), tokenizer_fingerprint(tiny_tokenizer)


def make_profile(
    folder: Path, samples: list[list[tuple[str, float, int]]], model: str, data: Path, fingerprint: str
) -> Path:
    """A profile artifact as 01_profile.py writes it; each sample is a list of (token text, p0, category)."""
    cols = {k: [] for k in ("p0", "c", "char_start", "char_end", "line_index")}
    records, offsets = [], [0]
    for i, toks in enumerate(samples):
        text, pos = "".join(s for s, _, _ in toks), 0
        for s, p, c in toks:
            for k, v in zip(cols, (p, c, pos, pos + len(s), text.count("\n", 0, pos))):
                cols[k].append(v)
            pos += len(s)
        offsets.append(offsets[-1] + len(toks))
        records.append(
            {
                "index": i,
                "id": f"s{i}",
                "line": i + 1,
                "response_text": text,
                "n_prompt_tokens": 3,
                "n_response_tokens": len(toks),
                "truncated": False,
            }
        )
    n = offsets[-1]
    tensors = {
        "token_ids": np.arange(n, dtype=np.int32),
        "p0": np.array(cols["p0"], np.float32),
        "entropy": np.linspace(0, 3, n).astype(np.float16),
        "c": np.array(cols["c"], np.uint8),
        "char_start": np.array(cols["char_start"], np.int32),
        "char_end": np.array(cols["char_end"], np.int32),
        "line_index": np.array(cols["line_index"], np.int32),
        "sample_offsets": np.array(offsets, np.int64),
    }
    meta = {
        "stage": "01_profile",
        "args": {},
        "model": model,
        "tokenizer_fingerprint": fingerprint,
        "data": {"path": str(data), "sha256": sha256_file(data)},
        "max_length": 512,
        "counts": {
            "samples": len(samples),
            "response_tokens": n,
            "truncated": 0,
            "no_response": sum(1 for s in samples if not s),
        },
        "categories": CATEGORIES,
    }
    write_artifact(folder, tensors, meta, {"samples.jsonl": "".join(json.dumps(r) + "\n" for r in records)})
    return folder


def random_samples(n_samples: int, seed: int) -> list[list[tuple[str, float, int]]]:
    """Code-like samples: lines of tokens, ~25% sensitive, confidences mostly high, some low runs;
    newline tokens carry the next line's indentation (as byte-level BPE merges them)."""
    rng = np.random.default_rng(seed)
    words = [
        "int",
        "i",
        "=",
        "blockIdx.x",
        "*",
        "if",
        "(",
        ")",
        "out[i]",
        "__syncthreads();",
        "x",
        "+",
        "n",
        ";",
    ]
    samples = []
    for _ in range(n_samples):
        toks = []
        for _line in range(rng.integers(0, 9)):
            cold = rng.random() < 0.3  # a line with a low-confidence stretch
            for _ in range(rng.integers(1, 8)):
                p = float(rng.uniform(0.0, 0.3) if cold and rng.random() < 0.7 else rng.uniform(0.4, 1.0))
                cat = int(rng.integers(1, 10)) if rng.random() < 0.25 else 0
                toks.append((str(rng.choice(words)) + " ", p, cat))
            toks.append(("\n" + " " * int(rng.integers(0, 3)) * 4, float(rng.uniform(0.3, 1.0)), 0))
        samples.append(toks)
    samples[1] = []  # a sample whose prompt filled max_length: kept, with 0 response tokens
    return samples


@pytest.fixture()
def inputs(tmp_path, tok):
    """(data file, model folder, fingerprint, argv prefix) for a run of stage 02 in tmp_path."""
    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "p", "completion": "c"}\n')
    model, fp = tok
    return (
        data,
        model,
        fp,
        [
            "--model",
            model,
            "--data",
            str(data),
            "--profile",
            str(tmp_path / "profile"),
            "--out",
            str(tmp_path / "regions"),
            "--permutations",
            "50",
        ],
    )


def read_regions(folder: Path) -> tuple[dict, dict]:
    return load_file(str(folder / "tensors.safetensors")), json.loads((folder / "meta.json").read_text())


# ---------------------------------------------------------------------------------------
# Region rules as pure functions
# ---------------------------------------------------------------------------------------


def test_adaptive_threshold_is_quantile_capped_by_tau_max():
    p = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.9, 0.95, 0.99, 1.0])
    off = np.array([0, 5, 5, 9])  # second sample empty
    tau = stage.adaptive_thresholds(p, off, rho=0.25, tau_max=0.5)
    assert tau[0] == pytest.approx(np.quantile(p[:5], 0.25))  # 0.2
    assert tau[1] == 0.0  # empty sample: nothing can be below
    assert tau[2] == 0.5  # quantile 0.9625 capped at tau_max


def test_low_chains_links_low_tokens_at_most_gap_apart_within_a_sample():
    low = np.array([1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1], bool)
    sample = np.array([0] * 9 + [1] * 2)
    idx, chain = stage.low_chains(low, sample, gap=2)
    assert idx.tolist() == [0, 1, 4, 8, 9, 10]
    # 1 -> 4 bridges 2 confident tokens, 4 -> 8 would bridge 3; 8 and 9 are in different samples
    assert chain.tolist() == [0, 0, 0, 1, 2, 2]
    idx, chain = stage.low_chains(np.zeros(4, bool), np.zeros(4, int), gap=2)
    assert idx.size == chain.size == 0


def test_grow_bridges_at_most_gap_confident_tokens_and_needs_a_seed():
    low = np.zeros(17, bool)
    low[[1, 2, 5, 9, 14, 15]] = True
    seed = np.zeros(17, bool)
    seed[[2, 9]] = True  # the chain 14-15 holds no seed: never a region
    sample = np.zeros(17, int)
    grow = lambda gap: list(zip(*stage.grow_regions(low, seed, sample, gap)))  # noqa: E731
    assert grow(2) == [(1, 6), (9, 10)]  # 2 confident tokens bridged (3, 4), 3 not (6, 7, 8)
    assert grow(0) == [(1, 3), (9, 10)]
    assert grow(3) == [(1, 10)]
    assert grow(4) == [(1, 16)]


def test_grow_never_crosses_a_sample_boundary():
    low = np.ones(6, bool)
    seed = np.array([0, 0, 1, 1, 0, 0], bool)
    s, e = stage.grow_regions(low, seed, np.array([0, 0, 0, 1, 1, 1]), gap=2)
    assert list(zip(s, e)) == [(0, 3), (3, 6)]


def test_snap_to_lines_and_merge():
    line = np.array([0, 0, 0, 1, 1, 1, 2, 2, 0, 0])  # last two tokens: the next sample's line 0
    sample = np.array([0, 0, 0, 0, 0, 0, 0, 0, 1, 1])
    s, e = stage.snap_to_lines(np.array([1, 4, 6]), np.array([2, 5, 7]), line, sample)
    assert list(zip(s, e)) == [(0, 3), (3, 6), (6, 8)]  # the last one stops at its sample's end
    s, e = stage.snap_to_lines(np.array([1, 2, 8]), np.array([2, 4, 9]), line, sample)
    assert list(zip(s, e)) == [(0, 3), (0, 6), (8, 10)]
    s, e = stage.merge_overlaps(s, e)
    assert list(zip(s, e)) == [(0, 6), (8, 10)]
    s, e = stage.merge_overlaps(np.array([0, 3, 4]), np.array([3, 5, 9]))
    assert list(zip(s, e)) == [(0, 3), (3, 9)]  # touching spans stay apart


def test_label_tokens_and_majority_category():
    rid = stage.label_tokens(np.array([1, 5]), np.array([4, 8]), 9)
    assert rid.tolist() == [-1, 0, 0, 0, -1, 1, 1, 1, -1] and rid.dtype == np.int32
    sens = np.array([2, 3, 3, 2, 0, 7, 2, 0, 3], np.uint8)  # region 0: 3,3,2 -> guard; region 1: 7,2 tie -> 2
    assert stage.region_categories(rid, sens, 2).tolist() == [3, 2]


def test_mass_and_weights_follow_the_formulas():
    p = np.array([0.2, 0.9, 0.4, 0.9, 0.9, 0.9, 0.9, 0.9])
    rid = np.array([0, -1, 0, -1, -1, -1, -1, -1])
    sample = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    n = np.array([4, 2, 2, 0])
    m = stage.region_mass(p, rid, sample, n)
    assert m == pytest.approx([(0.8 + 0.6) / 4, 0, 0, 0])
    w = stage.sample_weights(m, n, alpha=1.0, w_max=3.0)
    mean_m = m[:3].mean()  # empty sample 3 not in the mean (assumption)
    raw = np.array([min(1 + m[0] / mean_m, 3.0), 1, 1, 1])
    assert stage.sample_weights(m, n, 1.0, 3.0, norm="none") == pytest.approx(raw)
    assert w == pytest.approx(raw * n.sum() / (n * raw).sum())
    assert (w * n).sum() / n.sum() == pytest.approx(1.0)
    assert w[0] / w[1] == pytest.approx(3.0)  # 1 + 0.35 / (0.35 / 3) = 4, clipped to w_max
    assert stage.sample_weights(np.zeros(4), n, 1.0, 3.0) == pytest.approx(np.ones(4))


def naive_multi(low: np.ndarray, sample: np.ndarray, gap: int) -> np.ndarray:
    """Low tokens whose grown chain holds >= 2 low tokens, by walking the chains."""
    out = np.zeros(len(low), bool)
    seed_all = np.ones(len(low), bool)
    for s, e in zip(*stage.grow_regions(low, seed_all, sample, gap)):
        if low[s:e].sum() >= 2:
            out[s:e] = low[s:e]
    return out


@pytest.mark.parametrize("gap", [0, 1, 2, 4])
def test_multi_token_run_matches_the_grown_chains(gap):
    rng = np.random.default_rng(gap)
    low = rng.random(400) < 0.3
    sample = np.sort(rng.integers(0, 12, 400))
    assert np.array_equal(
        observation.in_multi_token_run(low, sample, gap, stage.low_chains), naive_multi(low, sample, gap)
    )
    assert not observation.in_multi_token_run(
        np.zeros(5, bool), np.zeros(5, int), gap, stage.low_chains
    ).any()
    assert not observation.in_multi_token_run(
        np.array([False, True]), np.zeros(2, int), gap, stage.low_chains
    ).any()


def test_holm_and_p_values():
    assert observation.holm([0.01, 0.04, np.nan, 0.03]) == pytest.approx(
        [0.03, 0.06, np.nan, 0.06], nan_ok=True
    )
    assert observation.holm([0.5, 0.9]).tolist() == [1.0, 1.0] and observation.holm([]).size == 0
    null = np.array([0.1, 0.2, 0.3, np.nan])  # a draw where the statistic is undefined is left out
    assert (
        observation.p_value(0.3, null) == pytest.approx(2 / 4)
        and observation.p_value(0.05, null, "less") == 1 / 4
    )
    assert (
        observation.p_value(0.35, null, "two") == pytest.approx(2 / 4)
        and observation.p_value(0.2, null, "two") == 1.0
    )
    assert np.isnan(observation.p_value(0.3, np.zeros(0))) and np.isnan(observation.p_value(np.nan, null))


def test_confidence_shuffle_stays_within_samples_and_is_seeded():
    p = np.r_[np.full(30, 0.1), np.full(50, 0.9)]  # sample 0 all low, sample 1 all high
    codes = np.r_[np.full(30, 3), np.full(50, 4)].astype(np.uint8)
    sample = np.repeat([0, 1], [30, 50])

    def draw():
        rng = np.random.default_rng(1)
        return observation.shuffled_confidence_null(
            p, np.full(80, 0.5), codes, sample, 2, 20, rng, stage.low_chains
        )

    null = draw()
    assert np.all(null[:, 1, 3] == 30) and np.all(null[:, 1, 4] == 0)  # no low confidence crosses a sample
    again = draw()
    assert np.array_equal(null, again)


def test_tag_rotation_keeps_a_lexeme_whole_and_stays_within_samples():
    # Sample 0: tokens 0 and 1 low, one two-token lexeme (code 2) at 0-1 of 8. A rotation lands both tags on
    # the low pair for 1 shift in 8 (a full shuffle would: 1 in 28). Sample 1: all low, all code 5.
    codes = np.r_[[2, 2, 0, 0, 0, 0, 0, 0], np.full(6, 5)].astype(np.uint8)
    low = np.r_[[True, True], np.zeros(6, bool), np.ones(6, bool)]
    off, sample = np.array([0, 8, 14]), np.repeat([0, 1], [8, 6])
    null = observation.rotated_tags_null(low, low, codes, off, sample, 4000, np.random.default_rng(0))
    # the low tokens stay where they are
    assert np.all(null[:, 1, 5] == 6) and np.all(null[:, 1, :].sum(1) == 8)
    on_pair = np.bincount(null[:, 1, 2], minlength=3) / 4000  # tags landing on the low pair: 0, 1 or 2
    assert on_pair == pytest.approx([5 / 8, 2 / 8, 1 / 8], abs=0.03)


def runs_samples(planted: bool, seed: int, n_samples: int = 60, length: int = 96) -> list:
    """Samples of `length` tokens at p0 = 0.9 but for two runs of 5 low tokens (p0 = 0.1) and two isolated
    low
    ones, one item per quarter of the sample, >= 4 confident tokens apart. planted: 3 tokens of the first run
    are tagged indexing and 3 of the second guard, plus 4 confident tokens; else every token is tagged
    (indexing or guard) with probability 0.15, independently of where the runs are."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n_samples):
        p, cat, q = np.full(length, 0.9), np.zeros(length, int), length // 4
        for k, item in enumerate(rng.permutation([2, 3, 0, 0])):  # run tagged 2, run tagged 3, isolated x2
            size = 5 if item else 1
            a = k * q + int(rng.integers(4, q - 3 - size))
            p[a : a + size] = 0.1
            cat[a + 1 : a + 4] = item * planted  # 3 tags inside a run (none for an isolated one)
        if planted:
            cat[rng.choice(np.flatnonzero(p > 0.5), 4, replace=False)] = rng.integers(2, 4, 4)
        else:
            cat = np.where(rng.random(length) < 0.15, rng.integers(2, 4, length), 0)
        samples.append([("x\n" if t % 8 == 7 else "x ", float(p[t]), int(cat[t])) for t in range(length)])
    return samples


def test_finding_on_planted_clustering(inputs, tmp_path):
    """Tags planted in the low-confidence runs: all three nulls reject at the smallest attainable p, and so
    do the per-category tests after Holm; the sentence says the data supports CUDA-specific clustering."""
    data, model, fp, argv = inputs
    make_profile(tmp_path / "profile", runs_samples(planted=True, seed=0), model, data, fp)
    assert stage.main(argv + ["--rho", "1", "--permutations", "200"]) == 0  # rho 1: low is exactly p0 < 0.5
    f = read_regions(tmp_path / "regions")[1]["finding"]
    n = f["nulls"]
    assert n["a"]["observed"] == n["b"]["observed"] == 1.0 and n["b"]["null_mean"] < 0.9
    assert n["a"]["p"] == n["b"]["p"] == n["c"]["p"] == pytest.approx(1 / 201)
    cats = f["per_category"]
    assert cats["indexing"]["p_b_holm"] < 0.05 and cats["guard"]["p_b_holm"] < 0.05
    assert cats["launch"]["p_b"] is None
    assert f["low_share"]["sensitive"] > 0.5 > 0.1 > f["low_share"]["other"]
    assert f["low_share"]["p"] == pytest.approx(2 / 201)  # two-sided
    assert (
        "so it supports that CUDA-sensitive low-confidence tokens cluster specially (categories that do "
        "after Holm: indexing, guard)" in f["conclusion"]
    )
    report = (tmp_path / "regions" / "report.md").read_text()
    assert f["conclusion"] in report and report.count("| (") == 3 and "| 0.0050 (0.0100) |" in report


def test_finding_when_tags_ignore_the_runs(inputs, tmp_path):
    """Tags placed independently of the low-confidence runs: shuffling confidences rejects for sensitive and
    non-sensitive tokens alike (autocorrelation), rotating the tags does not; the sentence says so."""
    data, model, fp, argv = inputs
    make_profile(tmp_path / "profile", runs_samples(planted=False, seed=0), model, data, fp)
    assert stage.main(argv + ["--rho", "1", "--permutations", "200"]) == 0
    f = read_regions(tmp_path / "regions")[1]["finding"]
    n = f["nulls"]
    assert n["a"]["p"] == n["c"]["p"] == pytest.approx(1 / 201)
    assert n["b"]["p"] > 0.25 and abs(n["b"]["observed"] - n["b"]["null_mean"]) < 0.03
    assert f["low_share"]["p"] > 0.25
    assert all(c["p_b_holm"] is None or c["p_b_holm"] > 0.05 for c in f["per_category"].values())
    assert "for sensitive and non-sensitive tokens alike" in f["conclusion"]
    assert (
        "does not support that CUDA-sensitive low-confidence tokens cluster specially (categories that "
        "do after Holm: none)" in f["conclusion"]
    )
    assert "neither more nor less often low-confidence" in f["conclusion"]


# ---------------------------------------------------------------------------------------
# The stage end to end on synthetic profiles
# ---------------------------------------------------------------------------------------


def check_region_invariants(t: dict, prof: dict) -> None:
    """Every region holds a seed, every seed lies in a region, no region crosses a sample boundary."""
    rid, starts, ends, off = t["region_id"], t["region_start"], t["region_end"], t["sample_offsets"]
    sample = np.repeat(np.arange(len(off) - 1), np.diff(off))
    seed = (prof["p0"] < t["tau"][sample]) & (prof["c"] > 0)
    assert np.all(rid[seed] >= 0), "a seed lies outside every region"
    R = len(starts)
    assert sorted(set(rid[rid >= 0].tolist())) == list(range(R))
    for r in range(R):
        s, e = int(starts[r]), int(ends[r])
        assert np.all(rid[s:e] == r) and np.sum(rid == r) == e - s, "region_id disagrees with start/end"
        assert seed[s:e].any(), f"region {r} holds no seed"
        assert sample[s] == sample[e - 1], f"region {r} crosses a sample boundary"
        counts = np.bincount(prof["c"][s:e], minlength=CODES)[1:]
        assert t["region_category"][r] == np.argmax(counts) + 1


def test_main_writes_the_regions_artifact(inputs, tmp_path, capsys):
    data, model, fp, argv = inputs
    samples = random_samples(30, seed=0)
    make_profile(tmp_path / "profile", samples, model, data, fp)
    assert stage.main(argv) == 0
    out = tmp_path / "regions"
    t, meta = read_regions(out)
    prof = load_file(str(tmp_path / "profile" / "tensors.safetensors"))
    T, S = len(prof["p0"]), len(samples)
    R = len(t["region_start"])
    expected = {
        "region_id": (np.int32, T),
        "region_category": (np.uint8, R),
        "region_start": (np.int64, R),
        "region_end": (np.int64, R),
        "tau": (np.float32, S),
        "m": (np.float32, S),
        "w": (np.float32, S),
        "sample_offsets": (np.int64, S + 1),
    }
    want = {k: (np.dtype(d), (n,)) for k, (d, n) in expected.items()}
    assert {k: (v.dtype, v.shape) for k, v in t.items()} == want
    assert R > 3 and np.array_equal(t["sample_offsets"], prof["sample_offsets"])
    check_region_invariants(t, prof)
    n = np.diff(t["sample_offsets"])
    # token-weighted mean is 1
    assert (t["w"] * n).sum() / n.sum() == pytest.approx(1.0, abs=1e-5)
    assert t["w"].max() <= 3.0 + 1e-6 and n[1] == 0 and t["tau"][1] == 0
    # Snapped regions cover whole lines: the token before / after a region is on another line (or sample).
    line, sample = prof["line_index"], np.repeat(np.arange(S), n)
    for s, e in zip(t["region_start"], t["region_end"]):
        assert s == 0 or sample[s - 1] != sample[s] or line[s - 1] != line[s]
        assert e == T or sample[e] != sample[e - 1] or line[e] != line[e - 1]
    assert meta["stage"] == "02_label_regions" and meta["model"] == model
    assert meta["tokenizer_fingerprint"] == fp
    assert meta["data"]["sha256"] == sha256_file(data) and meta["max_length"] == 512
    assert meta["profile"]["meta_sha256"] == sha256_file(tmp_path / "profile" / "meta.json")
    assert meta["args"]["rho"] == 0.2 and meta["counts"]["regions"] == R and meta["counts"]["samples"] == S
    report = (out / "report.md").read_text()
    for needle in (
        "What this data supports",
        "only the difference is evidence",
        "three nulls",
        "| 2 indexing |",
        "## Regions",
        "## Sample w",
        "end below 1",
        "sft scale",
        "use --permutations >= ",
    ):  # 50 draws: too few for Holm to pass over 7 categories
        assert needle in report
    assert "three nulls" in capsys.readouterr().out
    f = meta["finding"]
    assert 0 <= f["low_share"]["sensitive"] <= 1 and f["regions"]["count"] == R and f["permutations"] == 50
    w = f["weights"]  # token-mean 1: samples without regions end below 1
    assert w["norm"] == "token-mean"
    assert w["samples_below_1"] == int(np.sum((t["w"] < 1) & (n > 0))) > 0
    assert w["min"] == pytest.approx(t["w"][n > 0].min())
    assert meta["args"]["weight_norm"] == "token-mean"


def test_without_line_snapping_regions_are_the_grown_chains(inputs, tmp_path):
    data, model, fp, argv = inputs
    make_profile(tmp_path / "profile", random_samples(30, seed=1), model, data, fp)
    assert (
        stage.main(
            argv
            + ["--no-snap-lines", "--gap", "1", "--rho", "0.3", "--tau-max", "0.4", "--weight-norm", "none"]
        )
        == 0
    )
    t, meta = read_regions(tmp_path / "regions")
    prof = load_file(str(tmp_path / "profile" / "tensors.safetensors"))
    check_region_invariants(t, prof)
    low = prof["p0"] < t["tau"][np.repeat(np.arange(30), np.diff(t["sample_offsets"]))]
    assert np.all(low[t["region_start"]]) and np.all(low[t["region_end"] - 1])  # chains start and end low
    assert meta["args"]["snap_lines"] is False and t["tau"].max() <= 0.4
    w = t["w"]  # not normalised: the clipped weights, >= 1, one for samples without regions
    assert w.min() == 1.0 and w.max() <= 3.0 and np.all(w[t["m"] == 0] == 1.0)
    assert meta["args"]["weight_norm"] == "none" and meta["finding"]["weights"]["samples_below_1"] == 0
    assert "x the sft scale" in (tmp_path / "regions" / "report.md").read_text()


def test_hand_written_profile_gives_the_expected_regions(inputs, tmp_path):
    data, model, fp, argv = inputs
    s0 = [
        ("int ", 0.9, 0),
        ("i", 0.9, 0),
        (" = ", 0.9, 0),
        ("blockIdx", 0.1, 2),
        (".x", 0.2, 2),
        (";", 0.9, 0),
        ("\n", 0.9, 0),  # 0-6: line 0
        ("if ", 0.9, 3),
        ("(i < n)", 0.3, 3),
        (" out[i] = x;", 0.9, 9),
        ("\n", 0.9, 0),  # 7-10: line 1
        ("    ", 0.9, 0),
        ("// done", 0.05, 0),
        ("\n", 0.9, 0),  # 11-13: line 2
        ("__syncthreads", 0.9, 5),
        ("();", 0.9, 0),
    ]  # 14-15: line 3
    s1 = [("return", 0.2, 3), (";", 0.9, 0)]  # 16-17
    make_profile(tmp_path / "profile", [s0, s1], model, data, fp)
    # rho = 1 makes tau = tau_max = 0.5 in both samples: low tokens are exactly those with p < 0.5
    # (3, 4, 8, 12, 16). Seeds 3-4 chain; 8 is 4 positions on (3 confident tokens > gap 2);
    # the comment (12) is low but holds no seed and is 4 positions from 8: no region.
    assert stage.main(argv + ["--rho", "1", "--html-samples", "2"]) == 0
    t, _ = read_regions(tmp_path / "regions")
    assert list(zip(t["region_start"], t["region_end"])) == [(0, 7), (7, 11), (16, 18)]  # snapped to lines
    assert t["region_category"].tolist() == [2, 3, 3]  # line 1: guard x2, write_back x1
    assert t["tau"].tolist() == [0.5, 0.5]
    assert stage.main(argv + ["--rho", "1", "--no-snap-lines"]) == 0
    t, _ = read_regions(tmp_path / "regions")
    assert list(zip(t["region_start"], t["region_end"])) == [(3, 5), (8, 9), (16, 17)]
    assert stage.main(argv + ["--rho", "1", "--gap", "3", "--no-snap-lines"]) == 0
    t, _ = read_regions(tmp_path / "regions")
    # gap 3 chains in the comment
    assert list(zip(t["region_start"], t["region_end"])) == [(3, 13), (16, 17)]
    assert stage.main(argv + ["--rho", "1", "--permutations", "0"]) == 0  # no null draws: p reported as n/a
    f = read_regions(tmp_path / "regions")[1]["finding"]
    assert all(n["p"] is None for n in f["nulls"].values()) and f["conclusion"].startswith(
        "No permutation test"
    )
    assert "| n/a |" in (tmp_path / "regions" / "report.md").read_text()


def test_html_page_is_self_contained_and_outlines_every_region(inputs, tmp_path):
    data, model, fp, argv = inputs
    samples = random_samples(12, seed=2)
    samples[3] = [('a<b & "c" ', 0.1, 7), ("</span><script>", 0.2, 0), ("\n", 0.9, 0)]  # must be escaped
    make_profile(tmp_path / "profile", samples, model, data, fp)
    assert stage.main(argv + ["--html-samples", "100"]) == 0
    page = (tmp_path / "regions" / "regions.html").read_text()
    t, _ = read_regions(tmp_path / "regions")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"<script|<link|<img|@import|url\(|https?://|src=", page, re.I)
    assert "&lt;/span&gt;&lt;script&gt;" in page and "a&lt;b &amp; &quot;c&quot;" in page
    assert page.count("<section class='sample'>") == 12
    assert page.count('class="box"') == len(t["region_start"])  # snapped regions never share a line
    for name in CATEGORIES.values():
        assert name in page  # the legend names every category
    # Every token is drawn with its confidence in the tooltip (a token spanning lines, once per line).
    assert page.count('title="p=') >= int(t["sample_offsets"][-1])
    # Without snapping two regions may share a line: they share a box, and both are labelled.
    assert stage.main(argv + ["--html-samples", "100", "--no-snap-lines", "--gap", "0"]) == 0
    page = (tmp_path / "regions" / "regions.html").read_text()
    t, _ = read_regions(tmp_path / "regions")
    assert 0 < page.count('class="box"') <= len(t["region_start"])
    assert all(re.search(rf"[> ]R{r} ", page) for r in range(len(t["region_start"])))


# ---------------------------------------------------------------------------------------
# Refusals: exit status 2, a message naming the stage to rerun, nothing written
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("what", ["model", "data", "tokenizer", "stage", "schema", "offsets", "samples_line"])
def test_foreign_or_broken_profile_is_refused(inputs, tmp_path, capsys, what):
    data, model, fp, argv = inputs
    prof = make_profile(tmp_path / "profile", random_samples(6, seed=3), model, data, fp)
    assert stage.main(argv) == 0
    before = (tmp_path / "regions" / "meta.json").read_text()
    meta_path = prof / "meta.json"
    meta = json.loads(meta_path.read_text())
    if what == "model":
        meta["model"] = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    elif what == "data":
        data.write_text('{"prompt": "other", "completion": "data"}\n')
    elif what == "tokenizer":
        meta["tokenizer_fingerprint"] = "0" * 64
    elif what == "stage":
        meta["stage"] = "03_train_cuset"
    elif what == "schema":
        meta["schema_version"] = 99
    elif what == "offsets":
        t = load_file(str(prof / "tensors.safetensors"))
        t["sample_offsets"] = t["sample_offsets"] + 1
        write_artifact(prof, t, meta, {"samples.jsonl": (prof / "samples.jsonl").read_text()})
        meta = json.loads(meta_path.read_text())
    elif what == "samples_line":  # a damaged line that meta.json vouches for: the line's own check speaks
        (prof / "samples.jsonl").write_text((prof / "samples.jsonl").read_text() + "{not json\n")
        meta["files"] = file_records(prof)
    meta_path.write_text(json.dumps(meta))
    rc = stage.run_main(stage.main, argv)
    err = capsys.readouterr().err
    assert rc == 2 and "01_profile" in err, err
    if what == "samples_line":
        assert "samples.jsonl:7:" in err
    # nothing written, the previous artifact intact
    assert (tmp_path / "regions" / "meta.json").read_text() == before
    if what in ("model", "data", "tokenizer"):
        assert "--force" in err
        assert stage.main(argv + ["--force", "--html-samples", "1"]) == 0


def test_missing_profile_and_bad_knobs_are_user_errors(inputs, tmp_path, capsys):
    data, model, fp, argv = inputs
    assert stage.run_main(stage.main, argv) == 2
    assert "run python 01_profile.py" in capsys.readouterr().err
    make_profile(tmp_path / "profile", random_samples(3, seed=4), model, data, fp)
    for bad in (["--rho", "1.5"], ["--tau-max", "0"], ["--gap", "-1"], ["--w-max", "0.5"]):
        assert stage.run_main(stage.main, argv + bad) == 2
    assert not (tmp_path / "regions").exists()


# ---------------------------------------------------------------------------------------
# End to end: 01_profile.py on the tiny model and a small fixture, then this stage
# ---------------------------------------------------------------------------------------

FIXTURE = ROOT / "tests" / "fixtures" / "sft_small.jsonl"


def test_end_to_end_on_the_tiny_model(tmp_path, capsys):
    missing = [
        p for p in (ROOT / "01_profile.py", TINY_MODEL / "model.safetensors", FIXTURE) if not p.exists()
    ]
    if missing:
        pytest.skip(f"end-to-end needs {', '.join(str(p.relative_to(ROOT)) for p in missing)}")
    profile = load_script("01_profile.py")
    assert (
        profile.main(
            [
                "--model",
                str(TINY_MODEL),
                "--data",
                str(FIXTURE),
                "--out",
                str(tmp_path / "profile"),
                "--max-length",
                "256",
            ]
        )
        == 0
    )
    # The same model folder spelled differently (relative path) is the same model.
    common = ["--model", os.path.relpath(TINY_MODEL), "--data", str(FIXTURE)]
    argv = common + [
        "--profile",
        str(tmp_path / "profile"),
        "--out",
        str(tmp_path / "regions"),
        "--permutations",
        "50",
    ]
    assert stage.main(argv) == 0
    t, meta = read_regions(tmp_path / "regions")
    prof = load_file(str(tmp_path / "profile" / "tensors.safetensors"))
    check_region_invariants(t, prof)
    n = np.diff(t["sample_offsets"])
    assert (t["w"] * n).sum() / n.sum() == pytest.approx(1.0, abs=1e-5)
    assert meta["counts"]["response_tokens"] == len(prof["p0"]) > 0
    assert (
        meta["tokenizer_fingerprint"]
        == json.loads((tmp_path / "profile" / "meta.json").read_text())["tokenizer_fingerprint"]
    )
    page = (tmp_path / "regions" / "regions.html").read_text()
    assert page.count("<section class='sample'>") == min(8, len(n))
    # Another model's profile is refused (the tiny tokenizer differs from the one in the profile).
    other = make_profile(tmp_path / "other", [[("x", 0.5, 0)]], "some/other-model", FIXTURE, "f" * 64)
    capsys.readouterr()
    assert stage.run_main(stage.main, common + ["--profile", str(other), "--out", str(tmp_path / "r2")]) == 2
    assert "01_profile.py" in capsys.readouterr().err and not (tmp_path / "r2").exists()


def test_same_model_accepts_two_spellings_of_one_folder(tmp_path):
    (tmp_path / "m").mkdir()
    assert same_model(str(tmp_path / "m"), str(tmp_path / "." / "m"))
    assert same_model("Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert not same_model(str(tmp_path / "m"), "Qwen/Qwen2.5-Coder-1.5B-Instruct")
