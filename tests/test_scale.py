"""Stage 03's GPU paths, checked on the CPU by separating their logic from the hardware
(docs/scale.md): where each collective's tensor lives, the FSDP mesh, the wait while rank 0 writes a
checkpoint, the memory plan's activations against the tensors backward really keeps, and the choice of
device and precision."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import load_script

from cuset_common.cli import UserError
from cuset_common.device import bf16_supported, computes_bf16, pick_device, resolve_precision
from cuset_common.paths import ROOT, SFT_FILE, TINY_MODEL
from cuset_common.training.scale import (
    collective_device,
    decoder_layers,
    format_memory_plan,
    fsdp_mesh,
    memory_plan,
    memory_record,
    process_group_backend,
    reset_peak_memory,
    shard_fsdp,
)

train = load_script("03_train_cuset.py")


@pytest.fixture
def tiny_model():
    """The bundled tiny model, a fresh copy per test (sharding and dtype changes act in place)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32)


@pytest.fixture
def one_process_group():
    """A real gloo process group of this process alone, as torchrun --nproc_per_node 1 makes."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------
# The processes: collectives, the mesh, the wait while rank 0 writes
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_each_collective_tensor_lives_on_the_device_its_backend_reduces(device):
    """NCCL sums CUDA tensors only: a GPU process's statistics go to its own GPU, a CPU process's stay."""
    assert collective_device(device) == torch.device(device)
    assert (process_group_backend(device) == "nccl") == (collective_device(device).type == "cuda")


def test_fsdp_shards_over_a_mesh_of_the_requested_device_type(tiny_model, one_process_group):
    mesh = fsdp_mesh("cpu", 1)
    assert mesh.device_type == "cpu" and mesh.size() == 1
    net = train.GoldLogProbs(tiny_model, chunk=64)
    shard_fsdp(net, train.parse_args(["--fsdp"]), mesh)
    assert {p.device_mesh.device_type for p in net.parameters()} == {"cpu"}


# Two processes whose process group times out after 2 s; rank 0 writes a checkpoint (sleeps) for 4 s while
# rank 1 waits in wait_for_checkpoint. The rendezvous goes through a store with a long timeout of its own, so
# that two processes starting at different speeds on a busy machine meet before the short timeout counts.
WAITER = r"""
import datetime, os, sys, time
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
from cuset_common.training.scale import checkpoint_wait_group, wait_for_checkpoint
rank = int(os.environ["RANK"])
store = dist.TCPStore("127.0.0.1", int(sys.argv[2]), 2, rank == 0, timeout=datetime.timedelta(seconds=120))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=2))
group = checkpoint_wait_group(2)
if rank == 0:
    time.sleep(4)
wait_for_checkpoint(group)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_processes_wait_for_a_checkpoint_longer_than_the_process_groups_timeout(tmp_path):
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(ROOT), port],
            env={**os.environ, "RANK": str(rank), "OMP_NUM_THREADS": "1"},
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]


# Two processes load the model as stage 03 does under --fsdp (load_model), first with a check that refuses it,
# then with one that passes; each prints what it saw: the refusal, the checks it ran, where its model is.
LOADER = r"""
import datetime, json, os, sys
sys.path.insert(0, sys.argv[1])
from types import SimpleNamespace
import torch.distributed as dist
from cuset_common.cli import UserError
from cuset_common.training.scale import checkpoint_wait_group, load_model
rank = int(os.environ["RANK"])
store = dist.TCPStore("127.0.0.1", int(sys.argv[2]), 2, rank == 0, timeout=datetime.timedelta(seconds=120))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
group, args, checks = checkpoint_wait_group(2), SimpleNamespace(fsdp=True, model=sys.argv[3]), []
def refuse(model):
    checks.append(rank)
    raise UserError("its logits are scaled")
try:
    load_model(args, rank, "cpu", refuse, group)
    refusal = None
except UserError as e:
    refusal = str(e)
model = load_model(args, rank, "cpu", checks.append, group)
shapes = {n: list(t.shape) for n, t in [*model.named_parameters(), *model.named_buffers()]}
devices = sorted({t.device.type for t in [*model.parameters(), *model.buffers()]})
print(json.dumps(dict(refusal=refusal, checks=len(checks), devices=devices, shapes=shapes)))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_under_fsdp_rank_0_alone_loads_the_model_and_its_verdict_reaches_every_process(tmp_path):
    """Rank 0 loads and checks the model on the host; rank 1 builds the same modules on the meta device (no
    memory) and refuses with rank 0's words when rank 0 refuses, instead of waiting in the next collective."""
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(ROOT), port, str(TINY_MODEL)],
            env={**os.environ, "RANK": str(rank), "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    seen = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        seen.append(json.loads(out.splitlines()[-1]))
    assert [s["refusal"] for s in seen] == ["its logits are scaled"] * 2
    assert [s["checks"] for s in seen] == [2, 0]  # the check runs on rank 0 alone
    assert [s["devices"] for s in seen] == [["cpu"], ["meta"]]
    assert seen[0]["shapes"] == seen[1]["shapes"]  # tied embeddings and the rotary buffers included


# ---------------------------------------------------------------------------------------
# The memory plan's activations against the tensors backward keeps
# ---------------------------------------------------------------------------------------


def bytes_saved_for_backward(model, ids, attn, autocast: bool) -> int:
    """Bytes of the tensors autograd saves in the body's forward (through the final norm), each storage
    once; the parameters themselves are the plan's weights row, not activations (their bf16 copies are)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model.base_model(input_ids=ids, attention_mask=attn)
    return sum(saved.values())


@pytest.mark.parametrize(
    "kind, argv, precision",
    [
        ("fp32", [], "fp32"),
        ("autocast", [], "bf16"),
        ("bf16 weights", ["--fsdp", "--param-dtype", "bf16"], "bf16"),
    ],
)
def test_the_activations_row_is_what_backward_keeps(tiny_model, kind, argv, precision):
    """The plan's activations against the saved tensors of a forward on a full micro-batch (one sample
    padded: transformers then hands SDPA a mask, the worst case). "bf16 weights" is the model in bf16, as
    FSDP's --param-dtype bf16 gathers it.

    Tolerance: the plan leaves out, per token, the norms' rsqrt (4 B, two per layer and the final one),
    attention's log-sum-exp (4 B per head and layer), the token id (8 B), and per position the rotary cos
    and sin tables (2 x head_dim x 4 B): the measured count must lie between the plan and the plan plus
    these, which here is 0.4% of it (in fp32 the count is exactly the plan plus these).
    """
    cfg, batch, length = tiny_model.config, 2, 128
    args = train.parse_args(["--micro-batch-size", str(batch), *argv])
    plan = memory_plan(tiny_model, args, 1, "cpu", length, precision)["activations"][0]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, length), generator=g)
    attn = torch.ones(batch, length, dtype=torch.long)
    attn[1, 100:] = 0
    model = tiny_model.to(torch.bfloat16) if kind == "bf16 weights" else tiny_model
    count = bytes_saved_for_backward(model, ids, attn, autocast=kind == "autocast")
    layers, tokens = cfg.num_hidden_layers, batch * length
    left_out = (
        tokens * (layers * (2 * 4 + 4 * cfg.num_attention_heads) + 4 + 8) + length * 2 * cfg.head_dim * 4
    )
    assert plan <= count <= plan + left_out, (kind, plan, count, left_out)


def test_activations_are_counted_at_the_precision_not_the_device(tiny_model):
    """fp32 on a GPU keeps float32 activations: the plan for cuda equals the plan for the CPU."""
    args = train.parse_args(["--micro-batch-size", "4"])
    on_gpu = memory_plan(tiny_model, args, 1, "cuda", 512, "fp32")["activations"]
    assert on_gpu == memory_plan(tiny_model, args, 1, "cpu", 512, "fp32")["activations"]
    bf16 = memory_plan(tiny_model, args, 1, "cuda", 512, "bf16")["activations"]
    layer_weights = sum(p.numel() for m in decoder_layers(tiny_model) for p in m.parameters())
    assert bf16[0] > 2 * layer_weights and "autocast" in bf16[1]  # the weights' bf16 copies among them


def test_the_memory_record_holds_the_plan_and_no_gpu_peak_off_cuda(tiny_model):
    plan = memory_plan(tiny_model, train.parse_args(["--micro-batch-size", "1"]), 1, "cpu", 64, "fp32")
    assert memory_record(plan, "cpu") == {"plan_bytes": round(plan["total"][0]), "peak_allocated_bytes": None}


@pytest.mark.parametrize(
    "argv, world, where", [([], 1, "per process"), (["--fsdp"], 2, "rank 0's host alone")]
)
def test_the_plan_counts_loading_in_host_memory_outside_the_total(tiny_model, argv, world, where):
    """4 B x P of host memory while the model loads (under --fsdp on rank 0 alone): its own row, printed with
    the plan; the total stays the device's bytes of training."""
    args = train.parse_args(["--micro-batch-size", "1", *argv])
    plan = memory_plan(tiny_model, args, world, "cpu", 64, "fp32")
    bytes_, how = plan["load (host)"]
    assert bytes_ == 4 * sum(p.numel() for p in tiny_model.parameters()) and where in how
    state = sum(plan[row][0] for row in ("weights", "gradients", "optimizer"))
    work = max(plan["activations"][0] + plan["output layer"][0], plan["step"][0])
    assert plan["total"][0] == state + work
    assert "load (host)" in format_memory_plan(plan, args, world)


@pytest.mark.parametrize("device, reset", [("cpu", False), ("cuda", True), ("cuda:1", True)])
def test_the_peak_is_forgotten_on_cuda_devices_only(device, reset, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", calls.append)
    reset_peak_memory(device)
    assert calls == ([device] if reset else [])


class FirstStep(Exception):
    """Raised where stage 03 would take its first step."""


def test_the_peak_is_reset_once_the_model_is_placed_and_before_the_first_step(tmp_path, monkeypatch):
    """meta.json's peak must be training's: stage 03 resets it after place_model (and the optimizer and any
    resume state), right before the loop; loading's transients are forgotten."""
    order, place = [], train.place_model
    monkeypatch.setattr(train, "place_model", lambda *a: order.append("place") or place(*a))
    monkeypatch.setattr(train, "reset_peak_memory", lambda device: order.append(f"reset {device}"))

    def first_step(*_):
        order.append("train")
        raise FirstStep

    monkeypatch.setattr(train, "train", first_step)
    data = tmp_path / "sft8.jsonl"
    data.write_text("".join(SFT_FILE.read_text().splitlines(keepends=True)[:8]))
    argv = ["--model", str(TINY_MODEL), "--data", str(data), "--objective", "sft", "--device", "cpu"]
    with pytest.raises(FirstStep):
        train.main([*argv, "--max-length", "384", "--out", str(tmp_path / "out")])
    assert order == ["place", "reset cpu", "train"]


# ---------------------------------------------------------------------------------------
# The device and the precision
# ---------------------------------------------------------------------------------------


def stand_in_nvidia_smi(folder, listing: str, status: int) -> None:
    """An `nvidia-smi` on PATH that prints `listing` for -L and exits with `status`."""
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nprintf '%s\\n' '{listing}'\nexit {status}\n")
    exe.chmod(0o755)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only torch this refusal is about")
def test_auto_refuses_a_listed_gpu_that_this_torch_cannot_use(tmp_path, monkeypatch):
    stand_in_nvidia_smi(tmp_path, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)", 0)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(UserError, match="nvidia-smi lists a GPU.*--device cpu"):
        pick_device("auto")
    assert pick_device("cpu") == "cpu"  # the CPU on purpose


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto must find no GPU")
def test_auto_takes_the_cpu_where_nvidia_smi_lists_no_gpu(tmp_path, monkeypatch):
    stand_in_nvidia_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate with the driver", 9)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert pick_device("auto") == "cpu"


@pytest.mark.parametrize(
    "capability, native",
    [((6, 1), False), ((7, 0), False), ((7, 5), False), ((8, 0), True), ((8, 9), True), ((9, 0), True)],
)
def test_bf16_counts_as_native_from_compute_capability_8(capability, native):
    """Volta and Turing (7.x) emulate bf16, which torch.cuda.is_bf16_supported() counts by default."""
    assert computes_bf16(capability) is native


def test_bf16_is_not_claimed_for_a_gpu_that_is_not_there():
    if torch.cuda.is_available():
        pytest.skip("this torch sees a GPU")
    assert bf16_supported("cuda:1") is False and resolve_precision("auto", "cuda:1") == "fp32"
