"""What a comparison compares: the objectives, their variants (`<objective>.<variant>`: extra arguments of
one stage for that objective's runs) and the evaluations (stage 04 once per name; a name begins with its
mode)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from cuset_common.cli import UserError
from research.stage_modules import stage_module

OBJECTIVES = ("sft", "dft", "profit", "cuset", "cuset-mask", "cuset-weight")
MODES = ("kernel", "standalone")
EVALUATION_NAME = re.compile(rf"({'|'.join(MODES)})(-[A-Za-z0-9]+)*")  # its mode first: kernel-sampled
# A stage-02 variant makes regions of its own (base/regions.<variant>) and applies to the objectives that
# read regions; a stage-03 variant changes the training only, for the objectives it names.
VARIANTS = {
    "no-snap": {"stage": "02", "args": ["--no-snap-lines"]},
    # ProFit's fixed threshold (stage 03's default p >= 0.1) ten times lower: whether the threshold, not the
    # method, fails on a model whose confidences sit low
    "t01": {"stage": "03", "args": ["--profit-threshold", "0.01"], "objectives": ("profit",)},
}


def known_objective(label: str) -> bool:
    """`sft`, `cuset`, ... or `<objective>.<variant>` (cuset.no-snap, profit.t01): a variant where it
    applies."""
    objective, _, variant = label.partition(".")
    return objective in OBJECTIVES and (
        not variant or (variant in VARIANTS and objective in variant_objectives(variant))
    )


def check_objectives(objectives: list[str]) -> None:
    """Each objective known, with a variant only where it applies; sft among them; each once."""
    if bad := [o for o in objectives if not known_objective(o)]:
        raise UserError(
            f"unknown objective {', '.join(bad)}; objectives: {', '.join(OBJECTIVES)}, each "
            f"optionally with a variant after a dot ({variants_help()})"
        )
    if "sft" not in objectives or len(set(objectives)) < len(objectives):
        raise UserError("--objectives must include sft (the differences are to sft), each objective once")


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
    """The base model's regions of the training data: base/regions, or base/regions.<variant>."""
    return base / (f"regions.{variant}" if variant else "regions")


def evaluation_mode(name: str) -> str:
    """An evaluation's stage-04 mode: the first word of its name."""
    return name.split("-")[0]
