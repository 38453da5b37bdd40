"""The worked trace (python 03_train_cuset.py --trace I; cuset_common/training/trace.py): its columns are the
artifacts' tensors for that sample, and its losses are stage 03's objective_loss, which its own per-token
columns add up to, on real stage-01 and stage-02 artifacts of a few samples made here with the tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import load_script, make_artifacts, snapshot
from safetensors.numpy import load_file

from cuset_common.paths import SFT_KERNEL_FILE, TINY_MODEL
from cuset_common.training.trace import sample_trace

train = load_script("03_train_cuset.py")
SAMPLES = 4
U = torch.finfo(torch.float32).eps / 2  # float32's unit roundoff, 2^-24


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> dict:
    """Stage 01 and stage 02 on the first SAMPLES kernel SFT samples (conftest's calls of the stages)."""
    root = tmp_path_factory.mktemp("trace")
    w = {"root": root, "data": root / "d.jsonl", "profile": root / "profile", "regions": root / "regions"}
    w["data"].write_text("".join(SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:SAMPLES]))
    make_artifacts(w, ["01", "02"])
    return w


def trace_argv(pipeline, i: int, *extra) -> list[str]:
    flags = [
        "--trace",
        i,
        "--model",
        TINY_MODEL,
        "--data",
        pipeline["data"],
        "--regions",
        pipeline["regions"],
    ]
    return [*map(str, flags), "--device", "cpu", "--precision", "fp32", *extra]


@pytest.mark.parametrize("mask_source", ["online", "profile"])
def test_the_trace_is_the_artifacts_and_its_columns_add_up_to_the_loss(pipeline, mask_source):
    regions = load_file(str(pipeline["regions"] / "tensors.safetensors"))
    profile = load_file(str(pipeline["profile"] / "tensors.safetensors"))
    for i in range(SAMPLES):
        args = train.parse_args(trace_argv(pipeline, i, "--mask-source", mask_source))
        tr = sample_trace(args, train.trace_terms)
        lo, hi = regions["sample_offsets"][i], regions["sample_offsets"][i + 1]
        n = len(tr.tokens)
        assert n == hi - lo > 0
        # the artifacts' values, as stored
        np.testing.assert_array_equal(tr.p0, profile["p0"][lo:hi])
        np.testing.assert_array_equal(tr.c, profile["c"][lo:hi])
        np.testing.assert_array_equal(tr.r, regions["region_id"][lo:hi] >= 0)
        assert (tr.tau, tr.m, tr.w) == (regions["tau"][i], regions["m"][i], regions["w"][i])
        # stage 02's rules on them: every seed lies in a region (a region grows from its seeds)
        np.testing.assert_array_equal(tr.seed, (tr.p0 < tr.tau) & (tr.c > 0))
        assert not (tr.seed & ~tr.r).any()
        # each objective's loss (objective_loss, N = n_i) is the sum of the trace's own per-token terms
        # w_i f_it k_it l_it / n_i, each term float32 products of float32 values and the sum a float32 sum
        # of n_i of them, then a division: within gamma_(n_i + 4) = (n_i + 4) u / (1 - (n_i + 4) u) of
        # sum |term| (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1 and 4.2)
        for name, k in tr.k.items():
            f = tr.f.astype(np.float64) if name == "dft" else 1.0
            terms = tr.weights[name] * f * k * tr.l.astype(np.float64) / n
            gamma = (n + 4) * U / (1 - (n + 4) * U)
            assert abs(tr.loss[name] - terms.sum()) <= gamma * np.abs(terms).sum(), (i, name)
        # the masks as docs/method.md writes them, on the probability the mask reads
        p_k = tr.p0.astype(np.float32) if mask_source == "profile" else tr.p
        np.testing.assert_array_equal(tr.k["sft"], np.ones(n, bool))
        np.testing.assert_array_equal(tr.k["profit"], p_k >= args.profit_threshold)
        np.testing.assert_array_equal(tr.k["cuset"], (p_k >= tr.kappa) | tr.r)
        assert tr.weights["cuset"] == tr.w and tr.weights["sft"] == 1.0


def test_the_command_prints_every_token_writes_nothing_and_exits_0(pipeline, tmp_path, capsys):
    before = snapshot(pipeline["root"])
    out = tmp_path / "out"
    assert train.main(trace_argv(pipeline, 1, "--out", str(out))) == 0
    text = capsys.readouterr().out
    n = int(text.split(" response tokens")[0].split()[-1])
    header = next(line for line in text.splitlines() if line.split()[:3] == ["t", "token", "p0"])
    assert header.split()[-3:] == ["l", "k", "f"]
    rows = [line for line in text.splitlines() if line[:5].strip().isdigit()]
    assert len(rows) == n and rows[-1].split()[0] == str(n - 1)
    assert all(f"\n{name} " in text for name in train.OBJECTIVES)
    assert f"n_i {n} |" in text
    assert not out.exists() and snapshot(pipeline["root"]) == before


def test_a_sample_past_the_data_is_one_line_and_exit_2(pipeline, capsys):
    code = train.run_main(train.main, trace_argv(pipeline, SAMPLES))
    err = capsys.readouterr().err
    assert code == 2 and f"--trace {SAMPLES}: " in err and f"holds {SAMPLES} samples" in err
