"""Stage 04's generation, apart from the protocol in 04_eval_kernels.py: a hand-written batched decoding
loop with a KV cache, the model's chat template and the prompts of cuset_common.build_messages (the SFT
data's wording). Each sequence stops at the end of its turn, once its reply is complete (what is
complete, the protocol says) or once it loops (greedy decoding of a small model repeats a line or a word
until max_new_tokens), and a stopped sequence leaves the batch at once. HF generate() keeps every
sequence to the end of the batch's longest: on real replies that is most of the work (docs/performance.md).
A batch's tokens and their rate show while it runs (a batch of long answers takes minutes on a CPU).
"""
from __future__ import annotations

import inspect
import math
import os
import time
from typing import Callable

from cuset_common import (build_messages, end_of_turn_ids, load_causal_lm, load_tokenizer, pick_device,
                          render_prompt_and_response)


def generate(args, tasks_by_id: dict, jobs: list[tuple], complete: Callable[[str], bool], progress,
             on_batch) -> None:
    """Replies for `jobs` ((task id, level, sample)), --gen-batch-size prompts per generate() call, each
    prompt's --num-samples samples (greedy at --temperature 0). on_batch({job: reply}) is called as each
    batch finishes, so a kill loses one batch. Torch's thread count is set for the call and put back after
    it: a caller in the same process (a test, a bench) computes on with its own, bit for bit as before."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads or default_threads())
    try:
        generate_batches(args, tasks_by_id, jobs, complete, progress, on_batch)
    finally:
        torch.set_num_threads(previous)


def generate_batches(args, tasks_by_id: dict, jobs: list[tuple], complete: Callable[[str], bool], progress,
                     on_batch) -> None:
    """generate()'s work, at the thread count it set."""
    import torch

    device = pick_device(args.device)
    tok = load_tokenizer(args.model, need_offsets=False, padding_side="left")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = load_causal_lm(args.model, torch.bfloat16 if device.startswith("cuda") else torch.float32)
    model = model.to(device).eval()
    wanted = set(jobs)
    prompts = sorted({(tid, level) for tid, level, _ in jobs})
    batches = math.ceil(len(prompts) / args.gen_batch_size)
    for i in range(0, len(prompts), args.gen_batch_size):
        chunk = prompts[i:i + args.gen_batch_size]
        texts = [prompt_text(tok, tasks_by_id[t], lv, args.mode) for t, lv in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        stops = [stop_when_complete(tok, complete),
                 *([stop_when_looping(args.loop_stop)] if args.loop_stop else [])]
        with torch.no_grad():
            ids = decode(model, enc, args, stops, end_of_turn_ids(tok),
                         report_tokens(progress, f"{i // args.gen_batch_size + 1}/{batches}"))
        replies = tok.batch_decode(ids, skip_special_tokens=True)
        batch = {(tid, level, s): replies[j * args.num_samples + s]
                 for j, (tid, level) in enumerate(chunk) for s in range(args.num_samples)}
        on_batch({job: text for job, text in batch.items() if job in wanted})
        progress(len(chunk))


def decode(model, enc, args, stops: list[Callable], eos_ids: list[int], report: Callable) -> list[list[int]]:
    """Reply ids of each prompt of `enc` (left-padded), --num-samples rows per prompt: one token per step
    for every row still decoding, picked by pick_token. A row stops at an end-of-turn id (kept: decoding
    skips it), at --max-new-tokens, or where a stop in `stops` holds of its reply so far; it then leaves
    the batch, its cache rows with it. report(tokens written, rows decoding) is called every step."""
    import torch

    k, max_new = args.num_samples, args.max_new_tokens
    mask = enc["attention_mask"].repeat_interleave(k, 0)  # (rows, prompt)
    position = (mask.cumsum(1) - 1).clamp(min=0)  # (rows, prompt): left padding takes no position
    takes = inspect.signature(model.forward).parameters  # transformers 5 names the cache `cache`, 4 not
    cache_arg = "cache" if "cache" in takes else "past_key_values"
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in takes else {}  # the prompt's logits: 1 row
    out = model(input_ids=enc["input_ids"].repeat_interleave(k, 0), attention_mask=mask,
                position_ids=position, use_cache=True, **last_only)
    cache, position = getattr(out, "cache", None) or out.past_key_values, position[:, -1:]  # (rows, 1)
    rows = list(range(len(mask)))  # which row each decoding sequence is (a list: no device to match)
    replies = mask.new_zeros(len(mask), 0)  # (alive, step)
    eos, done, written = torch.tensor(eos_ids, device=mask.device), [None] * len(mask), 0
    for step in range(1, max_new + 1):
        token = pick_token(out.logits[:, -1].float(), args)  # (alive,)
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
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=position, use_cache=True,
                    **{cache_arg: cache})
    return done


def pick_token(logits, args):
    """The next token per row of logits (rows, vocab): the argmax at --temperature 0, else a sample at that
    temperature from the smallest set of most likely tokens whose probability reaches --top-p."""
    import torch

    if args.temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / args.temperature, -1)
    sorted_probs, order = probs.sort(-1, descending=True)
    outside = sorted_probs.cumsum(-1) - sorted_probs >= args.top_p  # mass before it already reaches top_p
    sorted_probs[outside] = 0
    return order.gather(-1, torch.multinomial(sorted_probs, 1))[:, 0]


def prompt_text(tok, task: dict, level: int, mode: str) -> str:
    """The chat-rendered prompt of a task at a level, open for the assistant's reply."""
    return render_prompt_and_response(tok, {"prompt_messages": build_messages(task, level, mode),
                                            "response": ""})[0]


def default_threads() -> int:
    """Torch threads for generating on a CPU: the CPUs this process may use, less one. Decoding one token
    at a time gains little from a second thread (SmolLM2-135M, 2 idle cores: 11.3 tok/s on 1 thread,
    11.0 on 2; measured 2026-12-01) and loses much beside another busy process, whose core the threads
    then wait for: one prompt at a time on 2 threads drops from 8.5 to 3.4 tok/s there, stage 04 on 1
    thread from 16.4 to 15.5 (docs/performance.md, bench/generate.py)."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def stop_when_complete(tok, complete: Callable[[str], bool]):
    """A stop rule: the replies (rows, length) for which complete(reply so far) holds. Decodes a whole
    reply only when a code fence has just been written, the only moment a reply can become complete."""
    import torch

    def stop(replies):
        done = [("```" in tok.decode(row[-4:], skip_special_tokens=True)
                 and complete(tok.decode(row, skip_special_tokens=True))) for row in replies]
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


def report_tokens(progress, batch: str):
    """report(tokens written, rows decoding) for decode(): shows the batch's tokens so far and their rate
    on the progress line, at most once a second. progress(0, detail) redraws the line with `detail`."""
    t0 = shown = time.time()

    def report(written: int, decoding: int) -> None:
        nonlocal shown
        if (now := time.time()) - shown >= 1.0:
            shown = now
            progress(0, f" (batch {batch}: {written} tokens, {decoding} replies going, "
                        f"{written / (now - t0):.1f} tok/s)")

    return report
