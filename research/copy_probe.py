"""Does a model copy from its prompt? Two measurements behind the kernel-mode compile rate.

In kernel mode the prompt gives each kernel's exact signature; a kernel that compiles must repeat its
names (the kernel's, its parameters'). A model can only get a name right that it has not seen in
training by copying it from the context, which in transformers is the job of induction heads (Olsson et
al., 2022: attend to the token after an earlier occurrence of the current one). This script measures:

1. random-repeat accuracy: a run of random tokens, other random tokens, then the first run again; the
   share of the repeat's tokens (from its second on) that the model's argmax predicts. Nothing but
   copying can predict them: a model with induction heads scores near 1, one without near 1/vocab.
2. prompt-name copying, teacher forced, on a kernel-mode SFT file: for the answer's tokens that spell a
   name from the prompt's signatures (kernel and parameter names), the mean probability of the right
   token and how often it is the argmax; the same for the other tokens; and how many whole signatures
   (`__global__ void name(...)` in the answer) the argmax gets right token by token.

    python research/copy_probe.py                                  # bundled tiny model, eval kernel data
    python research/copy_probe.py --model data/artifacts/ckpt-cuset --out runs/copy-cuset.json
    python research/copy_probe.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --device cuda
    python research/copy_probe.py --help
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cuset_common lives at the repo root
from cuset_common.cli import UserError, run_main
from cuset_common.data import encode_sample, load_sft
from cuset_common.device import pick_device
from cuset_common.files import json_safe, write_text_atomic
from cuset_common.labeling.observation import mean
from cuset_common.models import load_causal_lm, load_tokenizer
from cuset_common.paths import EVAL_SFT_KERNEL_FILE, TINY_MODEL
from cuset_common.progress import Progress
from cuset_common.tasks import KERNEL_SIGNATURE, signature_parts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(TINY_MODEL), help="model folder or hub id (default: %(default)s)")
    ap.add_argument(
        "--data",
        type=Path,
        default=EVAL_SFT_KERNEL_FILE,
        help="kernel-mode SFT file whose prompts give signatures (default: %(default)s)",
    )
    ap.add_argument(
        "--limit", type=int, default=0, help="first N records only; 0: all (default: %(default)s)"
    )
    ap.add_argument("--max-length", type=int, default=2048, help="tokens per record (default: %(default)s)")
    ap.add_argument("--trials", type=int, default=8, help="random-repeat sequences (default: %(default)s)")
    ap.add_argument(
        "--span", type=int, default=40, help="random tokens that are repeated (default: %(default)s)"
    )
    ap.add_argument(
        "--gap", type=int, default=200, help="random tokens between the two copies (default: %(default)s)"
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the random tokens (default: %(default)s)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=None, help="also write every number to this JSON file")
    args = ap.parse_args(argv)
    for name in ("max_length", "trials", "span", "gap"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.limit < 0:
        ap.error("--limit must be >= 0")
    return args


def prompt_text(record: dict) -> str:
    return "\n".join(m["content"] for m in record["prompt_messages"])


def prompt_names(text: str) -> set[str]:
    """Kernel and parameter names of every `__global__ void name(params)` the prompt text gives."""
    names = set()
    for m in KERNEL_SIGNATURE.finditer(text):
        kernel, _, params = signature_parts(m.group(0))
        names.update([kernel, *filter(None, params)])
    return names


def char_mask(text: str, spans: list[tuple[int, int]]) -> list[bool]:
    """True for each character of text inside one of the spans."""
    mask = [False] * len(text)
    for a, b in spans:
        mask[a:b] = [True] * (b - a)
    return mask


def name_and_signature_spans(
    response: str, names: set[str], kernels: list[str]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Character spans, in the response, of whole-word occurrences of the names, and of the signatures
    of the prompt's kernels (from the kernel name to the closing parenthesis)."""
    words = [m.span() for m in re.finditer(r"\w+", response) if m.group() in names]
    sigs = [(m.start(1), m.end()) for m in KERNEL_SIGNATURE.finditer(response) if m.group(1) in kernels]
    return words, sigs


def score_record(model, tokenizer, record: dict, max_length: int, device: str) -> dict | None:
    """Teacher-forced p(gold) and argmax hits of the response tokens, split into name / other tokens;
    None when the prompt gives no signature."""
    text = prompt_text(record)
    names = prompt_names(text)
    if not names:
        return None
    enc = encode_sample(tokenizer, record, max_length)
    ids = torch.tensor([enc["input_ids"]], device=device)
    start = enc["response_start"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, start - 1 : -1].float()  # [R, V]: predicts response tokens
    gold = ids[0, start:]
    p = torch.softmax(logits, -1).gather(1, gold[:, None])[:, 0].tolist()
    hit = (logits.argmax(-1) == gold).tolist()
    words, sigs = name_and_signature_spans(
        enc["response_text"], names, [k for k, _ in KERNEL_SIGNATURE.findall(text)]
    )
    in_name = char_mask(enc["response_text"], words)
    out = {
        "name_p": [],
        "name_hit": [],
        "other_p": [],
        "other_hit": [],
        "signatures": len(sigs),
        "signatures_right": 0,
    }
    for (a, b), pi, hi in zip(enc["spans"], p, hit):
        key = "name" if any(in_name[a:b]) else "other"
        out[f"{key}_p"].append(pi)
        out[f"{key}_hit"].append(hi)
    for a, b in sigs:
        inside = [hi for (s, e), hi in zip(enc["spans"], hit) if s < b and e > a]
        out["signatures_right"] += bool(inside) and all(inside)
    return out


def random_repeat_accuracy(model, tokenizer, args: argparse.Namespace, device: str) -> float:
    """Mean argmax accuracy on the second copy of a random run (from its second token on)."""
    special = set(tokenizer.all_special_ids)
    pool = np.array([i for i in range(len(tokenizer)) if i not in special])
    rng = np.random.default_rng(args.seed)
    hits = []
    for _ in range(args.trials):
        run, gap = rng.choice(pool, args.span), rng.choice(pool, args.gap)
        ids = torch.tensor([np.concatenate([run, gap, run]).tolist()], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        first = args.span + args.gap  # position of the repeat's first token
        hits += (logits[first:-1].argmax(-1) == ids[0, first + 1 :]).tolist()
    return float(np.mean(hits))


def summarize(rows: list[dict]) -> dict:
    pooled = {k: [v for r in rows for v in r[k]] for k in ("name_p", "name_hit", "other_p", "other_hit")}
    return {
        "records": len(rows),
        "name_tokens": len(pooled["name_p"]),
        "other_tokens": len(pooled["other_p"]),
        **json_safe({f"mean_{k}": mean(v) for k, v in pooled.items()}),  # no token of a kind: null
        "signatures": sum(r["signatures"] for r in rows),
        "signatures_right": sum(r["signatures_right"] for r in rows),
    }


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.data.is_file():
        raise UserError(
            f"--data {args.data}: no such file; build it with `python data/build_sft.py` or pass a "
            f"kernel-mode SFT file"
        )
    records = load_sft(args.data)[: args.limit or None]
    if not any(prompt_names(prompt_text(r)) for r in records):
        raise UserError(
            f"--data {args.data}: no record's prompt gives a `__global__ void name(...)` signature; "
            f"pass kernel-mode data (data/sft/*_kernel.jsonl)"
        )
    device = pick_device(args.device)
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model, torch.float32 if device == "cpu" else torch.bfloat16).to(device).eval()

    rows, skipped, progress = [], [], Progress("records", len(records), stream=sys.stdout)
    for record in records:
        row = score_record(model, tokenizer, record, args.max_length, device)
        if row:
            rows.append(row)
        else:
            skipped.append(record["id"])
        progress(1)
    result = {
        "model": args.model,
        "data": str(args.data),
        "skipped_no_signature": skipped,
        "random_repeat_accuracy": random_repeat_accuracy(model, tokenizer, args, device),
        "random_repeat": {"trials": args.trials, "span": args.span, "gap": args.gap, "seed": args.seed},
        **summarize(rows),
    }

    print(
        f"random-repeat accuracy: {result['random_repeat_accuracy']:.3f} ({args.trials} x {args.span} tokens "
        f"repeated after {args.gap}; chance ~ 1/{len(tokenizer)})"
    )
    print(
        f"prompt names in the answers ({result['records']} records): {result['name_tokens']} tokens, "
        f"mean p(gold) {fmt(result['mean_name_p'])}, argmax right {fmt(result['mean_name_hit'])}; "
        f"other tokens: mean p(gold) {fmt(result['mean_other_p'])}, "
        f"argmax right {fmt(result['mean_other_hit'])}"
    )
    print(
        f"whole signatures right under argmax: {result['signatures_right']}/{result['signatures']}"
        + (f"; {len(skipped)} records without a signature skipped" if skipped else "")
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
