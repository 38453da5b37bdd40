"""Stage 04's generation, apart from the protocol in 04_eval_kernels.py: batched HF generate() with
the model's chat template and the prompts of cuset_common.build_messages (the SFT data's wording),
stopping each sequence once its reply is complete (what is complete, the protocol says) or once it
loops (greedy decoding of a small model repeats a line or a word until max_new_tokens: a batch then
runs to the limit), and showing a batch's tokens and their rate while it runs (a batch of long answers
takes minutes on a CPU).
"""
from __future__ import annotations

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
    sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p) if args.temperature > 0 \
        else dict(do_sample=False)
    wanted = set(jobs)
    prompts = sorted({(tid, level) for tid, level, _ in jobs})
    batches = math.ceil(len(prompts) / args.gen_batch_size)
    for i in range(0, len(prompts), args.gen_batch_size):
        chunk = prompts[i:i + args.gen_batch_size]
        texts = [prompt_text(tok, tasks_by_id[t], lv, args.mode) for t, lv in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        prompt_len = enc["input_ids"].shape[1]
        # stop at the end of the turn, once the reply is complete or once it loops; not at max_new_tokens
        stops = [stop_when_complete(tok, prompt_len, complete),
                 *([stop_when_looping(prompt_len, args.loop_stop)] if args.loop_stop else []),
                 report_tokens(progress, prompt_len, f"{i // args.gen_batch_size + 1}/{batches}")]
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=args.max_new_tokens,
                                 num_return_sequences=args.num_samples, pad_token_id=tok.pad_token_id,
                                 eos_token_id=end_of_turn_ids(tok), stopping_criteria=stops, **sampling)
        replies = tok.batch_decode(gen[:, prompt_len:], skip_special_tokens=True)
        batch = {(tid, level, s): replies[j * args.num_samples + s]
                 for j, (tid, level) in enumerate(chunk) for s in range(args.num_samples)}
        on_batch({job: text for job, text in batch.items() if job in wanted})
        progress(len(chunk))


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


def stop_when_complete(tok, prompt_len: int, complete: Callable[[str], bool]):
    """Per sequence: stop once complete(reply so far) holds. Decodes the whole reply only when a code
    fence has just been written, the only moment a reply can become complete."""
    import torch
    from transformers import StoppingCriteria

    class StopWhenComplete(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            done = [("```" in tok.decode(row[-4:], skip_special_tokens=True)
                     and complete(tok.decode(row[prompt_len:], skip_special_tokens=True)))
                    for row in input_ids]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StopWhenComplete()


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


def stop_when_looping(prompt_len: int, span: int):
    """Per sequence: stop once looping() holds of its reply, checked every LOOP_CHECK_EVERY tokens."""
    import torch
    from transformers import StoppingCriteria

    class StopWhenLooping(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            new = input_ids.shape[1] - prompt_len
            if new < span or new % LOOP_CHECK_EVERY:
                return torch.zeros(len(input_ids), dtype=torch.bool, device=input_ids.device)
            return looping(input_ids, span)

    return StopWhenLooping()


def report_tokens(progress, prompt_len: int, batch: str):
    """Never stops: shows the batch's tokens so far and their rate on the progress line, at most once a
    second. progress(0, detail) redraws the line with `detail`."""
    import torch
    from transformers import StoppingCriteria

    class ReportTokens(StoppingCriteria):
        t0 = shown = time.time()

        def __call__(self, input_ids, scores, **kwargs):
            now = time.time()
            if now - self.shown >= 1.0:
                self.shown, new = now, input_ids.shape[1] - prompt_len
                rate = new * len(input_ids) / (now - self.t0)
                progress(0, f" (batch {batch}: {new} tokens each, {rate:.1f} tok/s)")
            return torch.zeros(len(input_ids), dtype=torch.bool, device=input_ids.device)

    return ReportTokens()
