"""Stage 03's run, set up and closed: its processes and device, the model loaded, checked and placed on them,
the optimizer, what every step uses (Training, with the log of its steps), the lines printed at the start,
and the end (log.jsonl, curves.png, the trackers closed, the processes waiting for rank 0's writing).
scale.py does the distributed work itself (DDP, FSDP2, the memory plan); checkpoint.py the resume state and
the final checkpoint."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cuset_common.artifacts import args_to_json, path_text
from cuset_common.cli import UserError
from cuset_common.device import resolve_precision
from cuset_common.files import write_text_atomic
from cuset_common.models import check_head_is_plain
from cuset_common.trackers import open_trackers
from cuset_common.training.divergence import refuse_nonfinite_model
from cuset_common.training.mfu import device_peak
from cuset_common.training.samples import Inputs
from cuset_common.training.scale import (
    checkpoint_wait_group,
    format_memory_plan,
    fsdp_mesh,
    load_model,
    memory_plan,
    setup_distributed,
    shard_fsdp,
    wait_for_checkpoint,
)
from cuset_common.training.step_log import CURVES_FILE, StepLog, write_curves

# What an interrupted run keeps (cuset_common/cli.py, run_main).
INTERRUPTED = (
    "the run is kept in --out as of its last checkpoint (every --save-every steps), and a run that --force "
    "replaced waits beside it until one finishes; rerun with --resume to go on (with --force if it stopped "
    "before its first checkpoint)"
)


@dataclass
class Processes:
    """Where this process stands: one process, or one of torchrun's."""

    rank: int  # this process, of `world` (torchrun; 0 of 1 otherwise)
    world: int
    device: str
    precision: str  # --precision resolved on this device: fp32 or bf16
    checkpoint_wait: object  # the group processes wait in while rank 0 writes (scale.py), None for one

    def autocast(self) -> torch.autocast:
        """bf16 autocast under --precision bf16 (float32 weights, gradients and log-probs), else disabled."""
        kind = torch.device(self.device).type
        return torch.autocast(kind, dtype=torch.bfloat16, enabled=self.precision == "bf16")


def start_processes(args) -> Processes:
    """The processes and the device (scale.py, setup_distributed); --micro-batch-size resolved, a global batch
    that does not split over them refused, torch seeded with --seed."""
    rank, world, device = setup_distributed(args.device, args.fsdp)
    checkpoint_wait = checkpoint_wait_group(world)
    precision = resolve_precision(args.precision, device)
    args.micro_batch_size = resolve_micro_batch_size(args, device)
    check_batch_split(args, world)
    torch.manual_seed(args.seed)
    return Processes(rank, world, device, precision, checkpoint_wait)


def resolve_micro_batch_size(args, device: str) -> int:
    """--micro-batch-size, else 1 on a CPU and 4 on a GPU. On a CPU one sample of a few hundred tokens
    already fills the core's matrix products, and the right padding of a larger micro-batch (and the
    masked attention it needs) costs more than batching gains; stage 01 chooses so too
    (docs/performance.md, "Micro-batches on a CPU"). Any size trains the same weights up to float
    rounding (tests/test_train.py)."""
    return args.micro_batch_size or (1 if torch.device(device).type == "cpu" else 4)


def check_batch_split(args, world: int) -> None:
    if args.batch_size % (world * args.micro_batch_size):
        raise UserError(
            f"--batch-size {args.batch_size} must be a multiple of processes x "
            f"--micro-batch-size ({world} x {args.micro_batch_size})"
        )


def check_model(model, first: torch.Tensor, name: str) -> None:
    """What stage 03 refuses of the model before it trains: weights that are not all finite (a checkpoint of
    a run that diverged), then logits that are not a plain head (read from the first sample)."""
    refuse_nonfinite_model(model, name)
    check_head_is_plain(model, first.to(model.device), "stage 03")


def load_checked_model(args, procs: Processes, first: dict) -> torch.nn.Module:
    """The float32 model, checked (check_model, on the first sample); under --fsdp rank 0 alone loads and
    checks it, on the host (scale.py, load_model)."""
    ids = torch.tensor([first["input_ids"]])
    check = lambda m: check_model(m, ids, args.model)  # noqa: E731
    return load_model(args, procs.rank, procs.device, check, procs.checkpoint_wait)


def place_model(net, args, procs: Processes, max_length: int) -> tuple[torch.nn.Module, dict]:
    """(net, memory plan): the model in training mode under net (stage 03's GoldLogProbs), on one process,
    under DDP, or sharded by FSDP2 over the processes (its parameters become DTensor shards: the optimizer,
    made after, sees only those)."""
    model = net.model
    if args.grad_checkpointing:  # renamed in transformers 5; 4.x has only the old name
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.config.use_cache = False
    model.train()
    device, world = procs.device, procs.world
    plan = memory_plan(model, args, world, device, max_length, procs.precision)
    if args.fsdp:
        shard_fsdp(net, args, fsdp_mesh(device, world))
    elif world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device] if device.startswith("cuda") else None
        )
    return net, plan


def make_optimizer(model, args) -> torch.optim.Optimizer:
    """--optimizer over all the model's parameters, at --lr (each step sets its own: schedule.py, lr_at)."""
    optimizer_class = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.SGD
    return optimizer_class(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)


@dataclass
class Training:
    """What every step uses: the arguments, the processes, what it trains, and the log of its steps."""

    args: argparse.Namespace
    procs: Processes
    pad_id: int
    model: torch.nn.Module  # the causal LM: the optimizer updates its parameters
    net: torch.nn.Module  # GoldLogProbs over it, wrapped by DDP or sharded by FSDP2
    optimizer: torch.optim.Optimizer
    log: StepLog


def open_step_log(args, procs: Processes, model, inputs: Inputs, total: int, step: int) -> StepLog:
    """The log of the run's steps (step_log.py): MFU against one device's peak (mfu.py), and on rank 0 the
    trackers --report-to names, the run's arguments and inputs their config."""
    peak = device_peak(procs.device, procs.precision, args.peak_tflops)
    trackers = None
    if procs.rank == 0:
        config = {"args": args_to_json(args), "data": inputs.data_id, "precision": procs.precision}
        trackers = open_trackers(args, "03", args.out, config | {"tokenizer_fingerprint": inputs.tok_fp})
    return StepLog(model, total, step, procs.device, peak, procs.world, trackers, args.log_every)


def print_start(args, inputs: Inputs, procs: Processes, total: int, step: int, plan: dict) -> None:
    """The run in one line, then the memory plan (scale.py, format_memory_plan): rank 0's."""
    print(
        f"objective {args.objective} | {len(inputs.samples)} samples ({inputs.skipped} skipped: no response "
        f"token within max_length) | max_length {inputs.max_length} | {total} steps of {args.batch_size} "
        f"samples ({procs.world} process(es) x micro-batches of {args.micro_batch_size}) | device "
        f"{procs.device}, {procs.precision}" + (f" | resumed at step {step}" if step else "")
    )
    print(format_memory_plan(plan, args, procs.world), flush=True)


def finish_run(run: Training, log_lines: list[str], step: int, total: int) -> None:
    """log.jsonl, the curves, the trackers closed and the last line (rank 0's), then every process waits for
    rank 0's writing and leaves its process group."""
    args, procs = run.args, run.procs
    if procs.rank == 0:
        write_text_atomic(args.out / "log.jsonl", "".join(log_lines))
        run.log.trackers.finish()
        if write_curves(args.out, [json.loads(line) for line in log_lines]):
            print(f"curves (loss, masked share): {path_text(args.out / CURVES_FILE)}")
        print(f"{'done' if step >= total else 'stopped'} at step {step}/{total}; {args.out}")
    # a process that tears its process group down while another still uses it can be aborted by gloo
    # ("terminate called without an active exception"; docs/notebook.md)
    wait_for_checkpoint(procs.checkpoint_wait)
    if dist.is_initialized():
        dist.destroy_process_group()
