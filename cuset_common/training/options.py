"""Stage 03's command line: its arguments in groups, the range of each number (RANGES) and what --resume may
change (RESUME_MAY_CHANGE).

The TRL port (research/trl_sft.py) shares the input, schedule and method groups, so that the same arguments
mean the same run there. The objectives and ProFit's default threshold are the stage's own (its OBJECTIVES
table and PROFIT_THRESHOLD): it hands them in.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

from cuset_common.cli import ArgumentParser, check_ranges
from cuset_common.data_sources import add_data_arguments
from cuset_common.method import RHO, TAU_MAX
from cuset_common.paths import DATA, TINY_MODEL
from cuset_common.progress import QUIET_EVERY_S
from cuset_common.trackers import add_report_arguments

DEFAULT_REGIONS = DATA / "artifacts" / "regions"

# Each numeric argument's allowed values (cuset_common.cli.check_ranges).
RANGES = {
    "max_length": "[1, inf)",
    "epochs": "(0, inf)",
    "max_steps": "[1, inf)",
    "batch_size": "[1, inf)",
    "micro_batch_size": "[1, inf)",
    "lr": "(0, inf)",
    "min_lr_ratio": "[0, 1]",
    "warmup_steps": "[0, inf)",
    "weight_decay": "[0, inf)",
    "grad_clip": "[0, inf)",
    "rho": "[0, 1]",
    "tau_max": "(0, 1]",
    "profit_threshold": "[0, 1]",
    "chunk_rows": "[1, inf)",
    "save_every": "[1, inf)",
    "stop_after": "[1, inf)",
    "seed": "[0, inf)",
    "trace": "[0, inf)",
    "peak_tflops": "(0, inf)",
    "log_every": "[0, inf)",
}

# Arguments --resume may change: they do not change the trained weights. Where the run is and how it is
# checkpointed and stopped (out, resume, force, save_every, stop_after), and the memory knobs whose
# equivalence the tests check (micro_batch_size, chunk_rows, grad_checkpointing: the same sums, split
# otherwise), so that a run can resume on a smaller GPU. Everything else (objective, data, lr, schedule,
# max_length, seed, device and hence precision, ...) would make the resumed run another run. So are --fsdp
# and --fsdp-keep-gathered (the resume state is the gathered one whatever wrote it, and FSDP is tested equal
# to one process): a DDP run can move to FSDP. --param-dtype changes precision: not. --trace trains nothing;
# --peak-tflops, --log-every, --report-to and --report-dir say how the run is watched. From the state a
# diverged run left, --lr may change too (cuset_common/training/checkpoint.py, check_resume).
RESUME_MAY_CHANGE = {
    "out",
    "resume",
    "force",
    "save_every",
    "stop_after",
    "micro_batch_size",
    "chunk_rows",
    "grad_checkpointing",
    "fsdp",
    "fsdp_keep_gathered",
    "trace",
    "peak_tflops",
    "log_every",
    "report_to",
    "report_dir",
}


def parse_train_args(
    argv: list[str] | None, description: str, objectives: Iterable[str], profit_threshold: float
) -> argparse.Namespace:
    """Stage 03's arguments (--help: its docstring), checked: each number in its RANGES, the FSDP-only
    flags only with --fsdp; --out defaults to data/artifacts/ckpt-<objective>."""
    ap = ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_arguments(ap, objectives)
    add_schedule_arguments(ap)
    add_method_arguments(ap, profit_threshold)
    add_run_arguments(ap)
    add_report_arguments(ap)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = DATA / "artifacts" / f"ckpt-{args.objective}"
    check_ranges(ap, args, RANGES)
    if (args.param_dtype == "bf16" or args.fsdp_keep_gathered) and not args.fsdp:
        ap.error(
            "--param-dtype bf16 and --fsdp-keep-gathered need --fsdp (one GPU: torchrun --nproc_per_node 1)"
        )
    return args


def add_input_arguments(ap: ArgumentParser, objectives: Iterable[str]) -> None:
    """What is trained on what, and where it goes."""
    a = ap.add_argument
    a("--model", default=str(TINY_MODEL), help="hub id or local folder (default: the bundled tiny model)")
    add_data_arguments(ap, "SFT data to train on")
    a("--regions", type=Path, default=DEFAULT_REGIONS, help="stage-02 artifact (default: %(default)s)")
    a("--objective", choices=objectives, default="cuset")
    a("--out", type=Path, default=None, help="output folder (default: data/artifacts/ckpt-<objective>)")
    a("--max-length", type=int, help="tokens per sample (default: the regions artifact's, else 1024)")


def add_schedule_arguments(ap: ArgumentParser) -> None:
    """How long, in what batches, with which optimizer and learning rate."""
    a = ap.add_argument
    a("--epochs", type=float, default=1.0, help="passes over the data (default: %(default)s)")
    a("--max-steps", type=int, default=None, help="optimizer steps; overrides --epochs")
    a("--batch-size", type=int, default=8, help="global batch in samples per optimizer step")
    a(
        "--micro-batch-size",
        type=int,
        default=None,
        help="samples per forward pass on one process (default: 1 on a CPU, 4 on a GPU)",
    )
    a("--optimizer", choices=("adamw", "sgd"), default="adamw", help="sgd: plain SGD, for equivalence tests")
    a("--lr", type=float, default=3e-4, help="peak learning rate (default: %(default)s)")
    a("--min-lr-ratio", type=float, default=0.1, help="cosine decays to lr * this")
    a("--warmup-steps", type=int, default=None, help="linear warmup (default: 5%% of steps, at least 1)")
    a("--weight-decay", type=float, default=0.0)
    a("--grad-clip", type=float, default=1.0, help="max global grad norm; 0 disables")


def add_method_arguments(ap: ArgumentParser, profit_threshold: float) -> None:
    """The knobs of the mask and the normaliser (docs/method.md "Objectives")."""
    a = ap.add_argument
    a("--rho", type=float, default=RHO, help="quantile of p defining kappa_i (default: %(default)s)")
    a("--tau-max", type=float, default=TAU_MAX, help="upper bound of kappa_i (default: %(default)s)")
    a(
        "--mask-source",
        choices=("online", "profile"),
        default="online",
        help="p for kappa and the mask: the current model's, or the stage-01 profile's (p0) the regions used",
    )
    a("--norm", choices=("all", "kept"), default="all", help="N counts all response tokens or only kept ones")
    a(
        "--profit-threshold",
        type=float,
        default=profit_threshold,
        help="ProFit's fixed threshold on p (default: %(default)s)",
    )


def add_run_arguments(ap: ArgumentParser) -> None:
    """Memory, processes, resume and the device: how the run is carried out, not what it computes."""
    a = ap.add_argument
    a("--chunk-rows", type=int, default=1024, help="positions per lm_head chunk (memory ~ chunk x vocab)")
    a("--grad-checkpointing", action="store_true", help="recompute activations in backward")
    a(
        "--fsdp",
        action="store_true",
        help="under torchrun: shard weights, gradients and optimizer state (FSDP2)",
    )
    a(
        "--param-dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="weights as gathered for compute under --fsdp; bf16 keeps fp32 shards (master) and fp32 "
        "optimizer state",
    )
    a(
        "--fsdp-keep-gathered",
        action="store_true",
        help="--fsdp: no all-gather or reduce-scatter between a step's micro-batches, for full weights and "
        "grads",
    )
    a("--save-every", type=int, default=50, help="steps between resume checkpoints")
    a(
        "--log-every",
        type=float,
        default=QUIET_EVERY_S,
        help="seconds between progress lines when output is not a terminal (0: every step; log.jsonl "
        "holds every step whatever it says)",
    )
    a("--stop-after", type=int, help="stop after this many steps in this invocation (time slices)")
    a("--resume", action="store_true", help="continue from --out/resume")
    a(
        "--force",
        action="store_true",
        help="start over in --out (its previous content is deleted only once the new run succeeds); accept "
        "regions/profile artifacts from other inputs",
    )
    a("--seed", type=int, default=0)
    a("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    a(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="bf16: forward under bf16 autocast (float32 weights, gradients, optimizer state and log-probs); "
        "auto: bf16 where the device computes it natively (a GPU, or a CPU with AVX512-BF16 or AMX), "
        "else fp32",
    )
    a(
        "--peak-tflops",
        type=float,
        help="one device's peak TFLOP/s at --precision, for MFU where cuset_common/training/mfu.py's table "
        "has none (another GPU; a CPU, as research/bench/ measures it); default: the table's, else no MFU",
    )
    a(
        "--trace",
        type=int,
        metavar="I",
        help="print sample I's worked trace (its tokens, regions, masks and loss at --model; docs/method.md "
        '"The worked trace") and exit: trains and writes nothing',
    )
