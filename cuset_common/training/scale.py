"""Stage 03 at scale: the processes, FSDP2 sharding and the memory plan (docs/scale.md).

One process, or N under torchrun: DDP (each process keeps the whole training state) or, with --fsdp,
FSDP2 (weights, gradients and optimizer state sharded over the processes). The loss is a global sum
divided by the global token count N either way, so all three train the same model; memory_plan says
beforehand how many bytes each process needs.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
import transformers
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from cuset_common.cli import UserError
from cuset_common.device import pick_device
from cuset_common.models import load_causal_lm, quiet_transformers

# Rank 0 alone writes the checkpoints (cuset_common/training/checkpoint.py) while the other processes wait for
# it. Waiting in the next training collective would put them under NCCL's watchdog, which aborts a collective
# after the process group's timeout (10 minutes by default): less than writing a large model's gathered
# state may take (12 B per parameter, 177 GB for 14B: docs/scale.md). So they wait at a barrier of a gloo
# group of their own (CPU, no watchdog) whose timeout covers the write, while the training collectives keep
# NCCL's short timeout, which still catches a hung step early. Under --fsdp they wait in it too while rank 0
# alone loads the model (load_model).
CHECKPOINT_WAIT = datetime.timedelta(hours=2)


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
    # device_id binds NCCL's communicator to this process's GPU (barriers included); gloo takes none
    dist.init_process_group(
        process_group_backend(device), device_id=torch.device(device) if device.startswith("cuda") else None
    )
    return rank, world, device


def process_group_backend(device: str) -> str:
    """NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def collective_device(device: str) -> torch.device:
    """Where the tensors of this process's collectives live: on its own device, since NCCL (a GPU process)
    reduces CUDA tensors only and gloo (a CPU process) CPU tensors."""
    return torch.device(device)


def all_reduce_stats(stats: dict, world: int, device: str) -> dict:
    """Sums over processes of this process's sums."""
    if world == 1:
        return stats
    keys = sorted(stats)
    sums = torch.tensor(
        [float(stats[k]) for k in keys], dtype=torch.float64, device=collective_device(device)
    )
    dist.all_reduce(sums)
    return dict(zip(keys, sums.tolist()))


def checkpoint_wait_group(world: int):
    """The gloo group the processes wait in while rank 0 writes a checkpoint, or loads the model under --fsdp
    (CHECKPOINT_WAIT); None for one process. Every process creates it, at the same point."""
    return dist.new_group(backend="gloo", timeout=CHECKPOINT_WAIT) if world > 1 else None


def wait_for_checkpoint(group) -> None:
    """Every process waits here until rank 0 has written what it writes alone (a no-op for one process)."""
    if group is not None:
        dist.barrier(group=group)


def load_model(args, rank: int, device: str, check, group) -> torch.nn.Module:
    """The float32 model to train, once check(model) has passed (stage 03's: its logits are a plain head).

    Without --fsdp every process trains the whole model: loaded, moved whole to its device, checked there.
    Under --fsdp neither a GPU nor the host should hold W whole copies (4 B x P each, 59 GB at 14B): rank 0
    alone loads it, into host memory (the plan's "load (host)" row), and checks it there, which for the head
    check is one forward of the whole model on the host's cores (about 2 x P x 64 flops, once); the other
    processes build it on the meta device (no memory), and shard_fsdp gives them rank 0's weights. Rank 0's
    verdict reaches them through `group` (gloo: loading may outlast NCCL's watchdog, CHECKPOINT_WAIT), so
    that all refuse alike.
    """
    if not args.fsdp:
        model = load_causal_lm(args.model, torch.float32).to(device)
        check(model)
        return model
    model, error = None, [None]
    if rank == 0:
        try:
            model = load_causal_lm(args.model, torch.float32)
            check(model)
        except UserError as e:
            error = [str(e)]
    if group is not None:
        dist.broadcast_object_list(error, src=0, group=group)
    if error[0]:
        raise UserError(error[0])
    return model if rank == 0 else model_on_meta(args.model)


def model_on_meta(name: str) -> torch.nn.Module:
    """The model built from its config.json on the meta device: its modules and shapes, no memory, no values
    (rank 0 has checked the folder and loaded it already)."""
    with quiet_transformers(), torch.device("meta"):
        config = transformers.AutoConfig.from_pretrained(name)
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks (HF's _no_split_modules: LlamaDecoderLayer, Qwen2DecoderLayer, ...)."""
    return [m for m in model.modules() if type(m).__name__ in set(model._no_split_modules or [])]


def fsdp_mesh(device: str, world: int) -> DeviceMesh:
    """The processes as FSDP2 shards over them: a 1-D mesh on --device's type. fully_shard without a mesh
    builds one on the accelerator torch was built for, a CUDA mesh on a CUDA build even for --device cpu."""
    return init_device_mesh(torch.device(device).type, (world,))


def shard_fsdp(net, args, mesh: DeviceMesh) -> None:
    """FSDP2 over `mesh`: one fully_shard unit per decoder layer of net.model, then the root, net itself
    (embeddings, final norm, head).

    The root's forward is stage 03's GoldLogProbs, so the output layer's weight is all-gathered with the root
    once per micro-batch (and again for backward) and the chunked head computes with the full [V, d] weight,
    as on one GPU: one V x d all-gather per pass, V x d x (2 or 4) bytes while gathered (in the memory plan).
    Gradients are reduce-scattered in float32 and averaged over processes, like DDP's. bf16: weights are
    gathered in bf16; the float32 shards are the master copy the optimizer updates.

    The weights come from rank 0's host (load_model): fully_shard moves each unit's parameters and buffers
    to the mesh's device and keeps this process's shard (torch's fsdp/_fully_shard/_fsdp_init.py,
    _move_states_to_device), so a GPU holds one unit whole at most, while it is sharded; receive_weights
    then fills the other processes' shards.
    """
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if args.param_dtype == "bf16" else None, reduce_dtype=torch.float32
    )
    full = net.model.state_dict() if mesh.size() > 1 and mesh.get_rank() == 0 else {}  # no copy: references
    for unit in [*decoder_layers(net.model), net]:
        fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=not args.fsdp_keep_gathered)
    if mesh.size() > 1:
        receive_weights(net, full, mesh)


def receive_weights(net, full: dict, mesh: DeviceMesh) -> None:
    """Every process's shards filled with rank 0's weights (`full`: its state dict; {} on the others).

    A model built on the meta device first gets its shards, uninitialised (to_empty; on CUDA on the GPU
    setup_distributed set). DCP broadcasts the state dict one tensor at a time: each process holds one
    whole tensor on its device at a time, beside its shards, and keeps its slice. Tied weights are one
    parameter, loaded under both names. Buffers left out of state dicts (non-persistent: the rotary
    inv_freq) are broadcast from rank 0 besides; FSDP does not shard buffers.
    """
    if any(t.is_meta for t in [*net.parameters(), *net.buffers()]):
        net.to_empty(device=mesh.device_type)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(net.model, full, options=options)
    for buffer in net.buffers():
        dist.broadcast(buffer, src=0, group=mesh.get_group())


def fsdp_micro_batch(net, last: bool, args) -> None:
    """--fsdp-keep-gathered: until a step's last micro-batch, weights stay gathered and gradients add up
    unsharded (no collective); the last reduce-scatters the sum. Otherwise each micro-batch
    reduce-scatters."""
    if args.fsdp and args.fsdp_keep_gathered:
        net.set_requires_gradient_sync(last)
        net.set_reshard_after_backward(last)


def memory_plan(
    model, args, world: int, device: str, max_length: int, precision: str
) -> dict[str, tuple[float, str]]:
    """Bytes per process, {row: (bytes, how)}; P parameters, W processes, pb = 4 (fp32) or 2 (bf16) bytes.

    weights 4P, or under --fsdp 4P/W float32 shards + the root and two layers gathered in pb (all P with
    --fsdp-keep-gathered); gradients 4P (+ 4P DDP buckets), or 4P/W + the root's and one layer's in pb (4P
    unsharded when kept gathered); AdamW's float32 m, v 8P (/W). Activations: activation_bytes, what
    backward keeps (precision: "fp32" or "bf16", --precision resolved). The head: 3 [chunk, V] float32
    blocks, and under autocast its weight's bf16 copy. The optimizer step's temporaries: CUDA's foreach
    AdamW takes a 4P (/W) one; elsewhere AdamW runs tensor by tensor (torch's default off CUDA), and its
    denominator sqrt(v) / c holds two temporaries of the largest parameter (shard) at once, 8 B x max(p).
    total = state + max(activations + head, step).
    """
    cfg, layers = model.config, decoder_layers(model)
    params = sum(p.numel() for p in model.parameters())  # tied weights once
    sizes = [sum(p.numel() for p in m.parameters()) for m in layers] or [0]
    root, pb = params - sum(sizes), (2 if bf16_weights(args) else 4)
    shard = world if args.fsdp else 1
    tokens = args.micro_batch_size * max_length
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
    chunk, vocab = min(args.chunk_rows, tokens), cfg.vocab_size
    head = (3 * chunk * vocab * 4, f"3 x {chunk} x V={vocab} x 4 B")
    if autocast_copies_weights(args, precision):  # autocast's cache holds it until forward ends
        head = (head[0] + 2 * vocab * cfg.hidden_size, head[1] + " + its weight's bf16 copy")
    plan = {
        "weights": w,
        "gradients": g,
        "optimizer": (opt, f"{8 if opt else 0} B x P / {shard}"),
        "activations": activation_bytes(model, args, max_length, precision),
        "output layer": head,
        "step": adamw_step_temporaries(model, args, shard, device),
    }
    peak = max(plan["activations"][0] + head[0], plan["step"][0])
    plan["total"] = (w[0] + g[0] + opt + peak, f"P = {params / 1e6:,.1f}M, {world} process(es)")
    plan["load (host)"] = host_load_bytes(params, args, world)
    return plan


def host_load_bytes(params: int, args, world: int) -> tuple[float, str]:
    """The "load (host)" row of memory_plan: host memory, not the device's, so not in the total, and held
    before the first step only. The float32 model as loaded, 4 B x P: under --fsdp on rank 0 alone (the
    others build it on the meta device: load_model), otherwise in every process, so W times that on a
    machine that runs W of them."""
    where = "rank 0's host alone" if args.fsdp else "the host per process" + f" ({world} x)" * (world > 1)
    return 4 * params, f"4 B x P on {where} while loading (not in the total)"


def bf16_weights(args) -> bool:
    """Whether the model computes with bf16 weights (--fsdp --param-dtype bf16), residual stream included."""
    return args.fsdp and args.param_dtype == "bf16"


def autocast_copies_weights(args, precision: str) -> bool:
    """Whether bf16 autocast casts float32 weights for each product, keeping the copies for backward."""
    return precision == "bf16" and not bf16_weights(args)


def activation_bytes(model, args, max_length: int, precision: str) -> tuple[float, str]:
    """The activations row of memory_plan: the bytes backward keeps from one micro-batch's forward, through
    the final norm, and how they are counted (tests/test_scale.py counts the saved tensors themselves).

    Per decoder layer and token, layer_bytes; times layers x micro-batch x max_length; plus the final norm's
    input and normalised input. Checkpointing keeps each layer's input (h) and recomputes one layer at a time.
    Under autocast, bf16 copies of the layers' weights besides (kept until backward, or, checkpointed, until
    forward ends: autocast caches them). Left out, small beside these: per-row scalars (the norms' rsqrt,
    attention's log-sum-exp), the rotary tables, the token ids.
    """
    cfg, layers = model.config, decoder_layers(model)
    h, kind = cfg.hidden_size, layer_kind(args, precision)
    n_layers, tokens = len(layers) or cfg.num_hidden_layers, args.micro_batch_size * max_length
    per_layer = layer_bytes(h, getattr(cfg, "intermediate_size", 4 * h), max_length, kind)
    residual = 2 if kind == "bf16 weights" else 4  # bytes of the stream between layers
    final_norm = residual * h + 4 * h  # its input, and the input normalised in float32
    if args.grad_checkpointing:
        body, how = n_layers * residual * h + per_layer, f"{n_layers} layer inputs + one layer"
    else:
        body, how = n_layers * per_layer, f"{n_layers} layers"
    total, how = (body + final_norm) * tokens, f"{how} x {per_layer / h:.1f}h B, {tokens} tokens, {kind}"
    if autocast_copies_weights(args, precision):
        total, how = (
            total + 2 * sum(p.numel() for m in layers for p in m.parameters()),
            how + " + bf16 copies of the layers' weights (2 B x their parameters)",
        )
    return total, how


def layer_kind(args, precision: str) -> str:
    """How a decoder layer computes: "fp32", "autocast" (bf16 products of float32 weights and a float32
    residual stream) or "bf16 weights" (--fsdp --param-dtype bf16; autocast changes nothing then)."""
    if bf16_weights(args):
        return "bf16 weights"
    return "autocast" if precision == "bf16" else "fp32"


def layer_bytes(h: int, inter: int, length: int, kind: str) -> int:
    """Bytes one Llama-style decoder layer keeps for backward per token (hidden size h, MLP width inter,
    padded micro-batches of `length` tokens), as transformers' modules and SDPA save them.

    Attention and MLP, in the compute dtype (c = 4 B in fp32, else 2): q, k and v (k and v repeated to every
    head: with a padding mask transformers hands SDPA repeated heads), the attention output; gate, its
    activation, up, their product; and the float mask SDPA makes of the padding mask, one row of `length`
    per token. The two RMSNorms: their input and the input normalised (both float32: the norm computes in
    float32) and their output, the projections' input: in fp32 one float32 tensor; under autocast a bf16
    copy for each projection that reads it (q, k, v after the first norm, gate and up after the second);
    with bf16 weights the norm's input arrives in bf16 and is kept as its float32 upcast, and the normalised
    input and the output are bf16.
    """
    c = 4 if kind == "fp32" else 2
    attention_and_mlp = c * (4 * h + 4 * inter + length)
    if kind == "fp32":
        norms = 2 * 3 * 4 * h
    elif kind == "autocast":
        norms = 2 * 2 * 4 * h + (3 + 2) * 2 * h
    else:
        norms = 2 * (4 * h + 2 * h + 2 * h)
    return norms + attention_and_mlp


def reset_peak_memory(device: str) -> None:
    """Forget the CUDA allocator's peak so far, once the model is placed and before the first step: the peak
    meta.json records (memory_record) is set beside the plan of training, and loading's transients are not
    training's (a whole unit on the GPU while fully_shard shards it, a whole tensor while rank 0's weights
    are broadcast, a resume state being loaded). Nothing to forget off CUDA."""
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_record(plan: dict, device: str) -> dict:
    """meta.json's "memory": the plan's total beside the most bytes torch allocated on this process's GPU
    (None off CUDA), so that a run on a GPU shows plan and measurement side by side."""
    peak = torch.cuda.max_memory_allocated(device) if device.startswith("cuda") else None
    return {"plan_bytes": round(plan["total"][0]), "peak_allocated_bytes": peak}


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
