"""Stage 01's command line (01_profile.py): its arguments in groups, their ranges (RANGES), and the
arguments a --resume may change (RESUME_MAY_CHANGE). The research tools that check a stage-01 call before
it runs (research/comparison/stages.py) parse it here too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cuset_common.cli import ArgumentParser, check_ranges
from cuset_common.data_sources import add_data_arguments
from cuset_common.paths import DATA, TINY_MODEL
from cuset_common.trackers import add_report_arguments

RANGES = {
    "max_length": "[1, inf)",
    "batch_tokens": "[1, inf)",
    "log_every": "[0, inf)",
    "save_every": "[0, inf)",
}
# arguments that do not change the result
RESUME_MAY_CHANGE = {"resume", "log_every", "save_every", "report_to", "report_dir"}


def parse_args(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    """Stage 01's command line, its ranges checked (RANGES). `description`: the stage's docstring, shown by
    --help."""
    ap = ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=str, default=str(TINY_MODEL), help="hub id or local folder (%(default)s)")
    add_data_arguments(ap, "SFT data to profile")
    ap.add_argument("--out", type=Path, default=DATA / "artifacts" / "profile", help="artifact folder")
    ap.add_argument(
        "--max-length",
        type=int,
        default=2048,
        help="tokens per sample, prompt included; longer samples are truncated and counted",
    )
    add_batching_arguments(ap)
    add_run_arguments(ap)
    add_report_arguments(ap)  # --report-to: the throughput and the findings to the trackers too
    args = ap.parse_args(argv)
    check_ranges(ap, args, RANGES)
    return args


def positive_or_auto(text: str) -> int | str:
    """--batch-size, --chunk-rows: `auto` or an integer >= 1."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither auto nor an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1 (or auto)")
    return value


def add_batching_arguments(ap: ArgumentParser) -> None:
    """How the scoring is cut up: samples and tokens per batch, output-layer rows per chunk
    (cuset_common/profiler/batching.py resolves `auto` for the device)."""
    ap.add_argument(
        "--batch-size",
        type=positive_or_auto,
        default="auto",
        help="most samples per batch; auto: 1 on a CPU, 8 on a GPU (see Efficiency above)",
    )
    ap.add_argument(
        "--batch-tokens",
        type=int,
        default=16384,
        help="most padded tokens per batch (fewer samples per batch when they are long)",
    )
    ap.add_argument(
        "--chunk-rows",
        type=positive_or_auto,
        default="auto",
        help="positions per lm_head chunk: only a [rows, vocab] block of logits exists at a "
        "time; auto: 128 on a CPU, 1024 on a GPU",
    )


def add_run_arguments(ap: ArgumentParser) -> None:
    """Where and how the run goes: device, precision, progress lines, partial results and --resume."""
    ap.add_argument("--device", type=str, default="auto", help="auto, cpu, cuda, cuda:1, ...")
    ap.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="bf16: the model body and head under bf16 autocast, log-probs in float32; auto: bf16 "
        "where the device computes it natively (a GPU, or a CPU with AVX512-BF16 or AMX), "
        "else fp32",
    )
    ap.add_argument("--log-every", type=float, default=10.0, help="seconds between progress lines")
    ap.add_argument(
        "--save-every",
        type=float,
        default=60.0,
        help="seconds between partial-result shards in <out>.partial/ (0: after every batch)",
    )
    ap.add_argument("--resume", action="store_true", help="continue a killed run from <out>.partial/")
