"""Stage 01: profile a base model on SFT data, token by token, and tag CUDA-sensitive tokens.

For every response token of every sample: the probability of the gold token under teacher
forcing (its confidence, p0_it in docs/method.md's notation), the entropy of the predicted distribution,
whether the model's most likely token is the gold one (its argmax: token accuracy), and the token's
CUDA-sensitivity category c_it (docs/method.md "CUDA sensitivity"; codes 1..9, 0 = none). Stage 02
turns these into low-confidence CUDA-sensitive regions and sample weights.

Commands
  python 01_profile.py                                   # tiny model + bundled data, on a CPU
  python 01_profile.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --data my_sft.jsonl --max-length 4096
                                                         # after a kill: the same command + --resume
  python 01_profile.py --help

Inputs -> outputs
  --model  hub id or local folder (default: bundled data/models/tiny-cuda-lm); needs a fast tokenizer
  --data   SFT JSONL in chat `messages`, `prompt`/`completion`, `instruction`/`input`/`output` or
           `text` form (default: bundled data/sft/train_kernel.jsonl); or a parquet/JSON file, dataset
           folder or hf:owner/name[:split] mapped by --data-fields, filtered by --data-where (docs/data.md)
  -> --out (default data/artifacts/profile), written atomically (cuset_common.artifacts.write_artifact):
     tensors.safetensors  flat over the response tokens of all samples, in data order:
                          token_ids int32 [T], p0 float32 [T], entropy float16 [T] (nats),
                          argmax_correct uint8 [T] (1: the argmax of the logits is the gold token;
                          ties go to the lowest id, as torch.argmax), c uint8 [T],
                          char_start/char_end int32 [T] (span in the response text), line_index
                          int32 [T] (0-based line of char_start), sample_offsets int64 [S+1]
     samples.jsonl        per sample: index, id, line, response_text, n_prompt_tokens,
                          n_response_tokens, truncated
     meta.json            stage, args, model, tokenizer_fingerprint, data (identity), max_length, counts
                          {samples, response_tokens, truncated, no_response}, categories, batch_size and
                          chunk_rows (auto resolved), resumed_at_batch

Tokenization is the one every stage uses (cuset_common.data.encode_sample): the tokenizer's chat
template when it has one, else cuset_common.data.PLAIN_PROMPT_TEMPLATE; prompt and response are
tokenized separately and only response tokens are profiled. The response ends with the template's
end-of-turn token: what a template writes after it (ChatML's `\\n` after <|im_end|>) is never
generated, so it is not profiled either. A sample longer than --max-length loses its tail and is
counted as truncated; one whose prompt alone fills --max-length is kept with 0 tokens (no_response;
it is counted as truncated too). In the `text` form there is no prompt, so the first token only
serves as context (assumption: nothing predicts it; n_prompt_tokens = 1).

Efficiency: the model body runs once per batch (under bf16 autocast where the device computes bf16
natively: --precision) and lm_head is applied to the response positions only, --chunk-rows at a time,
with log-softmax of the gold token, the entropy and the argmax per chunk in float32, so a float32
[batch, seq, vocab] logits tensor never exists (real vocabularies exceed 150k). The defaults depend on
the device (cuset_common/profiler/batching.py: for_device): on a GPU batches of 8 samples (longest first:
little padding) and chunks of 1024 rows; on a CPU one sample per batch and 128 rows per chunk
(research/bench/profiling.py measures both against the per-sample loop a user writes first).

Tagging (cuset_common/profiler/tagger.py): regexes over the response text with prose outside ``` fences,
comments and literals blanked; a token gets the first category in PRIORITY whose matches its character span
overlaps. Beyond the named lexemes, inside __global__/__device__ bodies: indexing = integer assignments
derived from thread builtins, and pointer arithmetic with an index (`x + row * cols`) in full;
guard = is_guard (bounds checks; a loop's own termination test is not one, nor a condition whose
`(` is never closed), early `return;`; write_back = stores through an output pointer (a non-const
pointer parameter, or a local pointer derived from one: `float* yr = y + row * cols; yr[j] = v`).

Resume (cuset_common/profiler/shards.py): finished batches are saved every --save-every seconds to
<out>.partial/ (state.json: what the result depends on; batches-B0-B1.safetensors: the results of batches [B0,
B1)), each file written to a temp name and renamed. --resume checks state.json against this run (only
cuset_common/profiler/options.py's RESUME_MAY_CHANGE may differ) and continues after the last shard; the
batch plan is deterministic, so the artifact equals an uninterrupted run's bit for bit. Without --resume a
partial state is refused, neither reused nor deleted. The folder is removed once the artifact is in place.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from cuset_common.artifacts import args_to_json, path_text, tokenizer_fingerprint, write_artifact
from cuset_common.cli import run_main
from cuset_common.data import encode_sample, right_pad
from cuset_common.data_sources import data_checks
from cuset_common.device import pick_device, resolve_precision
from cuset_common.method import gold_logprob_entropy, head_logits
from cuset_common.models import check_head_is_plain, load_causal_lm, load_tokenizer, output_head
from cuset_common.out_dir import check_out_dir, finishes_out
from cuset_common.profiler.batching import (
    batch_progress,
    check_response_tokens,
    for_device,
    line_indices,
    make_batches,
    print_profile_summary,
    profile_figures,
)
from cuset_common.profiler.inputs import check_scores, load_data_once
from cuset_common.profiler.options import RESUME_MAY_CHANGE, parse_args
from cuset_common.profiler.shards import check_partial, load_shards, partial_dir, save_shard
from cuset_common.profiler.tagger import CATEGORIES, PRIORITY, tag_tokens
from cuset_common.trackers import Trackers, open_trackers

STAGE = "01_profile"
# Per-token tensors of the artifact (all [T], flat over samples; sample_offsets int64 [S+1] delimits them).
TOKEN_DTYPES = {
    "token_ids": np.int32,
    "p0": np.float32,  # p0_it, the confidence
    "entropy": np.float16,
    "argmax_correct": np.uint8,
    "c": np.uint8,  # c_it, the category code, 0 = not sensitive
    "char_start": np.int32,
    "char_end": np.int32,
    "line_index": np.int32,
}


# ---------------------------------------------------------------------------------------
# 1. Confidence under teacher forcing: one forward pass of the body per batch, then the output layer on
#    the response positions only, chunk by chunk (cuset_common.method.gold_logprob_entropy: log p(gold),
#    entropy and argmax per position in float32), so a [batch, seq, vocab] float32 tensor never exists.
# ---------------------------------------------------------------------------------------


def encode_all(tokenizer, records: list[dict], max_length: int) -> list[dict]:
    """encode_sample for each record (shared with stage 03, so token positions agree)."""
    return [encode_sample(tokenizer, rec, max_length) for rec in records]


@torch.no_grad()
def score_batch(
    body, head, encs: list[dict], pad_id: int, device: str, chunk_rows: int, use_bf16: bool
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(p0 [n_i], entropy [n_i], argmax_correct [n_i] uint8) per sample of one right-padded batch."""
    lengths = [len(e["input_ids"]) for e in encs]
    ids, mask = right_pad([e["input_ids"] for e in encs], pad_id)  # [B, L] each
    ids, mask = ids.to(device), mask.to(device)
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=use_bf16):
        hidden = body(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state  # [B, L, H]
    # position t predicts token t + 1: keep only the positions that predict response tokens
    starts = [e["response_start"] for e in encs]
    rows_b = torch.cat([torch.full((lengths[b] - starts[b],), b) for b in range(len(encs))])  # [rows]
    rows_t = torch.cat([torch.arange(starts[b] - 1, lengths[b] - 1) for b in range(len(encs))])  # [rows]
    rows_b, rows_t = rows_b.to(device), rows_t.to(device)
    gold = ids[rows_b, rows_t + 1]  # [rows]
    # log p0, entropy, argmax == gold: [rows] each
    log_p0, ent, ok = gold_logprob_entropy(head, hidden[rows_b, rows_t], gold, chunk_rows, use_bf16)
    p0, ent, ok = log_p0.exp().cpu().numpy(), ent.cpu().numpy(), ok.cpu().numpy().astype(np.uint8)
    cuts = np.cumsum([0] + [lengths[b] - starts[b] for b in range(len(encs))])
    return [tuple(a[cuts[b] : cuts[b + 1]] for a in (p0, ent, ok)) for b in range(len(encs))]


def profile(
    model,
    tokenizer,
    encs: list[dict],
    args: argparse.Namespace,
    device: str,
    use_bf16: bool,
    run: dict,
    trackers: Trackers,
) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], int]:
    """p0, entropy and argmax_correct per sample (data order; no response tokens: empty arrays), and
    the batch it resumed at. Finished batches go to <out>.partial/ every --save-every seconds; the
    throughput to the progress line and the trackers."""
    weight, bias = output_head(model)
    body, head = model.base_model, lambda h: head_logits(h, weight, bias)  # what check_head_is_plain checks
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # masked; any id works
    # deterministic (resume needs the same plan; the device is part of the run, so auto resolves alike)
    batches = make_batches(encs, for_device("batch_size", args.batch_size, device), args.batch_tokens)
    chunk_rows = for_device("chunk_rows", args.chunk_rows, device)
    if batches:
        first = torch.tensor([encs[batches[0][0]]["input_ids"]], device=device)
        check_head_is_plain(model, first, "01_profile.py")
    results = [(np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, np.uint8)) for _ in encs]
    partial = partial_dir(args.out)
    start = load_shards(partial, batches, encs, results) if args.resume else 0
    batch_done = batch_progress(
        [sum(len(encs[i]["input_ids"]) for i in b) for b in batches], start, args.log_every, trackers
    )
    unsaved, last_save = start, time.time()
    for k in range(start, len(batches)):
        scored = score_batch(body, head, [encs[i] for i in batches[k]], pad_id, device, chunk_rows, use_bf16)
        check_scores(scored, batches[k], args, use_bf16)  # a NaN model stops here, before any shard holds it
        for i, res in zip(batches[k], scored):
            results[i] = res
        batch_done(k)
        if time.time() - last_save >= args.save_every and k < len(batches) - 1:
            save_shard(partial, run, batches, unsaved, k + 1, results)
            unsaved, last_save = k + 1, time.time()
    return results, start


# ---------------------------------------------------------------------------------------
# 2. CUDA sensitivity: cuset_common/profiler/tagger.py, tag_tokens (the categories and the rules are there)
# 3. The artifact: flat per-token tensors, one record per sample, meta.json
# ---------------------------------------------------------------------------------------


def room_needed(encs: list[dict]) -> int:
    """Bytes of the artifact (TOKEN_DTYPES per token; samples.jsonl, the response texts with JSON escapes,
    counted twice), plus the shards in <out>.partial (float32 p0 and entropy, uint8 argmax per
    token), which stay until the artifact is in place."""
    per_token = sum(np.dtype(d).itemsize for d in TOKEN_DTYPES.values()) + 4 + 4 + 1
    text_bytes = sum(len(e["response_text"].encode()) for e in encs)
    return sum(len(e["spans"]) for e in encs) * per_token + 2 * text_bytes


def build_artifact(records, encs, results, c_per_sample) -> tuple[dict[str, np.ndarray], list[dict], dict]:
    """Flat tensors over all response tokens (data order), per-sample records and counts."""
    cols: dict[str, list] = {k: [] for k in TOKEN_DTYPES}
    samples, offsets = [], [0]
    for i, (rec, enc, (p0, ent, ok), c) in enumerate(zip(records, encs, results, c_per_sample)):
        spans = enc["spans"]
        starts = [s for s, _ in spans]
        cols["token_ids"].append(np.asarray(enc["input_ids"][enc["response_start"] :], dtype=np.int32))
        cols["p0"].append(p0.astype(np.float32))
        cols["entropy"].append(ent.astype(np.float16))
        cols["argmax_correct"].append(ok.astype(np.uint8))
        cols["c"].append(c)
        cols["char_start"].append(np.asarray(starts, dtype=np.int32))
        cols["char_end"].append(np.asarray([e for _, e in spans], dtype=np.int32))
        cols["line_index"].append(np.asarray(line_indices(enc["response_text"], starts), dtype=np.int32))
        offsets.append(offsets[-1] + len(spans))
        samples.append(
            {
                "index": i,
                "id": path_text(rec["id"]),  # an id made of --data's path may hold non-UTF-8 bytes
                "line": rec["line"],
                "response_text": enc["response_text"],
                "n_prompt_tokens": enc["response_start"],
                "n_response_tokens": len(spans),
                "truncated": bool(enc["truncated"]),
            }
        )
    tensors = {k: np.concatenate(v).astype(TOKEN_DTYPES[k]) for k, v in cols.items()}  # each [T]
    tensors["sample_offsets"] = np.asarray(offsets, dtype=np.int64)
    counts = {
        "samples": len(samples),
        "response_tokens": int(offsets[-1]),
        "truncated": sum(s["truncated"] for s in samples),
        "no_response": sum(s["n_response_tokens"] == 0 for s in samples),
    }
    return tensors, samples, counts


def profile_meta(args, run: dict, data_id: dict, counts: dict, chat_template: bool, resumed_at: int) -> dict:
    """meta.json of the artifact: the run (arguments, data, tokenizer, device, precision), the counts and
    the category codes stage 02 reads."""
    return {
        "stage": STAGE,
        "args": run["args"],
        "model": args.model,
        "tokenizer_fingerprint": run["tokenizer_fingerprint"],
        "data": data_id,
        "max_length": args.max_length,
        "counts": counts,
        "categories": {str(k): v for k, v in CATEGORIES.items()},
        "chat_template": chat_template,
        "category_priority": [CATEGORIES[c] for c in PRIORITY],
        "device": run["device"],
        "precision": run["precision"],
        "batch_size": for_device("batch_size", args.batch_size, run["device"]),
        "chunk_rows": for_device("chunk_rows", args.chunk_rows, run["device"]),
        "resumed_at_batch": resumed_at,
    }


# ---------------------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------------------


def run_identity(args, data_id: dict, device: str, use_bf16: bool, tokenizer) -> dict:
    """What must not change between a killed run and its --resume: the result depends on all of it."""
    return {
        "args": args_to_json(args),
        **data_checks(data_id),
        "device": device,
        "precision": "bf16-autocast" if use_bf16 else "fp32",
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
    }


@finishes_out  # releases the lock on --out that check_out_dir takes
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)  # cuset_common/profiler/options.py
    # bad row or mapping -> UserError naming file and row, before any work; the sha256 is of the bytes read
    records, data_id = load_data_once(args)
    device = pick_device(args.device)
    use_bf16 = resolve_precision(args.precision, device) == "bf16"
    tokenizer = load_tokenizer(args.model)  # one-line UserError for a missing folder or one without a model
    encs = encode_all(tokenizer, records, args.max_length)
    check_response_tokens(encs, args)
    check_out_dir(
        args.out, STAGE, {"--data": args.data, "--model": Path(args.model)}, None, room_needed(encs)
    )
    run = run_identity(args, data_id, device, use_bf16, tokenizer)
    check_partial(partial_dir(args.out), run, args.resume, RESUME_MAY_CHANGE)
    model = load_causal_lm(args.model, torch.float32).to(device).eval()
    print(
        f"[profile] {len(records)} samples from {path_text(args.data)}; model {path_text(args.model)} on "
        f"{device} ({'bf16 autocast' if use_bf16 else 'fp32'}); chat template: "
        f"{bool(tokenizer.chat_template)}",
        flush=True,
    )

    trackers = open_trackers(args, "01", args.out, {"args": args_to_json(args), "run": run})
    results, resumed_at = profile(model, tokenizer, encs, args, device, use_bf16, run, trackers)  # p0_it, ...
    c_per_sample = [tag_tokens(e["response_text"], e["spans"]) for e in encs]  # c_it, uint8 [n_i] each
    tensors, samples, counts = build_artifact(records, encs, results, c_per_sample)
    meta = profile_meta(args, run, data_id, counts, bool(tokenizer.chat_template), resumed_at)
    samples_text = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples)
    write_artifact(args.out, tensors, meta, extra_files={"samples.jsonl": samples_text})
    shutil.rmtree(partial_dir(args.out), ignore_errors=True)  # only once the artifact is in place
    figures = profile_figures(tensors, counts, CATEGORIES)
    trackers.log(figures)  # beside the last batch's throughput
    print_profile_summary(figures, CATEGORIES, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(
        run_main(
            main,
            interrupted=(
                "the batches finished by its last save (every --save-every seconds) are kept in "
                "<out>.partial/; rerun the same command with --resume to go on from them"
            ),
        )
    )
