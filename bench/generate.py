"""Stage 04's generation against the loop a user would write (issue 30): tokens per second.

The anchor: for each prompt, `model.generate(**inputs, max_new_tokens=...)`, one prompt at a time,
torch's default thread count. Next to it, the batching a user would add: `model.generate` on 8
left-padded prompts at once, which keeps every finished reply in the batch to the end of its longest.
Stage 04: its own generate() (harness/generation.py: batches of --gen-batch-size prompts, its
--threads, a finished reply leaving the batch), stopping where stage 04 stops. All get the same chat
prompts (stage 04's kernel-mode level-1 prompts of the eval split), greedy decoding and max_new_tokens,
and stop at the end of the turn; all count generated tokens the same way (their replies re-tokenized).
Each variant runs in a fresh process (thread pools and OpenMP settings are per process), once on the
machine as it is and once beside a busy process this bench starts (what a shared CI machine or a second
job does). Replies of equal length (the base model runs each to the limit) hide what a kept finished
reply costs; a trained checkpoint's replies end anywhere (docs/performance.md has both).

    python bench/generate.py                                        # SmolLM2 (data/build_smollm2.py)
    python bench/generate.py --model runs/compare-cpu-real/sft-seed0/ckpt --max-new-tokens 512
    python bench/generate.py --model data/models/tiny-cuda-lm --prompts 16
    python bench/generate.py --quick                                # tiny model, 2 prompts: CI smoke
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

# the repo root instead of bench/, whose profile.py would shadow the standard library's (torch imports it)
sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench.common import cpus_available, print_table  # noqa: E402
from cuset_common import (SMOLLM2_MODEL as SMOLLM2, TASKS_FILE, TINY_MODEL, build_messages,  # noqa: E402
                          end_of_turn_ids, load_script, load_tasks)
from harness.generation import generate  # noqa: E402

BATCH = 8  # the batched variant's prompts per model.generate call: stage 04's default --gen-batch-size
VARIANTS = {"plain": "plain model.generate loop (anchor)",
            "batched": f"model.generate, {BATCH} prompts at once",
            "stage04": "stage 04 generate()"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None,
                    help="model folder (default: SmolLM2 if built, else the tiny model)")
    ap.add_argument("--prompts", type=int, default=8, help="eval-split prompts (default %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="(default %(default)s)")
    ap.add_argument("--threads", type=int, default=None,
                    help="stage 04's --threads (default: its own default)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny model, 2 prompts, 16 tokens: the figures mean little")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)  # one variant, in its own process
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.prompts, args.max_new_tokens = str(TINY_MODEL), 2, 16
    args.model = args.model or str(SMOLLM2 if (SMOLLM2 / "config.json").is_file() else TINY_MODEL)
    return args


def prompts(n: int) -> list[tuple[dict, list[dict]]]:
    tasks = [t for t in load_tasks(TASKS_FILE) if t.get("split") == "eval" and "kernel_mode" in t][:n]
    return [(t, build_messages(t, 1, "kernel")) for t in tasks]


def plain_loop(args, batch: int = 1) -> list[str]:
    """What a user writes: `batch` prompts per model.generate call (left-padded), every default left as it
    is but the end of the turn (stage 04's, so that all variants stop there)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    texts = [tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
             for _, messages in prompts(args.prompts)]
    replies = []
    for i in range(0, len(texts), batch):
        inputs = tok(texts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=end_of_turn_ids(tok))
        replies += tok.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    return replies


def stage04(args) -> list[str]:
    ev = load_script("04_eval_kernels.py")
    run = ev.parse_args(["--model", args.model, "--mode", "kernel", "--levels", "1",
                         "--max-new-tokens", str(args.max_new_tokens),
                         *(["--threads", str(args.threads)] if args.threads else [])])
    tasks = {str(t["id"]): t for t, _ in prompts(args.prompts)}
    replies: dict = {}
    complete = lambda reply: ev.reply_complete(reply, "kernel")  # noqa: E731
    generate(run, tasks, [(tid, 1, 0) for tid in tasks], complete, lambda *a, **k: None, replies.update)
    return [replies[(tid, 1, 0)] for tid in tasks]


def child(args) -> int:
    """Run one variant, print {"tokens", "seconds"} (load time excluded: the first token waits for it)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    t0 = time.perf_counter()
    run = {"plain": plain_loop, "batched": lambda a: plain_loop(a, BATCH), "stage04": stage04}[args.child]
    replies = run(args)
    seconds = time.perf_counter() - t0
    tokens = sum(len(tok(r, add_special_tokens=False)["input_ids"]) for r in replies)
    print(json.dumps({"tokens": tokens, "seconds": seconds}))
    return 0


def measure(args, variant: str) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, "--model", args.model,
           "--prompts", str(args.prompts), "--max-new-tokens", str(args.max_new_tokens),
           *(["--threads", str(args.threads)] if args.threads else [])]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{r.stderr[-3000:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # as it comes, so that a stopped bench keeps it (beside a busy process the anchor takes long)
    print(f"[bench] {VARIANTS[variant]}: {got['tokens']} tokens in {got['seconds']:.1f} s "
          f"({time.time() - t0:.0f} s with loading)", file=sys.stderr, flush=True)
    return got


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    print(f"# bench/generate.py{' --quick' if args.quick else ''}: {args.model}, {args.prompts} prompts, "
          f"max_new_tokens {args.max_new_tokens}, greedy; stage 04 --threads {args.threads or 'default'}")
    when = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    print(f"machine: {cpus_available()} CPUs available; {when}")
    rows = []
    for setting in ("as it is", "beside a busy process"):
        busy = setting != "as it is"
        print(f"[bench] machine {setting}:", file=sys.stderr, flush=True)
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            got = {v: measure(args, v) for v in VARIANTS}
        finally:
            if spinner:
                spinner.kill()
                spinner.wait()
        rate = {v: g["tokens"] / g["seconds"] for v, g in got.items()}
        for v, g in got.items():
            rows.append([setting, VARIANTS[v], str(g["tokens"]), f"{g['seconds']:.1f}", f"{rate[v]:.1f}",
                         f"{rate[v] / rate['plain']:.2f}x"])
    print_table(["machine", "variant", "tokens", "wall s", "tokens per s", "speed vs anchor"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
