"""Stage 03 at scale: the processes, FSDP2 sharding and the memory plan (docs/scale.md).

One process, or N under torchrun: DDP (each process keeps the whole training state) or, with --fsdp,
FSDP2 (weights, gradients and optimizer state sharded over the processes). The loss is a global sum
divided by the global token count N either way, so all three train the same model; memory_plan says
beforehand how many bytes each process needs.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from cuset_common.cli import UserError, pick_device


def setup_distributed(device_arg: str, fsdp: bool) -> tuple[int, int, str]:
    """(rank, world size, device) of this process; one process unless torchrun started it (or --fsdp)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if fsdp and "RANK" not in os.environ:
        raise UserError(
            "--fsdp runs under torchrun (one GPU: torchrun --nproc_per_node 1 03_train_cuset.py ...)"
        )
    if world == 1 and not fsdp:
        return 0, 1, pick_device(device_arg)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_arg)
    if device.startswith("cuda"):
        device = f"cuda:{local}"
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return rank, world, device


def all_reduce_stats(stats: dict, world: int) -> dict:
    """Sums over processes of this process's sums."""
    if world == 1:
        return stats
    keys = sorted(stats)
    t = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks (HF's _no_split_modules: LlamaDecoderLayer, Qwen2DecoderLayer, ...)."""
    return [m for m in model.modules() if type(m).__name__ in set(model._no_split_modules or [])]


def shard_fsdp(net, args) -> None:
    """FSDP2: one fully_shard unit per decoder layer of net.model, then the root, net itself (embeddings,
    final norm, head).

    The root's forward is stage 03's GoldLogProbs, so the output layer's weight is all-gathered with the root
    once per micro-batch (and again for backward) and the chunked head computes with the full [V, d] weight,
    as on one GPU: one V x d all-gather per pass, V x d x (2 or 4) bytes while gathered (in the memory plan).
    Gradients are reduce-scattered in float32 and averaged over processes, like DDP's. bf16: weights are
    gathered in bf16; the float32 shards are the master copy the optimizer updates.
    """
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if args.param_dtype == "bf16" else None, reduce_dtype=torch.float32
    )
    for unit in [*decoder_layers(net.model), net]:
        fully_shard(unit, mp_policy=mp, reshard_after_forward=not args.fsdp_keep_gathered)


def fsdp_micro_batch(net, last: bool, args) -> None:
    """--fsdp-keep-gathered: until a step's last micro-batch, weights stay gathered and gradients add up
    unsharded (no collective); the last reduce-scatters the sum. Otherwise each micro-batch
    reduce-scatters."""
    if args.fsdp and args.fsdp_keep_gathered:
        net.set_requires_gradient_sync(last)
        net.set_reshard_after_backward(last)


def memory_plan(model, args, world: int, device: str, max_length: int) -> dict[str, tuple[float, str]]:
    """Bytes per process, {row: (bytes, how)}; P parameters, W processes, pb = 4 (fp32) or 2 (bf16) bytes.

    weights 4P, or under --fsdp 4P/W float32 shards + the root and two layers gathered in pb (all P with
    --fsdp-keep-gathered); gradients 4P (+ 4P DDP buckets), or 4P/W + the root's and one layer's in pb (4P
    unsharded when kept gathered); AdamW's float32 m, v 8P (/W). Activations (Llama-style): a = 8h + 4h_kv
    + 4I values per layer and token (norm inputs and outputs, q, k, v, attention output; MLP gate, up,
    activation, product) x layers x micro-batch x max_length x 4 B on CPU, 2 under autocast or bf16;
    checkpointing keeps h per layer and token + one layer's a; fused attention (no L^2). The head: 3
    [chunk, V] float32 blocks. The optimizer step's temporaries: CUDA's foreach AdamW takes a 4P (/W) one;
    elsewhere AdamW runs tensor by tensor (torch's default off CUDA), and its denominator sqrt(v) / c holds
    two temporaries of the largest parameter (shard) at once, 8 B x max(p).
    total = state + max(activations + head, step).
    """
    cfg, layers = model.config, decoder_layers(model)
    params = sum(p.numel() for p in model.parameters())  # tied weights once
    sizes = [sum(p.numel() for p in m.parameters()) for m in layers] or [0]
    root, pb = params - sum(sizes), (2 if args.param_dtype == "bf16" else 4)
    shard = world if args.fsdp else 1
    h, tokens = cfg.hidden_size, args.micro_batch_size * max_length
    h_kv = (getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads) * (
        getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    )
    a = 8 * h + 4 * h_kv + 4 * getattr(cfg, "intermediate_size", 4 * h)
    ab = 2 if (device.startswith("cuda") or args.param_dtype == "bf16") else 4
    shards = f"4 B x P / {world} shards"
    if not args.fsdp:
        w = (4 * params, "4 B x P")
        g = (4 * params * min(world, 2), "4 B x P" + " + DDP buckets" * (world > 1))
    elif args.fsdp_keep_gathered:
        w = (4 * params / world + pb * params, f"{shards} + {pb} B x P gathered")
        g = (4 * params / world + 4 * params, f"{shards} + 4 B x P unsharded")
    else:
        w = (4 * params / world + pb * (root + 2 * max(sizes)), f"{shards} + {pb} B x (root + 2 layers)")
        g = (4 * params / world + pb * (root + max(sizes)), f"{shards} + {pb} B x (root + 1 layer)")
    opt = 8 * params / shard if args.optimizer == "adamw" else 0.0
    n_layers, chunk = len(layers) or cfg.num_hidden_layers, min(args.chunk_size, tokens)
    act = ((n_layers * h + a) if args.grad_checkpointing else n_layers * a) * tokens * ab
    plan = {
        "weights": w,
        "gradients": g,
        "optimizer": (opt, f"{8 if opt else 0} B x P / {shard}"),
        "activations": (
            act,
            f"{'(layers x h + a)' if args.grad_checkpointing else 'layers x a'}, "
            f"a = {a / h:.1f}h, {n_layers} layers x {tokens} tokens x {ab} B",
        ),
        "output layer": (3 * chunk * cfg.vocab_size * 4, f"3 x {chunk} x V={cfg.vocab_size} x 4 B"),
        "step": adamw_step_temporaries(model, args, shard, device),
    }
    peak = max(act + plan["output layer"][0], plan["step"][0])
    plan["total"] = (w[0] + g[0] + opt + peak, f"P = {params / 1e6:,.1f}M, {world} process(es)")
    return plan


def adamw_step_temporaries(model, args, shard: int, device: str) -> tuple[float, str]:
    """The step row of memory_plan: bytes AdamW's update holds besides the state, and how."""
    if args.optimizer != "adamw":
        return 0.0, "none (SGD updates in place)"
    if device.startswith("cuda"):
        return 4 * sum(
            p.numel() for p in model.parameters()
        ) / shard, f"4 B x P / {shard} (CUDA foreach AdamW)"
    largest = max(p.numel() for p in model.parameters())
    return 8 * largest / shard, f"2 x 4 B x largest parameter / {shard} (AdamW tensor by tensor)"


def format_memory_plan(plan: dict, args, world: int) -> str:
    """The plan as stage 03 prints it before the first step: one row per term, GiB and how it is counted."""
    mode = f"fsdp over {world}" if args.fsdp else (f"ddp over {world}" if world > 1 else "one process")
    checkpointing = ", grad checkpointing" if args.grad_checkpointing else ""
    return "\n".join(
        [
            f"memory plan per process ({mode}, weights {args.param_dtype}, {args.optimizer}, "
            f"micro-batch {args.micro_batch_size}{checkpointing}):"
        ]
        + [f"  {name:<13}{b / 2**30:>9.3f} GiB  {how}" for name, (b, how) in plan.items()]
    )
