"""The shared plumbing of cuset_common: turn closing, artifact validation, resume checks, model loading."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cuset_common.artifacts import (
    SCHEMA_1_TENSOR_NAMES,
    SCHEMA_VERSION,
    check_resume_args,
    file_records,
    read_artifact,
    write_artifact,
)
from cuset_common.cli import UserError
from cuset_common.data import close_turn, encode_sample, end_of_turn_ids
from cuset_common.files import append_jsonl, read_appended_jsonl
from cuset_common.models import check_head_is_plain, load_causal_lm, load_tokenizer
from cuset_common.paths import TINY_MODEL
from cuset_common.tasks import signature_parts


class FakeSpecials(SimpleNamespace):
    """Just what close_turn reads of a tokenizer: its special tokens."""

    all_special_tokens: list
    added_tokens_decoder: dict = {}


@pytest.mark.parametrize(
    "specials, response, content, expected",
    [
        (["<|im_end|>"], "int x;<|im_end|>\n", "int x;", "int x;<|im_end|>"),  # ChatML
        (["<|eot_id|>"], "int x;<|eot_id|>", "int x;", "int x;<|eot_id|>"),  # Llama 3: nothing after
        (["<end_of_turn>", "<eos>"], "a<end_of_turn>\n<eos>", "a", "a<end_of_turn>"),  # first special closes
        ([], "int x;\n\n", "int x;", "int x;"),  # no special: strip
        (
            ["<|im_end|>"],
            "<|im_end|> in text<|im_end|>\n",
            "<|im_end|> in text",
            "<|im_end|> in text<|im_end|>",
        ),
    ],
)
def test_close_turn_keeps_the_end_of_turn_token_and_nothing_after(specials, response, content, expected):
    tok = FakeSpecials(all_special_tokens=specials, added_tokens_decoder={})
    assert close_turn(tok, response, content) == expected


def test_encoded_chat_sample_ends_at_the_end_of_turn_token(tiny_tokenizer):
    record = {"prompt_messages": [{"role": "user", "content": "add"}], "response": "```cpp\nint x;\n```"}
    enc = encode_sample(tiny_tokenizer, record, 512)
    assert enc["response_text"].endswith("<|im_end|>")
    assert enc["input_ids"][-1] == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_a_prompt_longer_than_max_length_is_cut_and_has_no_response_tokens(tiny_tokenizer):
    record = {"prompt_messages": [{"role": "user", "content": "word " * 400}], "response": "int x;"}
    enc = encode_sample(tiny_tokenizer, record, 64)
    assert len(enc["input_ids"]) == 64 and enc["response_start"] == 64 and enc["spans"] == []
    assert enc["truncated"]


def test_end_of_turn_ids_hold_the_template_end_token_also_when_eos_is_another(tiny_tokenizer):
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn_ids(tiny_tokenizer) == [im_end]  # the tiny model: eos is ChatML's end of turn
    other = load_tokenizer(str(TINY_MODEL), eos_token="<|endoftext|>")
    assert end_of_turn_ids(other) == sorted([im_end, other.convert_tokens_to_ids("<|endoftext|>")])


def test_appended_jsonl_drops_a_torn_last_line_and_appends_clean(tmp_path):
    path = tmp_path / "rows.jsonl"
    append_jsonl(path, [{"a": 1}, {"a": 2}])
    with path.open("a") as f:
        f.write('{"a": 3')  # a kill in the middle of a row
    assert read_appended_jsonl(path) == [{"a": 1}, {"a": 2}]
    append_jsonl(path, [{"a": 4}])
    assert read_appended_jsonl(path) == [{"a": 1}, {"a": 2}, {"a": 4}]
    assert read_appended_jsonl(tmp_path / "none.jsonl") == []


def write_small_artifact(path):
    tensors = {
        "p0": np.array([0.5, 0.25, 1.0], np.float32),
        "sample_offsets": np.array([0, 2, 3], np.int64),
        "w": np.array([1.0, 2.0], np.float32),
    }
    write_artifact(path, tensors, {"stage": "x", "counts": {"samples": 2, "response_tokens": 3}})


SCHEMA = dict(token_tensors={"p0": np.float32}, sample_tensors={"w": np.float32})


def test_a_valid_artifact_reads_back(tmp_path):
    write_small_artifact(tmp_path / "a")
    t, meta = read_artifact(tmp_path / "a", "x", "stage x", **SCHEMA)
    assert t["p0"].tolist() == [0.5, 0.25, 1.0] and meta["counts"]["samples"] == 2


def test_a_schema_1_artifact_is_read_through_the_one_mapping_and_an_unknown_schema_is_refused(tmp_path):
    """Schema 1 named p0, c, m, w in words (SCHEMA_1_TENSOR_NAMES): such a folder reads back under the new
    names, its files untouched; a schema this code does not know is one line naming the stage to rerun."""
    old_names = {"confidence": "p0", "sensitive": "c", "sample_mass": "m", "sample_weight": "w"}
    assert SCHEMA_1_TENSOR_NAMES == old_names and SCHEMA_VERSION == 2
    tensors = {
        "confidence": np.array([0.5, 0.25, 1.0], np.float32),
        "sensitive": np.array([0, 2, 0], np.uint8),
        "sample_offsets": np.array([0, 2, 3], np.int64),
        "sample_weight": np.array([1.0, 2.0], np.float32),
    }
    write_artifact(tmp_path / "a", tensors, {"stage": "x", "counts": {"samples": 2, "response_tokens": 3}})
    meta_path = tmp_path / "a" / "meta.json"
    meta_path.write_text(json.dumps(json.loads(meta_path.read_text()) | {"schema_version": 1}))
    t, _ = read_artifact(tmp_path / "a", "x", "stage x", **SCHEMA)
    assert sorted(t) == ["c", "p0", "sample_offsets", "w"] and t["c"].tolist() == [0, 2, 0]
    assert t["w"].tolist() == [1.0, 2.0] and t["p0"].tolist() == [0.5, 0.25, 1.0]
    meta_path.write_text(json.dumps(json.loads(meta_path.read_text()) | {"schema_version": 3}))
    with pytest.raises(UserError, match="schema version 3 but this code reads 1 and 2; rerun stage x"):
        read_artifact(tmp_path / "a", "x", "stage x", **SCHEMA)


def test_a_truncated_tensor_file_is_a_user_error(tmp_path):
    write_small_artifact(tmp_path / "a")
    f = tmp_path / "a" / "tensors.safetensors"
    f.write_bytes(f.read_bytes()[:-7])
    with pytest.raises(UserError, match="not the file this artifact wrote.*rerun stage x"):
        read_artifact(tmp_path / "a", "x", "stage x", **SCHEMA)
    rerecord_files(tmp_path / "a")  # a file cut short before meta.json recorded it: safetensors refuses it
    with pytest.raises(UserError, match="cannot be read.*rerun stage x"):
        read_artifact(tmp_path / "a", "x", "stage x", **SCHEMA)


def rerecord_files(folder: Path) -> None:
    """Make meta.json record the files as they are now, so that the checks after the files' are reached."""
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps(meta | {"files": file_records(folder)}))


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda t, m: t.update(p0=t["p0"].astype(np.float64)),
            "tensor p0 missing or not 1-D float32",
        ),
        (
            lambda t, m: t.update(p0=t["p0"][:2]),
            "tensor p0 has 2 entries but sample_offsets cover 3",
        ),
        (
            lambda t, m: t.update(w=t["w"][:1]),
            "tensor w has 1 entries but there are 2",
        ),
        (lambda t, m: t.update(sample_offsets=np.array([0, 3, 2], np.int64)), "never decrease"),
        (lambda t, m: m["counts"].update(samples=5), "meta.json counts"),
    ],
)
def test_inconsistent_tensors_are_refused_with_what_is_wrong(tmp_path, damage, message):
    from safetensors.numpy import load_file, save_file

    write_small_artifact(tmp_path / "a")
    t = load_file(str(tmp_path / "a" / "tensors.safetensors"))
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    damage(t, meta)
    save_file(t, str(tmp_path / "a" / "tensors.safetensors"))
    (tmp_path / "a" / "meta.json").write_text(json.dumps(meta))
    rerecord_files(tmp_path / "a")
    with pytest.raises(UserError, match=message):
        read_artifact(tmp_path / "a", "x", "stage x", **SCHEMA)


def test_resume_with_other_arguments_names_each_difference(tmp_path):
    saved = {"objective": "cuset", "lr": 1e-4, "resume": False, "stop_after": 3}
    check_resume_args(
        saved, {**saved, "resume": True, "stop_after": None}, {"resume", "stop_after"}, tmp_path
    )
    with pytest.raises(
        UserError,
        match=r"--lr: the run has 0.0001, now 0.05; --objective: the run has "
        r"'cuset', now 'sft'",
    ):
        check_resume_args(saved, {**saved, "objective": "sft", "lr": 5e-2}, {"resume"}, tmp_path)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "no such folder"),
        (lambda p: p.mkdir(), "holds no tokenizer"),
        (lambda p: p.write_text("x"), "is not a folder"),
    ],
)
def test_a_path_without_a_model_is_one_clear_line(tmp_path, make, message):
    make(tmp_path / "m")
    with pytest.raises(UserError, match=message):
        load_tokenizer(str(tmp_path / "m"))


def test_a_folder_with_a_tokenizer_but_no_model_names_config_json(tmp_path, tiny_tokenizer):
    tiny_tokenizer.save_pretrained(tmp_path / "m")
    assert load_tokenizer(str(tmp_path / "m")).vocab_size == tiny_tokenizer.vocab_size
    with pytest.raises(UserError, match="holds no model.*config.json"):
        load_causal_lm(str(tmp_path / "m"), None)


@pytest.mark.parametrize(
    "signature,parts",
    [
        (
            "__global__ void k(const float* __restrict__ x, float *y,const int  n)",
            ("k", ["const float* __restrict__", "float *", "const int"], ["x", "y", "n"]),
        ),
        (
            "prose, then __global__  void\nscan_k(unsigned int* counts) and more",
            ("scan_k", ["unsigned int*"], ["counts"]),
        ),
        ("__global__ void k()", ("k", [], [])),
        ("__global__ void k(int, float* a)", ("k", ["int", "float*"], ["", "a"])),
    ],
)
def test_signature_parts_split_types_from_names(signature, parts):
    assert signature_parts(signature) == parts


def test_text_without_a_kernel_signature_is_a_user_error():
    with pytest.raises(UserError, match="not a `__global__ void name"):
        signature_parts("void k(float* x)")


def test_the_head_check_reads_one_pass_and_refuses_soft_capped_logits():
    """check_head_is_plain compares the logits with the hidden state of the same forward pass: passes that
    disagree slightly (on CPU the first pass of a process can take other kernels, 1e-3 in the logits) are no
    reason to refuse a plain model. Gemma-2-style soft-capping, 30 tanh(z / 30), is refused."""
    import torch

    model = load_causal_lm(str(TINY_MODEL), torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (1, 80), generator=torch.Generator().manual_seed(0))
    calls, base_forward = [], model.base_model.forward

    def drifting(*args, **kwargs):  # each call's hidden state 1e-3 x (call number) off
        out = base_forward(*args, **kwargs)
        calls.append(1)
        out.last_hidden_state = out.last_hidden_state + 1e-3 * len(calls)
        return out

    model.base_model.forward = drifting
    check_head_is_plain(model, ids, "stage 0x")
    assert len(calls) == 1  # one pass
    forward = model.forward

    def soft_capped(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = 30 * torch.tanh(out.logits / 30)
        return out

    model.forward = soft_capped
    with pytest.raises(UserError, match=r"'llama'.*soft-capping.*stage 0x"):
        check_head_is_plain(model, ids, "stage 0x")


# ---------------------------------------------------------------------------------------
# The per-sample threshold: one definition (cuset_common.method.sample_threshold), used by stages 02 and 03
# ---------------------------------------------------------------------------------------


def naive_threshold(p, valid, rho, tau_max):
    """The per-row loop sample_threshold replaces (one device sync per row)."""
    import torch

    kappa = torch.zeros(p.shape[0], dtype=p.dtype)  # a row without a valid token: 0 (docs/method.md)
    for i in range(p.shape[0]):
        row = p[i][valid[i]]
        if row.numel():
            kappa[i] = min(tau_max, torch.quantile(row, rho).item())
    return kappa


def skewed_rows(seed: int):
    """p [9, 31] skewed to 0 (both sides of the min occur), valid [9, 31]: an empty, a one-token, a full
    row."""
    import torch

    g = torch.Generator().manual_seed(seed)
    p = torch.rand(9, 31, generator=g) ** 3
    valid = torch.rand(9, 31, generator=g) < torch.rand(9, 1, generator=g)
    valid[0], valid[1], valid[2] = False, False, True
    valid[1, 5] = True
    return p, valid


@pytest.mark.parametrize("seed", range(4))
def test_sample_threshold_matches_the_per_row_loop(seed, monkeypatch):
    import torch

    from cuset_common.method import sample_threshold

    p, valid = skewed_rows(seed)
    for dtype in (torch.float32, torch.float64):
        for rho, tau_max in ((0.2, 0.5), (0.0, 0.3), (1.0, 1.0), (0.37, 0.05)):
            want = naive_threshold(p.to(dtype), valid, rho, tau_max)
            with monkeypatch.context() as m:  # no .item(): on a GPU it would wait for the device per row
                m.setattr(torch.Tensor, "item", lambda self: pytest.fail("sample_threshold called .item()"))
                got = sample_threshold(p.to(dtype), valid, rho, tau_max)
            torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("seed", range(3))
def test_stages_02_and_03_threshold_with_sample_threshold(seed):
    """Stage 02's tau_i (flat arrays, its own code path) and the token mask stage 03 keeps (keep_mask) are
    both sample_threshold on the same probabilities: the regions are labelled with the threshold training
    masks with."""
    import torch
    from conftest import load_script

    from cuset_common.method import RHO, TAU_MAX, sample_threshold

    stage02, stage03 = load_script("02_label_regions.py"), load_script("03_train_cuset.py")
    p, valid = skewed_rows(seed)
    p = p.double()
    want = sample_threshold(p, valid, RHO, TAU_MAX)  # [B]
    n_tok = valid.sum(1).numpy()
    flat = p[valid].numpy()  # the rows' valid tokens, in order: stage 02's layout
    tau = stage02.adaptive_thresholds(flat, np.r_[0, np.cumsum(n_tok)], RHO, TAU_MAX)
    np.testing.assert_array_equal(tau, want.numpy())  # an empty sample's too: 0 in both
    assert (tau[n_tok == 0] == 0).all()
    no_region = torch.zeros_like(valid)
    keep = stage03.keep_mask("cuset", p, valid, no_region, rho=RHO, tau_max=TAU_MAX, profit_threshold=0.1)
    assert torch.equal(keep, valid & (p >= want[:, None]))
    ap02, ap03 = stage02.parse_args([]), stage03.parse_args([])
    assert (ap02.rho, ap02.tau_max) == (ap03.rho, ap03.tau_max) == (RHO, TAU_MAX)


def test_stages_01_and_03_take_the_gold_log_prob_from_one_function():
    """Stage 01's profile (no grad, with entropy) and stage 03's loss (checkpointed chunks, with grad) give
    log p(gold) bit for bit alike, over chunk sizes that split the rows unevenly: one formula, two
    callers."""
    import torch

    from cuset_common.method import gold_logprob_entropy, gold_logprobs, head_logits

    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(37, 16, generator=g), torch.randn(50, 16, generator=g) * 3
    gold = torch.randint(0, 50, (37,), generator=g)
    want = torch.log_softmax(hidden @ weight.t(), -1).gather(1, gold[:, None])[:, 0]  # [37]
    for chunk in (1, 8, 37, 64):
        profiled, _, _ = gold_logprob_entropy(
            lambda h: head_logits(h, weight, None), hidden, gold, chunk, False
        )
        trained = gold_logprobs(hidden.requires_grad_(), weight, gold, chunk)
        assert torch.equal(profiled, trained.detach()), chunk
        torch.testing.assert_close(trained.detach(), want)
