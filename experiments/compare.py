"""The paper's comparison in one command: every objective x seed through the four stages, then one table.

Runs stages 01 and 02 once with the base model (on the training data, for the regions stage 03 uses, and
on the held-out data, for the "hard tokens" columns), then for each objective and seed: 03 (train), 01
with the checkpoint on the held-out data (token metrics) and 04 in kernel and standalone mode (kernel
verdicts). Each stage is called as a subprocess (`python 0N_*.py ...`, output in <run>/log.txt); this
file only decides what to run and aggregates the artifacts: the method lives in the stages.

An objective may name a regions variant after a dot: `cuset.no-snap` trains cuset on regions that stage 02
made with --no-snap-lines (REGION_VARIANTS), for data whose snapped regions cover much of each response.
With --eval-base (preset cpu-real) stage 04 also evaluates the untrained base model, a row of its own.

    python experiments/compare.py --preset cpu-quick                  # tiny model, 2 CPU cores (see --help)
    python data/build_smollm2.py && python experiments/compare.py --preset cpu-real   # a real model, hours
    python experiments/compare.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --out runs/compare-qwen1.5b
    python experiments/compare.py --preset cpu-quick --objectives sft,cuset --seeds 1   # a smaller look
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
03 on SmolLM2-135M holds about 11 GB, and two at once were killed on a 24 GB machine). `--save-record DIR`
copies every finished group (base, runs) into DIR without checkpoint weights (about 1 MB a run; commit it:
a new machine starts without runs/), and `--report-only --out DIR` makes the table from such a record as
it is, running nothing and checking no freshness (a record restored from git has no weights, and checkout
times for mtimes).

Metrics (comparison.md says what each column means). Token metrics come from stage 01's profile of the
checkpoint on the held-out data, aligned token by token with the base model's (same tokenizer and data,
checked). Paired differences to sft: per held-out sample (token metrics) or prompt (kernel metrics), the
objective's value minus sft's, each averaged over seeds; 95% percentile bootstrap over those units.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cuset_common lives at the repo root
from cuset_common import (EVAL_SFT_FILE, EVAL_SFT_KERNEL_FILE, ROOT, SFT_FILE, SFT_KERNEL_FILE,  # noqa: E402
                          SFT_KERNEL_ORIGINALS_FILE, SMOLLM2_MODEL, TINY_MODEL, ArgumentParser, UserError,
                          args_to_json, check_model_source, check_ranges, load_script,
                          read_appended_jsonl, read_artifact, resume_dir, run_main, sha256_file,
                          write_text_atomic)
from profiling.shards import partial_dir  # noqa: E402

OBJECTIVES = ("sft", "dft", "profit", "cuset", "cuset-mask", "cuset-weight")
MODES = ("kernel", "standalone")
HELD_OUT = {SFT_KERNEL_FILE: EVAL_SFT_KERNEL_FILE, SFT_KERNEL_ORIGINALS_FILE: EVAL_SFT_KERNEL_FILE,
            SFT_FILE: EVAL_SFT_FILE}  # training data -> its held-out twin
# `<objective>.<variant>`: stage 02 arguments of its regions
REGION_VARIANTS = {"no-snap": ["--no-snap-lines"]}
PRESETS = {  # per stage: arguments appended to its command line (--profile-args etc. replace them)
    "full": {"objectives": OBJECTIVES, "seeds": 3, "profile": [], "regions": [],
             "train": ["--batch-size", "64", "--micro-batch-size", "4", "--lr", "1e-5", "--epochs", "3"],
             "eval": ["--levels", "1,2,3", "--num-samples", "5", "--temperature", "0.8"], "standalone": []},
    "cpu-quick": {"objectives": ("sft", "profit", "cuset"), "seeds": 2, "profile": [], "regions": [],
                  "train": ["--max-steps", "100"], "eval": ["--levels", "1", "--backend", "emulate"],
                  "standalone": ["--max-new-tokens", "512"]},
    # The scratch run of the issue that asked for this preset: sft on the 102 records, 12 steps of 8 at lr
    # 1e-4, wrote kernels of which 14/40 compiled and 4/40 passed at level 1 (docs/comparison.md).
    "cpu-real": {"model": SMOLLM2_MODEL, "data": SFT_KERNEL_ORIGINALS_FILE, "modes": ("kernel",),
                 "eval_base": True, "objectives": ("sft", "profit", "cuset", "cuset.no-snap"), "seeds": 2,
                 "profile": [], "regions": [], "train": ["--lr", "1e-4", "--epochs", "1"],
                 "eval": ["--levels", "1,2,3", "--backend", "emulate"], "standalone": []},
}
PRESET_NOTES = {"full": """all six objectives x 3 seeds; stage 03 --batch-size 64 --micro-batch-size 4
--lr 1e-5 --epochs 3; stage 04 levels 1-3 of the 40 eval tasks, 5 samples at temperature 0.8 (pass@1 and
pass@5), backend auto. For a real model on a GPU: docs/comparison.md estimates its time.""",
                "cpu-quick": """\
the bundled tiny model on 2 CPU cores: sft, profit and cuset x 2 seeds (6 runs); stage 03
--max-steps 100 (800 of the 1,020 training samples, batches of 8); stage 04 level 1 of the 40 eval tasks
under the emulate backend in both modes, standalone answers cut at 512 new tokens (its references are
longer: on the tiny model standalone mode only exercises the path). Measured end to end on 2 idle cores
(2026-11-30): 30 min 22 s (base stages 78 s; per run 244-341 s: stage 03 176-203 s, stage 01 on the
held-out data 7-11 s, stage 04 28-80 s per mode).""",
                "cpu-real": """\
SmolLM2-135M-Instruct (data/build_smollm2.py) on 2 CPU cores: the base model, then sft, profit, cuset
on snapped regions and cuset on unsnapped ones (cuset.no-snap: snapped regions cover about half of this
model's response tokens) x 2 seeds; stage 03 on the 102 kernel-mode train records without renamed copies,
1 epoch (12 steps of 8) at lr 1e-4; stage 04 in kernel mode only, levels 1-3 of the 40 eval tasks (120
prompts, greedy) under the emulate backend. About 50 minutes a run at one torch thread beside a second
run (2026-12-02; docs/comparison.md has the measured times), seed by seed: split it across processes and
sessions with --runs and keep what finished with --save-record."""}
PRESET_HELP = "\n".join(f"{name}{' (default)' if name == 'full' else ''}: {note}"
                        for name, note in PRESET_NOTES.items())
TOKEN_GROUPS = ("all", "sensitive", "base_hard", "base_region")
UNIT_METRICS = ("all.nll", "sensitive.nll", "base_hard.nll",
                "all.acc")  # token metrics with a paired bootstrap
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
    "compile_rate / pass@1 / pass@k": "stage 04's summary.json (overall) in that mode",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, each checked before any work (check_before_work): a bad one is one line, exit 2."""
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = ap.add_argument
    a("--preset", choices=tuple(PRESETS), default="full", help=PRESET_HELP)
    a("--model", default=None, help="base model: hub id or local folder (default: the preset's; the bundled "
                                    "tiny model, SmolLM2 for cpu-real)")
    a("--data", type=Path, default=None, help=f"training SFT JSONL of stages 01-03 (default: the preset's; "
                                              f"{SFT_KERNEL_FILE.relative_to(ROOT)} but for cpu-real)")
    a("--eval-data", type=Path, default=None,
      help="held-out SFT JSONL (default: the held-out twin of --data)")
    a("--out", type=Path, default=None, help="output folder (default: runs/compare-<preset>)")
    a("--objectives", default=None, help="comma-separated objectives, each optionally with a regions "
                                         f"variant ({', '.join(REGION_VARIANTS)}): "
                                         "cuset.no-snap (default: the preset's)")
    a("--seeds", type=int, default=None, help="seeds 0..N-1 per objective (default: the preset's)")
    a("--modes", default=None, help="stage 04 modes (default: the preset's; both but for cpu-real)")
    a("--eval-base", action=argparse.BooleanOptionalAction, default=None,
      help="stage 04 on the untrained base model too (default: the preset's; on for cpu-real)")
    a("--max-length", type=int, default=2048,
      help="tokens per sample for stages 01 and 03 alike (default: %(default)s)")
    for stage in ("profile", "regions", "train", "eval", "standalone"):
        a(f"--{stage}-args", default=None, help=f"extra arguments of the {stage} stage, one string "
                                                 f"(default: the preset's)" if stage != "standalone" else
          "extra arguments of stage 04 in standalone mode only, after --eval-args (default: the preset's)")
    a("--bootstrap", type=int, default=2000,
      help="bootstrap resamples of the paired differences (default: %(default)s)")
    a("--runs", default=None,
      help="comma-separated run names (<objective>-seed<k>): run the base stages and these runs only, "
           "and write no table")
    a("--save-record", type=Path, default=None, metavar="DIR",
      help="copy every finished group of --out into DIR/<group>, checkpoint weights left out, and exit")
    a("--report-only", action="store_true",
      help="make the table from the artifacts in --out as they are (a --save-record folder): run nothing")
    a("--stop-after", type=int, default=None, help="stop after N stage calls in this invocation (time "
                                                   "slices; tests use it to interrupt a comparison "
                                                   "deterministically)")
    args = ap.parse_args(argv)
    check_ranges(ap, args, {"seeds": "[1, inf)", "max_length": "[1, inf)", "bootstrap": "[1, inf)",
                            "stop_after": "[1, inf)"})
    preset = PRESETS[args.preset]
    args.objectives = args.objectives.split(",") if args.objectives else list(preset["objectives"])
    args.seeds = preset["seeds"] if args.seeds is None else args.seeds
    args.modes = args.modes.split(",") if args.modes else list(preset.get("modes", MODES))
    args.eval_base = preset.get("eval_base", False) if args.eval_base is None else args.eval_base
    args.model = args.model or str(preset.get("model", TINY_MODEL))
    args.data = args.data or preset.get("data", SFT_KERNEL_FILE)
    if args.model == str(SMOLLM2_MODEL) and not (SMOLLM2_MODEL / "config.json").is_file():
        raise UserError(f"{SMOLLM2_MODEL}: not built; run `python data/build_smollm2.py` (about a minute)")
    forwarded = {stage: getattr(args, f"{stage}_args") for stage in FORWARDED}  # as typed (None: preset's)
    for stage, given in forwarded.items():
        setattr(args, f"{stage}_args", split_args(stage, given) if given is not None else list(preset[stage]))
    if bad := ([o for o in args.objectives if not known_objective(o)]
               + [m for m in args.modes if m not in MODES]):
        raise UserError(f"unknown objective or mode {', '.join(bad)}; objectives: {', '.join(OBJECTIVES)}, "
                        f"those that use regions with a variant ({', '.join(REGION_VARIANTS)}) after a dot; "
                        f"modes: {', '.join(MODES)}")
    if ("sft" not in args.objectives or len(set(args.objectives)) < len(args.objectives)
            or min(args.seeds, args.bootstrap) < 1):
        raise UserError("--objectives must include sft (the differences are to sft), each objective once; "
                        "--seeds and --bootstrap must be >= 1")
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
        raise UserError(f"--runs: no run {', '.join(unknown)} in this comparison; its runs are "
                        f"{', '.join(names)}")
    check_before_work(args, forwarded)
    return args


# The stage whose arguments each --<name>-args forwards (standalone: stage 04, after --eval-args).
FORWARDED = {"profile": "01", "regions": "02", "train": "03", "eval": "04", "standalone": "04"}


def split_args(name: str, given: str) -> list[str]:
    """A forwarded argument string split as a shell would; an unbalanced quote is a UserError."""
    try:
        return shlex.split(given)
    except ValueError as e:
        raise UserError(f"--{name}-args {given!r}: {e} (an unbalanced quote?); quote it as one shell word, "
                        f"e.g. --{name}-args '--flag value'") from None


def check_before_work(args, forwarded: dict[str, str | None]) -> None:
    """Refuse, before the first stage starts and before any file is made, what would fail later: an --out
    or --save-record that cannot hold what is written there, a model that is not there (when stages will
    run), and any stage call of the plan that its stage's own parser and range checks refuse, named by the
    --<name>-args string it came from."""
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} is a file; name a folder")
    base_steps, runs = plan(args)
    if args.save_record is not None:
        check_record_folder(args.save_record, args.out, step_groups(args, base_steps, runs))
    elif not args.report_only:
        check_model_source(args.model)
    for step in base_steps + [s for r in runs for s in r["steps"]]:
        if (refusal := stage_refusal(step["stage"], step["argv"])) is None:
            continue
        name = next(n for n, key in FORWARDED.items() if key == step["stage"])
        if step["out"].name == "eval-standalone" and stage_refusal(  # its own arguments come last
                "04", step["argv"][: len(step["argv"]) - len(args.standalone_args)]) is None:
            name = "standalone"
        source = f"--{name}-args {forwarded[name]!r}" if forwarded[name] is not None else \
            f"--{name}-args (the preset's, with the options given)"
        raise UserError(f"{source}: python {STAGES[step['stage']]} refuses its arguments ({refusal}); "
                        f"see python {STAGES[step['stage']]} --help")


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
        raise UserError(f"--save-record {record}: {file} is a file where the record keeps a folder; move it "
                        f"away, or name another folder")
    real_record, real_out = record.resolve(), out.resolve()
    if real_record == real_out or real_out in real_record.parents or real_record in real_out.parents:
        raise UserError(f"--save-record {record} and --out {out} overlap (one is the other or inside it); "
                        f"the record is a copy of --out: name a folder outside it")


def known_objective(label: str) -> bool:
    """`sft`, `cuset`, ... or `cuset.no-snap`: a variant only where the objective uses regions."""
    objective, _, variant = label.partition(".")
    return objective in OBJECTIVES and (not variant or (
        variant in REGION_VARIANTS and objective in stage_module("03").REGION_OBJECTIVES))


def region_variants(args) -> list[str]:
    """The regions variants the objectives name (`cuset.no-snap` -> no-snap), sorted."""
    return sorted({label.partition(".")[2] for label in args.objectives} - {""})


def regions_dir(base: Path, variant: str) -> Path:
    return base / (f"regions.{variant}" if variant else "regions")


# ---------------------------------------------------------------------------------------
# Steps: one stage call each, skipped when its artifact matches, continued when interrupted
# ---------------------------------------------------------------------------------------

STAGES = {"01": "01_profile.py", "02": "02_label_regions.py", "03": "03_train_cuset.py",
          "04": "04_eval_kernels.py"}
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
        steps.append({"stage": "01", "out": prof, "inputs": [],
                      "argv": [*m, "--data", str(data), "--out", str(prof), *ml, *args.profile_args]})
        for variant in [""] + (variants if not tag else []):  # variants of the training data's regions only
            reg = regions_dir(base, variant) if not tag else base / f"regions{tag}"
            steps.append({"stage": "02", "out": reg, "inputs": [prof / "meta.json"],
                          "argv": [*m, "--data", str(data), "--profile", str(prof), "--out", str(reg),
                                   *args.regions_args, *REGION_VARIANTS.get(variant, [])]})
    steps += [eval_step(args, args.model, base, mode) for mode in args.modes if args.eval_base]
    runs = []
    # seed by seed: a stop midway leaves every objective's first seeds, comparable, not one objective's all
    for seed in range(args.seeds):
        for label in args.objectives:
            objective, _, variant = label.partition(".")
            d = args.out / f"{label}-seed{seed}"
            ckpt, held, regions = d / "ckpt", d / "profile-heldout", regions_dir(base, variant)
            uses_regions = objective in stage_module("03").REGION_OBJECTIVES
            run = [{"stage": "03", "out": ckpt, "inputs": [regions / "meta.json"] if uses_regions else [],
                    "argv": [*m, "--data", str(args.data), "--regions", str(regions),
                             "--objective", objective, "--seed", str(seed), "--out", str(ckpt), *ml,
                             *args.train_args]},
                   {"stage": "01", "out": held, "inputs": [ckpt / "meta.json"],
                    "argv": ["--model", str(ckpt), "--data", str(args.eval_data), "--out", str(held), *ml,
                             *args.profile_args]}]
            run += [eval_step(args, str(ckpt), d, mode, [ckpt / "meta.json"]) for mode in args.modes]
            runs.append({"name": d.name, "objective": label, "seed": seed, "dir": d, "steps": run})
    return steps, runs


def eval_step(args, model: str, folder: Path, mode: str, inputs: list[Path] = ()) -> dict:
    """Stage 04 on the eval split in one mode, into <folder>/eval-<mode>."""
    out = folder / f"eval-{mode}"
    return {"stage": "04", "out": out, "inputs": list(inputs),
            "argv": ["--model", model, "--mode", mode, "--split", "eval", "--out", str(out), *args.eval_args,
                     *(args.standalone_args if mode == "standalone" else [])]}


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


@functools.lru_cache(maxsize=None)
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
    if not stamp.exists() or any(not p.exists() or p.stat().st_mtime > stamp.stat().st_mtime
                                 for p in step["inputs"]):
        return False
    if stage == "04":
        return read_json(out / "fingerprint.json") == fingerprint(step)
    meta, now = read_json(stamp) or {}, mod.parse_args(step["argv"])
    if not same_args(meta.get("args", {}), now, {"force"} if stage == "02" else mod.RESUME_MAY_CHANGE):
        return False
    weights = ("model.safetensors", "model.safetensors.index.json")  # one file, or shards and their index
    if stage == "03" and not (meta.get("final_step") and any((out / w).exists() for w in weights)):
        return False
    data = meta.get("data")
    return stage == "02" or (isinstance(data, dict) and data.get("sha256")
                             == data_sha256(str(now.data), now.data.stat().st_mtime_ns))


def continuation(step: dict, log) -> tuple[str, ...]:
    """Arguments that continue an interrupted step, or start it over where it cannot continue: another run's
    state, or one older than what the step reads (a checkpoint or regions made again since), is not
    resumed."""
    mod, out, stage = stage_module(step["stage"]), step["out"], step["stage"]

    def resumable(state: Path) -> bool:
        saved = read_json(state)
        return saved is not None and not any(p.exists() and p.stat().st_mtime > state.stat().st_mtime
                                             for p in step["inputs"]) and \
            same_args(saved.get("args", saved), mod.parse_args(step["argv"]), mod.RESUME_MAY_CHANGE)
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
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m" if seconds >= 3600 else \
        f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def step_groups(args, base_steps: list[dict], runs: list[dict]) -> list[tuple[str, list[dict], Path]]:
    """(name, steps, folder): the base stages, then each run."""
    return [("base", base_steps, args.out / "base")] + [(r["name"], r["steps"], r["dir"]) for r in runs]


def execute(args) -> tuple[list[dict], list[dict], int, bool]:
    """Run what is not finished; returns (base steps, runs, stage calls made, stopped by --stop-after)."""
    base_steps, runs = plan(args)
    groups = [g for g in step_groups(args, base_steps, runs) if g[0] == "base" or not args.runs
              or g[0] in args.runs]
    pending = [g for g in groups if not all(finished(s) for s in g[1])]
    print(f"[compare] {len(runs)} runs ({', '.join(args.objectives)} x {args.seeds} seeds) + base stages; "
          f"{len(groups) - len(pending)} of {len(groups)} groups finished earlier; out {args.out}",
          flush=True)
    if pending and args.preset == "full" and stage_module("04").gpu_name() is None:
        print("[compare] note: the full preset is sized for a real model on a GPU and none is listed here; "
              "--presets cpu-quick and cpu-real are the CPU ones", flush=True)
    calls, t0, done_now, run_seconds = 0, time.time(), 0, []
    for i, (name, steps, folder) in enumerate(groups):
        label = "base stages 01+02" if name == "base" else f"run {i}/{len(runs)} {name}"
        if all(finished(s) for s in steps):
            print(f"[compare] {label}: finished, skipped", flush=True)
            continue
        runs_left = sum(g[0] != "base" for g in pending[done_now:])  # this one included
        eta = f"ETA {hms(np.mean(run_seconds) * runs_left)}" if run_seconds else "ETA after the first run"
        print(f"[compare] {label} ({done_now + 1}/{len(pending)} to do) | elapsed "
              f"{hms(time.time() - t0)} | {eta}",
              flush=True)
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
                print(f"[compare] stopped after {calls} stage calls (--stop-after); rerun the same command "
                      f"to continue", flush=True)
                return base_steps, runs, calls, True
            with open(folder / "log.txt", "a") as log:
                cmd = command(step, continuation(
                    step, lambda msg: print(f"[compare]   {msg}", file=log, flush=True)))
                print(f"[compare]   {shown(cmd)}   (log: {folder / 'log.txt'})", flush=True)
                print(f"\n$ {shown(cmd)}", file=log, flush=True)
                t = time.time()
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=die_with_parent).returncode
            calls += 1
            timings[key] = round(time.time() - t, 1)
            write_text_atomic(timings_path, json.dumps(timings, indent=2) + "\n")
            if rc != 0:
                tail = "".join((folder / "log.txt").read_text().splitlines(keepends=True)[-15:])
                raise UserError(f"{shown(cmd)} failed (exit {rc}); last lines of "
                                f"{folder / 'log.txt'}:\n{tail}")
            # its resume state (weights + AdamW: 18 GB for 1.5B) is
            if step["stage"] == "03" and finished(step):
                for old in ("resume", ".resume.old"):     # of no use once the checkpoint is written
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
    print(f"[compare] saved {len(saved)} finished group(s) into {args.save_record}: "
          f"{', '.join(saved) or 'none'}; the table: --report-only --out {args.save_record}")
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

PROFILE = {"confidence": np.float32, "argmax_correct": np.uint8, "sensitive": np.uint8,
           "token_ids": np.int32}


def read_profile(path: Path, base: tuple[dict, dict] | None = None) -> tuple[dict, dict]:
    """A stage-01 profile; with `base`, refused unless it lines up with the base model's token by token."""
    t, meta = read_artifact(path, "01_profile", f"experiments/compare.py (stage 01 into {path})",
                            token_tensors=PROFILE)
    if base is not None:
        bt, bmeta = base
        for what, get in (("tokenizer", lambda m: m.get("tokenizer_fingerprint")),
                          ("data", lambda m: (m.get("data") or {}).get("sha256"))):
            if get(meta) != get(bmeta):
                raise UserError(f"{path}: made with another {what} (meta.json) than the base model's "
                                "held-out profile; token metrics align the two token by token: profile "
                                f"both with the same tokenizer and --eval-data")
        if not (np.array_equal(t["sample_offsets"], bt["sample_offsets"])
                and np.array_equal(t["token_ids"], bt["token_ids"])):
            raise UserError(f"{path}: its tokens differ from the base model's held-out profile (same "
                            "tokenizer and data but another --max-length?); rerun both with the same "
                            "settings")
    return t, meta


def per_sample(values: np.ndarray, mask: np.ndarray, sample_of: np.ndarray, n: int) -> np.ndarray:
    """Mean of values over each sample's masked tokens; nan for a sample without one. [S]"""
    count = np.bincount(sample_of, weights=mask, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(sample_of, weights=values * mask, minlength=n) / count


def token_metrics(prof: dict, groups: dict[str, np.ndarray], sample_of: np.ndarray,
                  n: int) -> tuple[dict, dict]:
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


def kernel_metrics(folder: Path, mode: str) -> tuple[dict, dict, str, int]:
    """Stage 04's overall compile rate, pass@1 and pass@k, per-prompt pass@1 (unit: task x level), backend,
    k."""
    summary = json.loads((folder / "summary.json").read_text())
    k = summary["num_samples"]
    over = summary["overall"]
    metrics = {f"{mode}.compile_rate": over["compile_rate"], f"{mode}.pass@1": over["pass@1"],
               f"{mode}.pass@k": over.get(f"pass@{k}", over["pass@1"])}
    judged: dict[str, list[bool]] = {}
    for r in read_appended_jsonl(folder / "results.jsonl"):
        if r["outcome"] not in ("unsupported", "task_error"):
            judged.setdefault(f"{r['task_id']}/L{r['level']}", []).append(r["outcome"] == "pass")
    units = {f"{mode}.pass@1": {key: float(np.mean(v)) for key, v in judged.items()}}
    return metrics, units, summary["backend"], k


def bootstrap(d: np.ndarray, n_boot: int, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean of d, resampling its entries with replacement."""
    rng = np.random.default_rng(seed)
    means = np.concatenate([d[rng.integers(0, len(d), (min(200, n_boot - i), len(d)))].mean(1)
                            for i in range(0, n_boot, 200)])
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def aggregate(args, runs: list[dict]) -> dict:
    base_dir = args.out / "base"
    base = read_profile(base_dir / "profile-heldout")
    reg, _ = read_artifact(base_dir / "regions-heldout", "02_label_regions", "experiments/compare.py",
                           token_tensors={"region_id": np.int32}, sample_tensors={"tau": np.float32})
    bt, bmeta = base
    n = len(bt["sample_offsets"]) - 1
    sample_of = np.repeat(np.arange(n), np.diff(bt["sample_offsets"]))  # [T]
    names = {int(c): v for c, v in bmeta["categories"].items()}
    groups = {"all": np.ones(len(sample_of), bool), "sensitive": bt["sensitive"] > 0,
              "base_hard": bt["confidence"] < reg["tau"][sample_of], "base_region": reg["region_id"] >= 0}
    groups |= {f"cat.{name}": bt["sensitive"] == code for code, name in names.items()}
    per_run, backends, ks = {}, set(), set()
    base_run = {"name": "base", "objective": "base", "seed": 0, "dir": base_dir, "profile": bt}
    for r in [base_run] + [r | {"profile": read_profile(r["dir"] / "profile-heldout", base)[0]}
                           for r in runs]:
        metrics, units = token_metrics(r["profile"], groups, sample_of, n)
        for mode in args.modes if r is not base_run or args.eval_base else ():
            km, ku, backend, k = kernel_metrics(r["dir"] / f"eval-{mode}", mode)
            metrics, units, backends, ks = metrics | km, units | ku, backends | {backend}, ks | {k}
        per_run[r["name"]] = {"objective": r["objective"], "seed": r["seed"], "metrics": metrics,
                              "units": units}
    table = {}
    for o in ["base", *args.objectives]:
        rows = [v["metrics"] for v in per_run.values() if v["objective"] == o]
        table[o] = {k: {"mean": float(np.mean([x[k] for x in rows])), "n": len(rows),
                        "std": float(np.std([x[k] for x in rows], ddof=1)) if len(rows) > 1 else math.nan}
                    for k in rows[0]}
    return {"per_run": per_run, "table": table, "paired": paired(args, per_run),
            "backends": sorted(backends), "k": sorted(ks),
            "token_counts": {g: int(m.sum()) for g, m in groups.items()}, "held_out_samples": n,
            "region_coverage": region_coverage(args)}


def region_coverage(args) -> dict[str, float]:
    """Share of the training data's response tokens inside regions, per regions variant stage 03 read."""
    variants = [""] + region_variants(args)
    out = {}
    for v in variants:
        folder = regions_dir(args.out / "base", v)
        t, _ = read_artifact(folder, "02_label_regions", "experiments/compare.py",
                             token_tensors={"region_id": np.int32})
        out[folder.name] = float((t["region_id"] >= 0).mean())
    return out


def paired(args, per_run: dict) -> dict:
    """Objective minus sft per unit (held-out sample, or prompt), each averaged over seeds; bootstrap CI."""
    def seed_mean(o: str, key: str) -> np.ndarray | dict:
        units = [v["units"][key] for v in per_run.values() if v["objective"] == o]
        if isinstance(units[0], dict):  # prompts: keyed by task/level
            return {u: float(np.mean([x[u] for x in units if u in x])) for u in set().union(*units)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a unit nan in every seed stays nan
            return np.nanmean(np.stack(units), axis=0)
    out = {}
    keys = [k for k in next(v for v in per_run.values() if v["objective"] == "sft")["units"]]
    for o in [o for o in args.objectives if o != "sft"] + (["base"] if args.eval_base else []):
        out[o] = {}
        for key in keys:
            a, b = seed_mean(o, key), seed_mean("sft", key)
            if isinstance(a, dict):
                common = sorted(set(a) & set(b))
                a, b = np.array([a[u] for u in common]), np.array([b[u] for u in common])
            d = (a - b)[~np.isnan(a - b)]
            out[o][key] = {"diff": float(d.mean()) if len(d) else math.nan, "units": len(d),
                           "ci95": list(bootstrap(d, args.bootstrap)) if len(d) else [math.nan, math.nan]}
    return out


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
    return [k for k in table["sft"]
            if k.startswith("cat.") and k.endswith(".nll") and not math.isnan(table["sft"][k]["mean"])]


def cell(s: dict) -> str:
    if math.isnan(s["mean"]):
        return "n/a"
    return f"{s['mean']:.3f}" + ("" if math.isnan(s["std"]) else f" ± {s['std']:.3f}")


def markdown(args, res: dict, commands: list[str], figure_note: str) -> str:
    t, objs = res["table"], ["base", *args.objectives]
    token_cols = [f"{g}.{m}" for g in TOKEN_GROUPS for m in ("nll", "acc")]
    kernel_cols = [f"{mode}.{m}" for mode in args.modes for m in ("compile_rate", "pass@1", "pass@k")
                   if m != "pass@k" or res["k"] != [1]]  # one sample per prompt: pass@k is pass@1
    cats = category_columns(t)

    k = "/".join(map(str, res["k"]))  # pass@k: k = stage 04's --num-samples

    def table(cols: list[str], rows: list[str], fmt) -> list[str]:
        if not cols or not rows:
            return ["(none: the comparison has only sft)"]
        return ["| objective | " + " | ".join(c.replace("pass@k", f"pass@{k}") for c in cols) + " |",
                "|---" * (len(cols) + 1) + "|",
                *[f"| {o} | " + " | ".join(fmt(o, c) for c in cols) + " |" for o in rows]]

    def diff(o: str, c: str) -> str:
        p = res["paired"][o][c]
        if math.isnan(p["diff"]):
            return "n/a"
        return f"{p['diff']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"
    seeds = f"{args.seeds} seed{'s' if args.seeds > 1 else ''}"
    lines = [f"# Comparison: {', '.join(args.objectives)} x {seeds} (preset {args.preset})", "",
             f"Base model `{typed(args.model)}`; training data `{typed(args.data)}`; held-out data "
             f"`{typed(args.eval_data)}` "
             f"({res['held_out_samples']} samples, {res['token_counts']['all']} response tokens, "
             f"{res['token_counts']['sensitive']} CUDA-sensitive, {res['token_counts']['base_hard']} "
             f"base-hard, {res['token_counts']['base_region']} in base regions). Stage 04 backend: "
             f"**{', '.join(res['backends']) or 'none'}**"
             + (" (CPU emulation: functional verdicts only)" if "emulated" in res["backends"] else "") + ".",
             "", f"Preset {args.preset} (options on the command line override it; the "
                 "commands below are what ran): "
             + " ".join(PRESET_NOTES[args.preset].split()),
             "", "Cells: mean ± standard deviation over seeds; `base` is the untrained base model"
             + (" (greedy decoding: one run)." if args.eval_base else " (token metrics only)."),
             "", "Regions stage 03 read, share of the training data's response tokens inside them: "
             + ", ".join(f"`{k}` {100 * v:.1f}%" for k, v in res["region_coverage"].items())
             + " (`.no-snap`: stage 02 with --no-snap-lines; cuset's token mask is its regions).",
             "", "## Held-out token metrics (stage 01 on the held-out data)", "",
             *table(token_cols, objs, lambda o, c: cell(t[o][c])), "",
             f"## Kernel verdicts (stage 04, eval split; {k} sample(s) per prompt)", "",
             *table(kernel_cols, (["base"] if args.eval_base else []) + args.objectives,
                    lambda o, c: cell(t[o][c])), "",
             "## Paired differences to sft (95% bootstrap interval)", "",
             "Per held-out sample (token metrics: the sample's mean over its tokens of that kind) or per "
             "prompt (pass@1: task x level), the objective's value minus sft's, each averaged over seeds; "
             f"the mean over units and a percentile interval from {args.bootstrap} resamples of the units "
             "(seed 0).", "",
             *table(list(res["paired"][next(iter(res["paired"]))]) if res["paired"] else [],
                    list(res["paired"]), diff), "",
             "## Held-out NLL per CUDA-sensitivity category", "",
             *table([c[4:-4]
                     for c in cats], objs, lambda o, c: cell(t[o][f"cat.{c}.nll"])), "", figure_note, "",
             "## Columns", "", *[f"- `{k}`: {v}" for k, v in COLUMNS.items()],
             "- `.nll`/`.acc` of a group: over all its tokens of all held-out samples (token-weighted)", "",
             "## Stage times (seconds, the last execution of each step)", "",
             *[f"- {name}: " + ", ".join(f"{k} {v:g}"
                                         for k, v in steps.items()) + f"; total {sum(steps.values()):g}"
               for name, steps in res["timings"].items()], "",
             "## Commands", "", "A step continued after an interruption ran with its "
                                "stage's --resume (or --force) "
             "added; `<run>/log.txt` holds every invocation and its output.", "",
             "```bash", res["command"], *commands, "```", ""]
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
        ax.bar([i - 0.4 + (j + 0.5) * width for i in range(len(objs))], [t[o][c]["mean"] for o in objs],
               width, yerr=[0 if math.isnan(t[o][c]["std"]) else t[o][c]["std"] for o in objs],
               label=c[4:-4])
    ax.set_xticks(range(len(objs)), objs)
    ax.set_ylabel("held-out NLL, nats per token (mean ± std over seeds)", fontsize=8)
    ax.set_title("Held-out NLL per CUDA-sensitivity category", fontsize=10)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.save_record:
        return save_record(args)
    if args.report_only:
        (base_steps, runs), calls = plan(args), 0
        if missing := missing_results(args, base_steps, runs):
            raise UserError(f"--report-only: {args.out} lacks results of {'; '.join(missing)}; run what "
                            f"makes them (--runs), then --save-record again")
    else:
        base_steps, runs, calls, stopped = execute(args)
        if stopped:
            return 0
        if args.runs:
            print("[compare] no table: --runs ran part of the comparison", flush=True)
            return 0
    res = aggregate(args, runs)
    commands = [shown(command(s)) for s in base_steps + [s for r in runs for s in r["steps"]]]
    res |= {"preset": args.preset, "objectives": args.objectives, "seeds": args.seeds, "model": args.model,
            "data": str(args.data), "eval_data": str(args.eval_data), "columns": COLUMNS,
            "stage_calls": calls, "command": shlex.join(["python", *sys.argv]), "commands": commands,
            "timings": {r["name"]: json.loads((r["dir"] / "timings.json").read_text())
                        for r in [{"name": "base", "dir": args.out / "base"}, *runs]
                        if (r["dir"] / "timings.json").exists()}}
    for v in res["per_run"].values():  # per-unit arrays as lists; nan as null
        v["units"] = {k: dict(sorted(a.items())) if isinstance(a, dict) else a.tolist()
                      for k, a in v.get("units", {}).items()}
    write_text_atomic(args.out / "comparison.json",
                      json.dumps(json_safe(res), indent=1, allow_nan=False) + "\n")
    made = figure(args.out / "comparison.png", res, args)
    note = ("![held-out NLL per category](comparison.png)" if made else
            "(No figure: matplotlib is not installed; pip install matplotlib, then "
            "rerun this command to add it.)")
    text = markdown(args, res, commands, note)
    write_text_atomic(args.out / "comparison.md", text)
    print(text)
    if not made:  # a figure from an earlier call would show other numbers
        (args.out / "comparison.png").unlink(missing_ok=True)
    print(f"[compare] wrote {args.out / 'comparison.png'}" if made else
          "[compare] no figure: matplotlib is not installed (pip install matplotlib for comparison.png)")
    print(f"[compare] wrote {args.out / 'comparison.md'} and comparison.json")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
