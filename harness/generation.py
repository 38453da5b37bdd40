"""Stage 04's generation, apart from the protocol in 04_eval_kernels.py: a hand-written batched decoding
loop with a KV cache, the model's chat template and the prompts of cuset_common.build_messages (the SFT
data's wording). Each sequence stops at the end of its turn, once its reply is complete (what is
complete, the protocol says) or once it loops (greedy decoding of a small model repeats a line or a word
until max_new_tokens), and a stopped sequence leaves the batch at once. HF generate() keeps every
sequence to the end of the batch's longest: on real replies that is most of the work (docs/performance.md).
A batch's tokens and their rate show while it runs (a batch of long answers takes minutes on a CPU).

What both engines share lives here: the prompts as token ids (prompt_ids: vLLM gets these ids, never text,
so the tokenization is ours), the stop rules (stop_rules), the per-prompt sampling seeds and the record
of what a generation took (generation_record); harness/vllm_generation.py is the other engine.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import inspect
import math
import os
import time
from collections.abc import Callable

import torch
import transformers

from cuset_common.data import end_of_turn_ids, render_prompt_and_response
from cuset_common.device import pick_device, resolve_precision
from cuset_common.models import load_causal_lm, load_tokenizer
from cuset_common.tasks import build_messages


def generate(
    args, tasks_by_id: dict, jobs: list[tuple], complete: Callable[[str], bool], progress, on_batch
) -> dict:
    """Replies for `jobs` ((task id, level, sample)), --gen-batch-size prompts per batch, each prompt's
    --num-samples samples (greedy at --temperature 0: one reply, every sample's). on_batch({job: reply}) is
    called as each batch finishes, so a kill loses one batch. Returns the generation record
    (generation_record), once the model and its KV cache are freed (release_memory): the kernels are judged
    next, on the same GPU. Torch's thread count is set for the call and put back after it: a caller in the
    same process (a test, a bench) computes on with its own, bit for bit as before."""
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads or default_threads())
    try:
        return generate_batches(args, tasks_by_id, jobs, complete, progress, on_batch)
    finally:
        torch.set_num_threads(previous)
        release_memory()


def release_memory() -> None:
    """Free the model and KV cache of a generation that has returned: a transformers model holds reference
    cycles, so dropping the last name of it frees nothing until the garbage collector runs; then hand
    torch's cached GPU blocks back to the driver (a no-op where CUDA never started)."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def generate_batches(
    args, tasks_by_id: dict, jobs: list[tuple], complete: Callable[[str], bool], progress, on_batch
) -> dict:
    """generate()'s work, at the thread count it set."""
    device = pick_device(args.device)
    precision = resolve_precision(args.precision, device)
    started = time.perf_counter()
    tok = load_tokenizer(args.model, need_offsets=False, padding_side="left")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = load_causal_lm(args.model, torch.bfloat16 if precision == "bf16" else torch.float32)
    model = model.to(device).eval()
    loaded = time.perf_counter()
    wanted, written = set(jobs), 0
    prompts = sorted({(tid, level) for tid, level, _ in jobs})
    batches = math.ceil(len(prompts) / args.gen_batch_size)
    stops, eos = stop_rules(tok, complete, args.loop_stop), end_of_turn_ids(tok)
    per_prompt = copy.copy(args)  # decode() takes --num-samples as its rows per prompt
    per_prompt.num_samples = k = distinct_samples(args)
    for i in range(0, len(prompts), args.gen_batch_size):
        chunk = prompts[i : i + args.gen_batch_size]
        enc = left_padded(
            [prompt_ids(tok, tasks_by_id[t], lv, args.mode) for t, lv in chunk], tok.pad_token_id, device
        )
        rngs = (
            [row_generator(prompt_seed(args.seed, t, lv) + s, device) for t, lv in chunk for s in range(k)]
            if args.temperature > 0
            else None
        )
        with torch.no_grad():
            ids = decode(
                model,
                enc,
                per_prompt,
                stops,
                eos,
                report_tokens(progress, f"batch {i // args.gen_batch_size + 1}/{batches}"),
                rngs,
            )
        written += sum(map(len, ids))
        replies = tok.batch_decode(ids, skip_special_tokens=True)
        batch = {
            (tid, level, s): replies[j * k + s % k]
            for j, (tid, level) in enumerate(chunk)
            for s in range(args.num_samples)
        }
        on_batch({job: text for job, text in batch.items() if job in wanted})
        progress(len(chunk))
    return generation_record(
        "hf",
        f"transformers {transformers.__version__}",
        precision,
        device,
        loaded - started,
        written,
        time.perf_counter() - loaded,
    )


def decode(
    model,
    enc,
    args,
    stops: list[Callable],
    eos_ids: list[int],
    report: Callable,
    generators: list | None = None,
) -> list[list[int]]:
    """Reply ids of each prompt of `enc` (left-padded), --num-samples rows per prompt: one token per step
    for every row still decoding, picked by pick_token (sampling with the row's own torch.Generator, one per
    row, when given). A row stops at an end-of-turn id (kept: decoding skips it), at --max-new-tokens, or
    where a stop in `stops` holds of its reply so far; it then leaves the batch, its cache rows with it.
    report(tokens written, rows decoding) is called every step."""
    k, max_new = args.num_samples, args.max_new_tokens
    mask = enc["attention_mask"].repeat_interleave(k, 0)  # (rows, prompt)
    position = (mask.cumsum(1) - 1).clamp(min=0)  # (rows, prompt): left padding takes no position
    takes = inspect.signature(model.forward).parameters  # transformers 5 names the cache `cache`, 4 not
    cache_arg = "cache" if "cache" in takes else "past_key_values"
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in takes else {}  # the prompt's logits: 1 row
    out = model(
        input_ids=enc["input_ids"].repeat_interleave(k, 0),
        attention_mask=mask,
        position_ids=position,
        use_cache=True,
        **last_only,
    )
    cache, position = getattr(out, "cache", None) or out.past_key_values, position[:, -1:]  # (rows, 1)
    rows = list(range(len(mask)))  # which row each decoding sequence is (a list: no device to match)
    replies = mask.new_zeros(len(mask), 0)  # (alive, step)
    eos, done, written = torch.tensor(eos_ids, device=mask.device), [None] * len(mask), 0
    for step in range(1, max_new + 1):
        token = pick_token(out.logits[:, -1].float(), args, generators and [generators[r] for r in rows])
        replies, written = torch.cat([replies, token[:, None]], 1), written + len(token)
        stop = torch.isin(token, eos) | (step == max_new)
        for rule in stops:
            stop |= rule(replies)
        for j in stop.nonzero()[:, 0].tolist():
            done[rows[j]] = replies[j].tolist()
        report(written, int((~stop).sum()))
        if stop.all():
            break
        if stop.any():
            keep = (~stop).nonzero()[:, 0]
            cache.batch_select_indices(keep)
            rows, replies, token = [rows[j] for j in keep.tolist()], replies[keep], token[keep]
            mask, position = mask[keep], position[keep]
        mask, position = torch.cat([mask, mask.new_ones(len(mask), 1)], 1), position + 1
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=position,
            use_cache=True,
            **{cache_arg: cache},
        )
    return done


def pick_token(logits, args, generators: list | None = None):
    """The next token per row of logits (rows, vocab): the argmax at --temperature 0, else a sample at that
    temperature from the smallest set of most likely tokens whose probability reaches --top-p, drawn with
    each row's own generator when given (else torch's global one)."""
    if args.temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / args.temperature, -1)
    sorted_probs, order = probs.sort(-1, descending=True)
    outside = sorted_probs.cumsum(-1) - sorted_probs >= args.top_p  # mass before it already reaches top_p
    sorted_probs[outside] = 0
    if generators is None:
        drawn = torch.multinomial(sorted_probs, 1)  # (rows, 1)
    else:
        drawn = torch.stack([torch.multinomial(p, 1, generator=g) for p, g in zip(sorted_probs, generators)])
    return order.gather(-1, drawn)[:, 0]


def distinct_samples(args) -> int:
    """Replies to compute per prompt: --num-samples when sampling; 1 when greedy, whose samples are all that
    one reply (vLLM refuses n > 1 there, and the own loop would compute the same row n times)."""
    return args.num_samples if args.temperature > 0 else 1


def prompt_text(tok, task: dict, level: int, mode: str) -> str:
    """The chat-rendered prompt of a task at a level, open for the assistant's reply."""
    return render_prompt_and_response(
        tok, {"prompt_messages": build_messages(task, level, mode), "response": ""}
    )[0]


def prompt_ids(tok, task: dict, level: int, mode: str) -> list[int]:
    """The prompt's token ids, as both engines get them: the chat template's text, tokenized without added
    special tokens (the template writes its own)."""
    return tok(prompt_text(tok, task, level, mode), add_special_tokens=False)["input_ids"]


def left_padded(ids: list[list[int]], pad_id: int, device: str) -> dict:
    """input_ids and attention_mask (prompts, longest) of prompts padded on the left, for decode()."""
    width = max(map(len, ids))
    padding = [width - len(x) for x in ids]
    input_ids = [[pad_id] * p + x for p, x in zip(padding, ids)]
    mask = [[0] * p + [1] * len(x) for p, x in zip(padding, ids)]
    return {
        "input_ids": torch.tensor(input_ids, device=device),
        "attention_mask": torch.tensor(mask, device=device),
    }


def prompt_seed(seed: int, task_id: str, level: int) -> int:
    """The sampling seed of one prompt, from --seed, its task and its level; sample s draws with seed + s
    (what vLLM gives the s-th of n samples). A prompt's samples so depend on neither its batch nor on
    whether the run was resumed. 31 bits: every engine takes it."""
    digest = hashlib.sha256(f"{seed}:{task_id}:{level}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def row_generator(seed: int, device: str):
    return torch.Generator(device=device).manual_seed(seed)


def stop_rules(tok, complete: Callable[[str], bool], loop_stop: int) -> list[Callable]:
    """The stops both engines apply to a reply so far, besides its end of turn and --max-new-tokens: the
    reply is complete (its code block is closed), or it loops (--loop-stop tokens; 0: never)."""
    return [stop_when_complete(tok, complete), *([stop_when_looping(loop_stop)] if loop_stop else [])]


def generation_record(
    engine: str, version: str, precision: str, device: str, load_s: float, tokens: int, seconds: float
) -> dict:
    """What summary.json says of a run's generation: the engine, its version, the dtype, the load seconds,
    and the tokens written (end-of-turn tokens included) and the seconds they took, loading excluded."""
    return {
        "engine": engine,
        "version": version,
        "dtype": {"bf16": "bfloat16", "fp32": "float32"}[precision],
        "device": device,
        "load_s": round(load_s, 2),
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None,
    }


def default_threads() -> int:
    """Torch threads for generating on a CPU: the CPUs this process may use, less one. Decoding a token
    does too little work per weight read for a second thread to gain much, and beside another busy process
    the threads would wait for the core it holds (measured in docs/performance.md,
    research/bench/generate.py)."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def stop_when_complete(tok, complete: Callable[[str], bool]):
    """A stop rule: the replies (rows, length) for which complete(reply so far) holds. Decodes a whole
    reply only when a code fence has just been written, the only moment a reply can become complete."""

    def stop(replies):
        done = [
            (
                "```" in tok.decode(row[-4:], skip_special_tokens=True)
                and complete(tok.decode(row, skip_special_tokens=True))
            )
            for row in replies
        ]
        return torch.tensor(done, dtype=torch.bool, device=replies.device)

    return stop


def looping(ids, span: int):
    """Rows of `ids` (batch, length) whose last `span` tokens repeat one stretch of at most span / 3
    tokens, at least three times over: `x = x + 1;` written again and again, or `-stride-stride`. A reply
    cut there is used as a reply cut at max_new_tokens is (its code block is unclosed); the loop would
    only have made it longer. Assumption: code that is not looping never repeats exactly that much
    (tests/test_eval.py measures it on every reference and training response of data/)."""
    tail = ids[:, -span:]  # (batch, span)
    found = tail.new_zeros(len(ids), dtype=bool)
    for period in range(1, span // 3 + 1):
        found |= (tail[:, period:] == tail[:, :-period]).all(1)
    return found


# tokens between looping() checks: cheaper than every token, and a loop caught 7 tokens late changes nothing
LOOP_CHECK_EVERY = 8


def stop_when_looping(span: int):
    """A stop rule: the replies (rows, length) for which looping() holds, checked every LOOP_CHECK_EVERY
    tokens."""

    def stop(replies):
        if replies.shape[1] < span or replies.shape[1] % LOOP_CHECK_EVERY:
            return replies.new_zeros(len(replies), dtype=bool)
        return looping(replies, span)

    return stop


def report_tokens(progress, label: str):
    """report(tokens written, rows decoding) for decode() (or vLLM's engine loop): shows the tokens so far of
    what `label` names and their rate on the progress line, at most once a second. progress(0, detail)
    redraws the line with `detail`."""
    t0 = shown = time.time()

    def report(written: int, decoding: int) -> None:
        nonlocal shown
        if (now := time.time()) - shown >= 1.0:
            shown = now
            progress(
                0, f" ({label}: {written} tokens, {decoding} replies going, {written / (now - t0):.1f} tok/s)"
            )

    return report
