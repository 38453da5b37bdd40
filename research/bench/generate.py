"""Stage 04's generation against the loop a user would write: tokens per second, beside the machine's limits.

The anchor: `model.generate` on 8 left-padded prompts at a time in fp32 (every default left as it is but
the end of the turn, stage 04's, so that all variants stop there), on --threads torch threads. Against it,
stage 04 itself (`04_eval_kernels.py --generate-only`, its figures from summary.json's generation record)
with each engine and precision: the own loop (harness/generation.py) and vLLM (harness/vllm_generation.py,
where `vllm` imports) in fp32 and bf16, and stage 04 as it is (--engine auto --precision auto). All get the
same chat prompts (kernel mode, level 1, the first --prompts tasks of the eval split), greedy decoding and
--max-new-tokens; stage 04 also stops where its rules stop a reply (a complete code block, a loop), which
the anchor does not. Tokens are the tokens generated, the end-of-turn token included; seconds exclude
loading (stated apart). Each variant runs in a fresh process (thread pools and OpenMP settings are per
process). The limits, measured in the same run on the same threads: GEMM FLOP/s in fp32 and bf16 and the
memory read rate (research/bench/common.py, machine_limits), and from them the tokens per second at which
every multiply of the model's weights (2 x parameters FLOP per token) would run at the GEMM rate: a ceiling no
decoding reaches. --beside-busy measures again beside a busy process this bench starts (what a shared CI
machine or a second job does).

    python research/bench/generate.py --threads 1 --prompts 16 --max-new-tokens 256   # SmolLM2
    python research/bench/generate.py --model runs/compare-cpu-real/sft-seed0/ckpt --max-new-tokens 512
    python research/bench/generate.py --quick           # tiny model, 2 prompts, 16 tokens, own loop: CI smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, whose packages it imports
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cuset_common.data import end_of_turn_ids
from cuset_common.device import bf16_supported
from cuset_common.models import model_parameters
from cuset_common.paths import ROOT, TASKS_FILE, TINY_MODEL
from cuset_common.paths import SMOLLM2_MODEL as SMOLLM2
from cuset_common.tasks import build_messages, load_tasks
from harness.eval_options import parse_args as eval_args
from harness.generation import default_threads
from harness.vllm_generation import generate_vllm
from research.bench.common import limits_line, machine, machine_limits, print_table
from research.stage_modules import stage_module

BATCH = 8  # the anchor's prompts per model.generate call: stage 04's default --gen-batch-size
STAGE04 = str(ROOT / "04_eval_kernels.py")
# variant: (label, stage 04's arguments; None: the anchor)
VARIANTS = {
    "anchor": (f"model.generate, fp32, {BATCH} prompts per call (anchor)", None),
    "hf-fp32": ("stage 04, own loop, fp32", ["--engine", "hf", "--precision", "fp32"]),
    "hf-bf16": ("stage 04, own loop, bf16", ["--engine", "hf", "--precision", "bf16"]),
    "vllm-fp32": ("stage 04, vLLM, fp32", ["--engine", "vllm", "--precision", "fp32"]),
    "vllm-bf16": ("stage 04, vLLM, bf16", ["--engine", "vllm", "--precision", "bf16"]),
    "default": ("stage 04 as it is (auto, auto)", []),
    "vllm-bf16-compiled": ("stage 04's vLLM, bf16, graphs compiled", "compiled"),
}
DEFAULT_VARIANTS = [v for v in VARIANTS if v != "vllm-bf16-compiled"]  # that one starts for minutes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="model folder (default: SmolLM2 if built, else the tiny model)"
    )
    ap.add_argument("--prompts", type=int, default=16, help="eval-split prompts (default %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="(default %(default)s)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads of every variant (default: stage 04's, the CPUs available less one)",
    )
    ap.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=DEFAULT_VARIANTS,
        help="which to run besides the anchor (default: all but vllm-bf16-compiled; the vLLM "
        "ones where vllm is installed)",
    )
    ap.add_argument("--beside-busy", action="store_true", help="measure again beside a busy process")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny model, 2 prompts, 16 tokens, anchor and own loop: the figures mean little",
    )
    ap.add_argument("--child", choices=("anchor", "compiled"), help=argparse.SUPPRESS)  # in its own process
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.prompts, args.max_new_tokens = str(TINY_MODEL), 2, 16
        args.variants = ["anchor", "hf-fp32"]
    args.model = args.model or str(SMOLLM2 if (SMOLLM2 / "config.json").is_file() else TINY_MODEL)
    args.threads = args.threads or default_threads()
    vllm = importlib.util.find_spec("vllm") is not None
    runnable = [v for v in args.variants if v != "anchor" and (vllm or not v.startswith("vllm"))]
    args.variants = ["anchor", *runnable]
    return args


def anchor(args) -> dict:
    """What a user writes: BATCH prompts per model.generate call (left-padded), fp32, greedy, every default
    left as it is but the end of the turn. {"tokens", "seconds", "load_s"}: tokens generated up to and with
    each row's first end-of-turn token (the padding after it is not a token written)."""
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    loaded = time.perf_counter()
    tasks = [t for t in load_tasks(TASKS_FILE) if t.get("split") == "eval"][: args.prompts]
    texts = [
        tok.apply_chat_template(build_messages(t, 1, "kernel"), add_generation_prompt=True, tokenize=False)
        for t in tasks
    ]
    eos, tokens = end_of_turn_ids(tok), 0
    for i in range(0, len(texts), BATCH):
        inputs = tok(texts[i : i + BATCH], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=eos,
            )
        for row in out[:, inputs["input_ids"].shape[1] :].tolist():
            tokens += next((n + 1 for n, t in enumerate(row) if t in eos), len(row))
    return {
        "tokens": tokens,
        "seconds": time.perf_counter() - loaded,
        "load_s": loaded - t0,
        "dtype": "float32",
        "engine": "transformers",
    }


def vllm_compiled(args) -> dict:
    """Stage 04's vLLM engine in bf16 with vLLM's graphs compiled, as they are by default: its generation
    record (stage 04 runs vLLM eagerly on a CPU; this measures why)."""
    run = eval_args(
        [
            "--model",
            args.model,
            "--mode",
            "kernel",
            "--levels",
            "1",
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--threads",
            str(args.threads),
            "--precision",
            "bf16",
        ]
    )
    tasks = {str(t["id"]): t for t in load_tasks(TASKS_FILE) if t.get("split") == "eval"}
    jobs = [(tid, 1, 0) for tid in list(tasks)[: args.prompts]]
    complete = lambda reply: stage_module("04").reply_complete(reply, "kernel")  # noqa: E731
    return generate_vllm(run, tasks, jobs, complete, lambda *_: None, lambda _: None, compiled=True)


def stage04(args, flags: list[str]) -> dict:
    """Stage 04 --generate-only in its own process: its generation record (summary.json)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            STAGE04,
            "--model",
            args.model,
            "--mode",
            "kernel",
            "--levels",
            "1",
            "--limit",
            str(args.prompts),
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--threads",
            str(args.threads),
            "--generate-only",
            *flags,
            "--out",
            out,
            "--force",
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
        return json.loads((Path(out) / "summary.json").read_text())["generation"]


def measure(args, variant: str) -> dict:
    label, flags = VARIANTS[variant]
    if flags is None or flags == "compiled":
        child = "anchor" if flags is None else "compiled"
        cmd = [
            sys.executable,
            __file__,
            "--child",
            child,
            "--model",
            args.model,
            "--prompts",
            str(args.prompts),
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--threads",
            str(args.threads),
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{label} failed:\n{r.stderr[-3000:]}")
        got = json.loads(r.stdout.strip().splitlines()[-1])
    else:
        got = stage04(args, flags)
    # as it comes, so that a stopped bench keeps it
    print(
        f"[bench] {label}: {got['tokens']} tokens in {got['seconds']:.1f} s (loading {got['load_s']:.1f} s)",
        file=sys.stderr,
        flush=True,
    )
    return got


def print_limits(args) -> dict[str, float]:
    """Measure and print the limits and the model's ceilings; returns the ceilings {dtype: tokens/s}."""
    limits = machine_limits(args.threads)
    parameters = model_parameters(args.model)
    print(limits_line(limits, args.threads, bf16_supported("cpu")))
    if parameters is None:
        return {}
    ceiling = {
        dtype: limits[f"gemm_{short}"] / (2 * parameters)
        for dtype, short in (("float32", "fp32"), ("bfloat16", "bf16"))
    }
    print(
        f"ceiling: {parameters / 1e6:,.1f}M parameters, 2 FLOP each per token at the GEMM rate: fp32 "
        f"{ceiling['float32']:,.0f} tokens/s, bf16 {ceiling['bfloat16']:,.0f} tokens/s"
    )
    return ceiling


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(anchor(args) if args.child == "anchor" else vllm_compiled(args)))
        return 0
    print(
        f"# research/bench/generate.py{' --quick' if args.quick else ''}: {Path(args.model).name}, "
        f"{args.prompts} "
        f"prompts (kernel mode, level 1, eval split), max_new_tokens {args.max_new_tokens}, greedy, "
        f"--threads {args.threads}"
    )
    print(f"machine: {machine('cpu', args.threads)}")
    ceiling = print_limits(args)
    rows = []
    for setting in ("as it is", *(["beside a busy process"] if args.beside_busy else [])):
        print(f"[bench] machine {setting}:", file=sys.stderr, flush=True)
        busy = setting != "as it is"
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            got = {v: measure(args, v) for v in args.variants}
        finally:
            if spinner:
                spinner.kill()
                spinner.wait()
        rate = {v: g["tokens"] / g["seconds"] for v, g in got.items()}
        for v, g in got.items():
            share = f"{rate[v] / ceiling[g['dtype']]:.0%}" if ceiling else "?"
            engine = "vllm" if g["engine"] == "vllm" else "own loop" if g["engine"] == "hf" else g["engine"]
            rows.append(
                [
                    setting,
                    VARIANTS[v][0],
                    engine,
                    g["dtype"],
                    str(g["tokens"]),
                    f"{g['load_s']:.1f}",
                    f"{g['seconds']:.1f}",
                    f"{rate[v]:.1f}",
                    f"{rate[v] / rate['anchor']:.2f}x",
                    share,
                ]
            )
    print_table(
        [
            "machine",
            "variant",
            "engine",
            "dtype",
            "tokens",
            "load s",
            "generation s",
            "tokens per s",
            "speed vs anchor",
            "of the ceiling",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
