"""Stage 03 (issue 5): the loss against a naive loop, the loop's invariances, resume, DDP,
input validation, and the checkpoint, on the bundled tiny model."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT, load_script
from cuset_common import (SFT_FILE, TINY_MODEL, encode_sample, load_sft, sha256_file, tokenizer_fingerprint,
                          write_artifact)

MODEL = str(TINY_MODEL)
MAX_LENGTH = 384


train = load_script("03_train_cuset.py")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL)


@pytest.fixture
def small_data(tmp_path):
    """The first 8 records of the bundled SFT data."""
    lines = SFT_FILE.read_text().splitlines(keepends=True)[:8]
    path = tmp_path / "sft8.jsonl"
    path.write_text("".join(lines))
    return path


def make_regions(tmp_path, tokenizer, data, seed=0, name="regions"):
    """A stage-02-shaped artifact with random regions and weights (and its profile), for the loop tests."""
    rng = np.random.default_rng(seed)
    lengths = [len(e["input_ids"]) - e["response_start"]
               for e in (encode_sample(tokenizer, r, MAX_LENGTH) for r in load_sft(data))]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(offsets[-1])
    common = {"tokenizer_fingerprint": tokenizer_fingerprint(tokenizer), "model": MODEL,
              "data": {"path": str(data), "sha256": sha256_file(data)}, "max_length": MAX_LENGTH}
    profile_dir = tmp_path / f"{name}-profile"
    write_artifact(profile_dir, {"confidence": rng.uniform(0, 1, total).astype(np.float32),
                                 "sample_offsets": offsets}, {"stage": "01_profile", **common})
    region_id = np.where(rng.uniform(size=total) < 0.2, 0, -1).astype(np.int32)
    weight = rng.uniform(0.5, 2.0, len(lengths)).astype(np.float32)
    write_artifact(tmp_path / name, {"region_id": region_id, "sample_weight": weight, "sample_offsets": offsets},
                   {"stage": "02_label_regions", **common, "profile": {"path": str(profile_dir)}})
    return tmp_path / name


def run(argv):
    return train.main([*map(str, argv)])


def base_args(data, out, **kw):
    args = ["--model", MODEL, "--data", data, "--out", out, "--max-length", MAX_LENGTH, "--seed", 0,
            "--lr", 1e-3, "--save-every", 1]
    for k, v in kw.items():
        flag = f"--{k.replace('_', '-')}"
        args += [flag] if v is True else [flag, v]
    return args


def log_of(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def weights_of(out):
    return load_file(str(out / "model.safetensors"))


# ---------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------


def naive_loss(logp, valid, region, weight, n_tokens, objective, p_mask, rho, tau_max, thr):
    """Per-token Python loop over DESIGN.md's table; numpy's linear quantile."""
    total = 0.0
    for i in range(logp.shape[0]):
        ps = [float(p_mask[i, t]) for t in range(logp.shape[1]) if valid[i, t]]
        kappa = min(tau_max, float(np.quantile(ps, rho))) if ps else tau_max
        w = float(weight[i]) if objective in ("cuset", "cuset-weight") else 1.0
        for t in range(logp.shape[1]):
            if not valid[i, t]:
                continue
            lit, pit, pm = -float(logp[i, t]), float(np.exp(float(logp[i, t]))), float(p_mask[i, t])
            if objective == "sft" or objective == "cuset-weight":
                m = 1.0
            elif objective == "dft":
                m = pit
            elif objective == "profit":
                m = 1.0 if pm >= thr else 0.0
            else:
                m = 1.0 if (pm >= kappa or region[i, t]) else 0.0
            total += w * m * lit
    return total / n_tokens


@pytest.mark.parametrize("objective", train.OBJECTIVES)
@pytest.mark.parametrize("mask_source", ["online", "profile"])
def test_loss_matches_a_naive_per_token_loop(objective, mask_source):
    g = torch.Generator().manual_seed(hash((objective, mask_source)) % 1000)
    b, length = 5, 23
    logp = torch.log_softmax(torch.randn(b, length, 7, generator=g) * 2, dim=-1)[..., 0]
    valid = torch.rand(b, length, generator=g) < 0.8
    valid[3] = False  # a sample with no response tokens
    region = torch.rand(b, length, generator=g) < 0.3
    weight = torch.rand(b, generator=g) * 2 + 0.5
    p_profile = torch.rand(b, length, generator=g)
    p_mask = p_profile if mask_source == "profile" else None
    n_tokens = float(valid.sum()) + 3
    loss, stats = train.objective_loss(logp, valid, region, weight, n_tokens, objective, p_mask=p_mask, rho=0.3,
                                       tau_max=0.4, profit_threshold=0.1)
    want = naive_loss(logp, valid, region, weight, n_tokens, objective,
                      p_profile if mask_source == "profile" else logp.exp(), 0.3, 0.4, 0.1)
    assert loss.item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert stats["tokens"] == int(valid.sum())


def test_cuset_keeps_confident_and_region_tokens_and_drops_the_rest():
    p = torch.tensor([[0.9, 0.05, 0.05, 0.8, 0.02]])
    valid = torch.ones(1, 5, dtype=torch.bool)
    region = torch.tensor([[False, True, False, False, False]])
    keep = train.keep_mask("cuset", p, valid, region, rho=0.5, tau_max=0.5, profit_threshold=0.1)
    # kappa = min(0.5, median 0.05) = 0.05: 0.9, 0.05 (>= kappa), 0.8 kept; region keeps index 1 too.
    assert keep.tolist() == [[True, True, True, True, False]]


def test_sft_objective_equals_the_models_own_labels_loss(tokenizer, small_data):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    samples = train.tokenize_dataset(load_sft(small_data)[:3], tokenizer, MAX_LENGTH, None)
    mb = train.collate(samples, tokenizer.pad_token_id, "cpu")
    labels = mb["ids"].clone()
    labels[:, 1:][~mb["valid"]] = -100
    labels[:, 0] = -100
    with torch.no_grad():
        hf = model(input_ids=mb["ids"], attention_mask=mb["attn"], labels=labels).loss.item()
        logp = train.GoldLogProbs(model, chunk=64)(mb["ids"], mb["attn"])
        ours, _ = train.objective_loss(logp, mb["valid"], mb["region"], mb["weight"], float(mb["valid"].sum()), "sft")
    assert ours.item() == pytest.approx(hf, rel=1e-5)


def test_chunked_log_probs_never_keep_full_logits_for_backward():
    """Tensors saved for backward do not grow with positions x vocabulary (DESIGN.md, Memory)."""
    b, length, d, vocab, chunk = 2, 64, 16, 5000, 8
    hidden = torch.randn(b, length, d, requires_grad=True)
    weight = torch.randn(vocab, d, requires_grad=True)
    labels = torch.randint(0, vocab, (b, length))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = train.gold_logprobs(hidden, weight, labels, chunk)
    out.sum().backward()
    assert max(saved) <= vocab * d  # the weight itself, never [b * length, vocab]
    full = torch.log_softmax(hidden.detach() @ weight.detach().t(), -1).gather(2, labels[..., None]).squeeze(2)
    assert torch.allclose(out.detach(), full, atol=1e-5)


# ---------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------


def test_training_lowers_the_loss_and_the_checkpoint_reloads_and_generates(tmp_path, small_data, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    regions = make_regions(tmp_path, tokenizer, small_data)
    out = tmp_path / "ckpt"
    assert run(base_args(small_data, out, regions=regions, objective="cuset", max_steps=6, batch_size=8,
                         micro_batch_size=4, warmup_steps=1)) == 0
    log = log_of(out)
    assert [r["step"] for r in log] == list(range(1, 7))
    assert log[-1]["nll"] < log[0]["nll"] - 0.05, [r["nll"] for r in log]
    assert 0 < log[0]["masked_share"] < 1 and log[0]["region_share"] > 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["objective"] == "cuset" and meta["final_step"] == 6
    assert meta["data"]["sha256"] == sha256_file(small_data) and meta["regions"]["sha256"]
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("__global__ void", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert gen.shape[1] > ids.shape[1]


def test_gradient_accumulation_does_not_depend_on_the_micro_batch_split(tmp_path, small_data):
    """Also with activation checkpointing on one side: recomputation must not change the result."""
    outs = []
    for micro, extra in ((8, {}), (2, {"grad_checkpointing": True})):
        out = tmp_path / f"mb{micro}"
        assert run(base_args(small_data, out, objective="dft", max_steps=2, batch_size=8,
                             micro_batch_size=micro, **extra)) == 0
        outs.append(weights_of(out))
    for name in outs[0]:
        torch.testing.assert_close(outs[0][name], outs[1][name], atol=2e-6, rtol=1e-5, msg=name)


def test_resume_after_stop_reproduces_the_uninterrupted_run(tmp_path, small_data, tokenizer):
    regions = make_regions(tmp_path, tokenizer, small_data)
    common = dict(regions=regions, objective="cuset", max_steps=4, batch_size=4, micro_batch_size=2)
    straight, sliced = tmp_path / "straight", tmp_path / "sliced"
    assert run(base_args(small_data, straight, **common)) == 0
    assert run(base_args(small_data, sliced, stop_after=2, **common)) == 0
    assert not (sliced / "model.safetensors").exists()  # not finished: no final checkpoint yet
    assert run(base_args(small_data, sliced, **common) + ["--resume"]) == 0
    assert [r["loss"] for r in log_of(sliced)] == [r["loss"] for r in log_of(straight)]
    for name, w in weights_of(straight).items():
        torch.testing.assert_close(weights_of(sliced)[name], w, atol=0, rtol=0, msg=name)


def test_a_killed_run_resumes_with_the_same_losses(tmp_path, small_data):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    kw = dict(objective="sft", max_steps=8, batch_size=4, micro_batch_size=4)
    assert run(base_args(small_data, straight, **kw)) == 0
    cmd = [sys.executable, str(ROOT / "03_train_cuset.py"), *map(str, base_args(small_data, killed, **kw))]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    state_log = killed / "resume" / "log.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if state_log.exists() and len(state_log.read_text().splitlines()) >= 2:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    assert run(base_args(small_data, killed, resume=True, **kw)) == 0
    assert [r["loss"] for r in log_of(killed)] == [r["loss"] for r in log_of(straight)]


def test_ddp_two_processes_match_single_process_training(tmp_path, small_data):
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    common = ["--model", MODEL, "--data", small_data, "--max-length", MAX_LENGTH, "--objective", "sft",
              "--max-steps", 2, "--batch-size", 8, "--micro-batch-size", 2, "--lr", 1e-3, "--device", "cpu"]
    assert run([*common, "--out", single]) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           str(ROOT / "03_train_cuset.py"), *map(str, common), "--out", str(ddp)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = weights_of(single), weights_of(ddp)
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=2e-6, rtol=1e-5, msg=name)
    assert [round(x["loss"], 4) for x in log_of(ddp)] == [round(x["loss"], 4) for x in log_of(single)]


# ---------------------------------------------------------------------------------------
# Refusals: exit 2, clear message, nothing overwritten.
# ---------------------------------------------------------------------------------------


def test_cuset_without_regions_names_stage_02(tmp_path, small_data, capsys):
    code = train.run_main(train.main, list(map(str, base_args(small_data, tmp_path / "o", regions=tmp_path / "none"))))
    assert code == 2
    assert "02_label_regions.py" in capsys.readouterr().err


def test_regions_from_other_data_are_refused(tmp_path, small_data, tokenizer, capsys):
    other = tmp_path / "other.jsonl"
    other.write_text(small_data.read_text().replace("CUDA", "Cuda", 1))
    regions = make_regions(tmp_path, tokenizer, other)
    code = train.run_main(train.main, list(map(str, base_args(small_data, tmp_path / "o", regions=regions))))
    err = capsys.readouterr().err
    assert code == 2 and "02_label_regions.py" in err and "data_sha256" in err
    assert not (tmp_path / "o").exists()


def test_malformed_data_is_reported_with_file_and_line_and_nothing_is_overwritten(tmp_path, small_data, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("previous run")
    bad = tmp_path / "bad.jsonl"
    lines = small_data.read_text().splitlines()
    bad.write_text("\n".join(lines[:2] + ["{not json"] + lines[2:]) + "\n")
    code = train.run_main(train.main, list(map(str, base_args(bad, out, objective="sft", force=True))))
    assert code == 2
    assert f"{bad}:3" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "previous run"
