"""Train with TRL's SFTTrainer on any objective of stage 03: the CuSeT loss in the trainer people already run.

TRL's SFTTrainer offers two losses, `loss_type="nll"` (stage 03's `sft`) and `"dft"` (stage 03's `dft`),
none with a per-token mask or a per-sample weight. This file hands SFTTrainer stage 03's own loss: the loss
itself (OBJECTIVES, objective_loss, mask_probability, mask_knobs, PROFIT_THRESHOLD) is 03_train_cuset.py's,
loaded from it through research/stage_modules.py (docs/method.md, "Training with TRL"); the rest of stage
03's run comes from the package it imports (cuset_common/training/). Stage 03 stays the readable loop; this
is the same run inside TRL:

  data     stage 03's samples (cuset_common/training/samples.py, load_samples): the tokenization of stages
           01 and 02 (cuset_common.data), each sample's region mask and weight cut from stage 02's artifact,
           checked against this run's tokenizer and data as stage 03 checks them. SFTTrainer gets a dataset
           of sample indices (skip_prepare_dataset) and a collator that pads the samples a batch names with
           stage 03's collate: tokens, labels, region mask and weights come from one place and line up by
           construction.
  loss     compute_loss takes the per-token log-probabilities of TRL's fused LM head and calls stage 03's
           objective_loss, with N = the response tokens of the optimizer step's global batch (every
           gradient-accumulation micro-batch, every process) counted before masking: get_batch_samples.
  schedule stage 03's (cuset_common/training/schedule.py): its optimizer over all parameters (AdamW or
           SGD), its learning rate (lr_at: warmup, then cosine) and its order of the samples (batch_order),
           so that the same arguments train the same model as 03_train_cuset.py, to float32 rounding
           (tests/test_trl.py).

Commands
  python research/trl_sft.py                                    # tiny model, bundled data, cuset
  python research/trl_sft.py --model M --data D --regions R --objective cuset --out O
  torchrun --nproc_per_node 4 research/trl_sft.py --model M ...  # DDP (or accelerate launch): N over all

Inputs and outputs are stage 03's (03_train_cuset.py --help), and so is its checkpoint in --out (default
data/artifacts/ckpt-trl-<objective>): the model (save_pretrained), its tokenizer, meta.json (with "trainer"
naming TRL's version) and log.jsonl, one line per step, so that stage 04 evaluates it as it is. Not here:
--norm kept (stage 03 counts the kept tokens in a no-grad pass before the step), --resume, --fsdp.
Refused before any work (exit 2, one line): what stage 03 refuses about the inputs and --out.
Stopped (exit 2, one line) when the run diverges, as stage 03 stops: a loss or gradient that is not finite
(each step), weights that are not (at the end); no model is written.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, whose packages it imports

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback

from cuset_common.cli import ArgumentParser, check_ranges, run_main
from cuset_common.data_sources import load_data
from cuset_common.device import pick_device, resolve_precision
from cuset_common.files import write_text_atomic
from cuset_common.models import load_causal_lm
from cuset_common.out_dir import aside_dir, check_train_out, finishes_out, open_out
from cuset_common.paths import DATA
from cuset_common.training.checkpoint import checkpoint_meta, save_final
from cuset_common.training.divergence import diverged_error, nonfinite_step, nonfinite_weights
from cuset_common.training.mfu import device_peak
from cuset_common.training.options import (
    RANGES,
    add_input_arguments,
    add_method_arguments,
    add_schedule_arguments,
)
from cuset_common.training.run import check_batch_split, resolve_micro_batch_size
from cuset_common.training.samples import collate, load_samples, regions_needed
from cuset_common.training.scale import all_reduce_stats
from cuset_common.training.schedule import batch_order, lr_at, schedule
from cuset_common.training.step_log import StepLog
from research.stage_modules import stage_module

try:
    import datasets
    import trl
    from trl import SFTConfig, SFTTrainer
except ImportError as e:  # TRL is optional for the rest of the project
    print(
        f"error: {Path(__file__).name} needs TRL ({e}); pip install -r tests/requirements.txt",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

train03 = stage_module("03")  # the loss: OBJECTIVES, objective_loss, mask_probability, mask_knobs

# What stage 03's collate adds to a batch beside the model's inputs: objective_loss's arguments.
LOSS_INPUTS = ("valid", "r", "w", "p0")


# ---------------------------------------------------------------------------------------
# 1. The data: stage 03's samples, batched by stage 03's collate
# ---------------------------------------------------------------------------------------


def visiting_order(samples: list[dict], args) -> datasets.Dataset:
    """One row per sample visit of the whole run, in stage 03's order: the global batches of batch_order,
    epoch after epoch, up to the last step. SFTTrainer reads it in sequence (train_sampling_strategy
    "sequential"), and each optimizer step takes the next --batch-size rows, split over processes and
    gradient-accumulation micro-batches as stage 03 splits them."""
    steps_per_epoch, total, _ = schedule(args, len(samples))
    rows = [
        i
        for epoch in range(math.ceil(total / steps_per_epoch))
        for batch in batch_order(len(samples), args.batch_size, epoch, args.seed)
        for i in batch
    ]
    return datasets.Dataset.from_dict({"sample_index": rows[: total * args.batch_size]})


class SampleCollator:
    """Stage 03's collate of the samples a micro-batch names, as the model's inputs (input_ids,
    attention_mask, labels: -100 but on the response tokens) beside the loss inputs (LOSS_INPUTS)."""

    def __init__(self, samples: list[dict], pad_id: int):
        self.samples, self.pad_id = samples, pad_id

    def __call__(self, rows: list[dict]) -> dict:
        batch = collate([self.samples[r["sample_index"]] for r in rows], self.pad_id, "cpu")
        ids, valid = batch["ids"], batch["valid"]  # valid [B, L-1]: the target positions, as the labels shift
        labels = torch.full_like(ids, -100)
        labels[:, 1:] = ids[:, 1:].masked_fill(~valid, -100)
        return {"input_ids": ids, "attention_mask": batch["attn"], "labels": labels} | {
            k: batch[k] for k in LOSS_INPUTS
        }


# ---------------------------------------------------------------------------------------
# 2. The loss: SFTTrainer with stage 03's objective_loss
# ---------------------------------------------------------------------------------------


class CusetSFTTrainer(SFTTrainer):
    """SFTTrainer whose loss is stage 03's objective_loss (any of its objectives), normalised by stage 03's
    N. The knobs come from stage 03's arguments (`cuset_args`: objective, rho, tau_max, profit_threshold,
    mask_source); `step_stats` sums objective_loss's statistics over the current optimizer step."""

    # compute_loss divides by the step's global N itself: Trainer must not divide by the accumulation steps
    loss_is_scaled_for_ga = True

    def __init__(self, *args, cuset_args: argparse.Namespace, **kwargs):
        super().__init__(*args, **kwargs)
        self.cuset_args = cuset_args
        self.step_stats: dict[str, float] = {}
        self.step_lengths: list[tuple[int, int]] = []  # (T, R) of this process's samples in the step
        self.step_log = StepLogCallback(self)
        self.add_callback(self.step_log)

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """The step's micro-batches, and as `num_items_in_batch` stage 03's N: their response tokens before
        masking, summed over processes. (Trainer's own count needs the model to accept loss kwargs.)"""
        batches, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        local = sum(b["valid"].sum() for b in batches).reshape(1).to(device)
        self.step_stats, self.step_lengths = {}, []
        return batches, self.accelerator.gather(local).sum()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        a = self.cuset_args
        loss_inputs = {k: inputs.pop(k) for k in LOSS_INPUTS}
        outputs = model(**inputs, fused_lm_head=True)  # log_probs [B, L-1]: log q(labels), 0 off them
        # evaluate() calls without a step's N: the batch's own response tokens then
        N = loss_inputs["valid"].sum() if num_items_in_batch is None else num_items_in_batch
        loss, stats = train03.objective_loss(
            outputs.log_probs,
            loss_inputs["valid"],
            loss_inputs["r"],
            loss_inputs["w"],
            max(float(N), 1.0),
            a.objective,
            p_mask=train03.mask_probability(a.mask_source, loss_inputs),
            **train03.mask_knobs(a),
        )
        for key, value in (stats | {"loss": loss.item()}).items():
            self.step_stats[key] = self.step_stats.get(key, 0.0) + value
        T, R = inputs["attention_mask"].sum(1).tolist(), loss_inputs["valid"].sum(1).tolist()
        self.step_lengths += list(zip(T, R))  # the step's model FLOPs (mfu.py)
        # DDP averages gradients over processes; the loss is already the global sum / N (stage 03 alike)
        loss = loss * self.accelerator.num_processes
        return (loss, outputs) if return_outputs else loss

    def diverged(self, what: str, step: int) -> None:
        """Stop a run whose loss, gradient or weights are not finite (cuset_common/training/divergence.py):
        raises Diverged, one line and exit 2; nothing is written (this run keeps no resume state)."""
        a = self.cuset_args
        restored = aside_dir(a.out).exists()  # --force: finishes_out puts the previous content back
        raise diverged_error(what, step, self.args.max_steps, a.lr, a.out, restored=restored, resumable=False)


class StepLogCallback(TrainerCallback):
    """Stage 03's log of each optimizer step (cuset_common/training/step_log.py: its log.jsonl row and
    progress line), with the step's statistics summed over processes and their samples' lengths gathered.
    on_optimizer_step comes before the scheduler's step: the learning rate read is the one the step used,
    as in stage 03's log.

    Before the update (on_pre_optimizer_step, after Trainer's clipping) the step's loss and the norm of its
    gradients are checked as stage 03 checks them (cuset_common/training/divergence.py): one that is not
    finite stops the run (Diverged, exit 2) before it reaches the weights, on every process alike (the loss is
    summed over them, the gradients are DDP's average)."""

    def __init__(self, trainer: CusetSFTTrainer):
        self.trainer = trainer
        self.lines: list[str] = []
        self.stats: dict = {}
        self.lengths: list[tuple[int, int]] = []
        self.log: StepLog | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        trainer, device = self.trainer, str(self.trainer.args.device)
        precision = "bf16" if args.bf16 else "fp32"
        world = trainer.accelerator.num_processes
        self.log = StepLog(trainer.model, state.max_steps, 0, device, device_peak(device, precision), world)

    def on_step_begin(self, args, state, control, **kwargs):
        self.log.start()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        trainer = self.trainer
        world = trainer.accelerator.num_processes
        self.stats = all_reduce_stats(trainer.step_stats, world, str(trainer.args.device))
        self.lengths = gather_object(trainer.step_lengths)  # every process's (T, R)
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        self.stats["grad_norm"] = float(torch.nn.utils.get_total_norm(grads))
        if what := nonfinite_step(self.stats):
            trainer.diverged(what, state.global_step + 1)

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.trainer.is_world_process_zero():
            step, lr = (
                state.global_step + 1,
                self.trainer.optimizer.param_groups[0]["lr"],
            )  # step: counted after
            self.lines.append(self.log(step, self.stats, lr, self.lengths))


# ---------------------------------------------------------------------------------------
# 3. The trainer: stage 03's optimizer, schedule and order in SFTConfig
# ---------------------------------------------------------------------------------------


def make_trainer(args, model, tokenizer, samples: list[dict], device: str, precision: str) -> CusetSFTTrainer:
    """CusetSFTTrainer set up to run stage 03's schedule: --max-steps (or --epochs) of --batch-size samples
    in micro-batches of --micro-batch-size, stage 03's optimizer and learning rate, nothing saved or
    reported by Trainer itself (the checkpoint is main's)."""
    _, total, warmup = schedule(args, len(samples))
    optimizer_class = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.SGD
    optimizer = optimizer_class(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_at(step, total, warmup, args.lr, args.min_lr_ratio) / args.lr
    )
    config = SFTConfig(
        output_dir=str(args.out),
        max_steps=total,
        per_device_train_batch_size=args.micro_batch_size,
        gradient_accumulation_steps=args.batch_size // (process_count() * args.micro_batch_size),
        train_sampling_strategy="sequential",  # visiting_order is stage 03's order already
        max_grad_norm=args.grad_clip,
        seed=args.seed,
        bf16=precision == "bf16",
        use_cpu=device == "cpu",
        remove_unused_columns=False,  # sample_index is no model input, but the collator needs it
        dataset_kwargs={"skip_prepare_dataset": True},
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    return CusetSFTTrainer(
        model=model,
        args=config,
        train_dataset=visiting_order(samples, args),
        data_collator=SampleCollator(samples, tokenizer.pad_token_id),
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
        cuset_args=args,
    )


# ---------------------------------------------------------------------------------------
# 4. The command line and main
# ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Stage 03's input, schedule and method arguments (the same names and defaults), and how this run
    is carried out."""
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_arguments(ap, train03.OBJECTIVES)
    add_schedule_arguments(ap)
    add_method_arguments(ap, train03.PROFIT_THRESHOLD)
    a = ap.add_argument
    a("--seed", type=int, default=0)
    a("--device", choices=("auto", "cpu"), default="auto", help="auto: a GPU if there is one, else the CPU")
    a("--precision", choices=("auto", "fp32", "bf16"), default="auto", help="as stage 03's --precision")
    a("--force", action="store_true", help="as stage 03's --force")
    ap.set_defaults(
        fsdp=False
    )  # save_final (cuset_common/training/checkpoint.py) reads it: stage 03's FSDP is not here
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = DATA / "artifacts" / f"ckpt-trl-{args.objective}"
    check_ranges(ap, args, {k: v for k, v in RANGES.items() if hasattr(args, k)})
    if args.norm == "kept":
        ap.error("--norm kept is stage 03's alone (it counts kept tokens before the step); use --norm all")
    return args


def check_out(args) -> None:
    """--out, before any work: stage 03's rule (check_train_out), without --resume."""
    regions = args.regions if regions_needed(args, train03.OBJECTIVES) else None
    check_train_out(args, regions, resumable=False)


def process_count() -> int:
    """The run's processes: accelerate launch and torchrun set WORLD_SIZE."""
    return int(os.environ.get("WORLD_SIZE", "1"))


@finishes_out
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    precision = resolve_precision(args.precision, device)
    args.micro_batch_size = resolve_micro_batch_size(args, device)
    check_batch_split(args, process_count())

    # The inputs, each checked before any work, as stage 03 checks them.
    records, data_id = load_data(args)
    check_out(args)
    inputs = load_samples(args, records, data_id, regions_needed(args, train03.OBJECTIVES))
    model = load_causal_lm(args.model, torch.float32)
    trainer = make_trainer(args, model, inputs.tokenizer, inputs.samples, device, precision)
    rank0 = trainer.is_world_process_zero()
    if rank0:  # --force: the previous run is put back if this one fails (finishes_out)
        open_out(args.out, start_over=True)
        print(
            f"objective {args.objective} | TRL {trl.__version__} SFTTrainer | {len(inputs.samples)} samples "
            f"({inputs.skipped} skipped: no response token within max_length) | max_length "
            f"{inputs.max_length} | {trainer.args.max_steps} steps of {args.batch_size} samples | {device}, "
            f"{precision}",
            flush=True,
        )
    trainer.train()

    step = trainer.state.global_step
    if what := nonfinite_weights(trainer.model, process_count(), str(trainer.args.device)):
        trainer.diverged(what, step)  # checked once, before the model is written
    uses_regions = train03.OBJECTIVES[args.objective].uses_regions
    meta = checkpoint_meta(args, inputs, step, precision, None, uses_regions)
    meta["trainer"] = {"name": "trl.SFTTrainer", "trl": trl.__version__}
    save_final(args, trainer.model, inputs.tokenizer, meta if rank0 else None, trainer.args.process_index)
    if rank0:
        write_text_atomic(args.out / "log.jsonl", "".join(trainer.step_log.lines))
        print(f"done at step {step}; {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
