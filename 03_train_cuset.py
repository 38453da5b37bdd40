"""Stage 03: supervised fine-tuning with the CuSeT loss and its baselines, in a plain PyTorch loop.

Inputs:  a causal LM (--model), SFT data (--data), and for the cuset objectives the regions
         artifact of stage 02 (--regions: region mask per response token, weight per sample;
         with --mask-source profile also the stage-01 profile it was labelled on).
Outputs: --out/ with the trained model (save_pretrained, safetensors) and tokenizer,
         meta.json (args, hashes of data and regions, versions, final step), log.jsonl (one
         line per step), and resume/ (model, optimizer, step, args; gathered under --fsdp) for --resume.
Refused before any work (exit 2, one line): artifacts from other data or tokenizer, a profile
rewritten since stage 02 read it, a model whose logits are not h @ W.T + b (scaled or soft-capped),
--resume with other arguments than the run's, a number out of its range, an --out that is not this
stage's run (README, Errors; --force starts over, keeping the previous run until the new one succeeds).
Samples whose prompt fills --max-length have no response token: they are skipped and counted.

    python 03_train_cuset.py                                   # tiny model, bundled data, cuset
    python 03_train_cuset.py --objective sft --out data/artifacts/ckpt-sft
    python 03_train_cuset.py --resume --out data/artifacts/ckpt-cuset      # continue a killed run
    python 03_train_cuset.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --data my_sft.jsonl \\
        --regions data/artifacts/regions-qwen --batch-size 64 --micro-batch-size 4 --lr 1e-5
    torchrun --nproc_per_node 4 03_train_cuset.py --model ... --regions ...    # DDP
    torchrun --nproc_per_node 8 03_train_cuset.py --fsdp --param-dtype bf16 --grad-checkpointing --model ...
                                              # FSDP2: state sharded over 8 GPUs (docs/scale.md)
A memory plan (bytes per process: weights, gradients, optimizer state, activations) is printed before
the first step.

Objectives (docs/method.md "Objectives"; our reconstruction of the paper's method), with
l = -log q(gold), p = exp(-l) detached, N = response tokens in the global batch before masking:
    sft           sum l / N
    dft           sum p l / N                              (Dynamic Fine-Tuning)
    profit        sum 1[p >= 0.1] l / N                    (ProFit, fixed threshold)
    cuset         sum_i w_i sum_t m_it l_it / N,  m_it = 1[p_it >= kappa_i] or r_it
    cuset-mask    cuset with w = 1                         (ablation)
    cuset-weight  cuset with m = 1                         (ablation)
kappa_i = min(tau_max, quantile_rho(p_i)) per sample, from the current model at each step
(--mask-source online) or from the stage-01 profile (--mask-source profile).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from cuset_common import (DATA, RHO, TAU_MAX, TINY_MODEL, ArgumentParser, UserError,
                          all_reduce_stats, args_to_json, check_head_is_plain, check_meta_matches,
                          check_ranges, check_resume, check_room, check_train_out, checkpoint_room,
                          encode_sample, end_of_turn_ids, finishes_out, format_memory_plan, fsdp_micro_batch,
                          gold_logprobs, library_versions, load_causal_lm, load_resume,
                          load_tokenizer, log_step, memory_plan, open_out, output_head, read_artifact,
                          run_main, sample_threshold, save_resume, setup_distributed, sha256_file,
                          shard_fsdp, state_options, tokenizer_fingerprint, write_text_atomic)
from cuset_common.cli import resolve_precision
from cuset_common.data_sources import add_data_arguments, data_checks, load_data

OBJECTIVES = ("sft", "dft", "profit", "cuset", "cuset-mask", "cuset-weight")
REGION_OBJECTIVES = ("cuset", "cuset-mask", "cuset-weight")
DEFAULT_REGIONS = DATA / "artifacts" / "regions"
# Each numeric argument's allowed values (cuset_common.check_ranges).
RANGES = {"max_length": "[1, inf)", "epochs": "(0, inf)", "max_steps": "[1, inf)", "batch_size": "[1, inf)",
          "micro_batch_size": "[1, inf)", "lr": "(0, inf)", "min_lr_ratio": "[0, 1]",
          "warmup_steps": "[0, inf)", "weight_decay": "[0, inf)", "grad_clip": "[0, inf)", "rho": "[0, 1]",
          "tau_max": "(0, 1]", "profit_threshold": "[0, 1]", "chunk_size": "[1, inf)",
          "save_every": "[1, inf)", "stop_after": "[1, inf)", "seed": "[0, inf)"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = ap.add_argument
    a("--model", default=str(TINY_MODEL), help="hub id or local folder (default: the bundled tiny model)")
    add_data_arguments(ap, "SFT data to train on")
    a("--regions", type=Path, default=DEFAULT_REGIONS, help="stage-02 artifact (default: %(default)s)")
    a("--objective", choices=OBJECTIVES, default="cuset")
    a("--out", type=Path, default=None, help="output folder (default: data/artifacts/ckpt-<objective>)")
    a("--max-length", type=int, default=None,
      help="tokens per sample (default: the regions artifact's, else 1024)")
    a("--epochs", type=float, default=1.0, help="passes over the data (default: %(default)s)")
    a("--max-steps", type=int, default=None, help="optimizer steps; overrides --epochs")
    a("--batch-size", type=int, default=8, help="global batch in samples per optimizer step")
    a("--micro-batch-size", type=int, default=4, help="samples per forward pass on one process")
    a("--optimizer", choices=("adamw", "sgd"), default="adamw", help="sgd: plain SGD, for equivalence tests")
    a("--lr", type=float, default=3e-4, help="peak learning rate (default: %(default)s)")
    a("--min-lr-ratio", type=float, default=0.1, help="cosine decays to lr * this")
    a("--warmup-steps", type=int, default=None, help="linear warmup (default: 5%% of steps, at least 1)")
    a("--weight-decay", type=float, default=0.0)
    a("--grad-clip", type=float, default=1.0, help="max global grad norm; 0 disables")
    a("--rho", type=float, default=RHO, help="quantile of p defining kappa_i (docs/method.md)")
    a("--tau-max", type=float, default=TAU_MAX, help="upper bound of kappa_i (docs/method.md)")
    a("--mask-source", choices=("online", "profile"), default="online",
      help="p for kappa and the mask: the current model's, or the stage-01 profile's (p0) the regions used")
    a("--norm", choices=("all", "kept"), default="all",
      help="N counts all response tokens or only kept ones")
    a("--profit-threshold", type=float, default=0.1, help="ProFit's fixed p threshold")
    a("--chunk-size", type=int, default=1024, help="positions per lm_head chunk (memory ~ chunk x vocab)")
    a("--grad-checkpointing", action="store_true", help="recompute activations in backward")
    a("--fsdp", action="store_true",
      help="under torchrun: shard weights, gradients and optimizer state (FSDP2)")
    a("--param-dtype", choices=("fp32", "bf16"), default="fp32",
      help="weights as gathered for compute under --fsdp; bf16 keeps fp32 shards (master) and fp32 "
           "optimizer state")
    a("--fsdp-keep-gathered", action="store_true",
      help="--fsdp: no all-gather or reduce-scatter between a step's micro-batches, for full weights "
           "and grads")
    a("--save-every", type=int, default=50, help="steps between resume checkpoints")
    a("--stop-after", type=int, default=None,
      help="stop after this many steps in this invocation (time slices)")
    a("--resume", action="store_true", help="continue from --out/resume")
    a("--force", action="store_true", help="start over in --out (its previous content is deleted only "
                                            "once the new run succeeds); accept regions/profile artifacts "
                                            "from other inputs")
    a("--seed", type=int, default=0)
    a("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    a("--precision", choices=("auto", "fp32", "bf16"), default="auto",
      help="bf16: forward under bf16 autocast (float32 weights, gradients, optimizer state and log-probs); "
           "auto: bf16 where the device computes it natively (a GPU, or a CPU with AVX512-BF16 or AMX), "
           "else fp32")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = DATA / "artifacts" / f"ckpt-{args.objective}"
    check_ranges(ap, args, RANGES)
    if (args.param_dtype == "bf16" or args.fsdp_keep_gathered) and not args.fsdp:
        ap.error("--param-dtype bf16 and --fsdp-keep-gathered need --fsdp (one GPU: torchrun "
                 "--nproc_per_node 1)")
    return args


# ---------------------------------------------------------------------------------------
# The method: the token mask and the loss (log q(gold) in chunks: cuset_common.gold_logprobs).
# ---------------------------------------------------------------------------------------


def keep_mask(objective: str, p: torch.Tensor, valid: torch.Tensor, region: torch.Tensor, *, rho: float,
              tau_max: float, profit_threshold: float) -> torch.Tensor:
    """Which response tokens contribute to the loss, [B, L] bool (before weighting).

    cuset / cuset-mask: m_it = 1[p_it >= kappa_i] or r_it -- confident tokens are kept
    (leveraged), low-confidence tokens are dropped unless they lie in a CUDA-sensitive
    region (preserved). profit: 1[p >= threshold]. Others keep every response token.
    """
    if objective in ("cuset", "cuset-mask"):
        kappa = sample_threshold(p, valid, rho, tau_max)  # [B]
        return valid & ((p >= kappa[:, None]) | region)
    if objective == "profit":
        return valid & (p >= profit_threshold)
    return valid


def objective_loss(logp: torch.Tensor, valid: torch.Tensor, region: torch.Tensor, weight: torch.Tensor,
                   n_tokens: float, objective: str, *, p_mask: torch.Tensor | None = None, rho: float = RHO,
                   tau_max: float = TAU_MAX, profit_threshold: float = 0.1) -> tuple[torch.Tensor, dict]:
    """The loss of one micro-batch, already divided by the global normaliser N.

    logp   [B, L] log q(gold) (with grad); valid [B, L] bool response tokens;
    region [B, L] bool r_it; weight [B] w_i; n_tokens N (global batch, counted by the caller);
    p_mask [B, L] probabilities the mask is computed from (default exp(logp), detached:
    the online, adaptive threshold). Formulas in the module docstring (docs/method.md "Objectives").
    Returns (loss, stats) with stats as sums, so that they add up over micro-batches.
    """
    nll = -logp
    p = logp.detach().exp()
    p_mask = p if p_mask is None else p_mask
    keep = keep_mask(objective, p_mask, valid, region, rho=rho, tau_max=tau_max,
                     profit_threshold=profit_threshold)
    w = weight if objective in ("cuset", "cuset-weight") else torch.ones_like(weight)
    coef = keep.float() * w[:, None].float()  # [B, L]
    if objective == "dft":
        coef = coef * p
    loss = (coef * nll).sum() / n_tokens
    stats = {"tokens": valid.sum().item(), "kept": keep.sum().item(),
             "region": (region & valid).sum().item(), "weight_sum": (w[:, None] * valid).sum().item(),
             "nll_sum": (nll * valid).sum().item()}
    return loss, stats


# ---------------------------------------------------------------------------------------
# Data: tokenized samples aligned with the regions artifact.
# ---------------------------------------------------------------------------------------


def uses_regions(args) -> bool:
    return args.objective in REGION_OBJECTIVES or args.mask_source == "profile"


def load_regions(args, tok_fp: str, data_id: dict) -> dict | None:
    """Region mask and weights per sample, checked against this run's tokenizer and data."""
    if not uses_regions(args):
        return None
    hint = "python 02_label_regions.py (after python 01_profile.py) with this --model and --data"
    if not (args.regions / "meta.json").exists():
        raise UserError(f"--objective {args.objective} needs the regions artifact of stage 02, not found at "
                        f"{args.regions}; run {hint}, or pass --regions")
    tensors, meta = read_artifact(args.regions, "02_label_regions", hint,
                                  token_tensors={"region_id": np.int32},
                                  sample_tensors={"sample_weight": np.float32})
    expected = {"tokenizer_fingerprint": tok_fp, **data_checks(data_id)}
    check_meta_matches({"tokenizer_fingerprint": meta.get("tokenizer_fingerprint"),
                        **data_checks(meta.get("data"))},
                       expected, args.regions, hint, args.force)
    out = {"meta": meta, "offsets": tensors["sample_offsets"], "region": tensors["region_id"] >= 0,
           "weight": tensors["sample_weight"]}
    if args.mask_source == "profile":
        out["p0"] = load_profile_confidence(args, meta, out["offsets"], expected)
    return out


def load_profile_confidence(args, regions_meta: dict, offsets: np.ndarray, expected: dict) -> np.ndarray:
    """p0 of the stage-01 profile that stage 02 read (--mask-source profile), refused if it changed since.

    The regions artifact records the profile's path as typed (relative to the folder stage 02 ran in, or
    absolute) and the sha256 of its meta.json: a profile rewritten since (stage 01 rerun on other data into
    the same folder) would otherwise silently mask other tokens than the regions were labelled on.
    """
    rec = regions_meta.get("profile") or {}
    prof_dir = Path(rec.get("path", ""))
    hint = f"python 01_profile.py --out {prof_dir}, then python 02_label_regions.py --profile {prof_dir} " \
           f"--out {args.regions}, with this --model and --data"
    if not (prof_dir / "meta.json").exists() and not prof_dir.is_absolute():
        raise UserError(f"{args.regions} was labelled on the profile {prof_dir}, relative to the folder "
                        f"stage 02 ran in; not found from here ({Path.cwd()}): run from that folder, or "
                        f"rerun {hint}")
    prof, meta = read_artifact(prof_dir, "01_profile", hint, token_tensors={"confidence": np.float32})
    if sha256_file(prof_dir / "meta.json") != rec.get("meta_sha256") and not args.force:
        raise UserError(f"{prof_dir} is not the profile {args.regions} was labelled on (its meta.json "
                        f"sha256 differs from the one stage 02 recorded); rerun {hint}, or pass --force")
    check_meta_matches({"tokenizer_fingerprint": meta.get("tokenizer_fingerprint"),
                        **data_checks(meta.get("data"))},
                       expected, prof_dir, hint, args.force)
    # Not overridable by --force: with other offsets, p0 would be read for the wrong tokens.
    if not np.array_equal(prof["sample_offsets"], offsets):
        raise UserError(f"{prof_dir}: its samples and response tokens ({len(prof['sample_offsets']) - 1}, "
                        f"{int(prof['sample_offsets'][-1])}) do not line up with {args.regions} "
                        f"({len(offsets) - 1}, {int(offsets[-1])}); rerun {hint}")
    return prof["confidence"]


def tokenize_dataset(records: list[dict], tokenizer, max_length: int,
                     regions: dict | None) -> tuple[list[dict], int]:
    """encode_sample for every record (the same tokenization as stage 01), plus its region slice.

    Returns (samples, skipped): a sample whose prompt fills max_length has no response token and is
    skipped (counted), after its alignment with the regions artifact's offsets is checked.
    """
    samples, skipped = [], 0
    for i, rec in enumerate(records):
        enc = encode_sample(tokenizer, rec, max_length)
        n_resp = len(enc["input_ids"]) - enc["response_start"]
        s = {"input_ids": enc["input_ids"], "start": enc["response_start"], "weight": 1.0,
             "region": np.zeros(n_resp, dtype=bool), "p0": None}
        if regions is not None:
            lo, hi = int(regions["offsets"][i]), int(regions["offsets"][i + 1])
            if hi - lo != n_resp:
                raise UserError(f"{rec.get('id')}: {n_resp} response tokens here but {hi - lo} in the "
                                "regions artifact; rerun stages 01 and 02 with the same --max-length "
                                "and data")
            s.update(region=regions["region"][lo:hi], weight=float(regions["weight"][i]),
                     p0=regions["p0"][lo:hi] if "p0" in regions else None)
        skipped += n_resp == 0
        samples += [s] if n_resp else []
    return samples, skipped


def collate(samples: list[dict], pad_id: int, device: str) -> dict:
    """Right-padded batch. Position t predicts token t+1, so targets are input_ids shifted."""
    length = max(len(s["input_ids"]) for s in samples)
    b = len(samples)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    attn = torch.zeros((b, length), dtype=torch.long)
    valid = torch.zeros((b, length - 1), dtype=torch.bool)  # over target positions
    region = torch.zeros((b, length - 1), dtype=torch.bool)
    p0 = torch.ones((b, length - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        n, start = len(s["input_ids"]), s["start"]
        ids[i, :n] = torch.tensor(s["input_ids"])
        attn[i, :n] = 1
        # response token j sits at position start + j and is predicted from position start + j - 1
        lo, hi = start - 1, n - 1
        valid[i, lo:hi] = True
        region[i, lo:hi] = torch.from_numpy(np.asarray(s["region"], dtype=bool))
        if s["p0"] is not None:
            p0[i, lo:hi] = torch.from_numpy(np.asarray(s["p0"], dtype=np.float32))
    weight = torch.tensor([s["weight"] for s in samples], dtype=torch.float32)
    return {k: v.to(device) for k, v in dict(ids=ids, attn=attn, valid=valid, region=region, p0=p0,
                                             weight=weight).items()}


class GoldLogProbs(torch.nn.Module):
    """Model body + chunked output layer -> log q(next token) [B, L-1], 0 off `valid`. DDP wraps this module.

    Only the response positions reach the output layer (prompt and padding are most positions, and the
    head is most of the cost with a 150k vocabulary): gathered to [N, d], scored, scattered back.
    """

    def __init__(self, model, chunk: int):
        super().__init__()
        self.model, self.chunk = model, chunk

    def forward(self, ids: torch.Tensor, attn: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        hidden = self.model.base_model(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, L, d]
        weight, bias = output_head(self.model)
        logp = gold_logprobs(hidden[:, :-1][valid], weight, ids[:, 1:][valid], self.chunk, bias)  # [N]
        return torch.zeros(valid.shape, dtype=logp.dtype, device=logp.device).masked_scatter(valid, logp)


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
    return [perm[i:i + batch] for i in range(0, n - batch + 1, batch)]


# Arguments --resume may change: they do not change the trained weights. Where the run is and how it is
# checkpointed and stopped (out, resume, force, save_every, stop_after), and the memory knobs whose
# equivalence the tests check (micro_batch_size, chunk_size, grad_checkpointing: the same sums, split
# otherwise), so that a run can resume on a smaller GPU. Everything else (objective, data, lr, schedule,
# max_length, seed, device and hence precision, ...) would make the resumed run another run.
# So are --fsdp and --fsdp-keep-gathered (the resume state is the gathered one whatever wrote it, and FSDP is
# tested equal to one process): a DDP run can move to FSDP. --param-dtype changes precision: not.
RESUME_MAY_CHANGE = {"out", "resume", "force", "save_every", "stop_after", "micro_batch_size", "chunk_size",
                     "grad_checkpointing", "fsdp", "fsdp_keep_gathered"}


@torch.no_grad()
def count_kept(net, micro: list[dict], args, knobs: dict, autocast, world: int) -> float:
    """--norm kept: N = kept tokens of the global batch, from a no-grad pass with the same weights."""
    kept = 0
    for mb in micro:
        with autocast:
            logp = net(mb["ids"], mb["attn"], mb["valid"])
        p = mb["p0"] if args.mask_source == "profile" else logp.float().exp()
        kept += keep_mask(args.objective, p, mb["valid"], mb["region"], **knobs).sum().item()
    return float(all_reduce_stats({"kept": kept}, world)["kept"])


def save_final(args, model, tokenizer, step: int, tok_fp: str, data_id: dict, max_length: int,
               rank: int) -> None:
    """Model + tokenizer + meta.json, written to a temp folder and then moved into --out (by rank 0; under
    --fsdp every process takes part in gathering the weights)."""
    weights = get_model_state_dict(model, options=state_options(args)) if args.fsdp else None
    if rank != 0:
        return
    if weights is not None:  # gathered tensors share no storage: keep tied weights once, as on one GPU
        names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        weights = {k: v for k, v in weights.items() if k in names}
    tmp = args.out / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # generate() stops at the end of the assistant's turn, as trained (close_turn), not only at eos
    model.generation_config.eos_token_id = end_of_turn_ids(tokenizer)
    model.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
    tokenizer.save_pretrained(tmp)
    regions_file = args.regions / "tensors.safetensors"
    regions_sha = (sha256_file(regions_file) if regions_file.exists() and args.objective in REGION_OBJECTIVES
                   else None)
    meta = {"schema_version": 1, "stage": "03_train_cuset", "objective": args.objective,
            "args": args_to_json(args), "model": args.model, "tokenizer_fingerprint": tok_fp,
            "data": data_id,
            "regions": {"path": str(args.regions), "sha256": regions_sha}, "max_length": max_length,
            "final_step": step, "versions": library_versions()}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    from cuset_common.files import give_user_modes

    give_user_modes(tmp)  # safetensors writes model.safetensors 0600; others may read what the umask allows
    for f in tmp.iterdir():
        os.replace(f, args.out / f.name)
    tmp.rmdir()


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------


@finishes_out
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = setup_distributed(args.device, args.fsdp)
    precision = resolve_precision(args.precision, device)
    if args.batch_size % (world * args.micro_batch_size):
        raise UserError(f"--batch-size {args.batch_size} must be a multiple of processes x "
                        f"--micro-batch-size ({world} x {args.micro_batch_size})")
    torch.manual_seed(args.seed)

    # Load and validate inputs before any work.
    if args.resume:
        check_resume(args, RESUME_MAY_CHANGE)
    records, data_id = load_data(args)
    check_train_out(args, args.regions if uses_regions(args) else None)
    tokenizer = load_tokenizer(args.model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tok_fp = tokenizer_fingerprint(tokenizer)
    regions = load_regions(args, tok_fp, data_id)
    max_length = args.max_length or (regions["meta"]["max_length"] if regions else 1024)
    if regions and max_length != regions["meta"]["max_length"]:
        raise UserError(f"--max-length {max_length} differs from the regions artifact's "
                        f"{regions['meta']['max_length']}; region masks would not line up")
    samples, skipped = tokenize_dataset(records, tokenizer, max_length, regions)
    if len(samples) < args.batch_size:
        raise UserError(f"{args.data}: {len(samples)} samples with response tokens ({skipped} skipped: "
                        f"prompt fills --max-length), fewer than --batch-size {args.batch_size}; "
                        + ("raise --max-length" if skipped else "lower --batch-size"))
    model = load_causal_lm(args.model, torch.float32).to(device)
    check_head_is_plain(model, torch.tensor([samples[0]["input_ids"]], device=device), "stage 03")
    check_room(args.out, checkpoint_room(model, args.optimizer))
    if rank == 0:  # --force: the previous run is put back if this one fails (finishes_out)
        open_out(args.out, start_over=not args.resume)

    if args.grad_checkpointing:  # renamed in transformers 5; 4.x has only the old name
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.config.use_cache = False
    model.train()
    net = GoldLogProbs(model, args.chunk_size)
    plan = memory_plan(model, args, world, device, max_length)
    if args.fsdp:
        shard_fsdp(net, args)  # parameters become DTensor shards; the optimizer below sees only the shards
    elif world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device] if device.startswith("cuda") else None)
    opt_class = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.SGD
    optimizer = opt_class(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    steps_per_epoch = len(samples) // args.batch_size
    total = args.max_steps or max(1, int(args.epochs * steps_per_epoch))
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, total // 20)
    step, log_lines = load_resume(args, model, optimizer, rank) if args.resume else (0, [])
    if rank == 0:
        print(f"objective {args.objective} | {len(samples)} samples ({skipped} skipped: no response token "
              f"within max_length) | max_length {max_length} | {total} steps of "
              f"{args.batch_size} samples ({world} process(es) x micro-batches of {args.micro_batch_size}) "
              f"| device {device}, {precision}" + (f" | resumed at step {step}" if step else ""))
        print(format_memory_plan(plan, args, world), flush=True)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")
    knobs = dict(rho=args.rho, tau_max=args.tau_max, profit_threshold=args.profit_threshold)
    t_start, tokens_seen, steps_run = time.time(), 0, 0

    while step < total and (args.stop_after is None or steps_run < args.stop_after):
        batch_ids = batch_order(len(samples), args.batch_size, step // steps_per_epoch, args.seed)[
            step % steps_per_epoch]
        mine = batch_ids[rank::world]  # this process's share of the global batch
        micro = [collate([samples[j] for j in mine[i:i + args.micro_batch_size]],
                         tokenizer.pad_token_id, device)
                 for i in range(0, len(mine), args.micro_batch_size)]
        # N: response tokens of the whole global batch, before masking (docs/method.md "Objectives").
        n_all = sum(len(samples[j]["input_ids"]) - samples[j]["start"] for j in batch_ids)
        n_norm = float(n_all) if args.norm == "all" else count_kept(net, micro, args, knobs, autocast, world)
        for g in optimizer.param_groups:
            g["lr"] = lr_at(step, total, warmup, args.lr, args.min_lr_ratio)
        stats = {"tokens": 0, "kept": 0, "region": 0, "weight_sum": 0.0, "nll_sum": 0.0, "loss": 0.0}
        for k, mb in enumerate(micro):
            last = k == len(micro) - 1
            fsdp_micro_batch(net, last, args)
            ctx = net.no_sync() if (world > 1 and not last and not args.fsdp) else torch.enable_grad()
            with ctx:
                with autocast:
                    logp = net(mb["ids"], mb["attn"], mb["valid"])  # [b, L-1]
                p_mask = mb["p0"] if args.mask_source == "profile" else None
                loss, s = objective_loss(logp, mb["valid"], mb["region"], mb["weight"], max(n_norm, 1.0),
                                         args.objective, p_mask=p_mask, **knobs)
                # DDP and FSDP average gradients over processes; our loss is already a global sum / N.
                (loss * world).backward()
            s["loss"] = loss.item()
            for key in stats:
                stats[key] += s[key]
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step, steps_run = step + 1, steps_run + 1
        stats = all_reduce_stats(stats, world)
        tokens_seen += stats["tokens"]
        if rank == 0:
            log_lines.append(log_step(step, total, stats, optimizer, tokens_seen, t_start, steps_run))
        stopping = args.stop_after is not None and steps_run >= args.stop_after
        if step % args.save_every == 0 or step == total or stopping:
            save_resume(args.out, args, model, optimizer, step, log_lines, rank)

    if step >= total:
        save_final(args, model, tokenizer, step, tok_fp, data_id, max_length, rank)
    if rank == 0:
        write_text_atomic(args.out / "log.jsonl", "".join(log_lines))
        print(f"{'done' if step >= total else 'stopped'} at step {step}/{total}; {args.out}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
