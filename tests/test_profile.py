"""Stage 01 (01_profile.py) on the bundled tiny model and small fixtures.

Covers: artifact schema, exactness against a plain unbatched float32 forward pass, the response ending
at the end-of-turn token, the tags of the fixture kernels in the artifact (the tagger's rules by
example: tests/test_tagger.py), the four record forms, truncation / no-response counting, refusals
(malformed line, unknown form, a folder without a model), the shared head check, resume after SIGKILL,
--batch-size and --chunk-rows auto (1 and 128 on a CPU, 8 and 1024 on a GPU) giving the batched values
and resuming alike, the in-place entropy equal to torch.special.entr even with -inf logits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from cuset_common.artifacts import SCHEMA_VERSION
from cuset_common.cli import load_script, run_main
from cuset_common.data import encode_sample, load_sft
from cuset_common.method import gold_logprob_entropy
from cuset_common.paths import ROOT
from cuset_common.profiler.batching import for_device, make_batches
from cuset_common.profiler.options import parse_args
from cuset_common.profiler.shards import partial_dir

FIXTURES = ROOT / "tests" / "fixtures"
TINY_MODEL = ROOT / "data" / "models" / "tiny-cuda-lm"
SFT_SMALL = FIXTURES / "sft_small.jsonl"
MAX_LEN = 384


stage = load_script("01_profile.py")


def read_profile(out: Path) -> tuple[dict, dict, list[dict]]:
    from safetensors.numpy import load_file

    tensors = load_file(str(out / "tensors.safetensors"))
    meta = json.loads((out / "meta.json").read_text())
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return tensors, meta, samples


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One profile of the small SFT fixture, batched (3 per batch) and chunked (7 rows) on purpose."""
    out = tmp_path_factory.mktemp("art") / "profile"
    rc = stage.main(
        [
            "--model",
            str(TINY_MODEL),
            "--data",
            str(SFT_SMALL),
            "--out",
            str(out),
            "--max-length",
            str(MAX_LEN),
            "--batch-size",
            "3",
            "--chunk-rows",
            "7",
            "--device",
            "cpu",
            "--precision",
            "fp32",
        ]
    )
    assert rc == 0
    return out, *read_profile(out)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval(), tiny_tokenizer


# ---------------------------------------------------------------------------------------
# Artifact
# ---------------------------------------------------------------------------------------


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as e:
        stage.main(["--help"])
    assert e.value.code == 0
    shown = capsys.readouterr().out
    assert "--max-length" in shown and "Inputs -> outputs" in shown  # the options and the stage's docstring


def test_artifact_schema(profiled):
    out, t, meta, samples = profiled
    n_records = len(load_sft(SFT_SMALL))
    dtypes = {
        "token_ids": np.int32,
        "p0": np.float32,
        "entropy": np.float16,
        "argmax_correct": np.uint8,
        "c": np.uint8,
        "char_start": np.int32,
        "char_end": np.int32,
        "line_index": np.int32,
        "sample_offsets": np.int64,
    }
    assert set(t) == set(dtypes)
    for k, dt in dtypes.items():
        assert t[k].dtype == dt, k
        assert t[k].ndim == 1, k
    T = int(t["sample_offsets"][-1])
    assert T > 0 and all(len(t[k]) == T for k in dtypes if k != "sample_offsets")
    assert len(t["sample_offsets"]) == n_records + 1 and t["sample_offsets"][0] == 0
    assert np.all(np.diff(t["sample_offsets"]) >= 0)
    assert np.all((t["p0"] >= 0) & (t["p0"] <= 1))
    assert np.all(np.isfinite(t["entropy"])) and np.all(t["entropy"] >= 0)
    assert set(np.unique(t["c"])) <= set(range(10))
    assert set(np.unique(t["argmax_correct"])) == {0, 1}  # the tiny model gets some tokens right, not all

    assert meta["stage"] == "01_profile" and meta["schema_version"] == SCHEMA_VERSION
    assert meta["model"] == str(TINY_MODEL) and meta["max_length"] == MAX_LEN
    assert meta["data"]["path"] == str(SFT_SMALL) and len(meta["data"]["sha256"]) == 64
    assert len(meta["tokenizer_fingerprint"]) == 64 and meta["args"]["max_length"] == MAX_LEN
    assert meta["categories"] == {
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
    c = meta["counts"]
    assert c["samples"] == n_records and c["response_tokens"] == T
    assert c["truncated"] == sum(s["truncated"] for s in samples) >= 1  # the two full programs exceed 384
    assert c["no_response"] == 0

    assert [s["index"] for s in samples] == list(range(n_records))
    for s, rec in zip(samples, load_sft(SFT_SMALL)):
        assert set(s) == {
            "index",
            "id",
            "line",
            "response_text",
            "n_prompt_tokens",
            "n_response_tokens",
            "truncated",
        }
        assert s["id"] == rec["id"] and s["line"] == rec["line"]
        assert rec["response"] in s["response_text"]  # plus the template's end-of-turn token
        i = s["index"]
        assert t["sample_offsets"][i + 1] - t["sample_offsets"][i] == s["n_response_tokens"]
        assert s["n_prompt_tokens"] + s["n_response_tokens"] <= MAX_LEN


def test_tokens_spans_and_lines_match_the_tokenizer(profiled, model_and_tokenizer):
    _, t, meta, samples = profiled
    _, tok = model_and_tokenizer
    for s in samples:
        lo, hi = t["sample_offsets"][s["index"]], t["sample_offsets"][s["index"] + 1]
        text = s["response_text"]
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert t["token_ids"][lo:hi].tolist() == ids[: hi - lo]
        starts, ends = t["char_start"][lo:hi], t["char_end"][lo:hi]
        assert np.all(starts <= ends) and np.all(ends <= len(text)) and np.all(np.diff(starts) >= 0)
        assert t["line_index"][lo:hi].tolist() == [text[:a].count("\n") for a in starts]
        if not s["truncated"]:  # the spans cover the whole response text
            assert tok.decode(t["token_ids"][lo:hi].tolist()) == text


def test_chat_response_ends_with_the_end_of_turn_token_and_nothing_after(profiled, model_and_tokenizer):
    """ChatML writes `<|im_end|>\\n`; the model stops at <|im_end|>, so the `\\n` is not a response token:
    the last profiled token of every complete chat sample is the end-of-turn token, ending the text."""
    _, t, meta, samples = profiled
    _, tok = model_and_tokenizer
    assert meta["chat_template"]
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    complete = [s for s in samples if not s["truncated"]]
    assert complete
    for s in complete:
        last = t["sample_offsets"][s["index"] + 1] - 1
        assert s["response_text"].endswith("<|im_end|>"), s["id"]
        assert t["token_ids"][last] == eot and t["char_end"][last] == len(s["response_text"]), s["id"]
        enc = encode_sample(tok, load_sft(SFT_SMALL)[s["index"]], MAX_LEN)
        assert s["n_prompt_tokens"] + s["n_response_tokens"] == len(enc["input_ids"])


def test_confidence_equals_unbatched_fp32_forward(profiled, model_and_tokenizer):
    """Each stored confidence is the softmax prob of the gold token from a plain
    unbatched float32 forward pass, within 1e-4 (entropy within float16 rounding)."""
    _, t, _, samples = profiled
    model, tok = model_and_tokenizer
    for rec, s in zip(load_sft(SFT_SMALL), samples):
        enc = encode_sample(tok, rec, MAX_LEN)
        start, n = enc["response_start"], s["n_response_tokens"]
        assert start == s["n_prompt_tokens"]
        ids = torch.tensor([enc["input_ids"][: start + n]])  # [1, L]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)  # [L, V]
        gold = ids[0, start:]  # [n]
        ref_p = logp[start - 1 : start - 1 + n].gather(1, gold[:, None])[:, 0].exp().numpy()
        ref_h = -(logp.exp() * logp).sum(-1)[start - 1 : start - 1 + n].numpy()
        lo = t["sample_offsets"][s["index"]]
        assert np.abs(t["p0"][lo : lo + n] - ref_p).max() <= 1e-4
        # and relatively: a tiny probability must be right too, not just small
        np.testing.assert_allclose(np.log(t["p0"][lo : lo + n]), np.log(ref_p), rtol=0, atol=1e-4)
        np.testing.assert_allclose(t["entropy"][lo : lo + n].astype(np.float32), ref_h, rtol=2e-3, atol=2e-3)


def test_argmax_correct_equals_a_naive_full_logits_argmax(profiled, model_and_tokenizer):
    """argmax_correct (computed in the chunked pass, batches of 3 in chunks of 7 rows) equals
    model(input_ids).logits.argmax(-1) == gold from a plain unbatched float32 forward pass. A position whose
    two largest logits lie within 1e-4 of each other may flip between the two matrix products: none is
    allowed to differ anywhere else, and such near-ties must be rare."""
    _, t, _, samples = profiled
    model, tok = model_and_tokenizer
    differ = near_ties = total = 0
    for rec, s in zip(load_sft(SFT_SMALL), samples):
        enc = encode_sample(tok, rec, MAX_LEN)
        start, n = enc["response_start"], s["n_response_tokens"]
        ids = torch.tensor([enc["input_ids"][: start + n]])  # [1, L]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, start - 1 : start - 1 + n].float()  # [n, V]
        naive = (logits.argmax(-1) == ids[0, start:]).numpy()  # [n]
        top2 = logits.topk(2, dim=-1).values  # [n, 2]
        tie = ((top2[:, 0] - top2[:, 1]) < 1e-4).numpy()
        lo = t["sample_offsets"][s["index"]]
        got = t["argmax_correct"][lo : lo + n].astype(bool)
        differ += int((got != naive)[~tie].sum())
        near_ties, total = near_ties + int(tie.sum()), total + n
    assert differ == 0 and near_ties <= total // 100 and total > 0


def test_profile_tags_the_fixture_kernels(profiled):
    _, t, meta, samples = profiled
    seen = set(np.unique(t["c"]).tolist())
    assert {1, 2, 3, 9} <= seen  # every fixture kernel: signature, index, guard, store
    for s in samples:
        lo, hi = t["sample_offsets"][s["index"]], t["sample_offsets"][s["index"] + 1]
        for a, b, cat in zip(t["char_start"][lo:hi], t["char_end"][lo:hi], t["c"][lo:hi]):
            piece = s["response_text"][a:b]
            if "threadIdx" in piece or "blockIdx" in piece:
                assert cat == 2, piece
            if "__global__" in piece:
                assert cat == 1, piece


def test_lm_head_sees_at_most_chunk_rows_positions(model_and_tokenizer):
    """The [batch, seq, vocab] logits never exist: lm_head gets <= chunk_rows positions per call."""
    model, tok = model_and_tokenizer
    encs = stage.encode_all(tok, load_sft(SFT_SMALL)[2:], 280)  # the three kernel-mode records
    head, calls = model.get_output_embeddings(), []

    def spy(h):
        calls.append(tuple(h.shape))
        return head(h)

    body = getattr(model, model.base_model_prefix)
    plain = stage.score_batch(body, head, encs, 0, "cpu", 10_000, False)
    chunked = stage.score_batch(body, spy, encs, 0, "cpu", 5, False)
    assert calls and all(len(c) == 2 and c[0] <= 5 for c in calls)
    assert sum(c[0] for c in calls) == sum(len(e["spans"]) for e in encs)  # response positions only
    for (p1, h1, a1), (p2, h2, a2) in zip(plain, chunked):
        np.testing.assert_allclose(p1, p2, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(h1, h2, rtol=1e-5, atol=1e-5)
        assert np.array_equal(a1, a2)


def test_bf16_autocast_path_runs_and_agrees_roughly(tmp_path, profiled):
    """bf16 autocast (the GPU's path, and the CPU's where it has native bf16) on two records, against fp32;
    bf16 allows a loose tolerance."""
    out, data = tmp_path / "profile", tmp_path / "two.jsonl"
    data.write_text("".join(SFT_SMALL.read_text().splitlines(keepends=True)[3:5]))
    assert (
        stage.main(
            [
                "--model",
                str(TINY_MODEL),
                "--data",
                str(data),
                "--out",
                str(out),
                "--max-length",
                str(MAX_LEN),
                "--device",
                "cpu",
                "--precision",
                "bf16",
            ]
        )
        == 0
    )
    t, meta, _ = read_profile(out)
    assert meta["precision"] == "bf16-autocast"
    ref = profiled[1]
    lo, hi = ref["sample_offsets"][3], ref["sample_offsets"][5]  # the same two records, fp32
    assert np.array_equal(t["token_ids"], ref["token_ids"][lo:hi])
    assert np.array_equal(t["c"], ref["c"][lo:hi])
    assert np.abs(t["p0"] - ref["p0"][lo:hi]).max() < 0.05


# ---------------------------------------------------------------------------------------
# Record forms, truncation, refusals
# ---------------------------------------------------------------------------------------


def test_record_forms_truncation_and_no_response(tmp_path, model_and_tokenizer):
    out = tmp_path / "profile"
    data = FIXTURES / "profile_forms.jsonl"
    assert (
        stage.main(
            [
                "--model",
                str(TINY_MODEL),
                "--data",
                str(data),
                "--out",
                str(out),
                "--max-length",
                "256",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    t, meta, samples = read_profile(out)
    by_id = {s["id"]: s for s in samples}
    assert len(samples) == 5 and meta["counts"]["samples"] == 5  # nothing dropped
    assert by_id["long-prompt"]["n_response_tokens"] == 0 and by_id["long-prompt"]["truncated"]
    assert by_id["long-response"]["truncated"] and by_id["long-response"]["n_response_tokens"] > 0
    assert meta["counts"]["no_response"] == 1 and meta["counts"]["truncated"] == 2
    for sid in ("prompt-completion", "instruction-input-output", "text"):
        assert not by_id[sid]["truncated"] and by_id[sid]["n_response_tokens"] > 0
    assert by_id["text"]["n_prompt_tokens"] == 1  # no prompt: the first token is context only
    assert len(t["p0"]) == meta["counts"]["response_tokens"] == t["sample_offsets"][-1]
    for s in samples:  # every complete sample has its kernel tagged
        lo, hi = t["sample_offsets"][s["index"]], t["sample_offsets"][s["index"] + 1]
        if not s["truncated"] and "blockIdx" in s["response_text"]:
            assert {1, 2} <= set(t["c"][lo:hi].tolist())


def test_plain_template_without_chat_template(tmp_path, profiled):
    """A tokenizer without a chat template gets cuset_common.data.PLAIN_PROMPT_TEMPLATE (and eos closes the
    answer)."""
    model = tmp_path / "no-template"
    shutil.copytree(TINY_MODEL, model, ignore=shutil.ignore_patterns("chat_template.jinja"))
    data = tmp_path / "one.jsonl"
    data.write_text(SFT_SMALL.read_text().splitlines(keepends=True)[2])
    out = tmp_path / "profile"
    assert (
        stage.main(["--model", str(model), "--data", str(data), "--out", str(out), "--max-length", "512"])
        == 0
    )
    t, meta, samples = read_profile(out)
    assert meta["chat_template"] is False
    assert meta["tokenizer_fingerprint"] != profiled[2]["tokenizer_fingerprint"]
    rec = load_sft(data)[0]
    assert samples[0]["response_text"] == rec["response"] + "<|im_end|>"
    assert samples[0]["n_response_tokens"] == len(t["p0"]) > 0 and not samples[0]["truncated"]


def test_malformed_line_is_reported_with_file_and_line(tmp_path, capsys):
    out = tmp_path / "profile"
    data = FIXTURES / "profile_malformed.jsonl"
    rc = run_main(stage.main, ["--model", str(TINY_MODEL), "--data", str(data), "--out", str(out)])
    assert rc == 2
    assert f"{data}:3:" in capsys.readouterr().err
    assert not out.exists() and not any(tmp_path.iterdir())  # nothing written, not even a temp folder


def test_unknown_record_form_is_reported(tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"question": "?", "answer": "!"}) + "\n")
    rc = run_main(stage.main, ["--model", str(TINY_MODEL), "--data", str(data), "--out", str(tmp_path / "p")])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"{data}:2:" in err and "unknown record form" in err
    assert not (tmp_path / "p").exists()


def test_missing_model_is_a_user_error(tmp_path, capsys):
    rc = run_main(
        stage.main,
        ["--model", str(tmp_path / "no-such-model"), "--data", str(SFT_SMALL), "--out", str(tmp_path / "p")],
    )
    assert rc == 2 and "--model" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("what", ["no-such-folder", "empty-folder", "tokenizer-only"])
def test_a_model_folder_without_a_model_is_one_line_and_exit_2(tmp_path, capfd, what):
    """Not a misleading 'install sentencepiece or tiktoken', one line naming the folder."""
    model = tmp_path / what
    if what != "no-such-folder":
        model.mkdir()
    if what == "tokenizer-only":
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(TINY_MODEL / f, model / f)
    rc = run_main(stage.main, ["--model", str(model), "--data", str(SFT_SMALL), "--out", str(tmp_path / "p")])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: --model {model}:")
    assert "no such folder" in err[0] or "holds no" in err[0]
    assert "sentencepiece" not in err[0] and "tiktoken" not in err[0]
    assert not (tmp_path / "p").exists()


def test_the_shared_head_check_runs_on_the_first_batch_and_refuses_scaled_logits(
    tmp_path, monkeypatch, capfd, tiny_tokenizer
):
    """Stage 01 uses cuset_common.models.check_head_is_plain on the first batch's first sample, and
    a model that scales its logits (as Granite does) is refused before any profiling."""
    calls, real_check, real_load = [], stage.check_head_is_plain, stage.load_causal_lm

    def spy(model, input_ids, where):
        calls.append((input_ids[0].tolist(), where))
        return real_check(model, input_ids, where)

    def load_scaled(name, dtype):
        model = real_load(name, dtype)
        forward = model.forward

        def scaled(*a, **kw):
            out = forward(*a, **kw)
            out.logits = out.logits * 0.5
            return out

        model.forward = scaled
        return model

    monkeypatch.setattr(stage, "check_head_is_plain", spy)
    monkeypatch.setattr(stage, "load_causal_lm", load_scaled)
    out = tmp_path / "profile"
    args = [
        "--model",
        str(TINY_MODEL),
        "--data",
        str(SFT_SMALL),
        "--out",
        str(out),
        "--max-length",
        str(MAX_LEN),
        "--batch-size",
        "2",
    ]
    assert run_main(stage.main, args) == 2
    err = capfd.readouterr().err.strip().splitlines()[-1]  # after the weight-loading progress bar
    assert err.startswith("error: ") and "logit scaling" in err and "01_profile.py" in err
    assert not out.exists() and not partial_dir(out).exists()
    encs = stage.encode_all(tiny_tokenizer, load_sft(SFT_SMALL), MAX_LEN)
    first = make_batches(encs, 2, 16384)[0][0]
    assert calls == [(encs[first]["input_ids"], "01_profile.py")]


KILLABLE = """
import sys, time
sys.path.insert(0, {tests!r})
from conftest import load_script
stage = load_script("01_profile.py")
score = stage.score_batch
def slow_score(*a, **kw):  # a slow model: the kill lands mid-run, not after the last batch
    time.sleep(0.3)
    return score(*a, **kw)
stage.score_batch = slow_score
sys.exit(stage.run_main(stage.main, sys.argv[1:]))
"""


def test_resume_after_sigkill_gives_the_same_artifact_bit_for_bit(tmp_path, capsys):
    """Kill a run (SIGKILL) once a shard is written, refuse to reuse or mix its partial state, then
    --resume: tensors.safetensors and samples.jsonl equal an uninterrupted run's byte for byte; meta.json
    differs only in args.resume, resumed_at_batch and the arguments --resume may change (args.log_every)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    common = [
        "--model",
        str(TINY_MODEL),
        "--data",
        str(SFT_SMALL),
        "--max-length",
        str(MAX_LEN),
        "--batch-size",
        "1",
        "--chunk-rows",
        "7",
        "--device",
        "cpu",
        "--save-every",
        "0",
    ]
    ref, out = tmp_path / "ref", tmp_path / "profile"
    assert stage.main(common + ["--out", str(ref)]) == 0
    assert not partial_dir(ref).exists()  # removed once the artifact is in place

    partial = partial_dir(out)
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLABLE.format(tests=str(ROOT / "tests")), *common, "--out", str(out)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.time() + 300
    while not list(partial.glob("batches-*.safetensors")):
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()
        assert time.time() < deadline, "no shard within 300 s"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not out.exists() and (partial / "state.json").exists()
    capsys.readouterr()

    # without --resume the partial state is neither reused nor deleted
    assert run_main(stage.main, common + ["--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err and partial.exists()
    # --resume with another argument that changes the result is refused
    assert (
        run_main(
            stage.main,
            common[:-2] + ["--save-every", "5", "--out", str(out), "--resume", "--chunk-rows", "9"],
        )
        == 2
    )
    assert "--chunk-rows" in capsys.readouterr().err and partial.exists()

    assert stage.main(common + ["--out", str(out), "--resume", "--log-every", "0"]) == 0
    log = capsys.readouterr().out
    resumed = json.loads((out / "meta.json").read_text())["resumed_at_batch"]
    assert resumed >= 1 and f"resuming at batch {resumed + 1}/5" in log
    assert "| batch 5/5 |" in log and f"(resumed at batch {resumed + 1})" in log
    assert not partial.exists()
    for name in ("tensors.safetensors", "samples.jsonl"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    meta, ref_meta = (json.loads((d / "meta.json").read_text()) for d in (out, ref))
    assert meta["args"].pop("resume") is True and ref_meta["args"].pop("resume") is False
    assert meta.pop("resumed_at_batch") >= 1 and ref_meta.pop("resumed_at_batch") == 0
    for m in (meta, ref_meta):  # two folders (this test's choice), and --log-every may change on resume
        del m["args"]["out"], m["args"]["log_every"]
    assert meta == ref_meta


def test_resume_without_a_partial_run_is_refused(tmp_path, capsys):
    rc = run_main(
        stage.main,
        ["--model", str(TINY_MODEL), "--data", str(SFT_SMALL), "--out", str(tmp_path / "p"), "--resume"],
    )
    assert rc == 2 and "no partial run" in capsys.readouterr().err and not (tmp_path / "p").exists()


# ---------------------------------------------------------------------------------------
# Speed: --batch-size auto, the in-place entropy
# ---------------------------------------------------------------------------------------


def test_auto_batch_size_and_chunk_rows_depend_on_the_device(capsys):
    """--batch-size and --chunk-rows default to auto: 1 sample and 128 rows on a CPU, 8 and 1024 on a GPU."""
    args = parse_args([])
    assert args.batch_size == args.chunk_rows == "auto"
    assert parse_args(["--batch-size", "5", "--chunk-rows", "9"]).chunk_rows == 9
    assert for_device("batch_size", "auto", "cpu") == 1
    assert for_device("chunk_rows", "auto", "cpu") == 128
    for gpu in ("cuda", "cuda:1"):
        assert for_device("batch_size", "auto", gpu) == 8 and for_device("chunk_rows", "auto", gpu) == 1024
    assert for_device("batch_size", 3, "cpu") == for_device("chunk_rows", 3, "cuda") == 3
    for flag in ("--batch-size", "--chunk-rows"):
        for bad in ("0", "-1", "eight"):
            with pytest.raises(SystemExit) as e:
                parse_args([flag, bad])
            assert e.value.code == 2 and flag in capsys.readouterr().err


@pytest.fixture(scope="module")
def profiled_auto(tmp_path_factory):
    """The small fixture profiled with the CPU defaults (auto: one sample per batch, 128 rows per chunk), in
    fp32 to compare with the batched values."""
    out = tmp_path_factory.mktemp("auto") / "profile"
    assert (
        stage.main(
            [
                "--model",
                str(TINY_MODEL),
                "--data",
                str(SFT_SMALL),
                "--out",
                str(out),
                "--max-length",
                str(MAX_LEN),
                "--device",
                "cpu",
                "--precision",
                "fp32",
            ]
        )
        == 0
    )
    return out, *read_profile(out)


def test_the_cpu_default_gives_the_batched_values(profiled, profiled_auto):
    """Batches of 3 in chunks of 7 rows (padded, masked attention) and the CPU defaults (one sample per
    batch, 128 rows): the same tokens, tags and spans, confidences within float32 rounding, entropies within
    float16 rounding."""
    _, t3, meta3, samples3 = profiled
    _, t1, meta1, samples1 = profiled_auto
    assert meta1["args"]["batch_size"] == meta1["args"]["chunk_rows"] == "auto"
    assert (meta1["batch_size"], meta1["chunk_rows"], meta3["batch_size"], meta3["chunk_rows"]) == (
        1,
        128,
        3,
        7,
    )
    assert samples1 == samples3
    for k in ("token_ids", "c", "char_start", "char_end", "line_index", "sample_offsets"):
        assert np.array_equal(t1[k], t3[k]), k
    np.testing.assert_allclose(t1["p0"], t3["p0"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        t1["entropy"].astype(np.float32), t3["entropy"].astype(np.float32), rtol=2e-3, atol=2e-3
    )


class Interrupted(Exception):
    pass


def test_resume_with_the_auto_defaults_gives_the_same_artifact(tmp_path, monkeypatch, profiled_auto):
    """A run with the default --batch-size and --chunk-rows stopped after two batches (shards after every
    batch), resumed with the same arguments: the artifact equals the uninterrupted default run's byte for
    byte."""
    common = [
        "--model",
        str(TINY_MODEL),
        "--data",
        str(SFT_SMALL),
        "--max-length",
        str(MAX_LEN),
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--out",
        str(tmp_path / "profile"),
    ]
    real_score, calls = stage.score_batch, []

    def stop_at_the_third_batch(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise Interrupted
        return real_score(*a, **kw)

    monkeypatch.setattr(stage, "score_batch", stop_at_the_third_batch)
    with pytest.raises(Interrupted):
        stage.main(common + ["--save-every", "0"])
    monkeypatch.setattr(stage, "score_batch", real_score)
    assert stage.main(common + ["--save-every", "0", "--resume"]) == 0
    meta = json.loads((tmp_path / "profile" / "meta.json").read_text())
    assert meta["resumed_at_batch"] == 2 and meta["batch_size"] == 1
    for name in ("tensors.safetensors", "samples.jsonl"):
        assert (tmp_path / "profile" / name).read_bytes() == (profiled_auto[0] / name).read_bytes(), name


def test_entropy_is_entr_even_with_minus_inf_logits():
    """The in-place -sum p log p equals torch.special.entr's sum, also where a logit is -inf (p = 0, log p =
    -inf: 0 there, not nan), chunked or not."""
    torch.manual_seed(0)
    logits = torch.randn(9, 50) * 4  # [n, V]
    logits[:, :7] = float("-inf")
    logits[3, 20:] = float("-inf")  # one row with only 13 finite logits
    gold = torch.randint(7, 20, (9,))
    for chunk in (4, 100):
        logp_gold, entropy, _ = gold_logprob_entropy(lambda h: h, logits, gold, chunk, False)
        ref = torch.log_softmax(logits, -1)
        assert torch.isfinite(entropy).all()
        torch.testing.assert_close(entropy, torch.special.entr(ref.exp()).sum(-1), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(logp_gold, ref.gather(1, gold[:, None])[:, 0])
