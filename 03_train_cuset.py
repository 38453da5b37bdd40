"""Stage 03: fine-tune a causal LM on SFT data with the CuSeT loss or one of its baselines, in a plain
PyTorch loop.

CuSeT changes two things in ordinary SFT: a keep mask k_it over the response tokens (the tokens the model
is already confident in are kept, the others dropped unless they lie in a CUDA-sensitive region of stage
02) and a weight w_i per sample (stage 02's, growing with its region mass). The objectives, the
notation (k_it, kappa_i, N, ...) and our assumptions: docs/method.md "Objectives". Here OBJECTIVES holds
each objective as data (its mask, whether w_i applies, its per-token factor) and objective_loss is the one
loss they share.

Commands
  python 03_train_cuset.py                                   # tiny model, bundled data, cuset
  python 03_train_cuset.py --objective sft --out data/artifacts/ckpt-sft
  python 03_train_cuset.py --resume --out data/artifacts/ckpt-cuset      # continue a killed run
  python 03_train_cuset.py --trace 0      # sample 0 token by token: p0, r, k, f, its loss (docs/method.md)
  python 03_train_cuset.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --data my_sft.jsonl \\
      --regions data/artifacts/regions-qwen --batch-size 64 --micro-batch-size 4 --lr 1e-5
  torchrun --nproc_per_node 4 03_train_cuset.py --model ... --regions ...    # DDP
  torchrun --nproc_per_node 8 03_train_cuset.py --fsdp --param-dtype bf16 --grad-checkpointing --model ...
                                            # FSDP2: state sharded over 8 GPUs (docs/scale.md)

Inputs -> outputs
  --model, --data  a causal LM and SFT data (tokenized as in stages 01 and 02: cuset_common.data)
  --regions        stage 02's artifact: region r_it per response token, weight w_i per sample (for the
                   cuset objectives), and with --mask-source profile the stage-01 profile it was labelled on
  -> --out (default data/artifacts/ckpt-<objective>):
     model.safetensors, config, tokenizer  the trained model (save_pretrained)
     meta.json   args, precision, hashes of data and regions, library versions, final step, memory
                 (the plan's total, and on a GPU the peak allocated)
     log.jsonl   one line per step: loss, nll, masked_share, region_share, weight_mean, lr, tokens
     resume/     model, optimizer, step, log and arguments, for --resume (one copy, also under --fsdp)

The file follows the data: 1. the keep mask and the loss; 2. the samples aligned with the regions; 3. log
q(gold) at the response positions; 4. the schedule; 5. one optimizer step; 6. main. The run's plumbing (its
arguments, processes, FSDP2, memory plan, checkpoints, log line) is in cuset_common/training/.

Refused before any work (exit 2, one line): artifacts from other data or tokenizer, a profile
rewritten since stage 02 read it, a model whose logits are not h @ W.T + b (scaled or soft-capped),
--resume with other arguments than the run's, a number out of its range, an --out that is not this
stage's run (README, "Pipeline and artifacts"; --force starts over, keeping the previous run until the
new one succeeds), an --out another run holds, a model whose weights are not all finite, a resume state
that is cut short or damaged.
Stopped (exit 2, one line) when the run diverges: a loss, gradient or weight that is not finite (checked as
cuset_common/training/divergence.py says). No model is written; the last resume state stays, and --resume may
continue from it with a lower --lr. A full disk while a checkpoint is written: one line, the previous one
kept. Samples whose prompt fills --max-length have no response token: they are skipped and counted.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Literal

import torch

from cuset_common.cli import run_main
from cuset_common.data_sources import load_data
from cuset_common.method import RHO, TAU_MAX, gold_logprobs, sample_threshold
from cuset_common.models import output_head
from cuset_common.out_dir import check_room, check_train_out, finishes_out, open_out
from cuset_common.training.checkpoint import (
    check_resume,
    checkpoint_meta,
    checkpoint_room,
    load_resume,
    save_final,
    save_resume,
    stop_diverged,
)
from cuset_common.training.divergence import grad_norm, nonfinite_step, nonfinite_weights
from cuset_common.training.options import RESUME_MAY_CHANGE, parse_train_args
from cuset_common.training.run import (
    INTERRUPTED,
    Training,
    finish_run,
    load_checked_model,
    make_optimizer,
    open_step_log,
    place_model,
    print_start,
    start_processes,
)
from cuset_common.training.samples import collate, load_samples, regions_needed
from cuset_common.training.scale import (
    all_reduce_stats,
    fsdp_micro_batch,
    memory_record,
    reset_peak_memory,
    wait_for_checkpoint,
)
from cuset_common.training.schedule import batch_order, lr_at, schedule
from cuset_common.training.trace import print_trace

PROFIT_THRESHOLD = 0.1  # default of --profit-threshold: ProFit's fixed threshold on p_it


# ---------------------------------------------------------------------------------------
# 1. The objectives, the keep mask k_it and the loss
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Objective:
    """One row of docs/method.md "Objectives": an objective's three choices in the one loss all of them
    share (objective_loss)."""

    mask: Literal["all", "profit", "cuset"]  # k_it: every response token, ProFit's or CuSeT's (keep_mask)
    weighted: bool  # w_i: stage 02's sample weight, else 1
    scaled_by_p: bool  # f_it: p_it (Dynamic Fine-Tuning), else 1

    @property
    def uses_regions(self) -> bool:
        """Whether it needs stage 02's artifact: the region mask r_it (cuset mask) or the weights w_i."""
        return self.mask == "cuset" or self.weighted


OBJECTIVES = {
    "sft": Objective(mask="all", weighted=False, scaled_by_p=False),
    "dft": Objective(mask="all", weighted=False, scaled_by_p=True),
    "profit": Objective(mask="profit", weighted=False, scaled_by_p=False),
    "cuset": Objective(mask="cuset", weighted=True, scaled_by_p=False),
    "cuset-mask": Objective(mask="cuset", weighted=False, scaled_by_p=False),  # ablation: the mask alone
    "cuset-weight": Objective(mask="all", weighted=True, scaled_by_p=False),  # ablation: the weights alone
}
REGION_OBJECTIVES = tuple(name for name, objective in OBJECTIVES.items() if objective.uses_regions)


def mask_probability(mask_source: str, batch: dict) -> torch.Tensor | None:
    """The probability kappa_i and k_it are computed from (--mask-source): the stage-01 profile's p0 [B, L]
    for "profile"; None for "online", which objective_loss reads as the current model's p_it."""
    return batch["p0"] if mask_source == "profile" else None


def keep_mask(
    objective: str, p, valid, r, *, rho: float, tau_max: float, profit_threshold: float
) -> torch.Tensor:
    """k_it [B, L] bool of p [B, L], valid [B, L] and r [B, L]: which response tokens count in the loss, the
    objective's mask in OBJECTIVES.

    "cuset" keeps a token the model is confident in (p_it >= kappa_i, sample_threshold: exploited) and a
    low-confidence one only in a CUDA-sensitive region (r_it: preserved); "profit" keeps
    p_it >= profit_threshold; "all" keeps every response token (docs/method.md "Objectives").
    """
    mask = OBJECTIVES[objective].mask
    if mask == "cuset":
        kappa = sample_threshold(p, valid, rho, tau_max)  # [B]
        return valid & ((p >= kappa[:, None]) | r)
    if mask == "profit":
        return valid & (p >= profit_threshold)
    return valid


def loss_terms(log_q, valid, r, w, objective: str, p_mask=None, **knobs) -> dict:
    """The factors of each token's term in the loss (docs/method.md "Objectives"), by the objective's row of
    OBJECTIVES:
    l [B, L] (with grad), p [B, L] (p_it, detached: it selects and scales, never differentiated), p_mask
    [B, L] (what k_it and kappa_i are computed from: mask_probability, None meaning p), k [B, L] bool, w [B]
    (w_i, or 1), f [B, L] (p_it for dft, else the number 1). knobs: keep_mask's, by default --help's."""
    spec = OBJECTIVES[objective]
    p = log_q.detach().exp()
    p_mask = p if p_mask is None else p_mask
    knobs = dict(rho=RHO, tau_max=TAU_MAX, profit_threshold=PROFIT_THRESHOLD) | knobs
    return {
        "l": -log_q,
        "p": p,
        "p_mask": p_mask,
        "k": keep_mask(objective, p_mask, valid, r, **knobs),
        "w": w if spec.weighted else torch.ones_like(w),
        "f": p if spec.scaled_by_p else 1.0,
    }


def objective_loss(log_q, valid, r, w, N: float, objective: str, **knobs) -> tuple[torch.Tensor, dict]:
    """The loss of one micro-batch, already divided by the global normaliser N: the one loss of docs/method.md
    "Objectives", the product of loss_terms' factors summed (knobs: its p_mask and keep_mask's).

    log_q [B, L] log q(y_it) (with grad); valid [B, L] bool response tokens; r [B, L] bool r_it; w [B] w_i;
    N the global batch's response tokens (counted by the caller). Returns (loss, stats) with stats as sums,
    so that they add up over micro-batches.
    """
    t = loss_terms(log_q, valid, r, w, objective, **knobs)
    loss = (t["w"][:, None].float() * t["f"] * t["k"].float() * t["l"]).sum() / N
    stats = {
        "tokens": valid.sum().item(),
        "kept": t["k"].sum().item(),
        "region": (r & valid).sum().item(),
        "weight_sum": (t["w"][:, None] * valid).sum().item(),
        "nll_sum": (t["l"] * valid).sum().item(),
    }
    return loss, stats


# ---------------------------------------------------------------------------------------
# 2. The samples, aligned with the regions
# ---------------------------------------------------------------------------------------
# Tokenized as stages 01 and 02 tokenized them, sample i takes r_it and w_i (with --mask-source profile
# p0_it) from the artifacts' slice i, refused where the token counts differ (cuset_common/training/
# samples.py). collate pads them: response token j (position start + j) is scored at position start + j - 1.


# ---------------------------------------------------------------------------------------
# 3. log q(gold) at the response positions: the model body, then the output layer in chunks
# ---------------------------------------------------------------------------------------


class GoldLogProbs(torch.nn.Module):
    """Model body + chunked output layer -> log q(next token) [B, L-1], 0 off `valid`. DDP wraps this module.

    Only the response positions reach the output layer (prompt and padding are most positions, and the
    head is most of the cost with a 150k vocabulary): gathered to [rows, d], scored, scattered back.
    """

    def __init__(self, model, chunk: int):
        super().__init__()
        self.model, self.chunk = model, chunk

    def forward(self, ids: torch.Tensor, attn: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        hidden = self.model.base_model(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, L, d]
        weight, bias = output_head(self.model)
        log_q = gold_logprobs(hidden[:, :-1][valid], weight, ids[:, 1:][valid], self.chunk, bias)  # [rows]
        return torch.zeros(valid.shape, dtype=log_q.dtype, device=log_q.device).masked_scatter(valid, log_q)


# ---------------------------------------------------------------------------------------
# 4. The schedule: each step's global batch and learning rate, its log line, the resume state
# ---------------------------------------------------------------------------------------


def train(t: Training, samples: list[dict], step: int, log_lines: list[str]) -> int:
    """The loop from `step` to the last step (or --stop-after steps): the step's global batch (batch_order: a
    seeded shuffle per epoch) and learning rate (lr_at: warmup, then cosine), the step, its log row (t.log:
    log.jsonl, the progress line with MFU, --report-to's trackers), and the resume state every --save-every
    steps and at the end. Returns the step reached; log_lines grows by one
    line per step (on rank 0). A loss, gradient or weight that is not finite stops the run
    (cuset_common/training/divergence.py: what is checked when); no resume state holds one."""
    args, procs, rank = t.args, t.procs, t.procs.rank
    steps_per_epoch, total, warmup = schedule(args, len(samples))
    steps_run = 0
    resume_step = step if args.resume else None  # the step of the resume state --out holds
    while step < total and (args.stop_after is None or steps_run < args.stop_after):
        epoch, k = divmod(step, steps_per_epoch)
        batch = [samples[j] for j in batch_order(len(samples), args.batch_size, epoch, args.seed)[k]]
        for group in t.optimizer.param_groups:
            group["lr"] = lr_at(step, total, warmup, args.lr, args.min_lr_ratio)
        t.log.start()
        stats = optimizer_step(t, batch)
        step, steps_run = step + 1, steps_run + 1
        if rank == 0:  # the step's row: its sums, lr, and (T, R) per sample for its model FLOPs
            lengths = [(len(s["input_ids"]), len(s["input_ids"]) - s["start"]) for s in batch]
            log_lines.append(t.log(step, stats, t.optimizer.param_groups[0]["lr"], lengths))
        stopping = args.stop_after is not None and steps_run >= args.stop_after
        saving = step % args.save_every == 0 or step == total or stopping
        # the weights are checked before a resume state keeps them (the final checkpoint: the last step's)
        if what := nonfinite_step(stats) or (
            saving and nonfinite_weights(t.model, procs.world, procs.device)
        ):
            stop_diverged(args, rank, procs.checkpoint_wait, what, step, total, log_lines, resume_step)
        if saving:
            save_resume(args.out, args, t.model, t.optimizer, step, log_lines, rank)
            wait_for_checkpoint(procs.checkpoint_wait)
            resume_step = step
    return step


# ---------------------------------------------------------------------------------------
# 5. One optimizer step: its micro-batches, N, the loss, the update
# ---------------------------------------------------------------------------------------


def mask_knobs(args) -> dict:
    """keep_mask's knobs from the run's arguments."""
    return dict(rho=args.rho, tau_max=args.tau_max, profit_threshold=args.profit_threshold)


def micro_batch_loss(args, mb: dict, log_q: torch.Tensor, N: float) -> tuple[torch.Tensor, dict]:
    """objective_loss of a collated micro-batch under the run's objective, mask source and knobs."""
    p_mask = mask_probability(args.mask_source, mb)
    return objective_loss(
        log_q, mb["valid"], mb["r"], mb["w"], N, args.objective, p_mask=p_mask, **mask_knobs(args)
    )


@torch.no_grad()
def count_kept(t: Training, micro: list[dict]) -> float:
    """--norm kept: N = kept tokens of the global batch, from a no-grad pass with the same weights."""
    kept = 0
    for mb in micro:
        with t.procs.autocast():
            log_q = t.net(mb["ids"], mb["attn"], mb["valid"])
        kept += micro_batch_loss(t.args, mb, log_q, 1.0)[1]["kept"]  # its stats only: N is not known yet
    return float(all_reduce_stats({"kept": kept}, t.procs.world, t.procs.device)["kept"])


def optimizer_step(t: Training, batch: list[dict]) -> dict:
    """One step on a global batch: this process's micro-batches, each loss divided by the global N and
    backpropagated (gradients add up), then clipping and the update. Returns the step's sums over all
    processes (objective_loss's stats, the loss, and the gradient norm)."""
    args, size, world = t.args, t.args.micro_batch_size, t.procs.world
    # this process's share of the global batch, shortest first: micro-batches of similar lengths carry less
    # padding, and their gradients add up to the same sum however the share is grouped
    mine = sorted(batch[t.procs.rank :: world], key=lambda s: len(s["input_ids"]))
    micro = [collate(mine[i : i + size], t.pad_id, t.procs.device) for i in range(0, len(mine), size)]
    # N: the response tokens of the whole global batch, counted before masking (docs/method.md "Objectives");
    # with --norm kept, the kept ones
    n_all = float(sum(len(s["input_ids"]) - s["start"] for s in batch))
    N = n_all if args.norm == "all" else count_kept(t, micro)
    stats = {"tokens": 0, "kept": 0, "region": 0, "weight_sum": 0.0, "nll_sum": 0.0, "loss": 0.0}
    for k, mb in enumerate(micro):
        last = k == len(micro) - 1
        fsdp_micro_batch(t.net, last, args)
        # DDP: gradients add up locally until the last micro-batch, whose backward all-reduces their sum
        ctx = t.net.no_sync() if (world > 1 and not last and not args.fsdp) else torch.enable_grad()
        with ctx:
            with t.procs.autocast():
                log_q = t.net(mb["ids"], mb["attn"], mb["valid"])  # [b, L-1]
            loss, s = micro_batch_loss(args, mb, log_q, max(N, 1.0))
            # DDP and FSDP average gradients over processes; our loss is already a global sum / N.
            (loss * world).backward()
        s["loss"] = loss.item()
        for key in stats:
            stats[key] += s[key]
    stats = all_reduce_stats(stats, world, t.procs.device)
    # the global gradient norm, clipped to --grad-clip; a step whose loss or gradient is not finite leaves
    # the weights as they are, and train stops the run (cuset_common/training/divergence.py)
    stats["grad_norm"] = grad_norm(t.model, args.grad_clip)
    if nonfinite_step(stats) is None:
        t.optimizer.step()
    t.optimizer.zero_grad(set_to_none=True)
    return stats


# ---------------------------------------------------------------------------------------
# 6. The worked trace, the command line and main
# ---------------------------------------------------------------------------------------


@torch.no_grad()
def trace_terms(model, mb: dict, args) -> dict:
    """The worked trace of one collated sample at `model` (cuset_common/training/trace.py prints it), from the
    functions a step calls: per objective its loss_terms and its objective_loss with N = n_i (the sample as a
    batch of its own)."""
    log_q = GoldLogProbs(model, args.chunk_rows)(mb["ids"], mb["attn"], mb["valid"])
    n, p_mask = float(mb["valid"].sum()), mask_probability(args.mask_source, mb)
    terms, inputs = {}, (log_q, mb["valid"], mb["r"], mb["w"])
    for name in OBJECTIVES:
        terms[name] = loss_terms(*inputs, name, p_mask=p_mask, **mask_knobs(args))
        terms[name]["loss"] = objective_loss(*inputs, n, name, p_mask=p_mask, **mask_knobs(args))[0]
    return terms


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (cuset_common/training/options.py), with this stage's objectives and --help."""
    return parse_train_args(argv, __doc__, OBJECTIVES, PROFIT_THRESHOLD)


@finishes_out
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.trace is not None:  # one sample's worked trace at --model: printed, nothing trained or written
        return print_trace(args, trace_terms)
    procs = start_processes(args)  # one process or torchrun's; the device, the precision
    reads_regions = regions_needed(args, OBJECTIVES)

    # The inputs, each checked before any work; --out locked for this run.
    if args.resume:
        check_resume(args, RESUME_MAY_CHANGE)
    records, data_id = load_data(args)
    check_train_out(args, args.regions if reads_regions else None)
    inputs = load_samples(args, records, data_id, reads_regions)  # 2. aligned with the regions
    model = load_checked_model(args, procs, inputs.samples[0])  # finite weights, a plain head
    check_room(args.out, checkpoint_room(model, args.optimizer, args.out if args.resume else None))
    if procs.rank == 0:  # --force: the previous run is put back if this one fails (finishes_out)
        open_out(args.out, start_over=not args.resume)

    # 3. under the chunked head, on the processes; its optimizer; where the run stands (resumed: step, log)
    net, plan = place_model(GoldLogProbs(model, args.chunk_rows), args, procs, inputs.max_length)
    optimizer = make_optimizer(model, args)
    step, log_lines = load_resume(args, model, optimizer, procs.rank) if args.resume else (0, [])
    total = schedule(args, len(inputs.samples))[1]
    if procs.rank == 0:
        print_start(args, inputs, procs, total, step, plan)  # the run in one line, the memory plan
    reset_peak_memory(procs.device)  # meta.json's measured peak is training's, not loading's
    log = open_step_log(args, procs, model, inputs, total, step)  # MFU; the trackers (--report-to)
    run = Training(args, procs, inputs.tokenizer.pad_token_id, model, net, optimizer, log)
    step = train(run, inputs.samples, step, log_lines)  # 4. and 5.

    if step >= total:
        memory = memory_record(plan, procs.device)
        uses = OBJECTIVES[args.objective].uses_regions
        meta = checkpoint_meta(args, inputs, step, procs.precision, memory, uses) if procs.rank == 0 else None
        save_final(args, model, inputs.tokenizer, meta, procs.rank)
    finish_run(run, log_lines, step, total)  # log.jsonl, curves.png; the processes end together
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, interrupted=INTERRUPTED))
