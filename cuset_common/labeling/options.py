"""Stage 02's command line (02_label_regions.py): its arguments in groups and the values each accepts
(RANGES). The research tools that check a stage-02 call before it runs (research/comparison/stages.py)
parse it here too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from cuset_common.cli import ArgumentParser, check_ranges
from cuset_common.data_sources import add_data_arguments
from cuset_common.method import RHO, TAU_MAX
from cuset_common.paths import DATA, TINY_MODEL

RANGES = {  # the values each option accepts (check_ranges)
    "rho": "[0, 1]",
    "tau_max": "(0, 1]",
    "gap": "[0, inf)",
    "alpha": "[0, inf)",
    "w_max": f"[1, {float(np.finfo(np.float32).max)!r}]",  # w is stored in float32
    "permutations": "[0, inf)",
    "seed": "[0, inf)",
    "html_samples": "[0, inf)",
}


class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The stage's docstring as written, and each option's default after its help."""


def parse_args(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    """Stage 02's command line, its ranges checked (RANGES). `description`: the stage's docstring, shown by
    --help."""
    ap = ArgumentParser(description=description, formatter_class=Formatter)
    add_input_arguments(ap)
    add_rule_arguments(ap)
    add_report_arguments(ap)
    args = ap.parse_args(argv)
    check_ranges(ap, args, RANGES)
    return args


def add_input_arguments(ap: ArgumentParser) -> None:
    """The profile read, the artifact written, and the model and data the profile must have been made
    from."""
    ap.add_argument(
        "--profile", type=Path, default=DATA / "artifacts" / "profile", help="stage-01 artifact folder"
    )
    ap.add_argument(
        "--out", type=Path, default=DATA / "artifacts" / "regions", help="regions artifact folder"
    )
    ap.add_argument(
        "--model", type=str, default=str(TINY_MODEL), help="model of the profile (hub id or folder)"
    )
    add_data_arguments(ap, "SFT data the profile was made from")


def add_rule_arguments(ap: ArgumentParser) -> None:
    """The knobs of the region rule and the sample weights (docs/method.md "Regions")."""
    ap.add_argument(
        "--rho", type=float, default=RHO, help="quantile of a sample's p0 for its threshold tau_i"
    )
    ap.add_argument("--tau-max", type=float, default=TAU_MAX, help="upper bound on tau_i")
    ap.add_argument("--gap", type=int, default=2, help="confident tokens a region may bridge")
    ap.add_argument("--alpha", type=float, default=1.0, help="slope of the weight w_i in the region mass m_i")
    ap.add_argument("--w-max", type=float, default=3.0, help="upper clip of the sample weight")
    ap.add_argument(
        "--weight-norm",
        choices=("token-mean", "none"),
        default="token-mean",
        help="token-mean: rescale w to token-weighted mean 1 (the sft loss scale); none: keep clipped w",
    )
    ap.add_argument(
        "--snap-lines",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="extend regions to whole source lines",
    )


def add_report_arguments(ap: ArgumentParser) -> None:
    """The permutation tests of the observation, the HTML page, and --force."""
    ap.add_argument("--permutations", type=int, default=200, help="draws of each permutation null")
    ap.add_argument("--seed", type=int, default=0, help="seed of the permutation nulls")
    ap.add_argument(
        "--html-samples", type=int, default=8, help="samples on the HTML page (highest region mass)"
    )
    ap.add_argument(
        "--force",
        action="store_true",
        help="use a profile made from other inputs anyway; replace another stage's artifact in --out",
    )
