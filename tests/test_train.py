"""Stage 03: the loss against a naive loop, the loop's invariances, resume, DDP, input validation, and the
checkpoint, on the bundled tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
import torch
from conftest import load_script
from safetensors.torch import load_file

import cuset_common.method
from cuset_common.artifacts import SCHEMA_VERSION, tokenizer_fingerprint, write_artifact
from cuset_common.data import encode_sample, load_sft
from cuset_common.device import BF16_LOSS_RTOL, resolve_precision
from cuset_common.files import sha256_file
from cuset_common.method import gold_logprobs
from cuset_common.models import check_head_is_plain
from cuset_common.paths import ROOT, SFT_FILE, TINY_MODEL
from cuset_common.training.samples import collate, tokenize_dataset

MODEL = str(TINY_MODEL)
MAX_LENGTH = 384


train = load_script("03_train_cuset.py")


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
    lengths = [
        len(e["input_ids"]) - e["response_start"]
        for e in (encode_sample(tokenizer, r, MAX_LENGTH) for r in load_sft(data))
    ]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(offsets[-1])
    common = {
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "model": MODEL,
        "data": {"path": str(data), "sha256": sha256_file(data)},
        "max_length": MAX_LENGTH,
    }
    profile_dir = tmp_path / f"{name}-profile"
    write_artifact(
        profile_dir,
        {"p0": rng.uniform(0, 1, total).astype(np.float32), "sample_offsets": offsets},
        {"stage": "01_profile", **common},
    )
    region_id = np.where(rng.uniform(size=total) < 0.2, 0, -1).astype(np.int32)
    weight = rng.uniform(0.5, 2.0, len(lengths)).astype(np.float32)
    write_artifact(
        tmp_path / name,
        {"region_id": region_id, "w": weight, "sample_offsets": offsets},
        {
            "stage": "02_label_regions",
            **common,
            "counts": {"samples": len(lengths), "response_tokens": total},
            "profile": {"path": str(profile_dir), "meta_sha256": sha256_file(profile_dir / "meta.json")},
        },
    )
    return tmp_path / name


def run(argv):
    return train.main([*map(str, argv)])


def base_args(data, out, **kw):
    args = []
    # fp32 on the CPU: the loop's invariances and resume are tested to float32 rounding or bit for bit, which
    # a GPU would change (bf16 autocast has its own test); on a GPU machine, too, these runs stay on the CPU
    for k, v in {
        "model": MODEL,
        "data": data,
        "out": out,
        "max_length": MAX_LENGTH,
        "seed": 0,
        "lr": 1e-3,
        "save_every": 1,
        "precision": "fp32",
        "device": "cpu",
        **kw,
    }.items():
        flag = f"--{k.replace('_', '-')}"
        args += [flag] if v is True else [flag, v]
    return args


def log_of(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def weights_of(out):
    return load_file(str(out / "model.safetensors"))


# Equivalence runs (micro-batching, DDP): plain SGD without clipping, so the comparison sees the gradient
# itself. AdamW divides by sqrt(v) + eps and turns float noise in near-zero gradients into weight changes
# of ~lr: 2e-5 apart, above any fixed tolerance one can defend.
SGD_STEPS = 2
SGD_ARGS = dict(optimizer="sgd", lr=1.0, grad_clip=0, max_steps=SGD_STEPS, batch_size=8)


def assert_same_sgd_training(a: dict, b: dict, steps: int, k_terms: int) -> None:
    """Two SGD runs computing the same sums in another order agree to float32 rounding, derived per tensor:

    SGD: w_T = w_0 - sum_t lr_t g_t, in float32 (eps = 2^-23, unit roundoff eps/2). Per step the runs differ
    by
      (1) rounding w - lr g to float32: at most eps/2 |w| each, eps |w| apart -> rtol = steps * eps;
      (2) the gradient. Each element is a float32 sum of per-token contributions over the K tokens of the
          global batch, added in another order (another micro-batch split, an all-reduce over processes).
          Reordering a K-term sum changes it by ~ sqrt(K) eps sum|x_i| (probabilistic bound, Higham & Mary,
          SIAM J. Sci. Comput. 2019), and for terms of mixed sign sum|x_i| ~ sqrt(K) |sum x_i|: ~ K eps |g|,
          i.e. K eps of the update lr g. Summed over the steps: atol = K * eps * max|w_T - w_0| of the
          tensor.
    The second step's gradient is taken at weights that differ by (1) + (2), i.e. by ~1e-7 of the weights;
    over 2 steps that feeds back at the same order and is covered by the factor-K bound of (2).
    Measured (8 vs 2 micro-batches): all differences at the level of (1), 1 ulp of the weight.
    For the test to mean anything the update must dwarf the tolerance: a wrong normalisation moves the
    weights by a multiple of the update, so we also check max|update| > 100 x the tolerance.
    """
    eps = torch.finfo(torch.float32).eps
    w0 = load_file(str(TINY_MODEL / "model.safetensors"))
    for name, wa in a.items():
        update = (wa - w0[name]).abs().max().item()
        atol, rtol = k_terms * eps * update, steps * eps
        assert update > 100 * (atol + rtol * wa.abs().max().item()), (name, update)
        torch.testing.assert_close(b[name], wa, atol=atol, rtol=rtol, msg=name)


# ---------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------


def naive_loss(log_q, valid, r, w, N, objective, p_mask, rho, tau_max, profit_threshold):
    """L = sum_i w_i sum_t f_it k_it l_it / N as docs/method.md "Objectives" writes it, one token at a time in
    Python (its table, not OBJECTIVES); kappa_i with numpy's linear quantile. p_mask: the probability k_it and
    kappa_i read (p_it online, p0_it with --mask-source profile)."""
    weighted = objective in ("cuset", "cuset-weight")
    total = 0.0
    for i in range(log_q.shape[0]):
        p_i = [float(p_mask[i, t]) for t in range(log_q.shape[1]) if valid[i, t]]
        kappa_i = min(tau_max, float(np.quantile(p_i, rho))) if p_i else tau_max
        w_i = float(w[i]) if weighted else 1.0
        for t in range(log_q.shape[1]):
            if not valid[i, t]:
                continue
            l_it = -float(log_q[i, t])
            p_it = float(np.exp(float(log_q[i, t])))
            pm_it = float(p_mask[i, t])
            if objective == "profit":
                k_it = 1.0 if pm_it >= profit_threshold else 0.0
            elif objective in ("cuset", "cuset-mask"):
                k_it = 1.0 if (pm_it >= kappa_i or r[i, t]) else 0.0
            else:  # sft, dft, cuset-weight
                k_it = 1.0
            f_it = p_it if objective == "dft" else 1.0
            total += w_i * f_it * k_it * l_it
    return total / N


@pytest.mark.parametrize("objective", train.OBJECTIVES)
@pytest.mark.parametrize("mask_source", ["online", "profile"])
def test_loss_matches_a_naive_per_token_loop(objective, mask_source):
    # a seed of its own per case, the same in every process (hash() of a str is salted per process)
    g = torch.Generator().manual_seed(zlib.crc32(f"{objective}/{mask_source}".encode()))
    b, length = 5, 23
    log_q = torch.log_softmax(torch.randn(b, length, 7, generator=g) * 2, dim=-1)[..., 0]
    valid = torch.rand(b, length, generator=g) < 0.8
    valid[3] = False  # a sample with no response tokens
    r = torch.rand(b, length, generator=g) < 0.3
    w = torch.rand(b, generator=g) * 2 + 0.5
    p0 = torch.rand(b, length, generator=g)
    N = float(valid.sum()) + 3  # the global batch's: more tokens than this micro-batch's
    knobs = dict(rho=0.3, tau_max=0.4, profit_threshold=0.1)
    p_mask = p0 if mask_source == "profile" else None
    loss, stats = train.objective_loss(log_q, valid, r, w, N, objective, p_mask=p_mask, **knobs)
    p_k = p0 if mask_source == "profile" else log_q.exp()
    want = naive_loss(log_q, valid, r, w, N, objective, p_k, **knobs)
    assert loss.item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert stats["tokens"] == int(valid.sum())


def test_cuset_keeps_confident_and_region_tokens_and_drops_the_rest():
    p = torch.tensor([[0.9, 0.05, 0.05, 0.8, 0.02]])
    valid = torch.ones(1, 5, dtype=torch.bool)
    region = torch.tensor([[False, True, False, False, False]])
    keep = train.keep_mask("cuset", p, valid, region, rho=0.5, tau_max=0.5, profit_threshold=0.1)
    # kappa = min(0.5, median 0.05) = 0.05: 0.9, 0.05 (>= kappa), 0.8 kept; region keeps index 1 too.
    assert keep.tolist() == [[True, True, True, True, False]]


def test_sft_objective_equals_the_models_own_labels_loss(tiny_tokenizer, small_data):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    samples, _ = tokenize_dataset(load_sft(small_data)[:3], tiny_tokenizer, MAX_LENGTH, None)
    mb = collate(samples, tiny_tokenizer.pad_token_id, "cpu")
    labels = mb["ids"].clone()
    labels[:, 1:][~mb["valid"]] = -100
    labels[:, 0] = -100
    with torch.no_grad():
        hf = model(input_ids=mb["ids"], attention_mask=mb["attn"], labels=labels).loss.item()
        logp = train.GoldLogProbs(model, chunk=64)(mb["ids"], mb["attn"], mb["valid"])
        ours, _ = train.objective_loss(logp, mb["valid"], mb["r"], mb["w"], float(mb["valid"].sum()), "sft")
    assert ours.item() == pytest.approx(hf, rel=1e-5)


def test_chunked_log_probs_never_keep_full_logits_for_backward():
    """Tensors saved for backward do not grow with positions x vocabulary (docs/method.md, "Memory")."""
    b, length, d, vocab, chunk = 2, 64, 16, 5000, 8
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(b, length, d, generator=g, requires_grad=True)
    weight = torch.randn(vocab, d, generator=g, requires_grad=True)
    labels = torch.randint(0, vocab, (b, length), generator=g)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = gold_logprobs(hidden, weight, labels, chunk)
    out.sum().backward()
    assert max(saved) <= vocab * d  # the weight itself, never [b * length, vocab]
    full = (
        torch.log_softmax(hidden.detach() @ weight.detach().t(), -1).gather(2, labels[..., None]).squeeze(2)
    )
    assert torch.allclose(out.detach(), full, atol=1e-5)


# ---------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_training_lowers_the_loss_and_the_checkpoint_reloads_and_generates(
    tmp_path, small_data, tiny_tokenizer
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    regions = make_regions(tmp_path, tiny_tokenizer, small_data)
    out = tmp_path / "ckpt"
    assert (
        run(
            base_args(
                small_data,
                out,
                regions=regions,
                objective="cuset",
                max_steps=6,
                batch_size=8,
                micro_batch_size=4,
                warmup_steps=1,
            )
        )
        == 0
    )
    log = log_of(out)
    assert [r["step"] for r in log] == list(range(1, 7))
    assert log[-1]["nll"] < log[0]["nll"] - 0.05, [r["nll"] for r in log]
    assert 0 < log[0]["masked_share"] < 1 and log[0]["region_share"] > 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["objective"] == "cuset" and meta["final_step"] == 6
    assert meta["memory"]["plan_bytes"] > 0 and meta["memory"]["peak_allocated_bytes"] is None  # no GPU
    # artifact_meta's layout, as every stage writes it: the schema version first, the library versions last
    assert list(meta)[0] == "schema_version" and meta["schema_version"] == SCHEMA_VERSION
    assert list(meta)[-1] == "versions" and meta["versions"]["torch"] == torch.__version__
    assert meta["data"]["sha256"] == sha256_file(small_data) and meta["regions"]["sha256"]
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    eos = model.generation_config.eos_token_id  # generation stops at the end of the turn, as trained
    assert tok.convert_tokens_to_ids("<|im_end|>") in (eos if isinstance(eos, list) else [eos])
    ids = tok("__global__ void", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert gen.shape[1] > ids.shape[1]


@pytest.mark.slow
def test_gradient_accumulation_does_not_depend_on_the_micro_batch_split(tmp_path, small_data):
    """Also with activation checkpointing on one side: recomputation must not change the result."""
    outs = []
    for micro, extra in ((8, {}), (2, {"grad_checkpointing": True})):
        out = tmp_path / f"mb{micro}"
        args = base_args(small_data, out, objective="dft", micro_batch_size=micro, **SGD_ARGS, **extra)
        assert run(args) == 0
        outs.append(weights_of(out))
    assert_same_sgd_training(outs[0], outs[1], SGD_STEPS, k_terms=8 * MAX_LENGTH)


@pytest.mark.slow
def test_bf16_autocast_trains_to_the_fp32_losses_within_bf16_precision(tmp_path, small_data):
    logs = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        assert (
            run(
                base_args(
                    small_data,
                    out,
                    objective="sft",
                    batch_size=4,
                    micro_batch_size=2,
                    max_steps=4,
                    precision=precision,
                )
            )
            == 0
        )
        meta = json.loads((out / "meta.json").read_text())
        assert meta["args"]["precision"] == precision and meta["precision"] == precision
        logs[precision] = [r["loss"] for r in log_of(out)]
    for fp32, bf16 in zip(logs["fp32"], logs["bf16"]):
        assert abs(bf16 - fp32) <= BF16_LOSS_RTOL * fp32, logs  # the bound's derivation: cuset_common/cli.py
    assert logs["bf16"] != logs["fp32"]  # autocast took effect: bf16 rounding shows in the losses


@pytest.mark.slow
def test_resume_after_stop_reproduces_the_uninterrupted_run(tmp_path, small_data, tiny_tokenizer):
    """Bit for bit: a resumed run repeats the same float operations in the same order, so no tolerance is
    needed (and AdamW stays: its moment estimates are the state resume must restore)."""
    regions = make_regions(tmp_path, tiny_tokenizer, small_data)
    common = dict(regions=regions, objective="cuset", max_steps=4, batch_size=4, micro_batch_size=2)
    straight, sliced = tmp_path / "straight", tmp_path / "sliced"
    assert run(base_args(small_data, straight, **common)) == 0
    assert run(base_args(small_data, sliced, stop_after=2, **common)) == 0
    assert not (sliced / "model.safetensors").exists()  # not finished: no final checkpoint yet
    assert run(base_args(small_data, sliced, **common) + ["--resume"]) == 0
    assert [r["loss"] for r in log_of(sliced)] == [r["loss"] for r in log_of(straight)]
    for name, w in weights_of(straight).items():
        torch.testing.assert_close(weights_of(sliced)[name], w, atol=0, rtol=0, msg=name)


@pytest.mark.slow
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


@pytest.mark.slow
def test_ddp_two_processes_match_single_process_training(tmp_path, small_data):
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    common = dict(objective="sft", micro_batch_size=2, device="cpu", **SGD_ARGS)
    assert run(base_args(small_data, single, **common)) == 0
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29517",
        str(ROOT / "03_train_cuset.py"),
        *map(str, base_args(small_data, ddp, **common)),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_sgd_training(weights_of(single), weights_of(ddp), SGD_STEPS, k_terms=8 * MAX_LENGTH)
    assert [round(x["loss"], 4) for x in log_of(ddp)] == [round(x["loss"], 4) for x in log_of(single)]


# ---------------------------------------------------------------------------------------
# Refusals: exit 2, clear message, nothing overwritten.
# ---------------------------------------------------------------------------------------


def test_cuset_without_regions_names_stage_02(tmp_path, small_data, capsys):
    code = train.run_main(
        train.main, list(map(str, base_args(small_data, tmp_path / "o", regions=tmp_path / "none")))
    )
    assert code == 2
    assert "02_label_regions.py" in capsys.readouterr().err


def test_regions_from_other_data_are_refused(tmp_path, small_data, tiny_tokenizer, capsys):
    other = tmp_path / "other.jsonl"
    other.write_text(small_data.read_text().replace("CUDA", "Cuda", 1))
    regions = make_regions(tmp_path, tiny_tokenizer, other)
    code = train.run_main(train.main, list(map(str, base_args(small_data, tmp_path / "o", regions=regions))))
    err = capsys.readouterr().err
    assert code == 2 and "02_label_regions.py" in err and "data_sha256" in err
    assert not (tmp_path / "o").exists()


def test_malformed_data_is_reported_with_file_and_line_and_nothing_is_overwritten(
    tmp_path, small_data, capsys
):
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


# ---------------------------------------------------------------------------------------
# Inputs checked before work, the head on response positions only, resume arguments.
# ---------------------------------------------------------------------------------------


def the_error_line(err: str) -> str:
    """A refusal is one `error: ...` line (run_main's form), no traceback; progress bars may surround it."""
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_head_sees_only_response_positions_and_the_loss_is_unchanged(
    tiny_tokenizer, small_data, monkeypatch
):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    samples, _ = tokenize_dataset(load_sft(small_data)[:4], tiny_tokenizer, MAX_LENGTH, None)
    mb = collate(samples, tiny_tokenizer.pad_token_id, "cpu")
    mb["r"] = torch.rand(mb["valid"].shape, generator=torch.Generator().manual_seed(0)) < 0.2
    rows, chunk_fn = [], cuset_common.method._chunk_gold_logp
    monkeypatch.setattr(
        cuset_common.method,
        "_chunk_gold_logp",
        lambda h, *rest: rows.append(h.shape[0]) or chunk_fn(h, *rest),
    )
    logp = train.GoldLogProbs(model, chunk=64)(mb["ids"], mb["attn"], mb["valid"])
    assert sum(rows) == int(mb["valid"].sum()) < mb["valid"].numel()
    with torch.no_grad():  # the old computation: every position through the head
        hidden = model.base_model(input_ids=mb["ids"], attention_mask=mb["attn"]).last_hidden_state
        every = gold_logprobs(hidden[:, :-1], model.lm_head.weight, mb["ids"][:, 1:], 64)
    n = float(mb["valid"].sum())
    for objective in train.OBJECTIVES:
        new, _ = train.objective_loss(logp, mb["valid"], mb["r"], mb["w"], n, objective)
        old, _ = train.objective_loss(every, mb["valid"], mb["r"], mb["w"], n, objective)
        assert new.item() == pytest.approx(old.item(), rel=1e-5), objective


def test_an_output_layer_with_a_bias_gives_the_models_own_log_probs(tiny_tokenizer, small_data):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.copy_(torch.randn(head.bias.shape, generator=torch.Generator().manual_seed(0)))
    model.lm_head = head
    samples, _ = tokenize_dataset(load_sft(small_data)[:3], tiny_tokenizer, MAX_LENGTH, None)
    mb = collate(samples, tiny_tokenizer.pad_token_id, "cpu")
    check_head_is_plain(model, mb["ids"][:1], "stage 03")  # accepted: logits = h @ W.T + b
    logp = train.GoldLogProbs(model, chunk=64)(mb["ids"], mb["attn"], mb["valid"])
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=mb["ids"], attention_mask=mb["attn"]).logits.float(), -1)
        ref = ref[:, :-1].gather(2, mb["ids"][:, 1:, None]).squeeze(2)
    torch.testing.assert_close(logp.detach()[mb["valid"]], ref[mb["valid"]], atol=1e-5, rtol=1e-5)
    loss, _ = train.objective_loss(logp, mb["valid"], mb["r"], mb["w"], float(mb["valid"].sum()), "sft")
    loss.backward()
    assert head.bias.grad is not None and head.bias.grad.abs().sum() > 0  # the bias is trained too


def test_a_model_with_scaled_logits_is_refused_in_one_line(tmp_path, small_data, tiny_tokenizer, capsys):
    from transformers import GraniteConfig, GraniteForCausalLM

    cfg = GraniteConfig(
        vocab_size=len(tiny_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.5,
        logits_scaling=4.0,
        pad_token_id=tiny_tokenizer.pad_token_id,
        eos_token_id=tiny_tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    folder = tmp_path / "granite"
    GraniteForCausalLM(cfg).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    code = train.run_main(
        train.main,
        list(map(str, base_args(small_data, tmp_path / "o", model=folder, objective="sft", max_steps=1))),
    )
    err = capsys.readouterr().err
    assert code == 2 and "'granite'" in the_error_line(err)
    assert not (tmp_path / "o").exists()


def test_a_prompt_longer_than_max_length_is_skipped_and_counted(tmp_path, small_data, tiny_tokenizer, capsys):
    long = {
        "id": "long",
        "messages": [
            {"role": "user", "content": "Add two vectors. " * 300},
            {"role": "assistant", "content": "```cpp\n__global__ void k() {}\n```"},
        ],
    }
    data = tmp_path / "with_long.jsonl"
    data.write_text(json.dumps(long) + "\n" + small_data.read_text())
    regions = make_regions(tmp_path, tiny_tokenizer, data)  # the long sample: 0 tokens in the offsets
    out = tmp_path / "o"
    argv = base_args(
        data, out, regions=regions, max_steps=1, batch_size=8, micro_batch_size=8, precision="auto"
    )
    assert run(argv) == 0
    assert "8 samples (1 skipped" in capsys.readouterr().out
    n_resp = [
        len(e["input_ids"]) - e["response_start"]
        for e in (encode_sample(tiny_tokenizer, r, MAX_LENGTH) for r in load_sft(small_data))
    ]
    assert log_of(out)[0]["tokens"] == sum(n_resp)  # exactly the 8 others, regions still aligned
    # meta.json records the precision --precision auto resolved to on this machine's CPU, not "auto"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["args"]["precision"] == "auto"
    assert meta["precision"] == resolve_precision("auto", "cpu")


@pytest.mark.slow
def test_resume_with_other_arguments_is_refused_and_the_same_ones_resume(tmp_path, small_data, capsys):
    out = tmp_path / "o"
    kw = dict(objective="sft", max_steps=3, batch_size=4, micro_batch_size=4)
    assert run(base_args(small_data, out, stop_after=1, **kw)) == 0
    other = base_args(small_data, out, resume=True, **{**kw, "objective": "dft"}, lr=5e-2)
    assert train.run_main(train.main, list(map(str, other))) == 2
    err = capsys.readouterr().err
    assert "--objective: the run has 'sft', now 'dft'" in err and "--lr" in err
    assert run(base_args(small_data, out, resume=True, stop_after=1, save_every=5, **kw)) == 0
    assert [r["step"] for r in log_of(out)] == [1, 2]


@pytest.mark.slow
def test_a_profile_rewritten_after_stage_02_is_refused(tmp_path, small_data, capsys):
    """Stage 01 rerun on other data into the profile folder that the regions point at."""
    profile_stage, regions_stage = load_script("01_profile.py"), load_script("02_label_regions.py")
    other = tmp_path / "other.jsonl"
    other.write_text("".join(SFT_FILE.read_text().splitlines(keepends=True)[8:16]))
    prof, regions = tmp_path / "profile", tmp_path / "regions"
    stage01 = ["--model", MODEL, "--max-length", str(MAX_LENGTH), "--out", str(prof), "--device", "cpu"]
    assert profile_stage.main([*stage01, "--data", str(small_data)]) == 0
    assert (
        regions_stage.main(
            ["--model", MODEL, "--data", str(small_data), "--profile", str(prof), "--out", str(regions)]
        )
        == 0
    )
    kw = dict(regions=regions, mask_source="profile", max_steps=1)
    assert run(base_args(small_data, tmp_path / "o1", **kw)) == 0  # the profile stage 02 read
    assert profile_stage.main([*stage01, "--data", str(other)]) == 0
    capsys.readouterr()
    assert train.run_main(train.main, list(map(str, base_args(small_data, tmp_path / "o2", **kw)))) == 2
    err = capsys.readouterr().err
    assert "01_profile.py" in err and "02_label_regions.py" in err and "sha256" in err
    assert not (tmp_path / "o2").exists()


@pytest.mark.parametrize("damage", ["truncated", "short w"])
def test_a_damaged_regions_artifact_is_one_line_and_exit_2(
    tmp_path, small_data, tiny_tokenizer, capsys, damage
):
    from safetensors.numpy import load_file as load_np
    from safetensors.numpy import save_file

    regions = make_regions(tmp_path, tiny_tokenizer, small_data)
    f = regions / "tensors.safetensors"
    if damage == "truncated":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    else:
        t = load_np(str(f))
        save_file({**t, "w": t["w"][:-1]}, str(f))
    code = train.run_main(train.main, list(map(str, base_args(small_data, tmp_path / "o", regions=regions))))
    err = capsys.readouterr().err
    assert code == 2 and str(regions) in the_error_line(err)


@pytest.mark.parametrize("content", ["nothing", "a tokenizer only"])
def test_a_model_folder_without_a_model_is_one_line_and_exit_2(
    tmp_path, small_data, tiny_tokenizer, capsys, content
):
    folder = tmp_path / "m"
    folder.mkdir()
    if content == "a tokenizer only":
        tiny_tokenizer.save_pretrained(folder)
    code = train.run_main(
        train.main, list(map(str, base_args(small_data, tmp_path / "o", model=folder, objective="sft")))
    )
    err = capsys.readouterr().err
    assert code == 2 and str(folder) in the_error_line(err)


def test_on_a_cpu_a_micro_batch_is_one_sample_unless_told(tmp_path, small_data, capsys):
    """--micro-batch-size unset: one sample per forward pass on a CPU (resolve_micro_batch_size), as the
    meta records; a size given is kept."""
    for given, expected in ((None, 1), (2, 2)):
        out = tmp_path / f"mb-{given}"
        extra = {"micro_batch_size": given} if given else {}
        assert run(base_args(small_data, out, objective="sft", max_steps=1, batch_size=4, **extra)) == 0
        assert json.loads((out / "meta.json").read_text())["args"]["micro_batch_size"] == expected
        assert f"micro-batches of {expected})" in capsys.readouterr().out
