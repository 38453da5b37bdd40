"""Stage 01 (01_profile.py) on the bundled tiny model and small fixtures.

Covers: artifact schema, exactness against a plain unbatched float32 forward pass (issue 4,
point 3), the CUDA-sensitivity tagger on hand-written snippets, the four record forms,
truncation / no-response counting, and refusals (malformed line, unknown form, bad model).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import load_script
from cuset_common import encode_sample, load_sft, run_main

ROOT = Path(__file__).resolve().parents[1]
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
    rc = stage.main(["--model", str(TINY_MODEL), "--data", str(SFT_SMALL), "--out", str(out),
                     "--max-length", str(MAX_LEN), "--batch-size", "3", "--chunk-rows", "7", "--device", "cpu"])
    assert rc == 0
    return out, *read_profile(out)


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(TINY_MODEL))


# ---------------------------------------------------------------------------------------
# Artifact
# ---------------------------------------------------------------------------------------


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as e:
        stage.main(["--help"])
    assert e.value.code == 0
    assert "--max-length" in capsys.readouterr().out


def test_artifact_schema(profiled):
    out, t, meta, samples = profiled
    n_records = len(load_sft(SFT_SMALL))
    dtypes = {"token_ids": np.int32, "confidence": np.float32, "entropy": np.float16, "sensitive": np.uint8,
              "char_start": np.int32, "char_end": np.int32, "line_index": np.int32, "sample_offsets": np.int64}
    assert set(t) == set(dtypes)
    for k, dt in dtypes.items():
        assert t[k].dtype == dt, k
        assert t[k].ndim == 1, k
    T = int(t["sample_offsets"][-1])
    assert T > 0 and all(len(t[k]) == T for k in dtypes if k != "sample_offsets")
    assert len(t["sample_offsets"]) == n_records + 1 and t["sample_offsets"][0] == 0
    assert np.all(np.diff(t["sample_offsets"]) >= 0)
    assert np.all((t["confidence"] >= 0) & (t["confidence"] <= 1))
    assert np.all(np.isfinite(t["entropy"])) and np.all(t["entropy"] >= 0)
    assert set(np.unique(t["sensitive"])) <= set(range(10))

    assert meta["stage"] == "01_profile" and meta["schema_version"] == 1
    assert meta["model"] == str(TINY_MODEL) and meta["max_length"] == MAX_LEN
    assert meta["data"]["path"] == str(SFT_SMALL) and len(meta["data"]["sha256"]) == 64
    assert len(meta["tokenizer_fingerprint"]) == 64 and meta["args"]["max_length"] == MAX_LEN
    assert meta["categories"] == {"1": "signature", "2": "indexing", "3": "guard", "4": "shared_memory",
                                  "5": "synchronization", "6": "warp_atomic", "7": "launch", "8": "memory_api",
                                  "9": "write_back"}
    c = meta["counts"]
    assert c["samples"] == n_records and c["response_tokens"] == T
    assert c["truncated"] == sum(s["truncated"] for s in samples) >= 1  # the two full programs exceed 384
    assert c["no_response"] == 0

    assert [s["index"] for s in samples] == list(range(n_records))
    for s, rec in zip(samples, load_sft(SFT_SMALL)):
        assert set(s) == {"index", "id", "line", "response_text", "n_prompt_tokens", "n_response_tokens", "truncated"}
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
        assert t["token_ids"][lo:hi].tolist() == ids[:hi - lo]
        starts, ends = t["char_start"][lo:hi], t["char_end"][lo:hi]
        assert np.all(starts <= ends) and np.all(ends <= len(text)) and np.all(np.diff(starts) >= 0)
        assert t["line_index"][lo:hi].tolist() == [text[:a].count("\n") for a in starts]
        if not s["truncated"]:  # the spans cover the whole response text
            assert tok.decode(t["token_ids"][lo:hi].tolist()) == text


def test_confidence_equals_unbatched_fp32_forward(profiled, model_and_tokenizer):
    """Issue point 3: each stored confidence is the softmax prob of the gold token from a plain
    unbatched float32 forward pass, within 1e-4 (entropy within float16 rounding)."""
    _, t, _, samples = profiled
    model, tok = model_and_tokenizer
    for rec, s in zip(load_sft(SFT_SMALL), samples):
        enc = encode_sample(tok, rec, MAX_LEN)
        start, n = enc["response_start"], s["n_response_tokens"]
        assert start == s["n_prompt_tokens"]
        ids = torch.tensor([enc["input_ids"][:start + n]])  # [1, L]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)  # [L, V]
        gold = ids[0, start:]  # [n]
        ref_p = logp[start - 1:start - 1 + n].gather(1, gold[:, None])[:, 0].exp().numpy()
        ref_h = -(logp.exp() * logp).sum(-1)[start - 1:start - 1 + n].numpy()
        lo = t["sample_offsets"][s["index"]]
        assert np.abs(t["confidence"][lo:lo + n] - ref_p).max() <= 1e-4
        # and relatively: a tiny probability must be right too, not just small
        np.testing.assert_allclose(np.log(t["confidence"][lo:lo + n]), np.log(ref_p), rtol=0, atol=1e-4)
        np.testing.assert_allclose(t["entropy"][lo:lo + n].astype(np.float32), ref_h, rtol=2e-3, atol=2e-3)


def test_profile_tags_the_fixture_kernels(profiled):
    _, t, meta, samples = profiled
    seen = set(np.unique(t["sensitive"]).tolist())
    assert {1, 2, 3, 9} <= seen  # every fixture kernel: signature, index, guard, store
    for s in samples:
        lo, hi = t["sample_offsets"][s["index"]], t["sample_offsets"][s["index"] + 1]
        for a, b, cat in zip(t["char_start"][lo:hi], t["char_end"][lo:hi], t["sensitive"][lo:hi]):
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
    for (p1, h1), (p2, h2) in zip(plain, chunked):
        np.testing.assert_allclose(p1, p2, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(h1, h2, rtol=1e-5, atol=1e-5)


def test_bf16_autocast_path_runs_and_agrees_roughly(tmp_path, profiled):
    """The GPU path (bf16 autocast) exercised on CPU on two records; bf16 allows a loose tolerance."""
    out, data = tmp_path / "profile", tmp_path / "two.jsonl"
    data.write_text("".join(SFT_SMALL.read_text().splitlines(keepends=True)[3:5]))
    assert stage.main(["--model", str(TINY_MODEL), "--data", str(data), "--out", str(out),
                       "--max-length", str(MAX_LEN), "--device", "cpu", "--precision", "bf16"]) == 0
    t, meta, _ = read_profile(out)
    assert meta["precision"] == "bf16-autocast"
    ref = profiled[1]
    lo, hi = ref["sample_offsets"][3], ref["sample_offsets"][5]  # the same two records, fp32
    assert np.array_equal(t["token_ids"], ref["token_ids"][lo:hi])
    assert np.array_equal(t["sensitive"], ref["sensitive"][lo:hi])
    assert np.abs(t["confidence"] - ref["confidence"][lo:hi]).max() < 0.05


# ---------------------------------------------------------------------------------------
# Tagger on hand-written CUDA (DESIGN.md "CUDA sensitivity")
# ---------------------------------------------------------------------------------------

SNIPPET = r'''Here is the kernel; it calls __syncthreads() between the phases and uses threadIdx.

```cpp
// Block sum: threadIdx and __syncthreads in this comment are not code
#include <cstdio>
__device__ float square(float v) { return v * v; }

__global__ void __launch_bounds__(256) block_sum(const float* __restrict__ x, float* out, int n) {
    extern __shared__ float buf[];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + tid;
    float v = (i < n) ? square(x[i]) : 0.0f;
    buf[tid] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 32; s >>= 1) {
        if (tid < s) buf[tid] += buf[tid + s];
        __syncthreads();
    }
    if (tid >= 32) return;
    float threads = buf[tid] + buf[tid + 32];
    int index_count = 3;
    for (int k = 0; k < index_count; ++k) threads *= 1.0f;
    threads += __shfl_down_sync(0xffffffff, threads, 16);
    if (tid == 0) atomicAdd(out + gridDim.x, threads);
    if (tid == 0) out[blockIdx.x] = threads;
}

int main() {
    const char* msg = "call __syncthreads() and cudaMalloc here";
    int n = 1000, threads = 256;
    int blocks = (n + threads - 1) / threads;
    float *d_x, *d_out;
    cudaMalloc(&d_x, n * sizeof(float));
    cudaMemcpy(d_x, h_x, n * sizeof(float), cudaMemcpyHostToDevice);
    dim3 grid(blocks);
    block_sum<<<grid, threads, threads * sizeof(float)>>>(d_x, d_out, n);
    cudaDeviceSynchronize();
    /* block comment: atomicAdd blockIdx cudaFree */
    for (int i = 0; i < n; ++i) printf("%d\n", i);
    cudaFree(d_x);
    return 0;
}
```
The launch uses one block per 256 elements; atomicAdd combines the blocks.
'''


def category_of(text: str, needle: str, nth: int = 0) -> int:
    """Category the tagger gives to a token spanning the nth occurrence of needle."""
    starts = [m.start() for m in re.finditer(re.escape(needle), text)]
    assert len(starts) > nth, f"{needle!r} occurs {len(starts)} times"
    a = starts[nth]
    return int(stage.tag_tokens(text, [(a, a + len(needle))])[0])


@pytest.mark.parametrize("needle, nth, code", [
    ("__global__", 0, 1), ("__launch_bounds__", 0, 1), ("__restrict__", 0, 1), ("__device__", 0, 1),
    ("threadIdx", 2, 2), ("blockDim", 0, 2), ("gridDim", 0, 2), ("int tid", 0, 2), ("int i =", 0, 2),
    ("+ tid;", 0, 2), ("int s =", 0, 2), ("s >>= 1", 0, 2),
    ("(i < n)", 0, 3), ("if (tid < s)", 0, 3), ("s > 32", 0, 3), ("return;", 0, 3), ("tid == 0", 0, 3),
    ("extern __shared__", 0, 4),
    ("__syncthreads", 2, 5), ("__syncthreads", 3, 5), ("cudaDeviceSynchronize", 0, 5),
    ("__shfl_down_sync", 0, 6), ("atomicAdd", 0, 6),
    ("<<<", 0, 7), (">>>", 0, 7), ("grid, threads", 0, 7), ("dim3", 0, 7), ("(n + threads - 1) / threads", 0, 7),
    ("cudaMalloc", 1, 8), ("cudaMemcpy", 0, 8), ("cudaMemcpyHostToDevice", 0, 8), ("cudaFree", 1, 8),
    ("out[", 0, 9), ("] =", 1, 9),
])
def test_tagger_hits_each_category(needle, nth, code):
    assert category_of(SNIPPET, needle, nth) == code, CATEGORIES_HELP


CATEGORIES_HELP = "codes: " + ", ".join(f"{k} {v}" for k, v in stage.CATEGORIES.items())


@pytest.mark.parametrize("needle, nth", [
    ("__syncthreads", 0), ("threadIdx", 0),           # prose outside the code fence
    ("threadIdx", 1), ("__syncthreads", 1),           # line comment
    ("__syncthreads", 4), ("cudaMalloc", 0),          # string literal
    ("atomicAdd", 1), ("blockIdx", 2),                # block comment
    ("atomicAdd", 2),                                 # prose after the fence
    ("float threads", 0), ("threads *= 1.0f", 0), ("int index_count", 0), ("k < index_count", 0),
    ("int n = 1000, threads", 0), ("buf[tid] = v", 0), ("return v * v", 0),
    ("i < n; ++i", 0), ("printf", 0), ("#include <cstdio>", 0),
])
def test_tagger_leaves_ordinary_code_comments_and_strings_alone(needle, nth):
    assert category_of(SNIPPET, needle, nth) == 0


def test_tag_tokens_priority_and_empty_spans():
    text = "__global__ void k(float* y) { if (threadIdx.x < 32) y[threadIdx.x] = 0.f; }"
    a = text.index("(threadIdx.x < 32)")
    # threadIdx inside a guard: named lexeme (indexing) beats the structural guard
    assert stage.tag_tokens(text, [(a, a + 1), (a + 1, a + 10), (a + 12, a + 17)]).tolist() == [3, 2, 3]
    assert stage.tag_tokens(text, [(5, 5)]).tolist() == [0]  # zero-width span overlaps nothing
    assert stage.tag_tokens(text, []).dtype == np.uint8
    assert stage.PRIORITY and sorted(stage.PRIORITY) == list(stage.CATEGORIES)


def test_quotes_and_slashes_do_not_confuse_the_blanking():
    text = ("__global__ void k(int* out) {\n"
            "    char q = '\"'; // it's a quote: __syncthreads\n"
            "    printf(\"// not a comment \\\" __syncwarp\"); __syncthreads();\n"
            "    /* a ' and a \" */ __syncwarp();\n"
            "    int big = 1'000'000; __threadfence();\n}\n")
    assert category_of(text, "__syncthreads", 0) == 0 and category_of(text, "__syncthreads", 1) == 5
    assert category_of(text, "__syncwarp", 0) == 0 and category_of(text, "__syncwarp", 1) == 5
    assert category_of(text, "__threadfence", 0) == 5


def test_code_view_keeps_length_and_lines():
    view = stage.code_view(SNIPPET)
    assert len(view) == len(SNIPPET) and view.count("\n") == SNIPPET.count("\n")
    assert "__syncthreads" not in view[:SNIPPET.index("```")] and "call __syncthreads" not in view
    assert "extern __shared__ float buf[];" in view


# ---------------------------------------------------------------------------------------
# Record forms, truncation, refusals
# ---------------------------------------------------------------------------------------


def test_record_forms_truncation_and_no_response(tmp_path, model_and_tokenizer):
    out = tmp_path / "profile"
    data = FIXTURES / "profile_forms.jsonl"
    assert stage.main(["--model", str(TINY_MODEL), "--data", str(data), "--out", str(out),
                       "--max-length", "256", "--device", "cpu"]) == 0
    t, meta, samples = read_profile(out)
    by_id = {s["id"]: s for s in samples}
    assert len(samples) == 5 and meta["counts"]["samples"] == 5  # nothing dropped
    assert by_id["long-prompt"]["n_response_tokens"] == 0 and by_id["long-prompt"]["truncated"]
    assert by_id["long-response"]["truncated"] and by_id["long-response"]["n_response_tokens"] > 0
    assert meta["counts"]["no_response"] == 1 and meta["counts"]["truncated"] == 2
    for sid in ("prompt-completion", "instruction-input-output", "text"):
        assert not by_id[sid]["truncated"] and by_id[sid]["n_response_tokens"] > 0
    assert by_id["text"]["n_prompt_tokens"] == 1  # no prompt: the first token is context only
    assert len(t["confidence"]) == meta["counts"]["response_tokens"] == t["sample_offsets"][-1]
    for s in samples:  # every complete sample has its kernel tagged
        lo, hi = t["sample_offsets"][s["index"]], t["sample_offsets"][s["index"] + 1]
        if not s["truncated"] and "blockIdx" in s["response_text"]:
            assert {1, 2} <= set(t["sensitive"][lo:hi].tolist())


def test_plain_template_without_chat_template(tmp_path, profiled):
    """A tokenizer without a chat template gets cuset_common.PLAIN_PROMPT_TEMPLATE (and eos closes the answer)."""
    model = tmp_path / "no-template"
    shutil.copytree(TINY_MODEL, model, ignore=shutil.ignore_patterns("chat_template.jinja"))
    data = tmp_path / "one.jsonl"
    data.write_text(SFT_SMALL.read_text().splitlines(keepends=True)[2])
    out = tmp_path / "profile"
    assert stage.main(["--model", str(model), "--data", str(data), "--out", str(out), "--max-length", "512"]) == 0
    t, meta, samples = read_profile(out)
    assert meta["chat_template"] is False and meta["tokenizer_fingerprint"] != profiled[2]["tokenizer_fingerprint"]
    rec = load_sft(data)[0]
    assert samples[0]["response_text"] == rec["response"] + "<|im_end|>"
    assert samples[0]["n_response_tokens"] == len(t["confidence"]) > 0 and not samples[0]["truncated"]


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
    rc = run_main(stage.main, ["--model", str(tmp_path / "no-such-model"), "--data", str(SFT_SMALL),
                               "--out", str(tmp_path / "p")])
    assert rc == 2 and "--model" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
