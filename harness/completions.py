"""What stage 04 judges, job by job: the model's replies (its engines: harness/generation.py,
vllm_generation.py, openai_generation.py), completions made elsewhere (--solutions), or the tasks' own
references written as a reply would hold them (--reference, and the task check of 04_eval_kernels.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from cuset_common.progress import Progress
from cuset_common.tasks import fence
from harness.generation import default_threads, generate
from harness.openai_generation import generate_openai
from harness.run_folder import run_engine
from harness.vllm_generation import engine_threads, generate_vllm


def reference_completion(task: dict, mode: str) -> str:
    """The task's own reference as a reply would hold it: the program, or in kernel mode its kernels."""
    return fence(task["bench.cu"] if mode == "standalone" else task["kernel_mode"]["reference_kernels"])


def gather_completions(
    args, by_id: dict, need: list[tuple], run, solutions: dict | None, complete: Callable[[str, str], bool]
) -> dict | None:
    """Completions for the jobs in `need` (the references with --reference, `solutions` when given, else
    the model's replies, each cut once `complete(reply, mode)` holds), kept in `run` as they come. Returns
    the generation record (harness/generation.py: generation_record; None when nothing was generated)."""
    if not need:
        return None
    if args.reference:
        run.keep_completions({j: reference_completion(by_id[j[0]], args.mode) for j in need})
        return None
    if solutions is not None:
        run.keep_completions({j: solutions.get(j) for j in need})  # None: no answer given (outcome `missing`)
        return None
    prompts = len({j[:2] for j in need})
    engine, why = run_engine(args)  # as the run's fingerprint says
    workers = {
        "vllm": lambda: f"threads {engine_threads(args)}",
        "hf": lambda: f"threads {args.threads or default_threads()}",
        "openai": lambda: f"{args.api_concurrency} requests at a time to {args.base_url}",
    }[engine]()
    print(f"generate: {prompts} prompts x {args.num_samples} samples with engine {engine} ({why}), {workers}")
    progress = Progress("generate (prompts)", prompts)
    engines = {"vllm": generate_vllm, "hf": generate, "openai": generate_openai}
    stop = functools.partial(complete, mode=args.mode)
    record = engines[engine](args, by_id, need, stop, progress, run.keep_completions)
    print(
        f"generated {record['tokens']:,} tokens in {record['seconds']:,.1f} s ({record['tokens_per_s']} "
        f"tok/s; {record['engine']} {record['dtype']}, loaded in {record['load_s']:,.1f} s)"
    )
    if record.get("errors"):
        errors = record["errors"]
        print(f"{len(errors)} rows got no reply (e.g. {errors[0]['error']}); rerun the command to ask again")
    return record | {"chosen": why}
