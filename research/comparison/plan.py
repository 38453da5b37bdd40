"""The plan: every stage call of a comparison, in order. The base model's stages 01 and 02 on the
training and the held-out data (and stage 04 with --eval-base), then for each objective and seed a run:
stage 03, stage 01 with the checkpoint on the held-out data, stage 04 once per evaluation. A step is
{stage, argv, out, inputs}: `inputs` are the files whose change makes its artifact stale."""

from __future__ import annotations

from pathlib import Path

from research.comparison.objectives import evaluation_mode, region_variants, regions_dir, variant_args
from research.stage_modules import stage_module


def seed_count(args, label: str) -> int:
    """The seeds of one objective: its --seeds-for count, else --seeds."""
    return args.seeds_for.get(label, args.seeds)


def most_seeds(args) -> int:
    return max(seed_count(args, label) for label in args.objectives)


def seeds_text(args) -> str:
    """'3 seeds', or '3 seeds (sft 5, profit.t01 1)' where some objectives have another count."""
    more = [(label, n) for label, n in args.seeds_for.items() if n != args.seeds]
    text = f"{args.seeds} seed{'s' if args.seeds > 1 else ''}"
    return text + (f" ({', '.join(f'{label} {n}' for label, n in more)})" if more else "")


def plan(args) -> tuple[list[dict], list[dict]]:
    """(base steps, runs): a run is {name, objective, seed, dir, steps}, seed by seed, so that a stop
    midway leaves every objective's first seeds (comparable), not one objective's all."""
    base = args.out / "base"
    steps = base_model_steps(args, base)
    steps += [eval_step(args, args.model, base, name) for name in args.evaluations if args.eval_base]
    runs = []
    for seed in range(most_seeds(args)):
        for label in [label for label in args.objectives if seed < seed_count(args, label)]:
            folder = args.out / f"{label}-seed{seed}"
            runs.append(
                {
                    "name": folder.name,
                    "objective": label,
                    "seed": seed,
                    "dir": folder,
                    "steps": run_steps(args, base, folder, label, seed),
                }
            )
    return steps, runs


def base_model_steps(args, base: Path) -> list[dict]:
    """Stages 01 and 02 with the base model: on the training data (regions for stage 03, one folder per
    stage-02 variant) and on the held-out data (the base model's hard tokens and regions)."""
    model, max_length = ["--model", args.model], ["--max-length", str(args.max_length)]
    steps = []
    for tag, data in (("", args.data), ("-heldout", args.eval_data)):
        prof = base / f"profile{tag}"
        steps.append(
            {
                "stage": "01",
                "out": prof,
                "inputs": [],
                "argv": [*model, "--data", str(data), "--out", str(prof), *max_length, *args.profile_args],
            }
        )
        for variant in [""] + (region_variants(args) if not tag else []):  # of the training data only
            regions = regions_dir(base, variant) if not tag else base / f"regions{tag}"
            steps.append(
                {
                    "stage": "02",
                    "out": regions,
                    "inputs": [prof / "meta.json"],
                    "argv": [
                        *model,
                        "--data",
                        str(data),
                        "--profile",
                        str(prof),
                        "--out",
                        str(regions),
                        *args.regions_args,
                        *variant_args(variant, "02"),
                    ],
                }
            )
    return steps


def run_steps(args, base: Path, folder: Path, label: str, seed: int) -> list[dict]:
    """One run of `label` (objective[.variant]): train, profile the checkpoint on the held-out data,
    evaluate it."""
    objective, _, variant = label.partition(".")
    ckpt, held = folder / "ckpt", folder / "profile-heldout"
    max_length = ["--max-length", str(args.max_length)]
    regions = regions_dir(base, variant if variant_args(variant, "02") else "")
    uses_regions = objective in stage_module("03").REGION_OBJECTIVES
    train = {
        "stage": "03",
        "out": ckpt,
        "inputs": [regions / "meta.json"] if uses_regions else [],
        "argv": [
            "--model",
            args.model,
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
            *max_length,
            *args.train_args,
            *variant_args(variant, "03"),
        ],
    }
    profile = {
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
            *max_length,
            *args.profile_args,
        ],
    }
    evals = [eval_step(args, str(ckpt), folder, name, [ckpt / "meta.json"]) for name in args.evaluations]
    return [train, profile, *evals]


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


def step_groups(args, base_steps: list[dict], runs: list[dict]) -> list[tuple[str, list[dict], Path]]:
    """(name, steps, folder): the base stages, then each run."""
    return [("base", base_steps, args.out / "base")] + [(r["name"], r["steps"], r["dir"]) for r in runs]
