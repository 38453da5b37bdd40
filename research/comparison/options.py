"""The command line: the options, the preset applied to those left out, and every check that can refuse a
comparison before any work (a bad option is one line, exit status 2)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import research.comparison as package
from cuset_common.cli import ArgumentParser, UserError, check_ranges
from cuset_common.files import real_path
from cuset_common.models import check_model_source
from cuset_common.paths import (
    EVAL_SFT_FILE,
    EVAL_SFT_KERNEL_FILE,
    ROOT,
    SFT_FILE,
    SFT_KERNEL_FILE,
    SFT_KERNEL_ORIGINALS_FILE,
    SMOLLM2_MODEL,
)
from cuset_common.trackers import add_report_arguments
from research.comparison.objectives import (
    EVALUATION_NAME,
    MODES,
    check_objectives,
    evaluation_mode,
    variants_help,
)
from research.comparison.plan import plan, step_groups
from research.comparison.presets import DEFAULT_PRESET, PRESET_HELP, PRESETS, apply_preset
from research.comparison.records import check_record_folder
from research.comparison.stages import FORWARDED, STAGES, stage_refusal

HELD_OUT = {
    SFT_KERNEL_FILE: EVAL_SFT_KERNEL_FILE,
    SFT_KERNEL_ORIGINALS_FILE: EVAL_SFT_KERNEL_FILE,
    SFT_FILE: EVAL_SFT_FILE,
}  # training data -> its held-out twin


def build_parser() -> ArgumentParser:
    """The options; those a preset gives default to None (apply_preset fills them)."""
    ap = ArgumentParser(description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = ap.add_argument
    a("--preset", choices=tuple(PRESETS), default=DEFAULT_PRESET, help=PRESET_HELP)
    a(
        "--model",
        help="base model: hub id or local folder (default: the preset's; the bundled tiny model, SmolLM2 "
        "for cpu-real and cpu-power)",
    )
    a(
        "--data",
        type=Path,
        help="training SFT JSONL of stages 01-03 (default: the preset's; "
        f"{SFT_KERNEL_FILE.relative_to(ROOT)} but for cpu-real and cpu-power)",
    )
    a("--eval-data", type=Path, help="held-out SFT JSONL (default: the held-out twin of --data)")
    a("--out", type=Path, help="output folder (default: runs/compare-<preset>)")
    a(
        "--objectives",
        help="comma-separated objectives, each optionally with a variant after "
        f"a dot ({variants_help()}): e.g. cuset.no-snap, profit.t01 (default: the preset's)",
    )
    a("--seeds", type=int, help="seeds 0..N-1 per objective (default: the preset's)")
    a(
        "--seeds-for",
        help="another seed count for some objectives, e.g. sft=5,cuset=5,profit.t01=1: seeds 0..N-1 "
        "of each named one (default: the preset's when --seeds is not given, else none)",
    )
    a(
        "--modes",
        help="stage 04 modes, one evaluation each, named by its mode (default: the "
        "preset's evaluations; both modes but for cpu-real and cpu-power)",
    )
    a(
        "--evaluation",
        action="append",
        metavar="NAME[=ARGS]",
        help="a stage-04 evaluation into <run>/eval-NAME, with ARGS (one string) after --eval-args; NAME "
        f"begins with its mode ({', '.join(MODES)}), e.g. --evaluation kernel --evaluation "
        "'kernel-sampled=--num-samples 4 --temperature 0.8 --seed 0'; repeat it for each (default: "
        "the preset's; instead of --modes)",
    )
    a(
        "--eval-base",
        action=argparse.BooleanOptionalAction,
        help="stage 04 on the untrained base model too (default: the preset's; on for cpu-real and "
        "cpu-power)",
    )
    a(
        "--max-length",
        type=int,
        default=2048,
        help="tokens per sample for stages 01 and 03 alike (default: %(default)s)",
    )
    for stage in FORWARDED:
        a(
            f"--{stage}-args",
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
        help="comma-separated run names (<objective>-seed<k>): run the base stages and these runs only, "
        "and write no table",
    )
    a(
        "--save-record",
        type=Path,
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
        help="stop after N stage calls in this invocation (time slices; tests use it to interrupt a "
        "comparison deterministically)",
    )
    # the table's figures to the trackers too (a stage's own figures: --train-args "--report-to ...")
    add_report_arguments(ap)
    return ap


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, each checked before any work (check_before_work): a bad one is one line, exit 2."""
    ap = build_parser()
    args = ap.parse_args(argv)
    check_ranges(
        ap,
        args,
        {"seeds": "[1, inf)", "max_length": "[1, inf)", "bootstrap": "[1, inf)", "stop_after": "[1, inf)"},
    )
    typed = argparse.Namespace(**vars(args))  # as typed (None: left to the preset), for refused_source
    apply_preset(args)
    args.objectives = args.objectives.split(",")
    check_objectives(args.objectives)
    args.seeds_for = parse_seeds_for(args.seeds_for, args.objectives, from_preset=typed.seeds_for is None)
    args.evaluations = evaluations(args.evaluation, args.modes)
    for stage in FORWARDED:
        option = f"{stage}_args"
        setattr(args, option, split_args(f"--{stage}-args", getattr(args, option)))
    args.eval_data = args.eval_data or held_out_twin(args.data)
    for path in (args.data, args.eval_data):
        if not path.is_file():
            raise UserError(f"{path}: no such file")
    args.out = args.out or Path("runs") / f"compare-{args.preset}"
    args.runs = args.runs.split(",") if args.runs else None
    check_runs(args)
    check_before_work(args, typed)
    return args


def held_out_twin(data: Path) -> Path:
    """The held-out SFT data of a bundled training file (HELD_OUT); other data needs --eval-data."""
    if (twin := HELD_OUT.get(data.resolve())) is None:
        raise UserError(f"--data {data}: pass --eval-data, the held-out SFT data for it")
    return twin


def parse_seeds_for(given: str | None, objectives: list[str], from_preset: bool) -> dict[str, int]:
    """--seeds-for sft=5,cuset=5 as {objective: seeds}, each with one seed or more. A typed one names only
    objectives among --objectives; the preset's applies to those of its objectives that are chosen."""
    out = {}
    for item in given.split(",") if given else []:
        label, _, count = item.partition("=")
        if not count.isdigit() or label in out:
            raise UserError(
                f"--seeds-for {given}: write objective=N, each objective once, e.g. sft=5,cuset=5"
            )
        if from_preset and label not in objectives:
            continue
        if label not in objectives or int(count) < 1:
            raise UserError(
                f"--seeds-for {label}={count}: name one of --objectives ({','.join(objectives)}) "
                "with one seed or more"
            )
        out[label] = int(count)
    return out


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


def evaluations(given: list[str] | None, modes: str | None) -> dict[str, list[str]]:
    """{name: its own stage-04 arguments}, in order: --evaluation's (NAME=ARGS), else one per --modes mode
    (named by it, no arguments of its own)."""
    if given is not None and modes is not None:
        raise UserError("give --evaluation or --modes, not both (--modes kernel is --evaluation kernel)")
    texts = given if given is not None else modes.split(",")
    pairs = [(name, own) for name, _, own in (text.partition("=") for text in texts)]
    for name, _ in pairs:
        if not EVALUATION_NAME.fullmatch(name):
            raise UserError(
                f"evaluation {name!r}: a name begins with its mode ({', '.join(MODES)}), then "
                f"optionally -<letters or digits>, e.g. kernel-sampled (--evaluation, --modes)"
            )
    pairs = [(name, split_args(f"--evaluation {name}", own)) for name, own in pairs]
    for name, own in pairs:
        if any(a == "--mode" or a.startswith("--mode=") for a in own):
            raise UserError(f"evaluation {name}: its name gives its mode; leave --mode out of its arguments")
    if len({name for name, _ in pairs}) < len(pairs):
        raise UserError(f"evaluations {', '.join(n for n, _ in pairs)}: each name once")
    return dict(pairs)


def check_runs(args: argparse.Namespace) -> None:
    """--runs names runs of this comparison only."""
    names = [r["name"] for r in plan(args)[1]] if args.runs else []
    if unknown := sorted(set(args.runs or ()) - set(names)):
        raise UserError(
            f"--runs: no run {', '.join(unknown)} in this comparison; its runs are {', '.join(names)}"
        )


def check_before_work(args: argparse.Namespace, typed: argparse.Namespace) -> None:
    """Refuse, before the first stage starts and before any file is made, what would fail later: an --out
    or --save-record that cannot hold what is written there, a model that is not there (when stages will
    run), and any stage call of the plan that its stage's own parser and range checks refuse, named by the
    option it came from."""
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
                f"{refused_source(args, typed, step)}: python {STAGES[step['stage']]} "
                f"refuses its arguments ({refusal}); see python {STAGES[step['stage']]} --help"
            )


def refused_source(args: argparse.Namespace, typed: argparse.Namespace, step: dict) -> str:
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
            given = "--evaluation" if typed.evaluation is not None else "the preset's evaluation"
            return f"{given} {evaluation} ({shlex.join(own)!r})"
    as_typed = getattr(typed, f"{name}_args")
    return (
        f"--{name}-args {as_typed!r}"
        if as_typed is not None
        else f"--{name}-args (the preset's, with the options given)"
    )
