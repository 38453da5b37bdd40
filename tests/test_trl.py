"""research/trl_sft.py: TRL's SFTTrainer trains with stage 03's loss. The same batch gives the same loss and
gradients as stage 03 for every objective, a short run the same loss curve, the checkpoint is one stage 04
evaluates, and regions from other inputs are refused, on the bundled tiny model."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import load_script, make_artifacts

from cuset_common.cli import run_main
from cuset_common.data_sources import load_data
from cuset_common.models import load_causal_lm
from cuset_common.paths import ROOT, SFT_KERNEL_FILE
from cuset_common.training.samples import load_samples, regions_needed

pytest.importorskip("trl")
trl_train = pytest.importorskip("research.trl_sft")
train03 = trl_train.train03  # stage 03 as research/trl_sft.py loaded it: the loss both sides call

EPS = torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> dict:
    """Real stage-01 and stage-02 artifacts of 8 kernel SFT samples (conftest's calls of the stages)."""
    root = tmp_path_factory.mktemp("trl")
    w = {"data": root / "d8.jsonl", "profile": root / "profile", "regions": root / "regions"}
    w["data"].write_text("".join(SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:8]))
    make_artifacts(w, ["01", "02"])
    return w


def trl_args(pipeline, out, *extra) -> list[str]:
    """A run of research/trl_sft.py (or of stage 03: the same flags) on the pipeline's data, in fp32 on the
    CPU: the comparisons are to float32 rounding."""
    flags = ["--data", pipeline["data"], "--regions", pipeline["regions"], "--out", out]
    return [*map(str, flags), "--device", "cpu", "--precision", "fp32", *extra]


# ---------------------------------------------------------------------------------------
# The same batch: loss and gradients
# ---------------------------------------------------------------------------------------


def trl_step(args, inputs, batch: dict, n_tokens: torch.Tensor) -> tuple[float, dict]:
    """Loss and gradients of one micro-batch through CusetSFTTrainer.training_step (its compute_loss, the
    fused LM head, Trainer's backward) on a fresh tiny model."""
    model = load_causal_lm(args.model, torch.float32)
    trainer = trl_train.make_trainer(args, model, inputs.tokenizer, inputs.samples, "cpu", "fp32")
    loss = trainer.training_step(trainer.model, dict(batch), num_items_in_batch=n_tokens)
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def stage03_step(args, batch: dict, n_tokens: float) -> tuple[float, dict]:
    """Loss and gradients of the same micro-batch through stage 03's GoldLogProbs and
    objective_loss on a fresh tiny model."""
    model = load_causal_lm(args.model, torch.float32).train()
    logp = train03.GoldLogProbs(model, 1024)(batch["input_ids"], batch["attention_mask"], batch["valid"])
    p_mask = batch["p0"] if args.mask_source == "profile" else None
    loss, _ = train03.objective_loss(
        logp,
        batch["valid"],
        batch["r"],
        batch["w"],
        n_tokens,
        args.objective,
        p_mask=p_mask,
        **train03.mask_knobs(args),
    )
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "objective, mask_source",
    [(o, "online") for o in train03.OBJECTIVES] + [("cuset", "profile")],
)
def test_same_batch_same_loss_and_gradients_as_stage_03(pipeline, tmp_path, objective, mask_source):
    """Both sides compute l_it = -log q(y_it) in float32 from the same hidden states, weighed by the same
    objective_loss; only the order of the arithmetic differs (TRL: every position in one matrix product, an
    online logsumexp over vocabulary tiles; stage 03: the response positions, log_softmax). So:

    - l_it differs by a few roundings of the largest logit: |dl| <= C eps max|z|, C = 16 (measured: 4).
      So do p_it = exp(-l_it) and the gradient of l_it, softmax(z) - onehot(y) = exp(z - logsumexp z) - ...,
      relatively: r = C eps max|z|, twice that for dft's p_it l_it.
    - The loss sums non-negative terms c_it l_it / N: relative error 2r at most.
    - A gradient element sums the K response tokens' terms, of mixed sign: its error is 2r sum|x|, and
      sum|x| ~ sqrt(K) |sum x| (tests/test_train.py, assert_same_sgd_training): atol 2r sqrt(K) max|g|.
    The mask compares p_it with kappa_i, a quantile of the same side's p: the sides differ only where two
    tokens' p lie within rounding of each other, which this fixed batch does not have. A wrong N, weight or
    mask changes the loss by 1/K or more of itself, far above these bounds (K is some hundreds).
    """
    args = trl_train.parse_args(
        trl_args(pipeline, tmp_path / "out", "--objective", objective, "--mask-source", mask_source)
    )
    args.micro_batch_size = 4
    records, data_id = load_data(args)
    inputs = load_samples(args, records, data_id, regions_needed(args, train03.OBJECTIVES))
    batch = trl_train.SampleCollator(inputs.samples, inputs.tokenizer.pad_token_id)(
        [{"sample_index": i} for i in range(4)]
    )
    n_tokens = batch["valid"].sum()

    loss_trl, grads_trl = trl_step(args, inputs, batch, n_tokens)
    loss_03, grads_03 = stage03_step(args, batch, float(n_tokens))

    with torch.no_grad():
        model = load_causal_lm(args.model, torch.float32)
        max_logit = model(input_ids=batch["input_ids"]).logits.abs().max().item()
    r = 16 * EPS * max_logit
    assert loss_03 > 0
    assert loss_trl == pytest.approx(loss_03, rel=2 * r, abs=0)
    for name, g03 in grads_03.items():
        atol = 2 * r * math.sqrt(n_tokens) * g03.abs().max().item()
        assert atol > 0, name
        torch.testing.assert_close(grads_trl[name], g03, atol=atol, rtol=0, msg=name)


# ---------------------------------------------------------------------------------------
# A short run: the loss curve, the checkpoint, stage 04 on it
# ---------------------------------------------------------------------------------------


# Three SGD steps of 4 samples, over two epochs of the 8 (stage 03's order crosses one), in micro-batches
# of 2: N spans the gradient-accumulation steps in one process, the processes under DDP.
SHORT_RUN = ["--objective", "cuset", "--max-steps", "3", "--batch-size", "4", "--micro-batch-size", "2"]
SHORT_RUN += ["--optimizer", "sgd", "--lr", "0.1", "--grad-clip", "0", "--seed", "3"]


def log_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def stage03_log(pipeline) -> list[dict]:
    """Stage 03's log.jsonl of SHORT_RUN: the curve the TRL runs must follow."""
    out = pipeline["data"].parent / "stage03"
    assert train03.main(trl_args(pipeline, out, *SHORT_RUN)) == 0
    return log_of(out)


def assert_same_curve(rows_trl: list[dict], rows_03: list[dict]) -> None:
    """Each step's loss and CuSeT diagnostics as stage 03's, for the same data, order, seed and schedule.

    Tolerance: a step's loss and nll as the same batch's in the test above, relatively 2r = 32 eps max|z|,
    below 1e-4 with the tiny model's logits (max|z| about 18 there); the weights differ after a step by the
    learning rate times that share of the gradient, which moves the next losses by far less at lr 0.1.
    log.jsonl rounds to 6 decimals: 1e-6 more. The counts (tokens, masked and region shares) and the
    learning rate are equal. A wrong N (about a factor 2 with two micro-batches or processes), mask or weight
    differs by more than 1e-3 of the loss.
    """
    assert [r["step"] for r in rows_trl] == [r["step"] for r in rows_03] == [1, 2, 3]
    for a, b in zip(rows_trl, rows_03):
        for key in ("tokens", "masked_share", "region_share", "lr"):
            assert a[key] == b[key], (a["step"], key)
        for key in ("loss", "nll", "weight_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_short_run_follows_stage_03_and_stage_04_evaluates_it(pipeline, stage03_log, tmp_path):
    assert trl_train.main(trl_args(pipeline, tmp_path / "trl", *SHORT_RUN)) == 0
    assert_same_curve(log_of(tmp_path / "trl"), stage03_log)
    meta = json.loads((tmp_path / "trl" / "meta.json").read_text())
    assert meta["stage"] == "03_train_cuset" and meta["trainer"]["trl"] == trl_train.trl.__version__
    assert meta["final_step"] == 3

    evaluate = load_script("04_eval_kernels.py").main
    argv = ["--model", tmp_path / "trl", "--split", "eval", "--limit", "1", "--levels", "1"]
    argv += ["--max-new-tokens", "8", "--backend", "emulate", "--no-task-check", "--out", tmp_path / "eval"]
    assert evaluate([*map(str, argv)]) == 0
    assert len((tmp_path / "eval" / "results.jsonl").read_text().splitlines()) == 1


def test_two_processes_follow_stage_03(pipeline, stage03_log, tmp_path):
    """Under torchrun (DDP over gloo), each process a micro-batch of 2 of the step's 4 samples: N and the
    log's sums span both processes, and the curve is the single-process stage 03's."""
    script = ROOT / "research" / "trl_sft.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533"]
    cmd += [str(script), *trl_args(pipeline, tmp_path / "ddp", *SHORT_RUN)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_curve(log_of(tmp_path / "ddp"), stage03_log)


# ---------------------------------------------------------------------------------------
# Regions from other inputs: refused with one line
# ---------------------------------------------------------------------------------------


def spoil_regions(pipeline, tmp_path, what: str):
    """(--data, --regions) where the regions were labelled on other data, or with another tokenizer (its
    fingerprint in meta.json changed, as another model's tokenizer would have it)."""
    if what == "data":
        other = tmp_path / "d7.jsonl"
        other.write_text("".join(pipeline["data"].read_text().splitlines(keepends=True)[:7]))
        return other, pipeline["regions"]
    regions = tmp_path / "regions"
    shutil.copytree(pipeline["regions"], regions)
    meta = json.loads((regions / "meta.json").read_text())
    meta["tokenizer_fingerprint"] = "0" * 64
    (regions / "meta.json").write_text(json.dumps(meta))
    return pipeline["data"], regions


@pytest.mark.parametrize("what", ["data", "tokenizer"])
def test_regions_from_other_inputs_are_refused(pipeline, tmp_path, capsys, what):
    data, regions = spoil_regions(pipeline, tmp_path, what)
    argv = trl_args(pipeline, tmp_path / "out", "--max-steps", "1", "--batch-size", "4")
    argv += ["--data", str(data), "--regions", str(regions)]
    assert run_main(trl_train.main, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {regions} was made from different inputs")
    assert not (tmp_path / "out").exists()
