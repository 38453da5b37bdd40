"""Stage 01: profile a base model on SFT data, token by token, and tag CUDA-sensitive tokens.

For every response token of every sample: the probability of the gold token under teacher
forcing (its "confidence"), the entropy of the predicted distribution, whether the model's most
likely token is the gold one (its argmax: token accuracy), and the token's CUDA-sensitivity
category (docs/method.md "CUDA sensitivity"; codes 1..9, 0 = none). Stage 02 turns these into
low-confidence CUDA-sensitive regions and sample weights.

Inputs -> outputs
  --model  hub id or local folder (default: bundled data/models/tiny-cuda-lm); needs a fast tokenizer
  --data   SFT JSONL in chat `messages`, `prompt`/`completion`, `instruction`/`input`/`output` or
           `text` form (default: bundled data/sft/train_kernel.jsonl); or a parquet/JSON file, dataset
           folder or hf:owner/name[:split] mapped by --data-fields, filtered by --data-where (docs/data.md)
  -> --out (default data/artifacts/profile), written atomically with cuset_common.write_artifact:
     tensors.safetensors  flat over the response tokens of all samples, in data order:
                          token_ids int32 [T], confidence float32 [T], entropy float16 [T] (nats),
                          argmax_correct uint8 [T] (1: the argmax of the logits is the gold token;
                          ties go to the lowest id, as torch.argmax), sensitive uint8 [T],
                          char_start/char_end int32 [T] (span in the response text), line_index
                          int32 [T] (0-based line of char_start), sample_offsets int64 [S+1]
     samples.jsonl        per sample: index, id, line, response_text, n_prompt_tokens,
                          n_response_tokens, truncated
     meta.json            stage, args, model, tokenizer_fingerprint, data (identity), max_length, counts
                          {samples, response_tokens, truncated, no_response}, categories, batch_size and
                          chunk_rows (auto resolved), resumed_at_batch

Commands
  python 01_profile.py                                   # tiny model + bundled data, CPU, seconds
  python 01_profile.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --data my_sft.jsonl --max-length 4096
  python 01_profile.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --data my_sft.jsonl --max-length 4096 \
--resume
                                                         # after a kill: the same arguments + --resume
  python 01_profile.py --help

Tokenization is the one every stage uses (cuset_common.encode_sample): the tokenizer's chat
template when it has one, else cuset_common.PLAIN_PROMPT_TEMPLATE; prompt and response are
tokenized separately and only response tokens are profiled. The response ends with the template's
end-of-turn token: what a template writes after it (ChatML's `\n` after <|im_end|>) is never
generated, so it is not profiled either. A sample longer than --max-length loses its tail and is
counted as truncated; one whose prompt alone fills --max-length is kept with 0 tokens (no_response;
it is counted as truncated too). In the `text` form there is no prompt, so the first token only
serves as context (assumption: nothing predicts it; n_prompt_tokens = 1).

Efficiency: the model body runs once per batch (under bf16 autocast where the device computes bf16
natively: --precision) and lm_head is applied to the response positions only, --chunk-rows at a time,
with log-softmax of the gold token, the entropy and the argmax per chunk in float32, so a float32
[batch, seq, vocab] logits tensor never exists (real vocabularies exceed 150k). The defaults depend on the device (for_device): on a GPU batches of 8
samples (longest first: little padding) and chunks of 1024 rows; on a CPU one sample per batch and
128 rows per chunk (bench/profile.py measures both against the per-sample loop a user writes first).

Resume: finished batches are saved every --save-every seconds to <out>.partial/ (state.json: what
the result depends on; batches-B0-B1.safetensors: the results of batches [B0, B1)), each file written
to a temp name and renamed. --resume checks state.json against this run (only RESUME_MAY_CHANGE may
differ) and continues after the last shard; the batch plan is deterministic, so the artifact equals an
uninterrupted run's bit for bit. Without --resume a partial state is refused, neither reused nor
deleted. The folder is removed once the artifact is in place.

Tagging: regexes over the response text with prose outside ``` fences, comments and literals
blanked; a token gets the first category in PRIORITY whose matches its character span overlaps.
Beyond the named lexemes, inside __global__/__device__ bodies: indexing = integer assignments
derived from thread builtins, and pointer arithmetic with an index (`x + row * cols`) in full;
guard = is_guard (bounds checks; a loop's own termination test is not one), early `return;`;
write_back = stores through an output pointer (a non-const pointer parameter, or a local pointer
derived from one: `float* yr = y + row * cols; yr[j] = v`).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from cuset_common import (DATA, TINY_MODEL, ArgumentParser, args_to_json,
                          check_head_is_plain, check_out_dir, check_partial, check_ranges,
                          check_response_tokens, encode_sample, for_device, gold_logprob_entropy,
                          head_logits, line_indices, load_causal_lm, load_shards, load_tokenizer,
                          make_batches, output_head, partial_dir, pick_device, positive_or_auto,
                          print_profile_summary, run_main, save_shard, tokenizer_fingerprint,
                          write_artifact)
from cuset_common.cli import resolve_precision
from cuset_common.data_sources import add_data_arguments, data_checks, load_data
from cuset_common.cuda_source import (COMPARISON, code_view, device_functions, expr_edge, match_paren,
                                      outside_brackets)

STAGE = "01_profile"
CATEGORIES = {1: "signature", 2: "indexing", 3: "guard", 4: "shared_memory", 5: "synchronization",
              6: "warp_atomic", 7: "launch", 8: "memory_api", 9: "write_back"}
# A token that overlaps several categories gets the first of these (assumption): named CUDA
# lexemes (specific) before the structural patterns (broad), so `threadIdx` inside a guard
# `if (threadIdx.x < 32)` is indexing and the rest of the condition is guard.
PRIORITY = (5, 6, 4, 8, 1, 2, 7, 3, 9)
RESUME_MAY_CHANGE = {"resume", "log_every", "save_every"}  # arguments that do not change the result
# Per-token tensors of the artifact (all [T], flat over samples; sample_offsets int64 [S+1] delimits them).
TOKEN_DTYPES = {"token_ids": np.int32, "confidence": np.float32, "entropy": np.float16,
                "argmax_correct": np.uint8, "sensitive": np.uint8, "char_start": np.int32,
                "char_end": np.int32, "line_index": np.int32}


# ---------------------------------------------------------------------------------------
# CUDA-sensitivity tagger (docs/method.md "CUDA sensitivity", our reconstruction). All regexes run on the
# code view of the response (cuset_common.cuda_source.code_view), so a word in a comment is never tagged.
# ---------------------------------------------------------------------------------------

LEXEMES = {  # category -> regex over the code view; \b keeps `threads` or `index_count` untagged
    1: r"\b__(?:global|device|host|launch_bounds|restrict|forceinline|noinline)__\b|\b__restrict\b",
    2: r"\b(?:threadIdx|blockIdx|blockDim|gridDim)\b(?:\s*\.\s*[xyz]\b)?|\bwarpSize\b",
    4: r"\b(?:extern\s+)?__shared__\b",
    5: (r"\b(?:__syncthreads(?:_count|_and|_or)?|__syncwarp|__threadfence(?:_block|_system)?"
        r"|cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize)\b|\bcg::sync\b"
        r"|\.\s*sync\s*\(\s*\)"),
    6: (r"\b__shfl(?:_up|_down|_xor)?_sync\b|\b__(?:ballot|any|all|match_any|match_all)_sync\b"
        r"|\b__activemask\b|\batomic(?:Add|Sub|Max|Min|CAS|Exch|And|Or|Xor|Inc|Dec)(?:_block|_system)?\b"),
    7: r"<<<[^;]*?>>>|<<<|>>>|\bdim3\b",  # the whole launch configuration <<<grid, block, smem>>>
    8: r"\bcuda(?:Malloc|Memcpy|Free|Memset)\w*\b",
}
BUILTIN = re.compile(r"\b(?:threadIdx|blockIdx|blockDim|gridDim|warpSize)\b")
INT_TYPE = (r"(?:const\s+)?(?:unsigned\s+|signed\s+)?"
            r"(?:int|long\s+long|long|size_t|int64_t|uint64_t|int32_t|uint32_t|unsigned|auto)")
TOP, NO_PAREN = r"[^;{}(),]*", r"[^;{}()]*"
ASSIGN = re.compile(  # `int i = ...;`, `i += stride)` (for header), `a = ..., b = ...;`; 2 paren levels
    rf"(?:\b(?P<type>{INT_TYPE})\s+)?(?<![\w.\]>])(?P<name>[A-Za-z_]\w*)\s*(?P<op>[+\-*/%&|^]|<<|>>)?=(?!=)"
    rf"(?P<rhs>{TOP}(?:\({NO_PAREN}(?:\({NO_PAREN}\){NO_PAREN})*\){TOP})*)[;),]")
NON_INT_DECL = re.compile(r"\b(?:float|double|half|__half|__nv_bfloat16|bool|char|float[1-4]|double[1-4])\b"
                          r"[\s*&]*(?:const\s+|__restrict__\s+)*([A-Za-z_]\w*)")
CEIL_DIV = re.compile(r"\(\s*[\w.]+(?:\s*\*\s*[\w.]+)*\s*\+\s*([\w.]+)\s*(?:-\s*1\s*)?\)\s*/\s*([\w.]+)")
CONDITION = re.compile(r"\b(if|while|for)\s*\(")  # ternary conditions are found from their `?`
LEADING = re.compile(r"\s*(?:return\b)?\s*")  # what may precede a ?: condition in its expression
PTR_DECL = re.compile(  # `const float* __restrict__ xr = x + row * cols;`; const data: `const` before the *
    r"(?<![\w.>])(?P<c1>const\s+)?(?:unsigned\s+)?[A-Za-z_][\w:]*(?:\s*<[^;<>]*>)?(?P<c2>\s+const)?\s*"
    r"(?:\*\s*(?:(?:const|__restrict__|__restrict)\b)?\s*)+(?P<name>[A-Za-z_]\w*)\s*=(?!=)(?P<rhs>[^;]*);")
STORE_OP = re.compile(r"\s*(?:[+\-*/%&|^]|<<|>>)?=(?!=)")
CONSTANT = re.compile(  # an operand made of literals only (and warpSize, 32 on every GPU so far)
    r"(?:[\s()+\-*/%<>&|^~]|\bwarpSize\b|\b(?:0[xX][\da-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)[uUlLfF]*\b)*")


def index_assignments(body: str, params: str) -> tuple[set[str], list[tuple[int, int]]]:
    """Index variables of a function body and the spans of their assignments.

    An index variable is an integer computed from thread/block builtins, directly or through
    other index variables (idx -> row/col -> offset); a value read at an index (`v = x[i]`)
    or a variable declared float/bool/... is not one.
    """
    not_int = set(NON_INT_DECL.findall(params + "\n" + body))
    names: set[str] = set()
    for _ in range(4):  # a few rounds of derivation (idx -> row -> offset) reach the fixed point
        known, hits = set(names), []
        for a in ASSIGN.finditer(body):
            rhs = outside_brackets(a["rhs"])
            uses = (BUILTIN.search(rhs) or names & set(re.findall(r"\w+", rhs))
                    or (a["op"] and a["name"] in names))
            if uses and a["name"] not in not_int and (a["type"] or a["name"] in names
                                                      or BUILTIN.search(rhs)):
                names.add(a["name"])
                hits.append((a.start(), a.end() - (body[a.end() - 1] in "),")))  # not the `)`/`,` after it
        if names == known:
            break
    return names, hits


def pointers(body: str, params: str) -> tuple[set[str], set[str]]:
    """(all pointers, output pointers) of a function: its pointer parameters and the local pointers it
    declares (`float* yr = y + row * cols;`). Outputs: non-const pointer parameters, and local pointers
    to non-const data derived from an output (`yr` above, then `float* p = yr + 1`), in body order."""
    ptrs, outs = set(), set()
    for p in params.split(","):
        star, ident = p.find("*"), re.findall(r"[A-Za-z_]\w*", p)
        if star >= 0 and ident:
            ptrs.add(ident[-1])
            if "const" not in p[:star].split():
                outs.add(ident[-1])
    for d in PTR_DECL.finditer(body):
        ptrs.add(d["name"])
        if not (d["c1"] or d["c2"]) and outs & set(re.findall(r"\w+", d["rhs"])):
            outs.add(d["name"])
    return ptrs, outs


def pointer_offset_spans(body: str, ptrs: set[str], uses_index) -> list[tuple[int, int]]:
    """Pointer arithmetic with an index, in full: `x + row * cols` (up to where the operand ends),
    `y += offset`, and a whole pointer declaration whose initializer uses an index."""
    spans = [d.span() for d in PTR_DECL.finditer(body) if uses_index(d["rhs"])]
    if ptrs:
        alt = "|".join(map(re.escape, sorted(ptrs)))
        # not a member `s.x + 1`
        for p in re.finditer(rf"(?<!\.)(?<!->)\b(?:{alt})\s*[+-]=?(?![+\-=>])", body):
            end = expr_edge(body, p.end(), 1)
            if uses_index(body[p.end():end]):
                spans.append((p.start(), end))
    return spans


def conditions(body: str) -> list[tuple[bool, str, int, int]]:
    """(in a loop header, condition text, span start, span end) of each condition: if/while (span: the whole
    `if (...)`), a for-loop's test (span: the test) and a ?: condition, parenthesised or not (span: it)."""
    found = []
    for c in CONDITION.finditer(body):
        lo, hi = c.end(), match_paren(body, c.end() - 1) - 1  # condition text: body[lo:hi]
        if c.group(1) != "for":
            found.append((c.group(1) == "while", body[lo:hi], c.start(), hi + 1))
        elif body.count(";", lo, hi) == 2:
            test = body[lo:hi].split(";")[1]
            a = body.index(";", lo) + 1
            found.append((True, test, a, a + len(test)))
    for q in re.finditer(r"\?", body):
        a = LEADING.match(body, expr_edge(body, q.start() - 1, -1)).end()
        found.append((False, body[a:q.start()], a, a + len(body[a:q.start()].rstrip())))
    return found


def is_guard(cond: str, index: re.Pattern, in_loop_header: bool) -> bool:
    """The guard rule (docs/method.md "CUDA sensitivity", category 3; our reconstruction): a guard is a
    bounds check on an index.

    In an if or ?: condition: any comparison involving an index variable or builtin (which threads or
    elements act: `i < n`, `tid == 0`, `lane < 16`). In a loop header (for test, while condition): only a
    comparison bounding an index variable (or threadIdx/blockIdx) by a size, an operand that is not a
    constant (literals, warpSize). So the grid-stride test `i < n` is a guard, and a loop's own termination
    test is not: halving/doubling loops stop at constants (`s > 0`, `offset < 32`, `stride > 0`), counting
    loops run a plain counter, not an index (`k < K`).
    """
    cond = outside_brackets(cond)
    if not in_loop_header:
        return bool(COMPARISON.search(cond) and (index.search(cond) or BUILTIN.search(cond)))
    for part in re.split(r"&&|\|\|", cond):
        sides = COMPARISON.split(part, maxsplit=1)
        if len(sides) == 2 and any(index.search(a) and not CONSTANT.fullmatch(b)
                                   for a, b in (sides, sides[::-1])):
            return True
    return False


def write_back_spans(body: str, outs: set[str]) -> list[tuple[int, int]]:
    """Stores through an output pointer (`y[...] =`, `*y =`, `*(y + i) =`, compound assignments too)."""
    spans = []
    for w in re.finditer(r"\b([A-Za-z_]\w*)\s*\[", body):
        op = STORE_OP.match(body, match_paren(body, w.end() - 1, "[]"))
        if w.group(1) in outs and op and (w.start() == 0 or body[w.start() - 1] not in ".>"):
            spans.append((w.start(), op.end()))
    for d in re.finditer(r"\*\s*(\(\s*)?([A-Za-z_]\w*)", body):  # `*p =`, `*(p + i) =`, starting a statement
        if d.group(2) not in outs:
            continue
        op = STORE_OP.match(body, match_paren(body, d.start(1)) if d.group(1) else d.end())
        before = body[:d.start()].rstrip()
        if op and (not before or before[-1] in ";{}:)" or before.endswith("else")):
            spans.append((d.start(), op.end()))
    return spans


def structural_spans(code: str) -> dict[int, list[tuple[int, int]]]:
    """Character spans of the structural categories: index and pointer arithmetic, guards, grid arithmetic,
    write-back."""
    spans: dict[int, list[tuple[int, int]]] = {2: [], 3: [], 7: [], 9: []}
    for m in CEIL_DIV.finditer(code):  # (n + b - 1) / b, or (n + 255) / 256
        b, div = m.group(1), m.group(2)
        if b == div or (b.isdigit() and div.isdigit() and int(b) + 1 == int(div)):
            spans[7].append(m.span())
    for kind, params, lo, hi in device_functions(code):
        body = code[lo:hi]
        idx, assigns = index_assignments(body, params)
        index = re.compile(r"\b(?:" + "|".join(["threadIdx", "blockIdx", *map(re.escape, sorted(idx))])
                           + r")\b")
        ptrs, outs = pointers(body, params)
        found = {2: assigns + pointer_offset_spans(body, ptrs,
                                                   lambda e: index.search(e) or BUILTIN.search(e)),
                 3: [(a, b) for loop, cond, a, b in conditions(body) if is_guard(cond, index, loop)]
                 + ([r.span() for r in re.finditer(r"\breturn\s*;", body)] if kind == "global" else []),
                 9: write_back_spans(body, outs) if kind == "global" else []}
        for cat, sp in found.items():
            spans[cat] += [(lo + s, lo + e) for s, e in sp]
    return spans


def category_masks(text: str) -> dict[int, np.ndarray]:
    """Per category, a bool mask over the characters of `text` (True where a match covers it)."""
    code = code_view(text)
    masks = {c: np.zeros(len(text), dtype=bool) for c in CATEGORIES}
    for cat, pattern in LEXEMES.items():
        for m in re.finditer(pattern, code):
            masks[cat][m.start():m.end()] = True
    for cat, spans in structural_spans(code).items():
        for s, e in spans:
            masks[cat][s:e] = True
    return masks


def tag_tokens(text: str, spans: list[tuple[int, int]]) -> np.ndarray:
    """Category code (uint8 [T]) of each token span (start, end) in `text`: first overlapping in PRIORITY."""
    tags = np.zeros(len(spans), dtype=np.uint8)
    if not spans:
        return tags
    s = np.array([a for a, _ in spans], dtype=np.int64)  # [T]
    e = np.array([b for _, b in spans], dtype=np.int64)  # [T]
    for cat, mask in sorted(category_masks(text).items(), key=lambda kv: -PRIORITY.index(kv[0])):
        csum = np.concatenate([[0], np.cumsum(mask)])  # [len+1]; chars covered in [s, e) = csum[e] - csum[s]
        tags[csum[e] - csum[s] > 0] = cat  # later (higher-priority) categories overwrite
    return tags


# ---------------------------------------------------------------------------------------
# Profiling: teacher-forced gold-token log-probs without a [batch, seq, vocab] float32 tensor.
# ---------------------------------------------------------------------------------------


def encode_all(tokenizer, records: list[dict], max_length: int) -> list[dict]:
    """encode_sample for each record (shared with stage 03, so token positions agree)."""
    return [encode_sample(tokenizer, rec, max_length) for rec in records]


def room_needed(encs: list[dict]) -> int:
    """Bytes of the artifact (TOKEN_DTYPES per token; samples.jsonl, the response texts with JSON escapes,
    counted twice), plus the shards in <out>.partial (float32 confidence and entropy, uint8 argmax per
    token), which stay until the artifact is in place."""
    per_token = sum(np.dtype(d).itemsize for d in TOKEN_DTYPES.values()) + 4 + 4 + 1
    return (sum(len(e["spans"]) for e in encs) * per_token
            + 2 * sum(len(e["response_text"].encode()) for e in encs))


@torch.no_grad()
def score_batch(body, head, encs: list[dict], pad_id: int, device: str, chunk_rows: int,
                use_bf16: bool) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(confidence [n_i], entropy [n_i], argmax_correct [n_i] uint8) per sample of one right-padded batch."""
    lengths = [len(e["input_ids"]) for e in encs]
    ids = torch.full((len(encs), max(lengths)), pad_id, dtype=torch.long)  # [B, L]
    mask = torch.zeros_like(ids)  # [B, L]
    for b, e in enumerate(encs):
        ids[b, :lengths[b]] = torch.tensor(e["input_ids"])
        mask[b, :lengths[b]] = 1
    ids, mask = ids.to(device), mask.to(device)
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=use_bf16):
        hidden = body(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state  # [B, L, H]
    # position t predicts token t + 1: keep only the positions that predict response tokens
    rows_b = torch.cat([torch.full((lengths[b] - e["response_start"],), b)
                        for b, e in enumerate(encs)])  # [N]
    rows_t = torch.cat([torch.arange(e["response_start"] - 1, lengths[b] - 1)
                        for b, e in enumerate(encs)])  # [N]
    rows_b, rows_t = rows_b.to(device), rows_t.to(device)
    logp, ent, ok = gold_logprob_entropy(head, hidden[rows_b, rows_t], ids[rows_b, rows_t + 1],
                                         chunk_rows, use_bf16)
    conf, ent, ok = logp.exp().cpu().numpy(), ent.cpu().numpy(), ok.cpu().numpy().astype(np.uint8)
    cuts = np.cumsum([0] + [lengths[b] - e["response_start"] for b, e in enumerate(encs)])
    return [(conf[cuts[b]:cuts[b + 1]], ent[cuts[b]:cuts[b + 1]], ok[cuts[b]:cuts[b + 1]])
            for b in range(len(encs))]


def profile(model, tokenizer, encs: list[dict], args: argparse.Namespace, device: str, use_bf16: bool,
            run: dict) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], int]:
    """Confidence, entropy and argmax_correct per sample (data order; no response tokens: empty arrays), and
    the batch it resumed at. Finished batches go to <out>.partial/ every --save-every seconds."""
    weight, bias = output_head(model)
    body, head = model.base_model, lambda h: head_logits(h, weight, bias)  # what check_head_is_plain checks
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # masked; any id works
    # deterministic (resume needs the same plan; the device is part of the run, so auto resolves alike)
    batches = make_batches(encs, for_device("batch_size", args.batch_size, device), args.batch_tokens)
    chunk_rows = for_device("chunk_rows", args.chunk_rows, device)
    if batches:
        check_head_is_plain(model, torch.tensor([encs[batches[0][0]]["input_ids"]], device=device),
                            "01_profile.py")
    results = [(np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, np.uint8)) for _ in encs]
    partial = partial_dir(args.out)
    start = load_shards(partial, batches, encs, results) if args.resume else 0
    # tokens per batch, padding excluded
    sizes = [sum(len(encs[i]["input_ids"]) for i in b) for b in batches]
    done0, total = sum(sizes[:start]), sum(sizes)
    if start:
        print(f"[profile] resuming at batch {start + 1}/{len(batches)}: {done0}/{total} tokens done",
              flush=True)
    done, unsaved, t0 = done0, start, time.time()
    last_log = last_save = t0
    for k in range(start, len(batches)):
        for i, res in zip(batches[k], score_batch(body, head, [encs[i] for i in batches[k]], pad_id, device,
                                                  chunk_rows, use_bf16)):
            results[i] = res
        done += sizes[k]
        if time.time() - last_log >= args.log_every or k == len(batches) - 1:
            rate = (done - done0) / max(time.time() - t0, 1e-9)
            eta = (total - done) / max(rate, 1e-9)
            print(f"[profile] batch {k + 1}/{len(batches)}  {done}/{total} tokens  {rate:,.0f} tok/s  "
                  f"ETA {eta // 60:.0f}m{eta % 60:02.0f}s"
                  + (f"  (resumed at batch {start + 1})" if start else ""), flush=True)
            last_log = time.time()
        if time.time() - last_save >= args.save_every and k < len(batches) - 1:
            save_shard(partial, run, batches, unsaved, k + 1, results)
            unsaved, last_save = k + 1, time.time()
    return results, start


def build_artifact(records, encs, results) -> tuple[dict[str, np.ndarray], list[dict], dict]:
    """Flat tensors over all response tokens (data order), per-sample records and counts."""
    cols: dict[str, list] = {k: [] for k in TOKEN_DTYPES}
    samples, offsets = [], [0]
    for i, (rec, enc, (conf, ent, ok)) in enumerate(zip(records, encs, results)):
        spans = enc["spans"]
        starts = [s for s, _ in spans]
        cols["token_ids"].append(np.asarray(enc["input_ids"][enc["response_start"]:], dtype=np.int32))
        cols["confidence"].append(conf.astype(np.float32))
        cols["entropy"].append(ent.astype(np.float16))
        cols["argmax_correct"].append(ok.astype(np.uint8))
        cols["sensitive"].append(tag_tokens(enc["response_text"], spans))
        cols["char_start"].append(np.asarray(starts, dtype=np.int32))
        cols["char_end"].append(np.asarray([e for _, e in spans], dtype=np.int32))
        cols["line_index"].append(np.asarray(line_indices(enc["response_text"], starts), dtype=np.int32))
        offsets.append(offsets[-1] + len(spans))
        samples.append({"index": i, "id": rec["id"], "line": rec["line"],
                        "response_text": enc["response_text"], "n_prompt_tokens": enc["response_start"],
                        "n_response_tokens": len(spans), "truncated": bool(enc["truncated"])})
    tensors = {k: np.concatenate(v).astype(TOKEN_DTYPES[k]) for k, v in cols.items()}  # each [T]
    tensors["sample_offsets"] = np.asarray(offsets, dtype=np.int64)
    counts = {"samples": len(samples), "response_tokens": int(offsets[-1]),
              "truncated": sum(s["truncated"] for s in samples),
              "no_response": sum(s["n_response_tokens"] == 0 for s in samples)}
    return tensors, samples, counts


# ---------------------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=str, default=str(TINY_MODEL),
                    help="hub id or local folder (%(default)s)")
    add_data_arguments(ap, "SFT data to profile")
    ap.add_argument("--out", type=Path, default=DATA / "artifacts" / "profile", help="artifact folder")
    ap.add_argument("--max-length", type=int, default=2048,
                    help="tokens per sample, prompt included; longer samples are truncated and counted")
    ap.add_argument("--batch-size", type=positive_or_auto, default="auto",
                    help="most samples per batch; auto: 1 on a CPU, 8 on a GPU (see Efficiency above)")
    ap.add_argument("--batch-tokens", type=int, default=16384,
                    help="most padded tokens per batch (fewer samples per batch when they are long)")
    ap.add_argument("--chunk-rows", type=positive_or_auto, default="auto",
                    help="positions per lm_head chunk: only a [rows, vocab] block of logits exists at a "
                         "time; auto: 128 on a CPU, 1024 on a GPU")
    ap.add_argument("--device", type=str, default="auto", help="auto, cpu, cuda, cuda:1, ...")
    ap.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                    help="bf16: the model body and head under bf16 autocast, log-probs in float32; auto: bf16 "
                         "where the device computes it natively (a GPU, or a CPU with AVX512-BF16 or AMX), "
                         "else fp32")
    ap.add_argument("--log-every", type=float, default=10.0, help="seconds between progress lines")
    ap.add_argument("--save-every", type=float, default=60.0,
                    help="seconds between partial-result shards in <out>.partial/ (0: after every batch)")
    ap.add_argument("--resume", action="store_true", help="continue a killed run from <out>.partial/")
    args = ap.parse_args(argv)
    check_ranges(ap, args, {"max_length": "[1, inf)", "batch_tokens": "[1, inf)", "log_every": "[0, inf)",
                            "save_every": "[0, inf)"})
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    records, data_id = load_data(args)  # bad row or mapping -> UserError naming file and row, before any work
    device = pick_device(args.device)
    use_bf16 = resolve_precision(args.precision, device) == "bf16"
    tokenizer = load_tokenizer(args.model)  # one-line UserError for a missing folder or one without a model
    encs = encode_all(tokenizer, records, args.max_length)
    check_response_tokens(encs, args)
    check_out_dir(args.out, STAGE, {"--data": args.data, "--model": Path(args.model)}, None,
                  room_needed(encs))
    # what must not change between a killed run and its --resume (the result depends on all of it)
    run = {"args": args_to_json(args), **data_checks(data_id), "device": device,
           "precision": "bf16-autocast" if use_bf16 else "fp32",
           "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer)}
    check_partial(partial_dir(args.out), run, args.resume, RESUME_MAY_CHANGE)
    model = load_causal_lm(args.model, torch.float32).to(device).eval()
    print(f"[profile] {len(records)} samples from {args.data}; model {args.model} on {device} "
          f"({'bf16 autocast' if use_bf16 else 'fp32'}); chat template: {bool(tokenizer.chat_template)}",
          flush=True)

    results, resumed_at = profile(model, tokenizer, encs, args, device, use_bf16, run)
    tensors, samples, counts = build_artifact(records, encs, results)

    meta = {"stage": STAGE, "args": run["args"], "model": args.model,
            "tokenizer_fingerprint": run["tokenizer_fingerprint"],
            "data": data_id, "max_length": args.max_length,
            "counts": counts, "categories": {str(k): v for k, v in CATEGORIES.items()},
            "chat_template": bool(tokenizer.chat_template),
            "category_priority": [CATEGORIES[c] for c in PRIORITY], "device": device,
            "precision": run["precision"], "batch_size": for_device("batch_size", args.batch_size, device),
            "chunk_rows": for_device("chunk_rows", args.chunk_rows, device), "resumed_at_batch": resumed_at}
    samples_text = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples)
    write_artifact(args.out, tensors, meta, extra_files={"samples.jsonl": samples_text})
    shutil.rmtree(partial_dir(args.out), ignore_errors=True)  # only once the artifact is in place
    print_profile_summary(tensors, counts, args.out, CATEGORIES)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
