"""Stage 01: profile a base model on SFT data, token by token, and tag CUDA-sensitive tokens.

For every response token of every sample: the probability of the gold token under teacher
forcing (its "confidence"), the entropy of the predicted distribution, and the token's
CUDA-sensitivity category (DESIGN.md "CUDA sensitivity"; codes 1..9, 0 = none). Stage 02
turns these into low-confidence CUDA-sensitive regions and sample weights.

Inputs -> outputs
  --model  hub id or local folder (default: bundled data/models/tiny-cuda-lm); needs a fast tokenizer
  --data   SFT JSONL in chat `messages`, `prompt`/`completion`, `instruction`/`input`/`output` or
           `text` form (default: bundled data/sft/train.jsonl)
  -> --out (default data/artifacts/profile), written atomically with cuset_common.write_artifact:
     tensors.safetensors  flat over the response tokens of all samples, in data order:
                          token_ids int32 [T], confidence float32 [T], entropy float16 [T] (nats),
                          sensitive uint8 [T], char_start/char_end int32 [T] (span in the response
                          text), line_index int32 [T] (0-based line of char_start), sample_offsets int64 [S+1]
     samples.jsonl        per sample: index, id, line, response_text, n_prompt_tokens,
                          n_response_tokens, truncated
     meta.json            stage, args, model, tokenizer_fingerprint, data {path, sha256}, max_length,
                          counts {samples, response_tokens, truncated, no_response}, categories

Commands
  python 01_profile.py                                   # tiny model + bundled data, CPU, seconds
  python 01_profile.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --data my_sft.jsonl --max-length 4096
  python 01_profile.py --help

Tokenization is the one every stage uses (cuset_common.encode_sample): the tokenizer's chat
template when it has one, else cuset_common.PLAIN_PROMPT_TEMPLATE; prompt and response are
tokenized separately and only response tokens are profiled (the response includes the
template's end-of-turn token). A sample longer than --max-length loses its tail and is counted
as truncated; one whose prompt alone fills --max-length is kept with 0 tokens (no_response;
it is counted as truncated too).
In the `text` form there is no prompt, so the first token only serves as context (assumption:
nothing predicts it; n_prompt_tokens = 1).

Efficiency: samples are batched longest first (little padding); the model body runs once per
batch (bf16 autocast on a GPU) and lm_head is applied to the response positions only, --chunk-rows
at a time, with log-softmax of the gold token and the entropy per chunk, so a float32
[batch, seq, vocab] logits tensor never exists (real vocabularies exceed 150k).
Tagging: regexes over the response text with prose outside ``` fences, comments and literals
blanked; a token gets the first category in PRIORITY whose matches its character span overlaps.
"""
from __future__ import annotations

import argparse
import bisect
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

from cuset_common import (DATA, SFT_FILE, TINY_MODEL, UserError, encode_sample, load_sft, pick_device,
                          run_main, sha256_file, tokenizer_fingerprint, write_artifact)

STAGE = "01_profile"
CATEGORIES = {1: "signature", 2: "indexing", 3: "guard", 4: "shared_memory", 5: "synchronization",
              6: "warp_atomic", 7: "launch", 8: "memory_api", 9: "write_back"}
# A token that overlaps several categories gets the first of these (assumption): named CUDA
# lexemes (specific) before the structural patterns (broad), so `threadIdx` inside a guard
# `if (threadIdx.x < 32)` is indexing and the rest of the condition is guard.
PRIORITY = (5, 6, 4, 8, 1, 2, 7, 3, 9)
# Per-token tensors of the artifact (all [T], flat over samples; sample_offsets int64 [S+1] delimits them).
TOKEN_DTYPES = {"token_ids": np.int32, "confidence": np.float32, "entropy": np.float16, "sensitive": np.uint8,
                "char_start": np.int32, "char_end": np.int32, "line_index": np.int32}


# ---------------------------------------------------------------------------------------
# CUDA-sensitivity tagger (DESIGN.md "CUDA sensitivity", our reconstruction). All regexes run
# on a "code view" of the response: same length, but prose outside ``` fences, comments and
# string/char literals blanked to spaces, so a word in a comment is never tagged.
# ---------------------------------------------------------------------------------------

LEXEMES = {  # category -> regex over the code view; \b keeps `threads` or `index_count` untagged
    1: r"\b__(?:global|device|host|launch_bounds|restrict|forceinline|noinline)__\b|\b__restrict\b",
    2: r"\b(?:threadIdx|blockIdx|blockDim|gridDim)\b(?:\s*\.\s*[xyz]\b)?|\bwarpSize\b",
    4: r"\b(?:extern\s+)?__shared__\b",
    5: (r"\b(?:__syncthreads(?:_count|_and|_or)?|__syncwarp|__threadfence(?:_block|_system)?"
        r"|cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize)\b|\bcg::sync\b|\.\s*sync\s*\(\s*\)"),
    6: (r"\b__shfl(?:_up|_down|_xor)?_sync\b|\b__(?:ballot|any|all|match_any|match_all)_sync\b|\b__activemask\b"
        r"|\batomic(?:Add|Sub|Max|Min|CAS|Exch|And|Or|Xor|Inc|Dec)(?:_block|_system)?\b"),
    7: r"<<<[^;]*?>>>|<<<|>>>|\bdim3\b",  # the whole launch configuration <<<grid, block, smem>>>
    8: r"\bcuda(?:Malloc|Memcpy|Free|Memset)\w*\b",
}
BUILTIN = re.compile(r"\b(?:threadIdx|blockIdx|blockDim|gridDim|warpSize)\b")
INT_TYPE = (r"(?:const\s+)?(?:unsigned\s+|signed\s+)?"
            r"(?:int|long\s+long|long|size_t|int64_t|uint64_t|int32_t|uint32_t|unsigned|auto)")
TOP, NO_PAREN = r"[^;{}(),]*", r"[^;{}()]*"
ASSIGN = re.compile(  # `int i = ...;`, `i += stride)` ending a for header, `a = ..., b = ...;`; 2 paren levels
    rf"(?:\b(?P<type>{INT_TYPE})\s+)?(?<![\w.\]>])(?P<name>[A-Za-z_]\w*)\s*(?P<op>[+\-*/%&|^]|<<|>>)?=(?!=)"
    rf"(?P<rhs>{TOP}(?:\({NO_PAREN}(?:\({NO_PAREN}\){NO_PAREN})*\){TOP})*)[;),]")
NON_INT_DECL = re.compile(r"\b(?:float|double|half|__half|__nv_bfloat16|bool|char|float[1-4]|double[1-4])\b"
                          r"[\s*&]*(?:const\s+|__restrict__\s+)*([A-Za-z_]\w*)")
CEIL_DIV = re.compile(r"\(\s*[\w.]+(?:\s*\*\s*[\w.]+)*\s*\+\s*([\w.]+)\s*(?:-\s*1\s*)?\)\s*/\s*([\w.]+)")
FUNC_HEAD, BEFORE_BODY = re.compile(r"\b__(global|device)__\b"), re.compile(r"[^;{]*")
CONDITION = re.compile(r"\b(if|while|for)\s*\(|\((?=[^()]*\)\s*\?)")  # ... and `(cond) ? a : b`
STORE_OP = re.compile(r"\s*(?:[+\-*/%&|^]|<<|>>)?=(?!=)")
LITERAL = re.compile(r"//[^\n]*|/\*.*?(?:\*/|\Z)|\"(?:\\.|[^\"\\\n])*\"?|(?<!\w)'(?:\\.|[^'\\\n]){1,4}'", re.S)
BLANK = re.compile(r"[^\n]")  # blanking keeps newlines, so offsets and line numbers stay valid
COMPARISON = re.compile(r"<=|>=|==|!=|(?<![<>\-])[<>](?![<>=])")


def outside_brackets(expr: str) -> str:
    """expr without the contents of [...]: `x[i] > 0` compares a value, not the index i."""
    return re.sub(r"\[[^\[\]]*\]", "[]", re.sub(r"\[[^\[\]]*\]", "[]", expr))


def code_view(text: str) -> str:
    """`text` with prose outside ``` fences, comments and string/char literals replaced by spaces."""
    lines = text.splitlines(keepends=True)
    if "```" in text:  # a markdown answer: only the fenced blocks are code (the fence lines are not)
        in_code = False
        for k, line in enumerate(lines):
            fence = line.lstrip().startswith("```")
            if fence or not in_code:
                lines[k] = BLANK.sub(" ", line)
            in_code ^= fence
    # one left-to-right scan, so a quote inside a comment (or // inside a string) is not misread
    return LITERAL.sub(lambda m: BLANK.sub(" ", m.group()), "".join(lines))


def match_paren(code: str, open_pos: int, pair: str = "()") -> int:
    """Index just past the bracket that closes the one at open_pos (len(code) if unclosed)."""
    depth = 0
    for j in range(open_pos, len(code)):
        depth += (code[j] == pair[0]) - (code[j] == pair[1])
        if depth == 0:
            return j + 1
    return len(code)


def device_functions(code: str) -> list[tuple[str, str, int, int]]:
    """(qualifier 'global'/'device', parameter text, body start, body end) of each defined function."""
    funcs = []
    for m in FUNC_HEAD.finditer(code):
        for name in re.finditer(r"\b(\w+)\s*\(", code[m.end():]):
            if name.group(1) not in ("__launch_bounds__", "__align__"):
                break
        else:
            continue
        p_open = m.end() + name.end() - 1
        if re.search(r"[;{}]", code[m.end():p_open]):  # a __device__ variable, not a function
            continue
        p_close = match_paren(code, p_open)
        nxt = BEFORE_BODY.match(code, p_close).end()  # skip `const`, trailing attributes
        if nxt < len(code) and code[nxt] == "{":  # a definition, not a declaration
            funcs.append((m.group(1), code[p_open + 1:p_close - 1], nxt, match_paren(code, nxt, "{}")))
    return funcs


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
            uses = BUILTIN.search(rhs) or names & set(re.findall(r"\w+", rhs)) or (a["op"] and a["name"] in names)
            if uses and a["name"] not in not_int and (a["type"] or a["name"] in names or BUILTIN.search(rhs)):
                names.add(a["name"])
                hits.append((a.start(), a.end() - (body[a.end() - 1] in "),")))  # not the `)` or `,` after it
        if names == known:
            break
    return names, hits


def output_pointers(params: str) -> set[str]:
    """Names of the kernel's pointer parameters whose data is not const (its outputs)."""
    outs = set()
    for p in params.split(","):
        star = p.find("*")
        ident = re.findall(r"[A-Za-z_]\w*", p)
        if star >= 0 and ident and "const" not in p[:star].split():
            outs.add(ident[-1])
    return outs


def guard_spans(body: str, idx: set[str], is_kernel: bool) -> list[tuple[int, int]]:
    """Bounds checks: if/while/ternary conditions and for-loop tests comparing an index variable or
    builtin (the whole `if (...)`, only the test of a `for`), plus early `return;` in kernels."""
    idx_re = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(idx))) + r")\b") if idx else BUILTIN
    spans = []
    for c in CONDITION.finditer(body):
        lo, hi = c.end(), match_paren(body, c.end() - 1) - 1  # condition text: body[lo:hi]
        start, end = c.start(), hi + 1
        if c.group(1) == "for":
            parts = body[lo:hi].split(";")
            if len(parts) != 3:
                continue
            lo += len(parts[0]) + 1
            start, end = lo, lo + len(parts[1])
            hi = end
        cond = outside_brackets(body[lo:hi])
        if COMPARISON.search(cond) and (idx_re.search(cond) or BUILTIN.search(cond)):
            spans.append((start, end))
    return spans + ([r.span() for r in re.finditer(r"\breturn\s*;", body)] if is_kernel else [])


def write_back_spans(body: str, params: str) -> list[tuple[int, int]]:
    """Stores `out[...] =` (any compound assignment too) to a non-const pointer parameter of a kernel."""
    outs, spans = output_pointers(params), []
    for w in re.finditer(r"\b([A-Za-z_]\w*)\s*\[", body):
        op = STORE_OP.match(body, match_paren(body, w.end() - 1, "[]"))
        if w.group(1) in outs and op and (w.start() == 0 or body[w.start() - 1] not in ".>"):
            spans.append((w.start(), op.end()))
    return spans


def structural_spans(code: str) -> dict[int, list[tuple[int, int]]]:
    """Character spans of the structural categories: index assignments, guards, grid arithmetic, write-back."""
    spans: dict[int, list[tuple[int, int]]] = {2: [], 3: [], 7: [], 9: []}
    for m in CEIL_DIV.finditer(code):  # (n + b - 1) / b, or (n + 255) / 256
        b, div = m.group(1), m.group(2)
        if b == div or (b.isdigit() and div.isdigit() and int(b) + 1 == int(div)):
            spans[7].append(m.span())
    for kind, params, lo, hi in device_functions(code):
        body = code[lo:hi]
        idx, assigns = index_assignments(body, params)
        spans[2] += [(lo + s, lo + e) for s, e in assigns]
        spans[3] += [(lo + s, lo + e) for s, e in guard_spans(body, idx, kind == "global")]
        if kind == "global":
            spans[9] += [(lo + s, lo + e) for s, e in write_back_spans(body, params)]
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
    """Category code (uint8 [T]) of each token span (start, end) in `text`: first overlapping one in PRIORITY."""
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=str, default=str(TINY_MODEL), help="hub id or local folder (%(default)s)")
    ap.add_argument("--data", type=Path, default=SFT_FILE, help="SFT JSONL file (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=DATA / "artifacts" / "profile", help="artifact folder")
    ap.add_argument("--max-length", type=int, default=2048,
                    help="tokens per sample, prompt included; longer samples are truncated and counted")
    ap.add_argument("--batch-size", type=int, default=8, help="most samples per batch")
    ap.add_argument("--batch-tokens", type=int, default=16384,
                    help="most padded tokens per batch (fewer samples per batch when they are long)")
    ap.add_argument("--chunk-rows", type=int, default=1024,
                    help="positions per lm_head chunk: only a [rows, vocab] block of logits exists at a time")
    ap.add_argument("--device", type=str, default="auto", help="auto, cpu, cuda, cuda:1, ...")
    ap.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                    help="auto: bf16 autocast on a GPU, fp32 on CPU")
    ap.add_argument("--log-every", type=float, default=10.0, help="seconds between progress lines")
    args = ap.parse_args(argv)
    for name in ("max_length", "batch_size", "batch_tokens", "chunk_rows"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def load_model(name: str, device: str):
    """Tokenizer (must be fast: we need character offsets) and the float32 model in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise UserError(f"--model {name}: cannot load it ({e})") from None
    if not tokenizer.is_fast:
        raise UserError(f"--model {name}: its tokenizer is not a fast tokenizer; character offsets are needed")
    return tokenizer, model.to(device).eval()


def encode_all(tokenizer, records: list[dict], max_length: int) -> list[dict]:
    """encode_sample for each record (shared with stage 03, so token positions agree)."""
    return [encode_sample(tokenizer, rec, max_length) for rec in records]


def make_batches(encs: list[dict], batch_size: int, batch_tokens: int) -> list[list[int]]:
    """Sample indices grouped longest first (little padding; an out-of-memory shows at once)."""
    order = sorted((i for i, e in enumerate(encs) if e["spans"]), key=lambda i: -len(encs[i]["input_ids"]))
    batches, pos = [], 0
    while pos < len(order):
        size = max(1, min(batch_size, batch_tokens // len(encs[order[pos]]["input_ids"])))
        batches.append(order[pos:pos + size])
        pos += size
    return batches


def gold_logprob_entropy(head, hidden: torch.Tensor, gold: torch.Tensor, chunk_rows: int,
                         use_bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(gold) and entropy per row of hidden [N, H], applying head chunk by chunk.

    Only a [chunk_rows, vocab] block of logits exists at a time; it is upcast to float32
    before log_softmax so the gold log-prob is exact up to the body's precision.
    """
    logp_gold, entropy = [], []
    for lo in range(0, hidden.shape[0], chunk_rows):
        with torch.autocast(device_type=hidden.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = head(hidden[lo:lo + chunk_rows])  # [n, V]
        logp = torch.log_softmax(logits.float(), dim=-1)  # [n, V] float32
        logp_gold.append(logp.gather(1, gold[lo:lo + chunk_rows, None])[:, 0])  # [n]
        entropy.append(torch.special.entr(logp.exp()).sum(-1))  # [n]; entr(0) = 0, no 0 * -inf
    return torch.cat(logp_gold), torch.cat(entropy)


@torch.no_grad()
def score_batch(body, head, encs: list[dict], pad_id: int, device: str, chunk_rows: int,
                use_bf16: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """(confidence [n_i], entropy [n_i]) for each sample of one right-padded batch."""
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
    rows_b = torch.cat([torch.full((lengths[b] - e["response_start"],), b) for b, e in enumerate(encs)])  # [N]
    rows_t = torch.cat([torch.arange(e["response_start"] - 1, lengths[b] - 1) for b, e in enumerate(encs)])  # [N]
    rows_b, rows_t = rows_b.to(device), rows_t.to(device)
    logp, ent = gold_logprob_entropy(head, hidden[rows_b, rows_t], ids[rows_b, rows_t + 1], chunk_rows, use_bf16)
    conf, ent = logp.exp().cpu().numpy(), ent.cpu().numpy()
    cuts = np.cumsum([0] + [lengths[b] - e["response_start"] for b, e in enumerate(encs)])
    return [(conf[cuts[b]:cuts[b + 1]], ent[cuts[b]:cuts[b + 1]]) for b in range(len(encs))]


@torch.no_grad()
def check_head_is_plain(model, body, head, enc: dict, device: str) -> None:
    """Refuse models whose logits are not lm_head(last hidden state) (e.g. soft-capped): compare once, fp32."""
    ids = torch.tensor([enc["input_ids"][:64]], device=device)  # [1, <=64]
    ref = torch.log_softmax(model(input_ids=ids, use_cache=False).logits.float()[0, :-1], dim=-1)  # [L-1, V]
    hidden = body(input_ids=ids, use_cache=False).last_hidden_state[0, :-1]  # [L-1, H]
    ours, _ = gold_logprob_entropy(head, hidden, ids[0, 1:], 1024, False)
    err = (ours.exp() - ref.gather(1, ids[0, 1:, None])[:, 0].exp()).abs().max().item() if len(ours) else 0.0
    if err > 1e-4:
        raise UserError(f"this model's logits are not lm_head(last hidden state) (gold probabilities differ by "
                        f"up to {err:.2g}); 01_profile.py does not support its output head")


def profile(model, tokenizer, encs: list[dict], args: argparse.Namespace, device: str,
            use_bf16: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Confidence and entropy per sample (data order); samples without response tokens get empty arrays."""
    body, head = getattr(model, model.base_model_prefix), model.get_output_embeddings()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # masked; any id works
    batches = make_batches(encs, args.batch_size, args.batch_tokens)
    if batches:
        check_head_is_plain(model, body, head, encs[batches[-1][-1]], device)
    results = [(np.zeros(0, np.float32), np.zeros(0, np.float32)) for _ in encs]
    total = sum(len(encs[i]["input_ids"]) for b in batches for i in b)
    done, t0, last_log = 0, time.time(), time.time()
    for k, batch in enumerate(batches):
        for i, res in zip(batch, score_batch(body, head, [encs[i] for i in batch], pad_id, device,
                                             args.chunk_rows, use_bf16)):
            results[i] = res
        done += sum(len(encs[i]["input_ids"]) for i in batch)
        if time.time() - last_log >= args.log_every or k == len(batches) - 1:
            rate = done / max(time.time() - t0, 1e-9)
            eta = (total - done) / max(rate, 1e-9)
            print(f"[profile] batch {k + 1}/{len(batches)}  {done}/{total} tokens  {rate:,.0f} tok/s  "
                  f"ETA {eta // 60:.0f}m{eta % 60:02.0f}s", flush=True)
            last_log = time.time()
    return results


def line_indices(text: str, starts: list[int]) -> list[int]:
    """0-based line number of each character offset in text."""
    newlines = [i for i, c in enumerate(text) if c == "\n"]
    return [bisect.bisect_left(newlines, s) for s in starts]


def build_artifact(records, encs, results) -> tuple[dict[str, np.ndarray], list[dict], dict]:
    """Flat tensors over all response tokens (data order), per-sample records and counts."""
    cols: dict[str, list] = {k: [] for k in TOKEN_DTYPES}
    samples, offsets = [], [0]
    for i, (rec, enc, (conf, ent)) in enumerate(zip(records, encs, results)):
        spans = enc["spans"]
        starts = [s for s, _ in spans]
        cols["token_ids"].append(np.asarray(enc["input_ids"][enc["response_start"]:], dtype=np.int32))
        cols["confidence"].append(conf.astype(np.float32))
        cols["entropy"].append(ent.astype(np.float16))
        cols["sensitive"].append(tag_tokens(enc["response_text"], spans))
        cols["char_start"].append(np.asarray(starts, dtype=np.int32))
        cols["char_end"].append(np.asarray([e for _, e in spans], dtype=np.int32))
        cols["line_index"].append(np.asarray(line_indices(enc["response_text"], starts), dtype=np.int32))
        offsets.append(offsets[-1] + len(spans))
        samples.append({"index": i, "id": rec["id"], "line": rec["line"], "response_text": enc["response_text"],
                        "n_prompt_tokens": enc["response_start"], "n_response_tokens": len(spans),
                        "truncated": bool(enc["truncated"])})
    tensors = {k: np.concatenate(v).astype(TOKEN_DTYPES[k]) for k, v in cols.items()}  # each [T]
    tensors["sample_offsets"] = np.asarray(offsets, dtype=np.int64)
    counts = {"samples": len(samples), "response_tokens": int(offsets[-1]),
              "truncated": sum(s["truncated"] for s in samples),
              "no_response": sum(s["n_response_tokens"] == 0 for s in samples)}
    return tensors, samples, counts


def print_summary(tensors: dict[str, np.ndarray], counts: dict, out: Path) -> None:
    conf, sens = tensors["confidence"], tensors["sensitive"]
    print(f"[profile] {counts['samples']} samples, {counts['response_tokens']} response tokens, "
          f"{counts['truncated']} truncated, {counts['no_response']} without response tokens")
    if len(conf):
        entropy = tensors["entropy"].astype(np.float32).mean()
        print(f"[profile] mean confidence {conf.mean():.3f}, mean entropy {entropy:.3f} nats, "
              f"CUDA-sensitive {(sens > 0).mean():.1%} of tokens")
    for code, name in CATEGORIES.items():
        sel = sens == code
        if sel.any():
            print(f"  {code} {name:<16} {sel.sum():>7} tokens  mean confidence {conf[sel].mean():.3f}")
    print(f"[profile] wrote {out}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    records = load_sft(args.data)  # bad line -> UserError with file:line, before any model work
    data_sha = sha256_file(args.data)
    device = pick_device(args.device)
    use_bf16 = args.precision == "bf16" or (args.precision == "auto" and device.startswith("cuda"))
    tokenizer, model = load_model(args.model, device)
    print(f"[profile] {len(records)} samples from {args.data}; model {args.model} on {device} "
          f"({'bf16 autocast' if use_bf16 else 'fp32'}); chat template: {bool(tokenizer.chat_template)}",
          flush=True)

    encs = encode_all(tokenizer, records, args.max_length)
    results = profile(model, tokenizer, encs, args, device, use_bf16)
    tensors, samples, counts = build_artifact(records, encs, results)

    meta = {"stage": STAGE, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "model": args.model, "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "data": {"path": str(args.data), "sha256": data_sha}, "max_length": args.max_length,
            "counts": counts, "categories": {str(k): v for k, v in CATEGORIES.items()},
            "category_priority": [CATEGORIES[c] for c in PRIORITY], "chat_template": bool(tokenizer.chat_template),
            "device": device, "precision": "bf16-autocast" if use_bf16 else "fp32"}
    samples_text = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples)
    write_artifact(args.out, tensors, meta, extra_files={"samples.jsonl": samples_text})
    print_summary(tensors, counts, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
