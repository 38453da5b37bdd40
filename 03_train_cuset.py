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

The file follows the data: 1. the keep mask and the loss; 2. the samples aligned with the regions;
3. log q(gold) at the response positions; 4. the schedule; 5. one optimizer step and its log line;
6. the command line and main. Beside it: cuset_common/training/scale.py (processes, FSDP2, the memory
plan, printed before the first step) and cuset_common/training/checkpoint.py (the resume state, the final
checkpoint).

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
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist

from cuset_common.artifacts import args_to_json, check_meta_matches, read_artifact, tokenizer_fingerprint
from cuset_common.cli import ArgumentParser, UserError, check_ranges, run_main
from cuset_common.data import encode_sample, right_pad
from cuset_common.data_sources import add_data_arguments, data_checks, load_data
from cuset_common.device import resolve_precision
from cuset_common.files import sha256_file, write_text_atomic
from cuset_common.method import RHO, TAU_MAX, gold_logprobs, sample_threshold
from cuset_common.models import check_head_is_plain, load_tokenizer, output_head
from cuset_common.out_dir import check_room, check_train_out, finishes_out, open_out
from cuset_common.paths import DATA, TINY_MODEL
from cuset_common.training.checkpoint import (
    check_resume,
    checkpoint_room,
    load_resume,
    save_final,
    save_resume,
    stop_diverged,
)
from cuset_common.training.divergence import (
    grad_norm,
    json_row,
    nonfinite_step,
    nonfinite_weights,
    refuse_nonfinite_model,
)
from cuset_common.training.scale import (
    all_reduce_stats,
    checkpoint_wait_group,
    format_memory_plan,
    fsdp_mesh,
    fsdp_micro_batch,
    load_model,
    memory_plan,
    memory_record,
    reset_peak_memory,
    setup_distributed,
    shard_fsdp,
    wait_for_checkpoint,
)

STAGE = "03_train_cuset"
DEFAULT_REGIONS = DATA / "artifacts" / "regions"
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
    objective: str,
    p: torch.Tensor,
    valid: torch.Tensor,
    r: torch.Tensor,
    *,
    rho: float,
    tau_max: float,
    profit_threshold: float,
) -> torch.Tensor:
    """k_it [B, L] bool: which response tokens count in the loss, the objective's mask in OBJECTIVES.

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


def objective_loss(
    log_q: torch.Tensor,
    valid: torch.Tensor,
    r: torch.Tensor,
    w: torch.Tensor,
    N: float,
    objective: str,
    *,
    p_mask: torch.Tensor | None = None,
    rho: float = RHO,
    tau_max: float = TAU_MAX,
    profit_threshold: float = PROFIT_THRESHOLD,
) -> tuple[torch.Tensor, dict]:
    """The loss of one micro-batch, already divided by the global normaliser N: the objective's row of
    OBJECTIVES (its mask k_it, weight w_i and factor f_it) in the loss docs/method.md "Objectives" defines.

    log_q [B, L] log q(y_it) (with grad); valid [B, L] bool response tokens; r [B, L] bool r_it; w [B] w_i;
    N the global batch's response tokens (counted by the caller); p_mask [B, L], what the mask is
    computed from (mask_probability; None: the current model's p_it). Returns (loss, stats) with stats as
    sums, so that they add up over micro-batches.
    """
    spec = OBJECTIVES[objective]
    nll = -log_q  # l_it [B, L]
    p = log_q.detach().exp()  # p_it [B, L]: selects and scales, never differentiated
    k = keep_mask(
        objective,
        p if p_mask is None else p_mask,
        valid,
        r,
        rho=rho,
        tau_max=tau_max,
        profit_threshold=profit_threshold,
    )  # k_it [B, L]
    w = w if spec.weighted else torch.ones_like(w)  # [B]
    f = p if spec.scaled_by_p else 1.0  # f_it [B, L], or 1 for every token
    loss = (w[:, None].float() * f * k.float() * nll).sum() / N
    stats = {
        "tokens": valid.sum().item(),
        "kept": k.sum().item(),
        "region": (r & valid).sum().item(),
        "weight_sum": (w[:, None] * valid).sum().item(),
        "nll_sum": (nll * valid).sum().item(),
    }
    return loss, stats


# ---------------------------------------------------------------------------------------
# 2. The samples: tokenized as in stage 01, aligned with the regions artifact of stage 02
# ---------------------------------------------------------------------------------------


def uses_regions(args) -> bool:
    return args.objective in REGION_OBJECTIVES or args.mask_source == "profile"


def load_regions(args, tok_fp: str, data_id: dict) -> dict | None:
    """Region mask and weights per sample, checked against this run's tokenizer and data."""
    if not uses_regions(args):
        return None
    hint = "python 02_label_regions.py (after python 01_profile.py) with this --model and --data"
    if not (args.regions / "meta.json").exists():
        raise UserError(
            f"--objective {args.objective} needs the regions artifact of stage 02, not found at "
            f"{args.regions}; run {hint}, or pass --regions"
        )
    tensors, meta = read_artifact(
        args.regions,
        "02_label_regions",
        hint,
        token_tensors={"region_id": np.int32},
        sample_tensors={"w": np.float32},
    )
    expected = {"tokenizer_fingerprint": tok_fp, **data_checks(data_id)}
    found = {"tokenizer_fingerprint": meta.get("tokenizer_fingerprint"), **data_checks(meta.get("data"))}
    check_meta_matches(found, expected, args.regions, hint, args.force)
    out = {
        "meta": meta,
        "offsets": tensors["sample_offsets"],
        "r": tensors["region_id"] >= 0,  # r_it [T]
        "w": tensors["w"],  # w_i [S]
    }
    if args.mask_source == "profile":
        out["p0"] = load_profile_p0(args, meta, out["offsets"], expected)
    return out


def load_profile_p0(args, regions_meta: dict, offsets: np.ndarray, expected: dict) -> np.ndarray:
    """p0 of the stage-01 profile that stage 02 read (--mask-source profile), refused if it changed since.

    The regions artifact records the profile's absolute path and the sha256 of its meta.json: a profile
    rewritten since (stage 01 rerun on other data into the same folder) would otherwise silently mask other
    tokens than the regions were labelled on.
    """
    recorded = regions_meta["profile"]  # {path, meta_sha256}: read_artifact checked both are there
    prof_dir = Path(recorded["path"])
    hint = (
        f"python 01_profile.py --out {prof_dir}, then python 02_label_regions.py --profile {prof_dir} "
        f"--out {args.regions}, with this --model and --data"
    )
    prof, meta = read_artifact(prof_dir, "01_profile", hint, token_tensors={"p0": np.float32})
    if sha256_file(prof_dir / "meta.json") != recorded["meta_sha256"] and not args.force:
        raise UserError(
            f"{prof_dir} is not the profile {args.regions} was labelled on (its meta.json "
            f"sha256 differs from the one stage 02 recorded); rerun {hint}, or pass --force"
        )
    found = {"tokenizer_fingerprint": meta.get("tokenizer_fingerprint"), **data_checks(meta.get("data"))}
    check_meta_matches(found, expected, prof_dir, hint, args.force)
    # Not overridable by --force: with other offsets, p0 would be read for the wrong tokens.
    if not np.array_equal(prof["sample_offsets"], offsets):
        raise UserError(
            f"{prof_dir}: its samples and response tokens ({len(prof['sample_offsets']) - 1}, "
            f"{int(prof['sample_offsets'][-1])}) do not line up with {args.regions} "
            f"({len(offsets) - 1}, {int(offsets[-1])}); rerun {hint}"
        )
    return prof["p0"]


def tokenize_dataset(
    records: list[dict], tokenizer, max_length: int, regions: dict | None
) -> tuple[list[dict], int]:
    """encode_sample for every record (the same tokenization as stage 01), plus its region slice.

    Returns (samples, skipped): a sample whose prompt fills max_length has no response token and is
    skipped (counted), after its alignment with the regions artifact's offsets is checked.
    """
    samples, skipped = [], 0
    for i, rec in enumerate(records):
        enc = encode_sample(tokenizer, rec, max_length)
        n_resp = len(enc["input_ids"]) - enc["response_start"]
        s = {
            "input_ids": enc["input_ids"],
            "start": enc["response_start"],
            "w": 1.0,
            "r": np.zeros(n_resp, dtype=bool),
            "p0": None,
        }
        if regions is not None:
            lo, hi = int(regions["offsets"][i]), int(regions["offsets"][i + 1])
            if hi - lo != n_resp:
                raise UserError(
                    f"{rec.get('id')}: {n_resp} response tokens here but {hi - lo} in the regions "
                    "artifact; rerun stages 01 and 02 with the same --max-length and data"
                )
            s.update(
                r=regions["r"][lo:hi],
                w=float(regions["w"][i]),
                p0=regions["p0"][lo:hi] if "p0" in regions else None,
            )
        skipped += n_resp == 0
        samples += [s] if n_resp else []
    return samples, skipped


def collate(samples: list[dict], pad_id: int, device: str) -> dict:
    """Right-padded batch. Position t predicts token t+1, so targets are input_ids shifted."""
    ids, attn = right_pad([s["input_ids"] for s in samples], pad_id)  # [B, L] each
    b, length = ids.shape
    valid = torch.zeros((b, length - 1), dtype=torch.bool)  # over target positions
    r = torch.zeros((b, length - 1), dtype=torch.bool)
    p0 = torch.ones((b, length - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        n, start = len(s["input_ids"]), s["start"]
        # response token j sits at position start + j and is predicted from position start + j - 1
        lo, hi = start - 1, n - 1
        valid[i, lo:hi] = True
        r[i, lo:hi] = torch.from_numpy(np.asarray(s["r"], dtype=bool))
        if s["p0"] is not None:
            p0[i, lo:hi] = torch.from_numpy(np.asarray(s["p0"], dtype=np.float32))
    w = torch.tensor([s["w"] for s in samples], dtype=torch.float32)  # [B]
    batch = dict(ids=ids, attn=attn, valid=valid, r=r, p0=p0, w=w)
    return {k: v.to(device) for k, v in batch.items()}


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
# 4. The schedule: the learning rate and the order of the global batches
# ---------------------------------------------------------------------------------------


def lr_at(step: int, total: int, warmup: int, peak: float, min_ratio: float) -> float:
    """Linear warmup to `peak`, then cosine decay to peak * min_ratio at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def batch_order(n: int, batch: int, epoch: int, seed: int) -> list[list[int]]:
    """This epoch's global batches: a seeded shuffle, the last partial batch dropped."""
    g = torch.Generator().manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    return [perm[i : i + batch] for i in range(0, n - batch + 1, batch)]


def schedule(args, n_samples: int) -> tuple[int, int, int]:
    """(steps per epoch, total steps, warmup steps): --max-steps, else --epochs; warmup 5% by default."""
    steps_per_epoch = n_samples // args.batch_size
    total = args.max_steps or max(1, int(args.epochs * steps_per_epoch))
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, total // 20)
    return steps_per_epoch, total, warmup


# ---------------------------------------------------------------------------------------
# 5. One optimizer step, and its log line with the CuSeT diagnostics
# ---------------------------------------------------------------------------------------


@dataclass
class Training:
    """What every step uses: the arguments, where this process stands, and what it trains."""

    args: argparse.Namespace
    rank: int  # this process, of `world` (torchrun; 0 of 1 otherwise)
    world: int
    device: str
    pad_id: int
    model: torch.nn.Module  # the causal LM: the optimizer updates its parameters
    net: torch.nn.Module  # GoldLogProbs over it, wrapped by DDP or sharded by FSDP2
    optimizer: torch.optim.Optimizer
    autocast: torch.autocast  # bf16 autocast, or disabled (--precision)
    checkpoint_wait: object  # the group processes wait in while rank 0 writes (scale.py), None for one


def mask_knobs(args) -> dict:
    """keep_mask's knobs from the run's arguments."""
    return dict(rho=args.rho, tau_max=args.tau_max, profit_threshold=args.profit_threshold)


@torch.no_grad()
def count_kept(t: Training, micro: list[dict]) -> float:
    """--norm kept: N = kept tokens of the global batch, from a no-grad pass with the same weights."""
    kept = 0
    for mb in micro:
        with t.autocast:
            log_q = t.net(mb["ids"], mb["attn"], mb["valid"])
        kept += micro_batch_loss(t.args, mb, log_q, 1.0)[1]["kept"]  # its stats only: N is not known yet
    return float(all_reduce_stats({"kept": kept}, t.world, t.device)["kept"])


def micro_batch_loss(args, mb: dict, log_q: torch.Tensor, N: float) -> tuple[torch.Tensor, dict]:
    """objective_loss of a collated micro-batch under the run's objective, mask source and knobs."""
    return objective_loss(
        log_q,
        mb["valid"],
        mb["r"],
        mb["w"],
        N,
        args.objective,
        p_mask=mask_probability(args.mask_source, mb),
        **mask_knobs(args),
    )


def optimizer_step(t: Training, batch: list[dict]) -> dict:
    """One step on a global batch: this process's micro-batches, each loss divided by the global N and
    backpropagated (gradients add up), then clipping and the update. Returns the step's sums over all
    processes (objective_loss's stats, the loss, and the gradient norm)."""
    args, size = t.args, t.args.micro_batch_size
    # this process's share of the global batch, shortest first: micro-batches of similar lengths carry less
    # padding, and their gradients add up to the same sum however the share is grouped
    mine = sorted(batch[t.rank :: t.world], key=lambda s: len(s["input_ids"]))
    micro = [collate(mine[i : i + size], t.pad_id, t.device) for i in range(0, len(mine), size)]
    # N: the response tokens of the whole global batch, counted before masking (docs/method.md "Objectives");
    # with --norm kept, the kept ones
    N = (
        float(sum(len(s["input_ids"]) - s["start"] for s in batch))
        if args.norm == "all"
        else count_kept(t, micro)
    )
    stats = {"tokens": 0, "kept": 0, "region": 0, "weight_sum": 0.0, "nll_sum": 0.0, "loss": 0.0}
    for k, mb in enumerate(micro):
        last = k == len(micro) - 1
        fsdp_micro_batch(t.net, last, args)
        # DDP: gradients add up locally until the last micro-batch, whose backward all-reduces their sum
        ctx = t.net.no_sync() if (t.world > 1 and not last and not args.fsdp) else torch.enable_grad()
        with ctx:
            with t.autocast:
                log_q = t.net(mb["ids"], mb["attn"], mb["valid"])  # [b, L-1]
            loss, s = micro_batch_loss(args, mb, log_q, max(N, 1.0))
            # DDP and FSDP average gradients over processes; our loss is already a global sum / N.
            (loss * t.world).backward()
        s["loss"] = loss.item()
        for key in stats:
            stats[key] += s[key]
    stats = all_reduce_stats(stats, t.world, t.device)
    # the global gradient norm, clipped to --grad-clip; a step whose loss or gradient is not finite leaves
    # the weights as they are, and train stops the run (cuset_common/training/divergence.py)
    stats["grad_norm"] = grad_norm(t.model, args.grad_clip)
    if nonfinite_step(stats) is None:
        t.optimizer.step()
    t.optimizer.zero_grad(set_to_none=True)
    return stats


def log_step(
    step: int, total: int, stats: dict, optimizer, tokens_seen: float, t_start: float, steps_run: int
) -> str:
    """Print the step's progress line; return its log.jsonl row. Besides loss and nll (per response
    token), the CuSeT diagnostics: the share of response tokens the mask drops (1 - sum k / n), the share
    in regions (sum r / n) and the mean weight per token (sum w / n)."""
    elapsed = time.time() - t_start
    n = max(stats["tokens"], 1)
    row = {
        "step": step,
        "loss": round(stats["loss"], 6),
        "nll": round(stats["nll_sum"] / n, 6),
        "masked_share": round(1 - stats["kept"] / n, 4),
        "region_share": round(stats["region"] / n, 4),
        "weight_mean": round(stats["weight_sum"] / n, 4),
        "lr": optimizer.param_groups[0]["lr"],
        "tokens": int(stats["tokens"]),
    }
    eta = elapsed / steps_run * (total - step)
    print(
        f"step {step:>5}/{total} | loss {row['loss']:.4f} | nll {row['nll']:.4f} | "
        f"masked {row['masked_share']:.1%} | region {row['region_share']:.1%} | "
        f"w {row['weight_mean']:.3f} | lr {row['lr']:.2e} | {tokens_seen / elapsed:,.0f} tok/s | "
        f"ETA {eta:,.0f}s",
        flush=True,
    )
    return json_row(row)  # a diverged step's NaN as null: log.jsonl stays JSON


def train(t: Training, samples: list[dict], step: int, log_lines: list[str]) -> int:
    """The loop from `step` to the last step (or --stop-after steps): the learning rate of the step, the
    step, its log line, and the resume state every --save-every steps and at the end. Returns the step
    reached; log_lines grows by one line per step (on rank 0). A loss, gradient or weight that is not
    finite stops the run (cuset_common/training/divergence.py: what is checked when); no resume state holds
    one."""
    args = t.args
    steps_per_epoch, total, warmup = schedule(args, len(samples))
    t_start, tokens_seen, steps_run = time.time(), 0, 0
    resume_step = step if args.resume else None  # the step of the resume state --out holds
    while step < total and (args.stop_after is None or steps_run < args.stop_after):
        epoch, k = divmod(step, steps_per_epoch)
        batch = [samples[j] for j in batch_order(len(samples), args.batch_size, epoch, args.seed)[k]]
        for group in t.optimizer.param_groups:
            group["lr"] = lr_at(step, total, warmup, args.lr, args.min_lr_ratio)
        stats = optimizer_step(t, batch)
        step, steps_run = step + 1, steps_run + 1
        tokens_seen += stats["tokens"]
        if t.rank == 0:
            log_lines.append(log_step(step, total, stats, t.optimizer, tokens_seen, t_start, steps_run))
        stopping = args.stop_after is not None and steps_run >= args.stop_after
        saving = step % args.save_every == 0 or step == total or stopping
        # the weights are checked before a resume state keeps them (the final checkpoint: the last step's)
        if what := nonfinite_step(stats) or (saving and nonfinite_weights(t.model, t.world, t.device)):
            stop_diverged(args, t.rank, t.checkpoint_wait, what, step, total, log_lines, resume_step)
        if saving:
            save_resume(args.out, args, t.model, t.optimizer, step, log_lines, t.rank)
            wait_for_checkpoint(t.checkpoint_wait)
            resume_step = step
    return step


# ---------------------------------------------------------------------------------------
# 6. The command line, the run's setup and main
# ---------------------------------------------------------------------------------------

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
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_arguments(ap)
    add_schedule_arguments(ap)
    add_method_arguments(ap)
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = DATA / "artifacts" / f"ckpt-{args.objective}"
    check_ranges(ap, args, RANGES)
    if (args.param_dtype == "bf16" or args.fsdp_keep_gathered) and not args.fsdp:
        ap.error(
            "--param-dtype bf16 and --fsdp-keep-gathered need --fsdp (one GPU: torchrun --nproc_per_node 1)"
        )
    return args


def add_input_arguments(ap: ArgumentParser) -> None:
    """What is trained on what, and where it goes."""
    a = ap.add_argument
    a("--model", default=str(TINY_MODEL), help="hub id or local folder (default: the bundled tiny model)")
    add_data_arguments(ap, "SFT data to train on")
    a("--regions", type=Path, default=DEFAULT_REGIONS, help="stage-02 artifact (default: %(default)s)")
    a("--objective", choices=OBJECTIVES, default="cuset")
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


def add_method_arguments(ap: ArgumentParser) -> None:
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
        default=PROFIT_THRESHOLD,
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


# Arguments --resume may change: they do not change the trained weights. Where the run is and how it is
# checkpointed and stopped (out, resume, force, save_every, stop_after), and the memory knobs whose
# equivalence the tests check (micro_batch_size, chunk_rows, grad_checkpointing: the same sums, split
# otherwise), so that a run can resume on a smaller GPU. Everything else (objective, data, lr, schedule,
# max_length, seed, device and hence precision, ...) would make the resumed run another run.
# So are --fsdp and --fsdp-keep-gathered (the resume state is the gathered one whatever wrote it, and FSDP is
# tested equal to one process): a DDP run can move to FSDP. --param-dtype changes precision: not.
# From the state a diverged run left, --lr may change too (cuset_common/training/checkpoint.py, check_resume).
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
}


def resolve_max_length(args, regions: dict | None) -> int:
    """--max-length, else the regions artifact's (the masks line up only with the same), else 1024."""
    max_length = args.max_length or (regions["meta"]["max_length"] if regions else 1024)
    if regions and max_length != regions["meta"]["max_length"]:
        raise UserError(
            f"--max-length {max_length} differs from the regions artifact's "
            f"{regions['meta']['max_length']}; region masks would not line up"
        )
    return max_length


def resolve_micro_batch_size(args, device: str) -> int:
    """--micro-batch-size, else 1 on a CPU and 4 on a GPU. On a CPU one sample of a few hundred tokens
    already fills the core's matrix products, and the right padding of a larger micro-batch (and the
    masked attention it needs) costs more than batching gains; stage 01 chooses so too
    (docs/performance.md, "Micro-batches on a CPU"). Any size trains the same weights up to float
    rounding (tests/test_train.py)."""
    return args.micro_batch_size or (1 if torch.device(device).type == "cpu" else 4)


def check_enough_samples(args, n_samples: int, skipped: int) -> None:
    if n_samples < args.batch_size:
        raise UserError(
            f"{args.data}: {n_samples} samples with response tokens ({skipped} skipped: prompt fills "
            f"--max-length), fewer than --batch-size {args.batch_size}; "
            + ("raise --max-length" if skipped else "lower --batch-size")
        )


def check_model(model, first: torch.Tensor, name: str) -> None:
    """What stage 03 refuses of the model before it trains: weights that are not all finite (a checkpoint of
    a run that diverged), then logits that are not a plain head (read from the first sample)."""
    refuse_nonfinite_model(model, name)
    check_head_is_plain(model, first.to(model.device), "stage 03")


def place_model(
    model, args, world: int, device: str, max_length: int, precision: str
) -> tuple[torch.nn.Module, dict]:
    """(net, memory plan): the model in training mode under GoldLogProbs, on one process, under DDP, or
    sharded by FSDP2 over --device's processes (its parameters become DTensor shards: the optimizer, made
    after, sees only those)."""
    if args.grad_checkpointing:  # renamed in transformers 5; 4.x has only the old name
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.config.use_cache = False
    model.train()
    net = GoldLogProbs(model, args.chunk_rows)
    plan = memory_plan(model, args, world, device, max_length, precision)
    if args.fsdp:
        shard_fsdp(net, args, fsdp_mesh(device, world))
    elif world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device] if device.startswith("cuda") else None
        )
    return net, plan


def checkpoint_meta(
    args, step: int, tok_fp: str, data_id: dict, max_length: int, precision: str, memory: dict
) -> dict:
    """The final checkpoint's meta.json fields: what was trained, from what inputs, how far, and the memory
    planned beside the peak measured on a GPU (memory_record)."""
    regions_file = args.regions / "tensors.safetensors"
    trained_on_regions = regions_file.exists() and args.objective in REGION_OBJECTIVES
    return {
        "stage": STAGE,
        "objective": args.objective,
        "args": args_to_json(args),
        "model": args.model,
        "tokenizer_fingerprint": tok_fp,
        "data": data_id,
        "regions": {
            "path": str(args.regions),
            "sha256": sha256_file(regions_file) if trained_on_regions else None,
        },
        "max_length": max_length,
        "precision": precision,  # --precision resolved on this device: fp32 or bf16
        "final_step": step,
        "memory": memory,
    }


@finishes_out
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = setup_distributed(args.device, args.fsdp)
    checkpoint_wait = checkpoint_wait_group(world)
    precision = resolve_precision(args.precision, device)
    args.micro_batch_size = resolve_micro_batch_size(args, device)
    if args.batch_size % (world * args.micro_batch_size):
        raise UserError(
            f"--batch-size {args.batch_size} must be a multiple of processes x "
            f"--micro-batch-size ({world} x {args.micro_batch_size})"
        )
    torch.manual_seed(args.seed)

    # The inputs, each checked before any work.
    if args.resume:
        check_resume(args, RESUME_MAY_CHANGE)
    records, data_id = load_data(args)
    check_train_out(args, args.regions if uses_regions(args) else None)
    tokenizer = load_tokenizer(args.model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tok_fp = tokenizer_fingerprint(tokenizer)
    regions = load_regions(args, tok_fp, data_id)
    max_length = resolve_max_length(args, regions)
    samples, skipped = tokenize_dataset(records, tokenizer, max_length, regions)
    check_enough_samples(args, len(samples), skipped)
    first = torch.tensor([samples[0]["input_ids"]])  # what the head check reads
    # under --fsdp rank 0 alone loads and checks it, on the host (cuset_common/training/scale.py)
    model = load_model(args, rank, device, lambda m: check_model(m, first, args.model), checkpoint_wait)
    check_room(args.out, checkpoint_room(model, args.optimizer, args.out if args.resume else None))
    if rank == 0:  # --force: the previous run is put back if this one fails (finishes_out)
        open_out(args.out, start_over=not args.resume)

    # The model on the processes, its optimizer, and where the run stands (a resumed run: its step and log).
    net, plan = place_model(model, args, world, device, max_length, precision)
    optimizer_class = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.SGD
    optimizer = optimizer_class(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    step, log_lines = load_resume(args, model, optimizer, rank) if args.resume else (0, [])
    total = schedule(args, len(samples))[1]
    if rank == 0:
        print(
            f"objective {args.objective} | {len(samples)} samples ({skipped} skipped: no response token "
            f"within max_length) | max_length {max_length} | {total} steps of {args.batch_size} samples "
            f"({world} process(es) x micro-batches of {args.micro_batch_size}) | device {device}, {precision}"
            + (f" | resumed at step {step}" if step else "")
        )
        print(format_memory_plan(plan, args, world), flush=True)
    reset_peak_memory(
        device
    )  # meta.json's measured peak is training's, not loading's (cuset_common/training/scale.py)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")
    run = Training(
        args, rank, world, device, tokenizer.pad_token_id, model, net, optimizer, autocast, checkpoint_wait
    )
    step = train(run, samples, step, log_lines)

    if step >= total:
        memory = memory_record(plan, device)
        meta = (
            checkpoint_meta(args, step, tok_fp, data_id, max_length, precision, memory) if rank == 0 else None
        )
        save_final(args, model, tokenizer, meta, rank)
    if rank == 0:
        write_text_atomic(args.out / "log.jsonl", "".join(log_lines))
        print(f"{'done' if step >= total else 'stopped'} at step {step}/{total}; {args.out}")
    # every process waits for rank 0's writing: one that tears its process group down while another still
    # uses it can be aborted by gloo ("terminate called without an active exception"; docs/notebook.md)
    wait_for_checkpoint(checkpoint_wait)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(
        run_main(
            main,
            interrupted=(
                "the run is kept in --out as of its last checkpoint (every --save-every steps), and "
                "a run that --force replaced waits beside it until one finishes; rerun with --resume "
                "to go on (with --force if it stopped before its first checkpoint)"
            ),
        )
    )
