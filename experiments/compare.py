"""The paper's comparison in one command: every objective x seed through the four stages, then one table.

Runs stages 01 and 02 once with the base model (on the training data, for the regions stage 03 uses, and
on the held-out data, for the "hard tokens" columns), then for each objective and seed: 03 (train), 01
with the checkpoint on the held-out data (token metrics) and 04 once per evaluation (kernel verdicts).
Each stage is called as a subprocess (`python 0N_*.py ...`, output in <run>/log.txt); this file only
decides what to run and aggregates the artifacts: the method lives in the stages.

Evaluations. An evaluation is a name and stage-04 arguments of its own, into <run>/eval-<name>/; its name
begins with its mode (`kernel`, `kernel-sampled`, `standalone`). `--evaluation kernel --evaluation
"kernel-sampled=--num-samples 4 --temperature 0.8 --seed 0"` gives the greedy verdict beside pass@1 and
pass@4 of samples; `--modes kernel,standalone` means one evaluation per mode, named by it.

Variants. An objective may name a variant after a dot (VARIANTS): extra arguments of one stage for its
runs. `cuset.no-snap` trains cuset on regions that stage 02 made with --no-snap-lines (for data whose
snapped regions cover much of each response); `profit.t01` trains profit with --profit-threshold 0.01.
With --eval-base (presets cpu-real, cpu-power) stage 04 also evaluates the untrained base model, a row of
its own.

    python experiments/compare.py --preset cpu-quick                  # tiny model, 2 CPU cores (see --help)
    python data/build_smollm2.py && python experiments/compare.py --preset cpu-real   # a real model, hours
    python experiments/compare.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --out runs/compare-qwen1.5b
    python experiments/compare.py --preset cpu-quick --objectives sft,cuset --seeds 1   # a smaller look
    python experiments/compare.py --preset cpu-power --runs sft-seed0,cuset-seed0          # part of one
    python experiments/compare.py --help

Outputs in --out: comparison.md (tables, what each column means, the commands), comparison.json (every
number), comparison.png (held-out NLL per CUDA-sensitivity category; only with matplotlib installed), and
base/ and <objective>-seed<k>/ with the stages' artifacts, log.txt (every stage call and its output) and
timings.json (seconds per step).

Resume. A step (one stage call) is finished when its artifact exists (meta.json; stage 04: summary.json)
and matches what would be run now: the arguments the stage records equal those it would be given (stage
04: its fingerprint.json), the data sha256 is the data's, and it is newer than the artifacts it reads (a
retrained checkpoint makes its profile and evaluations stale). Finished steps are skipped; a run whose
steps are all finished is skipped. A step that was interrupted continues: stage 01 with --resume when
<out>.partial/ holds the same run, newer than what it reads (else that folder is removed and it starts
over), stage 03 with --resume when <ckpt>/resume/ does (else --force: it starts over), stage 04 in the same
--out (it keeps finished rows; --force when the folder holds another run). A stage gets SIGTERM when this
command dies (Linux), so a rerun never races one left running. With everything finished a call only
re-aggregates. A finished training's resume state (<ckpt>/resume/) is deleted: the checkpoint stays.

Split across processes or sessions. `--runs sft-seed1,cuset-seed1` runs the base stages and those runs
only, and writes no table (two processes with one torch thread each share 2 cores; give --no-eval-base to
all but one, so that one evaluates the base model; keep their trainings apart where memory is short: stage
03 on SmolLM2-135M held about 11 GB with micro-batches of 4, and two at once were killed on a 24 GB
machine; on a CPU it now plans 5.2 GiB, one sample a micro-batch). `--save-record DIR`
copies every finished group (base, runs) into DIR without checkpoint weights (about 1 MB a run; commit it:
a new machine starts without runs/), and `--report-only --out DIR` makes the table from such a record as
it is, running nothing and checking no freshness (a record restored from git has no weights, and checkout
times for mtimes).

Metrics (comparison.md says what each column means). Token metrics come from stage 01's profile of the
checkpoint on the held-out data, aligned token by token with the base model's (same tokenizer and data,
checked). Paired differences to sft: per objective a matrix [seeds, units] (units: held-out samples for
token metrics, prompts = task x level for pass@1, each prompt's value its share of passing samples); a
bootstrap draws the units with replacement, the same draw for the objective and sft, and each side's
seeds with replacement, independently (seed k of one objective is a training apart from seed k of sft);
95% percentile interval of mean(objective) - mean(sft), its standard error, and the smallest difference
that design resolves at 80% power and a 5% two-sided level: (z_0.975 + z_0.8) x SE.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from statistics import NormalDist

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cuset_common lives at the repo root
from cuset_common.artifacts import args_to_json, finishes_out, read_artifact
from cuset_common.cli import ArgumentParser, UserError, check_ranges, load_script, run_main
from cuset_common.files import (
    read_jsonl,
    real_path,  # noqa: E402
    sha256_file,
    write_text_atomic,
)
from cuset_common.models import check_model_source
from cuset_common.out_lock import lock_out
from cuset_common.paths import (
    EVAL_SFT_FILE,
    EVAL_SFT_KERNEL_FILE,
    ROOT,
    SFT_FILE,
    SFT_KERNEL_FILE,
    SFT_KERNEL_ORIGINALS_FILE,
    SMOLLM2_MODEL,
    TINY_MODEL,
)
from harness.outcomes import APART
from profiler.shards import partial_dir  # noqa: E402
from training.checkpoint import resume_dir  # noqa: E402

OBJECTIVES = ("sft", "dft", "profit", "cuset", "cuset-mask", "cuset-weight")
MODES = ("kernel", "standalone")
EVALUATION_NAME = re.compile(rf"({'|'.join(MODES)})(-[A-Za-z0-9]+)*")  # its mode first: kernel-sampled
HELD_OUT = {
    SFT_KERNEL_FILE: EVAL_SFT_KERNEL_FILE,
    SFT_KERNEL_ORIGINALS_FILE: EVAL_SFT_KERNEL_FILE,
    SFT_FILE: EVAL_SFT_FILE,
}  # training data -> its held-out twin
# `<objective>.<variant>`: extra arguments of one stage for that objective's runs. A stage-02 variant makes
# regions of its own (base/regions.<variant>) and applies to the objectives that read regions; a stage-03
# variant changes the training only, for the objectives it names.
VARIANTS = {
    "no-snap": {"stage": "02", "args": ["--no-snap-lines"]},
    # ProFit's fixed threshold (stage 03's default p >= 0.1) ten times lower: whether the threshold, not the
    # method, fails on a model whose confidences sit low
    "t01": {"stage": "03", "args": ["--profit-threshold", "0.01"], "objectives": ("profit",)},
}
PRESETS = {  # per stage: arguments appended to its command line (--profile-args etc. replace them)
    "full": {
        "objectives": OBJECTIVES,
        "seeds": 3,
        "profile": [],
        "regions": [],
        "train": ["--batch-size", "64", "--micro-batch-size", "4", "--lr", "1e-5", "--epochs", "3"],
        "eval": ["--levels", "1,2,3", "--num-samples", "5", "--temperature", "0.8"],
        "standalone": [],
    },
    "cpu-quick": {
        "objectives": ("sft", "profit", "cuset"),
        "seeds": 2,
        "profile": [],
        "regions": [],
        "train": ["--max-steps", "100"],
        "eval": ["--levels", "1", "--backend", "emulate"],
        "standalone": ["--max-new-tokens", "512"],
    },
    # lr 1e-4 for one epoch (12 steps of 8): already enough for sft on SmolLM2-135M to write kernels that
    # compile and a few that pass (docs/comparison.md, "The real model on a CPU").
    "cpu-real": {
        "model": SMOLLM2_MODEL,
        "data": SFT_KERNEL_ORIGINALS_FILE,
        "modes": ("kernel",),
        "eval_base": True,
        "objectives": ("sft", "profit", "cuset", "cuset.no-snap"),
        "seeds": 2,
        "profile": [],
        "regions": [],
        "train": ["--lr", "1e-4", "--epochs", "1"],
        "eval": ["--levels", "1,2,3", "--backend", "emulate"],
        "standalone": [],
    },
    # Every objective x 3 seeds, greedy and sampled verdicts: a design sized to resolve a few points of
    # pass@1 (docs/comparison.md, "The powered design"). Training as cpu-real's: the pilot (docs/notebook.md)
    # found no longer training that passes more prompts.
    "cpu-power": {
        "model": SMOLLM2_MODEL,
        "data": SFT_KERNEL_ORIGINALS_FILE,
        "eval_base": True,
        "objectives": OBJECTIVES,
        "seeds": 3,
        # The power calculation asks for more seeds of the pair the question is about: with 3 the interval
        # of cuset - sft in pass@1 was 0.025 wide each side, projected to about 0.022 with 5
        # (docs/notebook.md, "seed 2, dft, cuset-mask and the profit diagnostic"; the record,
        # docs/records/cpu-power/comparison.md, measures it). profit.t01, the diagnostic of profit's
        # threshold, is one run when --objectives names it.
        "seeds_for": {"sft": 5, "cuset": 5, "profit.t01": 1},
        "profile": [],
        "regions": [],
        "train": ["--lr", "1e-4", "--epochs", "1"],
        "evaluations": {
            "kernel": ["--num-samples", "1", "--temperature", "0"],
            "kernel-sampled": [
                "--num-samples",
                "4",
                "--temperature",
                "0.2",
                "--top-p",
                "0.95",
                "--seed",
                "0",
            ],
        },
        "eval": ["--levels", "1,2,3", "--backend", "emulate", "--max-new-tokens", "512"],
        "standalone": [],
    },
}
PRESET_NOTES = {
    "full": """all six objectives x 3 seeds; stage 03 --batch-size 64 --micro-batch-size 4
--lr 1e-5 --epochs 3; stage 04 levels 1-3 of the 40 eval tasks, 5 samples at temperature 0.8 (pass@1 and
pass@5), backend auto. For a real model on a GPU: docs/comparison.md estimates its time.""",
    "cpu-quick": """\
the bundled tiny model on 2 CPU cores: sft, profit and cuset x 2 seeds (6 runs); stage 03
--max-steps 100 (800 of the 1,020 training samples, batches of 8); stage 04 level 1 of the 40 eval tasks
under the emulate backend in both modes, standalone answers cut at 512 new tokens (its references are
longer: on the tiny model standalone mode only exercises the path). About half an hour on 2 idle cores,
most of it stage 03 (docs/comparison.md has the measured times).""",
    "cpu-real": """\
SmolLM2-135M-Instruct (data/build_smollm2.py) on 2 CPU cores: the base model, then sft, profit, cuset
on snapped regions and cuset on unsnapped ones (cuset.no-snap: snapped regions cover about half of this
model's response tokens) x 2 seeds; stage 03 on the 102 kernel-mode train records without renamed copies,
1 epoch (12 steps of 8) at lr 1e-4; stage 04 in kernel mode only, levels 1-3 of the 40 eval tasks (120
prompts, greedy) under the emulate backend. Most of an hour a run at one torch thread beside a second run
(docs/comparison.md has the measured times), seed by seed: split it across processes and sessions with
--runs and keep what finished with --save-record.""",
    "cpu-power": """\
SmolLM2-135M-Instruct (data/build_smollm2.py): the base model, then sft, dft, profit, cuset and its two
ablations (cuset-mask, cuset-weight) x 3 seeds, sft and cuset x 5 (the power calculation); stage 03 on
the 102 kernel-mode train records, 1 epoch (12 steps of 8) at lr 1e-4 (the pilot in docs/notebook.md:
longer training lowers held-out NLL but passes no more prompts); stage 04 in kernel mode, levels 1-3 of
the 40 eval tasks (120 prompts) under the emulate backend, replies cut at 512 new tokens (the longest
that passed so far: 114), twice: `kernel` greedy (one reply per prompt) and `kernel-sampled`, 4 replies
per prompt at temperature 0.2, top-p 0.95, sampling seed 0 (unbiased pass@1 and pass@4;
docs/comparison.md says why 0.2). Paired intervals resample seeds and prompts. Split it across processes
and sessions with --runs and keep what finished with --save-record; `profit.t01` (--objectives) is the
diagnostic of profit's threshold, one seed. About 20 minutes a run on 2 idle cores, 9 hours in all
(docs/comparison.md has the measured times).""",
}
PRESET_HELP = "\n".join(
    f"{name}{' (default)' if name == 'full' else ''}: {note}" for name, note in PRESET_NOTES.items()
)
TOKEN_GROUPS = ("all", "sensitive", "base_hard", "base_region")
UNIT_METRICS = (
    "all.nll",
    "sensitive.nll",
    "base_hard.nll",
    "all.acc",
)  # token metrics with a paired bootstrap
COLUMNS = {
    "all": "every response token of the held-out data",
    "sensitive": "CUDA-sensitive tokens (stage 01's tagger, any category)",
    "base_hard": "tokens the base model found hard: base confidence below the sample's threshold tau_i "
    "(stage 02 on the base model's held-out profile, as stored)",
    "base_region": "tokens inside the base model's low-confidence CUDA-sensitive regions "
    "(stage 02 on the held-out data)",
    "nll": "mean negative log-likelihood of the gold token, nats per token (confidences below float32's "
    "smallest normal count as that: at most 87.3)",
    "acc": "token accuracy: share of tokens whose argmax is the gold token",
    "compile_rate / pass@1 / pass@k": "stage 04's summary.json (overall) of that evaluation "
    "(<evaluation>.<metric>: its folder eval-<evaluation>)",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, each checked before any work (check_before_work): a bad one is one line, exit 2."""
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = ap.add_argument
    a("--preset", choices=tuple(PRESETS), default="full", help=PRESET_HELP)
    a(
        "--model",
        default=None,
        help="base model: hub id or local folder (default: the preset's; the bundled "
        "tiny model, SmolLM2 for cpu-real and cpu-power)",
    )
    a(
        "--data",
        type=Path,
        default=None,
        help="training SFT JSONL of stages 01-03 (default: the preset's; "
        f"{SFT_KERNEL_FILE.relative_to(ROOT)} but for cpu-real and cpu-power)",
    )
    a(
        "--eval-data",
        type=Path,
        default=None,
        help="held-out SFT JSONL (default: the held-out twin of --data)",
    )
    a("--out", type=Path, default=None, help="output folder (default: runs/compare-<preset>)")
    a(
        "--objectives",
        default=None,
        help="comma-separated objectives, each optionally with a variant after "
        f"a dot ({variants_help()}): e.g. cuset.no-snap, profit.t01 "
        "(default: the preset's)",
    )
    a("--seeds", type=int, default=None, help="seeds 0..N-1 per objective (default: the preset's)")
    a(
        "--seeds-for",
        default=None,
        help="another seed count for some objectives, e.g. sft=5,cuset=5,profit.t01=1: seeds 0..N-1 "
        "of each named one (default: the preset's when --seeds is not given, else none)",
    )
    a(
        "--modes",
        default=None,
        help="stage 04 modes, one evaluation each, named by its mode (default: the "
        "preset's evaluations; both modes but for cpu-real and cpu-power)",
    )
    a(
        "--evaluation",
        action="append",
        default=None,
        metavar="NAME[=ARGS]",
        help="a stage-04 evaluation into <run>/eval-NAME, with ARGS (one string) after --eval-args; NAME "
        f"begins with its mode ({', '.join(MODES)}), e.g. --evaluation kernel --evaluation "
        "'kernel-sampled=--num-samples 4 --temperature 0.8 --seed 0'; repeat it for each (default: "
        "the preset's; instead of --modes)",
    )
    a(
        "--eval-base",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stage 04 on the untrained base model too "
        "(default: the preset's; on for cpu-real and cpu-power)",
    )
    a(
        "--max-length",
        type=int,
        default=2048,
        help="tokens per sample for stages 01 and 03 alike (default: %(default)s)",
    )
    for stage in ("profile", "regions", "train", "eval", "standalone"):
        a(
            f"--{stage}-args",
            default=None,
            help=f"extra arguments of the {stage} stage, one string (default: the preset's)"
            if stage != "standalone"
            else "extra arguments of stage 04 in standalone mode only, after --eval-args "
            "(default: the preset's)",
        )
    a(
        "--bootstrap",
        type=int,
        default=2000,
        help="bootstrap resamples of the paired differences (default: %(default)s)",
    )
    a(
        "--runs",
        default=None,
        help="comma-separated run names (<objective>-seed<k>): run the base stages and these runs only, "
        "and write no table",
    )
    a(
        "--save-record",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy every finished group of --out into DIR/<group>, checkpoint weights left out, and exit",
    )
    a(
        "--report-only",
        action="store_true",
        help="make the table from the artifacts in --out as they are (a --save-record folder): run nothing",
    )
    a(
        "--stop-after",
        type=int,
        default=None,
        help="stop after N stage calls in this invocation (time "
        "slices; tests use it to interrupt a comparison "
        "deterministically)",
    )
    args = ap.parse_args(argv)
    check_ranges(
        ap,
        args,
        {"seeds": "[1, inf)", "max_length": "[1, inf)", "bootstrap": "[1, inf)", "stop_after": "[1, inf)"},
    )
    preset = PRESETS[args.preset]
    args.objectives = args.objectives.split(",") if args.objectives else list(preset["objectives"])
    preset_more = {k: n for k, n in preset.get("seeds_for", {}).items() if k in args.objectives}
    preset_more = preset_more if args.seeds is None else {}
    args.seeds = preset["seeds"] if args.seeds is None else args.seeds
    args.seeds_for = parse_seeds_for(args.seeds_for, preset_more, args.objectives)
    args.evaluations = evaluations(args.evaluation, args.modes, preset)
    args.eval_base = preset.get("eval_base", False) if args.eval_base is None else args.eval_base
    args.model = args.model or str(preset.get("model", TINY_MODEL))
    args.data = args.data or preset.get("data", SFT_KERNEL_FILE)
    forwarded = {stage: getattr(args, f"{stage}_args") for stage in FORWARDED}  # as typed (None: preset's)
    for stage, given in forwarded.items():
        setattr(
            args,
            f"{stage}_args",
            split_args(f"--{stage}-args", given) if given is not None else list(preset[stage]),
        )
    check_objectives(args.objectives)
    if args.eval_data is None:
        args.eval_data = HELD_OUT.get(args.data.resolve())
        if args.eval_data is None:
            raise UserError(f"--data {args.data}: pass --eval-data, the held-out SFT data for it")
    for path in (args.data, args.eval_data):
        if not path.is_file():
            raise UserError(f"{path}: no such file")
    args.out = args.out or Path("runs") / f"compare-{args.preset}"
    args.runs = args.runs.split(",") if args.runs else None
    names = [r["name"] for r in plan(args)[1]] if args.runs else []
    if unknown := sorted(set(args.runs or ()) - set(names)):
        raise UserError(
            f"--runs: no run {', '.join(unknown)} in this comparison; its runs are {', '.join(names)}"
        )
    check_before_work(args, forwarded)
    return args


def check_objectives(objectives: list[str]) -> None:
    """Each objective known, with a variant only where it applies; sft among them; each once."""
    if bad := [o for o in objectives if not known_objective(o)]:
        raise UserError(
            f"unknown objective {', '.join(bad)}; objectives: {', '.join(OBJECTIVES)}, each "
            f"optionally with a variant after a dot ({variants_help()})"
        )
    if "sft" not in objectives or len(set(objectives)) < len(objectives):
        raise UserError("--objectives must include sft (the differences are to sft), each objective once")


def parse_seeds_for(given: str | None, preset: dict[str, int], objectives: list[str]) -> dict[str, int]:
    """--seeds-for sft=5,cuset=5 as {objective: seeds} (the preset's when not given); each one among
    --objectives, with one seed or more."""
    if given is None:
        return dict(preset)
    out = {}
    for item in given.split(","):
        label, _, count = item.partition("=")
        if not count.isdigit() or label in out:
            raise UserError(
                f"--seeds-for {given}: write objective=N, each objective once, e.g. sft=5,cuset=5"
            )
        if label not in objectives or int(count) < 1:
            raise UserError(
                f"--seeds-for {label}={count}: name one of --objectives ({','.join(objectives)}) "
                "with one seed or more"
            )
        out[label] = int(count)
    return out


def seed_count(args, label: str) -> int:
    return args.seeds_for.get(label, args.seeds)


def most_seeds(args) -> int:
    return max(seed_count(args, label) for label in args.objectives)


def seeds_text(args) -> str:
    """'3 seeds', or '3 seeds (sft 5, profit.t01 1)' where some objectives have another count."""
    more = [(label, n) for label, n in args.seeds_for.items() if n != args.seeds]
    text = f"{args.seeds} seed{'s' if args.seeds > 1 else ''}"
    return text + (f" ({', '.join(f'{label} {n}' for label, n in more)})" if more else "")


# The stage whose arguments each --<name>-args forwards (standalone: stage 04, after --eval-args).
FORWARDED = {"profile": "01", "regions": "02", "train": "03", "eval": "04", "standalone": "04"}


def split_args(option: str, given: str) -> list[str]:
    """An argument string split as a shell would; an unbalanced quote is a UserError naming `option`."""
    try:
        return shlex.split(given)
    except ValueError as e:
        example = (
            f"{option} '--flag value'" if option.endswith("-args") else "--evaluation 'NAME=--flag value'"
        )
        raise UserError(
            f"{option} {given!r}: {e} (an unbalanced quote?); quote it as one shell word, e.g. {example}"
        ) from None


def evaluations(given: list[str] | None, modes: str | None, preset: dict) -> dict[str, list[str]]:
    """{name: its own stage-04 arguments}, in order: --evaluation's, else one per --modes mode (named by it,
    no arguments of its own), else the preset's evaluations (or modes)."""
    if given is not None and modes:
        raise UserError("give --evaluation or --modes, not both (--modes kernel is --evaluation kernel)")
    if given is not None:
        pairs = [(name, own) for name, _, own in (text.partition("=") for text in given)]
    elif modes:
        pairs = [(mode, []) for mode in modes.split(",")]
    else:
        pairs = list(preset.get("evaluations", {m: [] for m in preset.get("modes", MODES)}).items())
    for name, _ in pairs:
        if not EVALUATION_NAME.fullmatch(name):
            raise UserError(
                f"evaluation {name!r}: a name begins with its mode ({', '.join(MODES)}), then "
                f"optionally -<letters or digits>, e.g. kernel-sampled (--evaluation, --modes)"
            )
    pairs = [
        (name, split_args(f"--evaluation {name}", own) if isinstance(own, str) else list(own))
        for name, own in pairs
    ]
    for name, own in pairs:
        if any(a == "--mode" or a.startswith("--mode=") for a in own):
            raise UserError(f"evaluation {name}: its name gives its mode; leave --mode out of its arguments")
    if len({name for name, _ in pairs}) < len(pairs):
        raise UserError(f"evaluations {', '.join(n for n, _ in pairs)}: each name once")
    return dict(pairs)


def evaluation_mode(name: str) -> str:
    """An evaluation's stage-04 mode: the first word of its name."""
    return name.split("-")[0]


def check_before_work(args, forwarded: dict[str, str | None]) -> None:
    """Refuse, before the first stage starts and before any file is made, what would fail later: an --out
    or --save-record that cannot hold what is written there, a model that is not there (when stages will
    run), and any stage call of the plan that its stage's own parser and range checks refuse, named by the
    --<name>-args string it came from."""
    for option, path in (("--out", args.out), ("--save-record", args.save_record)):
        if path is not None:
            real_path(path, option)  # a loop of links is refused; a link to a folder is followed
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} is a file; name a folder")
    base_steps, runs = plan(args)
    if args.save_record is not None:
        check_record_folder(args.save_record, args.out, step_groups(args, base_steps, runs))
    elif not args.report_only:  # a record's table needs no model
        if args.model == str(SMOLLM2_MODEL) and not (SMOLLM2_MODEL / "config.json").is_file():
            raise UserError(
                f"{SMOLLM2_MODEL}: not built; run `python data/build_smollm2.py` (about a minute)"
            )
        check_model_source(args.model)
    for step in base_steps + [s for r in runs for s in r["steps"]]:
        if (refusal := stage_refusal(step["stage"], step["argv"])) is not None:
            raise UserError(
                f"{refused_source(args, step, forwarded)}: python {STAGES[step['stage']]} "
                f"refuses its arguments ({refusal}); see python {STAGES[step['stage']]} --help"
            )


def refused_source(args, step: dict, forwarded: dict[str, str | None]) -> str:
    """The option whose arguments a refused stage call took last: a stage-04 call ends with the
    evaluation's own arguments and then, in standalone mode, --standalone-args, so it is asked again
    without those, one part at a time."""
    name = next(n for n, key in FORWARDED.items() if key == step["stage"])
    if step["stage"] == "04":
        argv, evaluation = step["argv"], step["evaluation"]
        standalone = args.standalone_args if evaluation_mode(evaluation) == "standalone" else []
        own = args.evaluations[evaluation]
        if standalone and stage_refusal("04", argv[: len(argv) - len(standalone)]) is None:
            name = "standalone"
        elif own and stage_refusal("04", argv[: len(argv) - len(standalone) - len(own)]) is None:
            given = "--evaluation" if args.evaluation is not None else "the preset's evaluation"
            return f"{given} {evaluation} ({shlex.join(own)!r})"
    return (
        f"--{name}-args {forwarded[name]!r}"
        if forwarded[name] is not None
        else f"--{name}-args (the preset's, with the options given)"
    )


def stage_refusal(key: str, argv: list[str]) -> str | None:
    """What stage `key`'s own parse_args (its parser and range checks) says of argv; None if it takes it."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            stage_module(key).parse_args(argv)
    except SystemExit as e:
        if e.code == 0:
            return "it asks for --help"
        last = said.getvalue().strip().splitlines()[-1:] or [f"exit status {e.code}"]
        return last[0].removeprefix("error: ").removesuffix("; see --help")
    except UserError as e:
        return str(e)
    return None


def check_record_folder(record: Path, out: Path, groups: list[tuple[str, list[dict], Path]]) -> None:
    """--save-record must be a folder (or one to make) apart from --out: neither inside the other, so that
    a copy never lands in what it copies; and no folder it copies into may be a file."""
    holder = next((p for p in [record, *record.absolute().parents] if p.exists()), None)
    if holder is not None and not holder.is_dir():
        raise UserError(f"--save-record {record}: {holder} is a file; name a folder")
    targets = [record / name / step["out"].name for name, steps, _ in groups for step in steps]
    if file := next((t for p in targets for t in (p.parent, p) if t.is_file()), None):
        raise UserError(
            f"--save-record {record}: {file} is a file where the record keeps a folder; move it "
            f"away, or name another folder"
        )
    real_record, real_out = record.resolve(), out.resolve()
    if real_record == real_out or real_out in real_record.parents or real_record in real_out.parents:
        raise UserError(
            f"--save-record {record} and --out {out} overlap (one is the other or inside it); "
            f"the record is a copy of --out: name a folder outside it"
        )


def known_objective(label: str) -> bool:
    """`sft`, `cuset`, ... or `<objective>.<variant>` (cuset.no-snap, profit.t01): a variant where it
    applies."""
    objective, _, variant = label.partition(".")
    return objective in OBJECTIVES and (
        not variant or (variant in VARIANTS and objective in variant_objectives(variant))
    )


def variant_objectives(variant: str) -> tuple[str, ...]:
    """The objectives a variant applies to: a stage-02 one to those that read regions."""
    spec = VARIANTS[variant]
    return stage_module("03").REGION_OBJECTIVES if spec["stage"] == "02" else spec["objectives"]


def variants_help() -> str:
    """Each variant, the stage arguments it adds and the objectives it applies to, for --help and errors."""
    return "; ".join(
        f"{name}: stage {spec['stage']} {shlex.join(spec['args'])}, for "
        + ("the objectives that read regions" if spec["stage"] == "02" else ", ".join(spec["objectives"]))
        for name, spec in VARIANTS.items()
    )


def variant_args(variant: str, stage: str) -> list[str]:
    """The arguments a variant (or "" for none) adds to `stage`'s command line."""
    return list(VARIANTS[variant]["args"]) if variant and VARIANTS[variant]["stage"] == stage else []


def region_variants(args) -> list[str]:
    """The stage-02 variants the objectives name (`cuset.no-snap` -> no-snap), sorted."""
    named = {label.partition(".")[2] for label in args.objectives}
    return sorted(v for v in named if variant_args(v, "02"))


def regions_dir(base: Path, variant: str) -> Path:
    return base / (f"regions.{variant}" if variant else "regions")


# ---------------------------------------------------------------------------------------
# Steps: one stage call each, skipped when its artifact matches, continued when interrupted
# ---------------------------------------------------------------------------------------

STAGES = {
    "01": "01_profile.py",
    "02": "02_label_regions.py",
    "03": "03_train_cuset.py",
    "04": "04_eval_kernels.py",
}
_modules: dict[str, object] = {}


def stage_module(key: str):
    """The stage's own module, to parse a command line the way it will (loaded once, never run here)."""
    if key not in _modules:
        _modules[key] = load_script(STAGES[key])
    return _modules[key]


def plan(args) -> tuple[list[dict], list[dict]]:
    """(base steps, runs): a step is {stage, argv, out, inputs}; a run is {name, objective, seed, steps}."""
    base, m = args.out / "base", ["--model", args.model]
    ml = ["--max-length", str(args.max_length)]
    steps = []
    variants = region_variants(args)
    for tag, data in (("", args.data), ("-heldout", args.eval_data)):
        prof = base / f"profile{tag}"
        steps.append(
            {
                "stage": "01",
                "out": prof,
                "inputs": [],
                "argv": [*m, "--data", str(data), "--out", str(prof), *ml, *args.profile_args],
            }
        )
        for variant in [""] + (variants if not tag else []):  # variants of the training data's regions only
            reg = regions_dir(base, variant) if not tag else base / f"regions{tag}"
            steps.append(
                {
                    "stage": "02",
                    "out": reg,
                    "inputs": [prof / "meta.json"],
                    "argv": [
                        *m,
                        "--data",
                        str(data),
                        "--profile",
                        str(prof),
                        "--out",
                        str(reg),
                        *args.regions_args,
                        *variant_args(variant, "02"),
                    ],
                }
            )
    steps += [eval_step(args, args.model, base, name) for name in args.evaluations if args.eval_base]
    runs = []
    # seed by seed: a stop midway leaves every objective's first seeds, comparable, not one objective's all
    for seed in range(most_seeds(args)):
        for label in [label for label in args.objectives if seed < seed_count(args, label)]:
            objective, _, variant = label.partition(".")
            d = args.out / f"{label}-seed{seed}"
            ckpt, held = d / "ckpt", d / "profile-heldout"
            regions = regions_dir(base, variant if variant_args(variant, "02") else "")
            uses_regions = objective in stage_module("03").REGION_OBJECTIVES
            run = [
                {
                    "stage": "03",
                    "out": ckpt,
                    "inputs": [regions / "meta.json"] if uses_regions else [],
                    "argv": [
                        *m,
                        "--data",
                        str(args.data),
                        "--regions",
                        str(regions),
                        "--objective",
                        objective,
                        "--seed",
                        str(seed),
                        "--out",
                        str(ckpt),
                        *ml,
                        *args.train_args,
                        *variant_args(variant, "03"),
                    ],
                },
                {
                    "stage": "01",
                    "out": held,
                    "inputs": [ckpt / "meta.json"],
                    "argv": [
                        "--model",
                        str(ckpt),
                        "--data",
                        str(args.eval_data),
                        "--out",
                        str(held),
                        *ml,
                        *args.profile_args,
                    ],
                },
            ]
            run += [eval_step(args, str(ckpt), d, name, [ckpt / "meta.json"]) for name in args.evaluations]
            runs.append({"name": d.name, "objective": label, "seed": seed, "dir": d, "steps": run})
    return steps, runs


def eval_step(args, model: str, folder: Path, name: str, inputs: list[Path] = ()) -> dict:
    """Stage 04 on the eval split, one evaluation, into <folder>/eval-<name>: --eval-args, then the
    evaluation's own arguments, then (standalone mode) --standalone-args."""
    out, mode = folder / f"eval-{name}", evaluation_mode(name)
    return {
        "stage": "04",
        "out": out,
        "inputs": list(inputs),
        "evaluation": name,
        "argv": [
            "--model",
            model,
            "--mode",
            mode,
            "--split",
            "eval",
            "--out",
            str(out),
            *args.eval_args,
            *args.evaluations[name],
            *(args.standalone_args if mode == "standalone" else []),
        ],
    }


def command(step: dict, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, str(ROOT / STAGES[step["stage"]]), *step["argv"], *extra]


def typed(arg) -> str:
    """A path inside the repository as a user types it (relative), anything else unchanged."""
    arg = str(arg)
    inside = os.path.isabs(arg) and Path(arg).is_relative_to(ROOT)
    return os.path.relpath(arg) if inside else arg


def shown(cmd: list[str]) -> str:
    """A command as a user types it: `python 03_train_cuset.py ...`."""
    return shlex.join(["python", *map(typed, cmd[1:])])


def same_args(saved: dict, now, ignore: set[str]) -> bool:
    if not isinstance(saved, dict):  # an edited or damaged record: the step runs again
        return False
    now = args_to_json(now)
    return all(saved.get(k) == now.get(k) for k in set(saved) | set(now) if k not in ignore)


@functools.cache
def data_sha256(path: str, mtime_ns: int) -> str:
    """sha256 of a data file, once per version of it (finished() asks for every step)."""
    return sha256_file(Path(path))


def read_json(path: Path) -> dict | None:
    """A JSON object file; None when it is absent, unreadable or not an object (its step runs again)."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def fingerprint(step: dict) -> dict:
    """What stage 04 would record in fingerprint.json for this step (its own function, on its own
    parsing)."""
    mod = stage_module("04")
    now = mod.parse_args(step["argv"])
    return mod.run_fingerprint(now, mod.resolve_backend(now.backend, mod.gpu_name()))


def stamp_file(step: dict) -> Path:
    """The file a step writes last, which says it finished: stage 04's summary.json, else meta.json."""
    return step["out"] / ("summary.json" if step["stage"] == "04" else "meta.json")


def finished(step: dict) -> bool:
    """The step's artifact exists, matches what would be run now, and is newer than what it reads."""
    mod, out, stage = stage_module(step["stage"]), step["out"], step["stage"]
    stamp = stamp_file(step)
    if not stamp.exists() or any(
        not p.exists() or p.stat().st_mtime > stamp.stat().st_mtime for p in step["inputs"]
    ):
        return False
    if stage == "04":  # a summary.json the table cannot read (damaged, edited by hand) is made again
        return summary_problem(read_json(stamp)) is None and read_json(
            out / "fingerprint.json"
        ) == fingerprint(step)
    meta, now = read_json(stamp) or {}, mod.parse_args(step["argv"])
    if not same_args(meta.get("args", {}), now, {"force"} if stage == "02" else mod.RESUME_MAY_CHANGE):
        return False
    weights = ("model.safetensors", "model.safetensors.index.json")  # one file, or shards and their index
    if stage == "03" and not (meta.get("final_step") and any((out / w).exists() for w in weights)):
        return False
    data = meta.get("data")
    return stage == "02" or (
        isinstance(data, dict)
        and data.get("sha256") == data_sha256(str(now.data), now.data.stat().st_mtime_ns)
    )


def continuation(step: dict, log) -> tuple[str, ...]:
    """Arguments that continue an interrupted step, or start it over where it cannot continue: another run's
    state, or one older than what the step reads (a checkpoint or regions made again since), is not
    resumed."""
    mod, out, stage = stage_module(step["stage"]), step["out"], step["stage"]

    def resumable(state: Path) -> bool:
        saved = read_json(state)
        return (
            saved is not None
            and not any(p.exists() and p.stat().st_mtime > state.stat().st_mtime for p in step["inputs"])
            and same_args(saved.get("args", saved), mod.parse_args(step["argv"]), mod.RESUME_MAY_CHANGE)
        )

    if stage == "01" and (partial_dir(out) / "state.json").exists():
        if resumable(partial_dir(out) / "state.json"):
            return ("--resume",)
        log(f"removing {partial_dir(out)}: partial results of another run")
        shutil.rmtree(partial_dir(out))
    if stage == "03":
        if resumable(resume_dir(out) / "args.json"):
            return ("--resume",)
        return ("--force",) if out.exists() and any(out.iterdir()) else ()
    if stage == "04" and read_json(out / "fingerprint.json") not in (None, fingerprint(step)):
        return ("--force",)
    return ()


def die_with_parent() -> None:
    """In the stage's process before it starts (Linux): SIGTERM when this command dies, even by SIGKILL, so
    that a rerun never races a stage left running (the stages write atomically; a rerun continues what it
    left)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: a killed comparison leaves its current stage running to the end


def hms(seconds: float) -> str:
    return (
        f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
        if seconds >= 3600
        else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    )


def step_groups(args, base_steps: list[dict], runs: list[dict]) -> list[tuple[str, list[dict], Path]]:
    """(name, steps, folder): the base stages, then each run."""
    return [("base", base_steps, args.out / "base")] + [(r["name"], r["steps"], r["dir"]) for r in runs]


def execute(args) -> tuple[list[dict], list[dict], int, bool]:
    """Run what is not finished; returns (base steps, runs, stage calls made, stopped by --stop-after)."""
    base_steps, runs = plan(args)
    groups = [
        g for g in step_groups(args, base_steps, runs) if g[0] == "base" or not args.runs or g[0] in args.runs
    ]
    pending = [g for g in groups if not all(finished(s) for s in g[1])]
    print(
        f"[compare] {len(runs)} runs ({', '.join(args.objectives)} x {seeds_text(args)}) + base stages; "
        f"{len(groups) - len(pending)} of {len(groups)} groups finished earlier; out {args.out}",
        flush=True,
    )
    if pending and args.preset == "full" and stage_module("04").gpu_name() is None:
        print(
            "[compare] note: the full preset is sized for a real model on a GPU and none is listed here; "
            "--presets cpu-quick and cpu-real are the CPU ones",
            flush=True,
        )
    calls, t0, done_now, run_seconds = 0, time.time(), 0, []
    for i, (name, steps, folder) in enumerate(groups):
        label = "base stages 01+02" if name == "base" else f"run {i}/{len(runs)} {name}"
        if all(finished(s) for s in steps):
            print(f"[compare] {label}: finished, skipped", flush=True)
            continue
        runs_left = sum(g[0] != "base" for g in pending[done_now:])  # this one included
        eta = f"ETA {hms(np.mean(run_seconds) * runs_left)}" if run_seconds else "ETA after the first run"
        print(
            f"[compare] {label} ({done_now + 1}/{len(pending)} to do) | elapsed "
            f"{hms(time.time() - t0)} | {eta}",
            flush=True,
        )
        t_group = time.time()
        folder.mkdir(parents=True, exist_ok=True)
        timings_path = folder / "timings.json"
        timings = json.loads(timings_path.read_text()) if timings_path.exists() else {}
        for step in steps:
            key = f"{STAGES[step['stage']]} -> {step['out'].name}"
            if finished(step):
                print(f"[compare]   {key}: finished, skipped", flush=True)
                continue
            if args.stop_after is not None and calls >= args.stop_after:
                print(
                    f"[compare] stopped after {calls} stage calls (--stop-after); rerun the same command "
                    f"to continue",
                    flush=True,
                )
                return base_steps, runs, calls, True
            with open(folder / "log.txt", "a") as log:
                cmd = command(
                    step, continuation(step, lambda msg: print(f"[compare]   {msg}", file=log, flush=True))
                )
                print(f"[compare]   {shown(cmd)}   (log: {folder / 'log.txt'})", flush=True)
                print(f"\n$ {shown(cmd)}", file=log, flush=True)
                t = time.time()
                rc = subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
                ).returncode
            calls += 1
            timings[key] = round(time.time() - t, 1)
            write_text_atomic(timings_path, json.dumps(timings, indent=2) + "\n")
            if rc != 0:
                tail = "".join((folder / "log.txt").read_text().splitlines(keepends=True)[-15:])
                raise UserError(
                    f"{shown(cmd)} failed (exit {rc}); last lines of {folder / 'log.txt'}:\n{tail}"
                )
            # its resume state (weights + AdamW: 18 GB for 1.5B) is
            if step["stage"] == "03" and finished(step):
                for old in ("resume", ".resume.old"):  # of no use once the checkpoint is written
                    shutil.rmtree(step["out"] / old, ignore_errors=True)
        done_now += 1
        run_seconds += [time.time() - t_group] if name != "base" else []
    print(f"[compare] {calls} stage calls in {hms(time.time() - t0)}", flush=True)
    return base_steps, runs, calls, False


# ---------------------------------------------------------------------------------------
# Records: finished results without weights, to keep (commit) and to report from as they are
# ---------------------------------------------------------------------------------------

CKPT_KEPT = ("meta.json", "log.jsonl")  # of a checkpoint folder: its arguments and its training log


def without_weights(folder: str, names: list[str]) -> list[str]:
    """copytree's ignore: a checkpoint keeps CKPT_KEPT only (its weights and resume state stay behind)."""
    return [n for n in names if n not in CKPT_KEPT] if Path(folder).name == "ckpt" else []


def save_record(args) -> int:
    """Copy each finished group of --out into --save-record, step folder by step folder: a step's earlier
    copy is replaced, the others stay (a base model evaluated in another session keeps its results)."""
    base_steps, runs = plan(args)
    saved = []
    for name, steps, folder in step_groups(args, base_steps, runs):
        if not all(finished(s) for s in steps):
            continue
        dest = args.save_record / name
        for src in [s["out"] for s in steps]:
            tmp = dest / f".{src.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp, ignore=without_weights)
            shutil.rmtree(dest / src.name, ignore_errors=True)
            os.replace(tmp, dest / src.name)
        timings = (read_json(dest / "timings.json") or {}) | (read_json(folder / "timings.json") or {})
        write_text_atomic(dest / "timings.json", json.dumps(timings, indent=2) + "\n")
        if (folder / "log.txt").exists():
            shutil.copyfile(folder / "log.txt", dest / "log.txt")
        saved.append(name)
    print(
        f"[compare] saved {len(saved)} finished group(s) into {args.save_record}: "
        f"{', '.join(saved) or 'none'}; the table: --report-only --out {args.save_record}"
    )
    return 0


def missing_results(args, base_steps: list[dict], runs: list[dict]) -> list[str]:
    """`group (folder, ...)` for each group of --out that lacks artifacts the table reads: every step's but
    stage 03's and the base profile of the training data (the regions stand for it)."""
    missing = []
    for name, steps, _ in step_groups(args, base_steps, runs):
        read = [s for s in steps if s["stage"] != "03" and (s["stage"], s["out"].name) != ("01", "profile")]
        lacks = [s["out"].name for s in read if not stamp_file(s).exists()]
        missing += [f"{name} ({', '.join(lacks)})"] if lacks else []
    return missing


# ---------------------------------------------------------------------------------------
# Aggregation: token metrics from the profiles, kernel verdicts from stage 04's summaries
# ---------------------------------------------------------------------------------------

PROFILE = {"confidence": np.float32, "argmax_correct": np.uint8, "sensitive": np.uint8, "token_ids": np.int32}


def read_profile(path: Path, base: tuple[dict, dict] | None = None) -> tuple[dict, dict]:
    """A stage-01 profile; with `base`, refused unless it lines up with the base model's token by token."""
    t, meta = read_artifact(
        path, "01_profile", f"experiments/compare.py (stage 01 into {path})", token_tensors=PROFILE
    )
    if base is not None:
        bt, bmeta = base
        for what, get in (
            ("tokenizer", lambda m: m.get("tokenizer_fingerprint")),
            ("data", lambda m: (m.get("data") or {}).get("sha256")),
        ):
            if get(meta) != get(bmeta):
                raise UserError(
                    f"{path}: made with another {what} (meta.json) than the base model's "
                    "held-out profile; token metrics align the two token by token: profile "
                    f"both with the same tokenizer and --eval-data"
                )
        if not (
            np.array_equal(t["sample_offsets"], bt["sample_offsets"])
            and np.array_equal(t["token_ids"], bt["token_ids"])
        ):
            raise UserError(
                f"{path}: its tokens differ from the base model's held-out profile (same "
                "tokenizer and data but another --max-length?); rerun both with the same "
                "settings"
            )
    return t, meta


def per_sample(values: np.ndarray, mask: np.ndarray, sample_of: np.ndarray, n: int) -> np.ndarray:
    """Mean of values over each sample's masked tokens; nan for a sample without one. [S]"""
    count = np.bincount(sample_of, weights=mask, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(sample_of, weights=values * mask, minlength=n) / count


def token_metrics(
    prof: dict, groups: dict[str, np.ndarray], sample_of: np.ndarray, n: int
) -> tuple[dict, dict]:
    """({group.nll, group.acc: mean over the group's tokens}, {UNIT_METRICS: per-sample means [S]})."""
    nll = -np.log(np.maximum(prof["confidence"].astype(np.float64), np.finfo(np.float32).tiny))  # [T]
    acc = prof["argmax_correct"].astype(np.float64)  # [T]
    metrics, units = {}, {}
    for g, mask in groups.items():
        for name, v in (("nll", nll), ("acc", acc)):
            metrics[f"{g}.{name}"] = float(v[mask].mean()) if mask.any() else math.nan
            if f"{g}.{name}" in UNIT_METRICS:
                units[f"{g}.{name}"] = per_sample(v, mask, sample_of, n)
    return metrics, units


def kernel_metrics(folder: Path, name: str) -> tuple[dict, dict, str, int]:
    """One evaluation's overall compile rate, pass@1 and pass@k (stage 04's summary.json), its per-prompt
    pass@1 (unit: task x level; the prompt's share of passing samples c/n, unbiased), backend, k."""
    anew = (
        f"not as stage 04 wrote it; restore it, or remove {folder} and run without --report-only to "
        f"evaluate anew"
    )
    summary_path, results_path = folder / "summary.json", folder / "results.jsonl"
    summary = read_json(summary_path)
    if problem := summary_problem(summary):
        raise UserError(f"{summary_path}: {problem}, {anew}")
    k, over = summary["num_samples"], summary["overall"]
    metrics = {
        f"{name}.compile_rate": over["compile_rate"],
        f"{name}.pass@1": over["pass@1"],
        f"{name}.pass@k": over.get(f"pass@{k}", over["pass@1"]),
    }
    judged: dict[str, list[bool]] = {}
    for lineno, r in read_jsonl(results_path):
        if (
            type(r.get("task_id")) not in (str, int)
            or type(r.get("level")) is not int
            or type(r.get("outcome")) is not str
        ):
            raise UserError(
                f"{results_path}:{lineno}: a row needs task_id, level (an integer) and outcome "
                f"(a string), {anew}"
            )
        if r["outcome"] not in APART:
            judged.setdefault(f"{r['task_id']}/L{r['level']}", []).append(r["outcome"] == "pass")
    units = {f"{name}.pass@1": {key: float(np.mean(v)) for key, v in judged.items()}}
    return metrics, units, summary["backend"], k


def summary_problem(summary: dict | None) -> str | None:
    """What keeps kernel_metrics from reading a stage-04 summary.json (read_json's value: None when it is
    absent or no JSON object), in words; None when it holds all it reads."""
    if summary is None:
        return "absent, or not a JSON object"
    k, over = summary.get("num_samples"), summary.get("overall")
    if type(k) is not int or k < 1:
        return "num_samples must be an integer >= 1"
    if not isinstance(summary.get("backend"), str):
        return "backend must be a string"
    if not isinstance(over, dict):
        return "overall must be an object"
    rates = ("compile_rate", "pass@1", *([f"pass@{k}"] if k > 1 else []))  # pass@k: pass@1 when k is 1
    if bad := [r for r in rates if type(over.get(r)) not in (int, float) or not 0 <= over[r] <= 1]:
        return f"overall.{bad[0]} must be a number in [0, 1]"
    return None


# The power statement: a two-sided test at the 5% level (z_0.975) with 80% power (z_0.8) detects a true
# difference of (z_0.975 + z_0.8) x SE four times in five (normal approximation, the SE the bootstrap's).
POWER_Z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)  # 1.960 + 0.842
BOOTSTRAP_CHUNK = 250  # resamples at a time: [250, seeds, units] float64 is a few MB at 200 prompts


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int = 0) -> dict:
    """The objective minus sft from a [Sa, U] and b [Sb, U] (seeds x units, the same units in the same
    order; nan where a run has no value for a unit). A resample draws U units with replacement, one draw
    for both sides (paired by unit), and Sa seeds of a and Sb seeds of b with replacement, each side apart
    (independent trainings; one seed: a no-op); its statistic is the mean over the drawn units of a's mean
    over its drawn seeds minus b's (nan-aware). Returns the point estimate, units and seeds used, the 95%
    percentile interval, the standard error (the resamples' standard deviation) and the smallest
    difference resolved at 80% power and a 5% two-sided level, POWER_Z x SE."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a unit (or a draw) without a value is nan
        keep = ~np.isnan(np.nanmean(a, 0) - np.nanmean(b, 0))  # units with a value on both sides
        a, b = a[:, keep], b[:, keep]
        (sa, units), sb = a.shape, b.shape[0]
        out = {
            "diff": math.nan,
            "units": int(units),
            "seeds": [int(sa), int(sb)],
            "ci95": [math.nan] * 2,
            "se": math.nan,
            "resolves": math.nan,
        }
        if not units:
            return out
        rng, stats = np.random.default_rng(seed), []
        for start in range(0, n_boot, BOOTSTRAP_CHUNK):
            r = min(BOOTSTRAP_CHUNK, n_boot - start)
            drawn = rng.integers(0, units, (r, 1, units))  # [R, 1, U]: the units, one draw for both sides
            mean_a = np.nanmean(a[rng.integers(0, sa, (r, sa, 1)), drawn], 1)  # [R, Sa, U] -> [R, U]
            mean_b = np.nanmean(b[rng.integers(0, sb, (r, sb, 1)), drawn], 1)  # [R, Sb, U] -> [R, U]
            stats.append(np.nanmean(mean_a - mean_b, 1))  # [R]
        stats = np.concatenate(stats)  # [n_boot]
        se = float(np.nanstd(stats, ddof=1)) if n_boot > 1 else math.nan
        out |= {
            "diff": float(np.nanmean(np.nanmean(a, 0) - np.nanmean(b, 0))),
            "se": se,
            "ci95": [float(x) for x in np.nanpercentile(stats, [2.5, 97.5])],
            "resolves": POWER_Z * se,
        }
    return out


def aggregate(args, runs: list[dict]) -> dict:
    base_dir = args.out / "base"
    base = read_profile(base_dir / "profile-heldout")
    reg, _ = read_artifact(
        base_dir / "regions-heldout",
        "02_label_regions",
        "experiments/compare.py",
        token_tensors={"region_id": np.int32},
        sample_tensors={"tau": np.float32},
    )
    bt, bmeta = base
    n = len(bt["sample_offsets"]) - 1
    sample_of = np.repeat(np.arange(n), np.diff(bt["sample_offsets"]))  # [T]
    names = {int(c): v for c, v in bmeta["categories"].items()}
    groups = {
        "all": np.ones(len(sample_of), bool),
        "sensitive": bt["sensitive"] > 0,
        "base_hard": bt["confidence"] < reg["tau"][sample_of],
        "base_region": reg["region_id"] >= 0,
    }
    groups |= {f"cat.{name}": bt["sensitive"] == code for code, name in names.items()}
    per_run, backends, ks = {}, set(), {name: set() for name in args.evaluations}
    base_run = {"name": "base", "objective": "base", "seed": 0, "dir": base_dir, "profile": bt}
    for r in [base_run] + [
        r | {"profile": read_profile(r["dir"] / "profile-heldout", base)[0]} for r in runs
    ]:
        metrics, units = token_metrics(r["profile"], groups, sample_of, n)
        for name in args.evaluations if r is not base_run or args.eval_base else ():
            km, ku, backend, k = kernel_metrics(r["dir"] / f"eval-{name}", name)
            metrics, units, backends = metrics | km, units | ku, backends | {backend}
            ks[name].add(k)
        per_run[r["name"]] = {
            "objective": r["objective"],
            "seed": r["seed"],
            "metrics": metrics,
            "units": units,
        }
    table = {}
    for o in ["base", *args.objectives]:
        rows = [v["metrics"] for v in per_run.values() if v["objective"] == o]
        table[o] = {
            k: {
                "mean": float(np.mean([x[k] for x in rows])),
                "n": len(rows),
                "std": float(np.std([x[k] for x in rows], ddof=1)) if len(rows) > 1 else math.nan,
            }
            for k in rows[0]
        }
    return {
        "per_run": per_run,
        "table": table,
        "paired": paired(args, per_run),
        "backends": sorted(backends),
        "k": {name: sorted(k) for name, k in ks.items()},
        "evaluations": args.evaluations,
        "token_counts": {g: int(m.sum()) for g, m in groups.items()},
        "held_out_samples": n,
        "region_coverage": region_coverage(args),
    }


def region_coverage(args) -> dict[str, float]:
    """Share of the training data's response tokens inside regions, per regions variant stage 03 read."""
    variants = [""] + region_variants(args)
    out = {}
    for v in variants:
        folder = regions_dir(args.out / "base", v)
        t, _ = read_artifact(
            folder, "02_label_regions", "experiments/compare.py", token_tensors={"region_id": np.int32}
        )
        out[folder.name] = float((t["region_id"] >= 0).mean())
    return out


def unit_matrices(per_run: dict, objectives: list[str], key: str) -> list[np.ndarray]:
    """Each objective's values of `key` as a matrix [seeds, units] over the same units in the same order:
    held-out samples (arrays, aligned by the profiles) or prompts (task/level -> value; nan where a run has
    no verdict for a prompt)."""
    runs = [[v["units"][key] for v in per_run.values() if v["objective"] == o] for o in objectives]
    if not isinstance(runs[0][0], dict):
        return [np.stack(r).astype(np.float64) for r in runs]
    prompts = sorted(set().union(*(u for r in runs for u in r)))
    return [np.array([[u.get(p, math.nan) for p in prompts] for u in r], dtype=np.float64) for r in runs]


def paired(args, per_run: dict) -> dict:
    """Every objective (and the base model, when evaluated) against sft, per paired metric: the bootstrap
    over seeds and units of paired_bootstrap."""
    keys = list(next(v for v in per_run.values() if v["objective"] == "sft")["units"])
    others = [o for o in args.objectives if o != "sft"] + (["base"] if args.eval_base else [])
    return {
        o: {key: paired_bootstrap(*unit_matrices(per_run, [o, "sft"], key), args.bootstrap) for key in keys}
        for o in others
    }


# ---------------------------------------------------------------------------------------
# Output: comparison.md, comparison.json, comparison.png
# ---------------------------------------------------------------------------------------


def json_safe(x):
    """nan -> null, recursively (JSON has no nan)."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


def category_columns(table: dict) -> list[str]:
    """The `cat.<name>.nll` metrics that have tokens in the held-out data (sft's row has every metric)."""
    return [
        k
        for k in table["sft"]
        if k.startswith("cat.") and k.endswith(".nll") and not math.isnan(table["sft"][k]["mean"])
    ]


def cell(s: dict) -> str:
    if math.isnan(s["mean"]):
        return "n/a"
    return f"{s['mean']:.3f}" + ("" if math.isnan(s["std"]) else f" ± {s['std']:.3f}")


def number(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3f}"


def md_table(cols: list[str], rows: list[str], fmt, label=lambda c: c) -> list[str]:
    """A markdown table: one row per objective, fmt(objective, column) per cell, label(column) heads."""
    if not cols or not rows:
        return ["(none: the comparison has only sft)"]
    return [
        "| objective | " + " | ".join(map(label, cols)) + " |",
        "|---" * (len(cols) + 1) + "|",
        *[f"| {o} | " + " | ".join(fmt(o, c) for c in cols) + " |" for o in rows],
    ]


def kernel_section(args, res: dict) -> list[str]:
    """Kernel verdicts per evaluation: compile rate, pass@1 and (several replies per prompt) pass@k."""
    t, ks = res["table"], {name: "/".join(map(str, k)) for name, k in res["k"].items()}
    cols = [
        f"{name}.{m}"
        for name in args.evaluations
        for m in ("compile_rate", "pass@1", "pass@k")
        if m != "pass@k" or res["k"][name] != [1]
    ]  # one reply per prompt: pass@k is pass@1

    def label(c: str) -> str:  # pass@k: k = the evaluation's --num-samples
        name, _, metric = c.partition(".")
        return f"{name}.pass@{ks[name]}" if metric == "pass@k" else c

    described = [
        f"`{name}` ({shlex.join(own) + '; ' if own else ''}{ks[name]} repl"
        f"{'y' if ks[name] == '1' else 'ies'} per prompt)"
        for name, own in args.evaluations.items()
    ]
    return [
        "## Kernel verdicts (stage 04, eval split)",
        "",
        f"Evaluations, with their stage-04 arguments after --eval-args: {', '.join(described)}. pass@1 "
        "is the unbiased c/n of each prompt (c of its n replies pass), averaged over prompts; pass@k is "
        "stage 04's unbiased pass@k.",
        "",
        *md_table(
            cols, (["base"] if args.eval_base else []) + args.objectives, lambda o, c: cell(t[o][c]), label
        ),
        "",
    ]


def paired_section(args, res: dict) -> list[str]:
    """The paired differences to sft (what the bootstrap resampled) and the power statement."""
    paired = res["paired"]
    cols = list(paired[next(iter(paired))]) if paired else []

    def diff(o: str, c: str) -> str:
        p = paired[o][c]
        return (
            "n/a" if math.isnan(p["diff"]) else f"{p['diff']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"
        )

    def resolves(o: str, c: str) -> str:
        p = paired[o][c]
        return "n/a" if math.isnan(p["resolves"]) else f"{number(p['resolves'])} (SE {number(p['se'])})"

    drawn = "seeds and units" if most_seeds(args) > 1 else "units; one seed, so no seed draw"
    passes = [c for c in cols if c.endswith(".pass@1")]
    return [
        f"## Paired differences to sft (95% bootstrap interval; resampled: {drawn})",
        "",
        "Units: held-out samples for the token metrics (a sample's value: its mean over its tokens of "
        "that kind), prompts (task x level) for pass@1 (a prompt's value: c/n, its share of passing "
        f"replies). Each objective is a matrix [seeds, units]. In each of {args.bootstrap} resamples "
        "(numpy seed 0) the units are drawn with replacement, one draw for the objective and sft "
        "(paired by unit), and the objective's seeds and sft's seeds are drawn with replacement, each "
        "apart (seed k of an objective is a training apart from seed k of sft); the statistic is the "
        "objective's mean over its drawn seeds and units minus sft's. Cells: the difference on every "
        "seed and unit [2.5th, 97.5th percentile of the resamples]."
        + (
            " With one seed per objective the seed draw is a no-op: the intervals hold the units' "
            "variance, not the seed-to-seed one."
            if most_seeds(args) == 1
            else ""
        )
        + (" `base` is one run: only sft's seeds are drawn against it." if args.eval_base else ""),
        "",
        *md_table(cols, list(paired), diff),
        "",
        "## Power: the smallest difference this design resolves",
        "",
        f"{POWER_Z:.2f} x SE (z_0.975 + z_0.8, SE the standard deviation of the resamples above): the "
        "true difference a two-sided test at the 5% level detects with 80% power (normal "
        "approximation, the variance as measured here).",
        "",
        *[
            f"- {o}: resolves differences of "
            + ", ".join(
                f"{number(paired[o][c]['resolves'])} in pass@1 ({c.partition('.')[0]})" for c in passes
            )
            for o in paired
            if passes
        ],
        *([""] if passes and paired else []),
        "Every metric's resolvable difference, the SE it comes from in parentheses:",
        "",
        *md_table(cols, list(paired), resolves),
        "",
    ]


def markdown(args, res: dict, commands: list[str], figure_note: str) -> str:
    t, objs = res["table"], ["base", *args.objectives]
    token_cols = [f"{g}.{m}" for g in TOKEN_GROUPS for m in ("nll", "acc")]
    seeds = seeds_text(args)
    variants = sorted({label.partition(".")[2] for label in args.objectives} - {""})
    lines = [
        f"# Comparison: {', '.join(args.objectives)} x {seeds} (preset {args.preset})",
        "",
        f"Base model `{typed(args.model)}`; training data `{typed(args.data)}`; held-out data "
        f"`{typed(args.eval_data)}` "
        f"({res['held_out_samples']} samples, {res['token_counts']['all']} response tokens, "
        f"{res['token_counts']['sensitive']} CUDA-sensitive, {res['token_counts']['base_hard']} "
        f"base-hard, {res['token_counts']['base_region']} in base regions). Stage 04 backend: "
        f"**{', '.join(res['backends']) or 'none'}**"
        + (" (CPU emulation: functional verdicts only)" if "emulated" in res["backends"] else "")
        + ".",
        "",
        f"Preset {args.preset} (options on the command line override it; the "
        "commands below are what ran): " + " ".join(PRESET_NOTES[args.preset].split()),
        "",
        "Cells: mean ± standard deviation over seeds; `base` is the untrained base model"
        + (" (one run)." if args.eval_base else " (token metrics only)."),
        "",
        "Regions stage 03 read, share of the training data's response tokens inside them: "
        + ", ".join(f"`{k}` {100 * v:.1f}%" for k, v in res["region_coverage"].items())
        + " (cuset's token mask is its regions)."
        + "".join(
            f" `.{v}`: stage {VARIANTS[v]['stage']} with {shlex.join(VARIANTS[v]['args'])}." for v in variants
        ),
        "",
        "## Held-out token metrics (stage 01 on the held-out data)",
        "",
        *md_table(token_cols, objs, lambda o, c: cell(t[o][c])),
        "",
        *kernel_section(args, res),
        *paired_section(args, res),
        "## Held-out NLL per CUDA-sensitivity category",
        "",
        *md_table([c[4:-4] for c in category_columns(t)], objs, lambda o, c: cell(t[o][f"cat.{c}.nll"])),
        "",
        figure_note,
        "",
        "## Columns",
        "",
        *[f"- `{k}`: {v}" for k, v in COLUMNS.items()],
        "- `.nll`/`.acc` of a group: over all its tokens of all held-out samples (token-weighted)",
        "",
        "## Stage times (seconds, the last execution of each step)",
        "",
        *[
            f"- {name}: "
            + ", ".join(f"{k} {v:g}" for k, v in steps.items())
            + f"; total {sum(steps.values()):g}"
            for name, steps in res["timings"].items()
        ],
        "",
        "## Commands",
        "",
        "A step continued after an interruption ran with its "
        "stage's --resume (or --force) "
        "added; `<run>/log.txt` holds every invocation and its output.",
        "",
        "```bash",
        res["command"],
        *commands,
        "```",
        "",
    ]
    return "\n".join(lines)


def figure(path: Path, res: dict, args) -> bool:
    """comparison.png (matplotlib, an optional extra); False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    objs, t = ["base", *args.objectives], res["table"]
    cats = category_columns(t)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 + 1.1 * len(objs)), 4))
    width = 0.8 / max(len(cats), 1)
    for j, c in enumerate(cats):
        ax.bar(
            [i - 0.4 + (j + 0.5) * width for i in range(len(objs))],
            [t[o][c]["mean"] for o in objs],
            width,
            yerr=[0 if math.isnan(t[o][c]["std"]) else t[o][c]["std"] for o in objs],
            label=c[4:-4],
        )
    ax.set_xticks(range(len(objs)), objs)
    ax.set_ylabel("held-out NLL, nats per token (mean ± std over seeds)", fontsize=8)
    ax.set_title("Held-out NLL per CUDA-sensitivity category", fontsize=10)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    return True


@finishes_out  # releases the lock on the folder this run writes
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lock_out(args.save_record or args.out)  # one run per folder (cuset_common/out_lock.py)
    if args.save_record:
        return save_record(args)
    if args.report_only:
        (base_steps, runs), calls = plan(args), 0
        if missing := missing_results(args, base_steps, runs):
            raise UserError(
                f"--report-only: {args.out} lacks results of {'; '.join(missing)}; run what "
                f"makes them (--runs), then --save-record again"
            )
    else:
        base_steps, runs, calls, stopped = execute(args)
        if stopped:
            return 0
        if args.runs:
            print("[compare] no table: --runs ran part of the comparison", flush=True)
            return 0
    res = aggregate(args, runs)
    commands = [shown(command(s)) for s in base_steps + [s for r in runs for s in r["steps"]]]
    res |= {
        "preset": args.preset,
        "objectives": args.objectives,
        "seeds": args.seeds,
        "seeds_for": args.seeds_for,
        "model": args.model,
        "data": str(args.data),
        "eval_data": str(args.eval_data),
        "columns": COLUMNS,
        "stage_calls": calls,
        "command": shlex.join(["python", *sys.argv]),
        "commands": commands,
        "timings": {
            r["name"]: json.loads((r["dir"] / "timings.json").read_text())
            for r in [{"name": "base", "dir": args.out / "base"}, *runs]
            if (r["dir"] / "timings.json").exists()
        },
    }
    for v in res["per_run"].values():  # per-unit arrays as lists; nan as null
        v["units"] = {
            k: dict(sorted(a.items())) if isinstance(a, dict) else a.tolist()
            for k, a in v.get("units", {}).items()
        }
    write_text_atomic(
        args.out / "comparison.json", json.dumps(json_safe(res), indent=1, allow_nan=False) + "\n"
    )
    made = figure(args.out / "comparison.png", res, args)
    note = (
        "![held-out NLL per category](comparison.png)"
        if made
        else "(No figure: matplotlib is not installed; pip install matplotlib, then "
        "rerun this command to add it.)"
    )
    text = markdown(args, res, commands, note)
    write_text_atomic(args.out / "comparison.md", text)
    print(text)
    if not made:  # a figure from an earlier call would show other numbers
        (args.out / "comparison.png").unlink(missing_ok=True)
    print(
        f"[compare] wrote {args.out / 'comparison.png'}"
        if made
        else "[compare] no figure: matplotlib is not installed (pip install matplotlib for comparison.png)"
    )
    print(f"[compare] wrote {args.out / 'comparison.md'} and comparison.json")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
