"""Stage 03 at scale: FSDP2 under torchrun (gloo, CPU) against single-process training, resume after a kill
in the middle of an FSDP run, and the memory plan against the measured peak of live tensor bytes.

Launch budget (2 cores): four torchrun launches (the FSDP run compared with one process; an uninterrupted, a
killed and a resumed run), one in-process single-process reference, two single-process memory runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_train import (
    MAX_LENGTH,
    MODEL,
    SFT_FILE,
    SGD_ARGS,
    SGD_STEPS,
    assert_same_sgd_training,
    base_args,
    log_of,
    run,
    train,
    weights_of,
)

from cuset_common.data import load_sft
from cuset_common.paths import ROOT
from cuset_common.training.scale import format_memory_plan, memory_plan

# Under FSDP each gradient element is the same K-term sum as on one process, reduce-scattered over the
# processes in another order: the reordering bound of assert_same_sgd_training (test_train.py) holds as for
# DDP.
K_TERMS = 8 * MAX_LENGTH
SINGLE_ARGS = dict(objective="sft", micro_batch_size=2, device="cpu", **SGD_ARGS)
FSDP_ARGS = dict(SINGLE_ARGS, fsdp=True)

# The driver: runs stage 03's main in a fresh process and counts live tensor bytes (tests/live_memory.py) from
# the moment the plan is made (one process) or the model is sharded (--fsdp), with the model's own parameters
# and buffers registered first, so that the peak is comparable with the plan's total; it also records the
# device type of the mesh FSDP shards over, and whether the model was built on the meta device (under --fsdp
# every rank but 0: cuset_common/training/scale.py, load_model).
DRIVER = r"""
import json, os, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from conftest import load_script
from live_memory import LiveTensorBytes
import cuset_common.training.run as run  # where stage 03 makes the plan and shards (place_model)
train = load_script("03_train_cuset.py")
rec, tracker, model = {}, LiveTensorBytes(), []
def start():
    for t in [*model[0].parameters(), *model[0].buffers()]:
        tracker.add(t)
    tracker.__enter__()
plan, shard = run.memory_plan, run.shard_fsdp
def spy_plan(m, *a, **k):
    model.append(m)
    rec["on_meta"] = any(p.is_meta for p in [*m.parameters(), *m.buffers()])
    rec["plan"] = plan(m, *a, **k)
    if "--fsdp" not in sys.argv:
        start()
    return rec["plan"]
def spy_shard(net, args, mesh):
    rec["mesh"] = mesh.device_type
    shard(net, args, mesh)
    start()
run.memory_plan, run.shard_fsdp = spy_plan, spy_shard
assert train.main(sys.argv[2:]) == 0
tracker.__exit__(None, None, None)
rec["peak"] = tracker.peak
# a file per process, beside --out: the processes share stdout, where their lines can interleave
out = sys.argv[sys.argv.index("--out") + 1]
with open(f"{out}.memory-{os.environ.get('RANK', '0')}.json", "w") as f:
    json.dump(rec, f)
"""


def memory_records(out: Path) -> list[dict]:
    """The driver's records of a run with --out `out`, one per process, by rank."""
    return [json.loads(p.read_text()) for p in sorted(out.parent.glob(f"{out.name}.memory-*.json"))]


def torchrun(script, argv, **popen):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        *map(str, script),
        *map(str, argv),
    ]
    return subprocess.Popen(cmd, cwd=ROOT, text=True, **popen)


def kill_tree(pid: int) -> None:
    """SIGKILL torchrun and its workers (each in its own session, so a process-group kill misses them)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    os.kill(pid, signal.SIGKILL)
    for child in children:
        kill_tree(int(child))


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def padding_only_bytes(model, tokens: int) -> int:
    """The plan's activation bytes that only a padded micro-batch keeps (cuset_common/training/scale.py,
    layer_bytes), in float32: the float mask SDPA makes of the padding mask (a row of MAX_LENGTH per token and
    layer) and k, v repeated to every head, which transformers does only when there is a mask. data8 pads
    nothing."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model)
    h, h_kv = cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim
    return cfg.num_hidden_layers * tokens * 4 * (MAX_LENGTH + 2 * (h - h_kv))


def check_plan(rec: dict, padding_only: int) -> None:
    """The plan's total against the measured peak of live tensor bytes, within bounds the plan's own
    terms give.

    The count is exact and the same on every machine (tests/live_memory.py), so the bounds are not noise
    allowances: they are where the plan, a sum of worst moments, may lie. Above the peak: the plan adds every
    gradient and all activations (with the head's chunk) as if they coexisted, while backward frees
    activations as gradients arrive, so at most the smaller of the two is counted twice; and it counts what a
    padded micro-batch keeps besides (padding_only). Below the peak: nothing; the plan is an upper bound of
    what is live (docs/scale.md gives the measured ratios). A plan that drops AdamW's state, or counts it
    twice, leaves these bounds: in the wide model the state is 43% of the total, in the tiny one 12.5%, more
    than the room allowed below the plan (11%).
    """
    plan = {name: row[0] for name, row in rec["plan"].items()}
    overlap = min(plan["gradients"], plan["activations"] + plan["output layer"]) + padding_only
    print(
        {k: round(v / 2**20, 1) for k, v in plan.items()},
        "MiB; measured peak",
        round(rec["peak"] / 2**20, 1),
        "MiB; ratio",
        round(rec["peak"] / plan["total"], 3),
    )
    assert plan["total"] - overlap <= rec["peak"] <= plan["total"], rec


@pytest.fixture(scope="module")
def data8(tmp_path_factory):
    """8 `text` records (no prompt: every token is a response token) longer than MAX_LENGTH: every micro-batch
    is the plan's worst case, micro-batch x max_length tokens all scored."""
    path = tmp_path_factory.mktemp("data") / "text8.jsonl"
    responses = [r["response"] for r in load_sft(SFT_FILE)[:8]]
    path.write_text(
        "".join(json.dumps({"id": f"t{i}", "text": (r + "\n") * 8}) + "\n" for i, r in enumerate(responses))
    )
    return path


@pytest.fixture(scope="module")
def single(data8, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "out"
    assert run(base_args(data8, out, **SINGLE_ARGS)) == 0
    return out


@pytest.fixture(scope="module")
def fsdp_run(data8, tmp_path_factory):
    """One FSDP launch (2 processes, 2 micro-batches each) through the memory driver; its per-rank records."""
    out = tmp_path_factory.mktemp("fsdp") / "out"
    driver = out.parent / "driver.py"
    driver.write_text(DRIVER)
    proc = torchrun(
        [driver, ROOT], base_args(data8, out, **FSDP_ARGS), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    records = memory_records(out)
    assert len(records) == 2 and "memory plan per process (fsdp over 2" in stdout
    return out, records


def test_fsdp_two_processes_match_single_process_training(single, fsdp_run):
    out, records = fsdp_run
    assert_same_sgd_training(weights_of(single), weights_of(out), SGD_STEPS, k_terms=K_TERMS)
    assert set(weights_of(out)) == set(weights_of(single))  # gathered, tied weights saved once as on one GPU
    assert [round(x["loss"], 4) for x in log_of(out)] == [round(x["loss"], 4) for x in log_of(single)]
    # rank 1 built the model on the meta device and received rank 0's weights, the tied embeddings and the
    # rotary inv_freq (a buffer no state dict holds) among them: the equalities above hold for its shards too
    assert [rec["on_meta"] for rec in records] == [False, True]
    for rec in records:  # the plan under FSDP, per process, and --device cpu's mesh on a GPU machine too
        check_plan(rec, padding_only_bytes(MODEL, FSDP_ARGS["micro_batch_size"] * MAX_LENGTH))
        assert rec["mesh"] == "cpu"


def test_a_killed_fsdp_run_resumes_to_the_uninterrupted_run(data8, tmp_path):
    """Bit for bit, with what resume must restore: AdamW's moments (gathered to rank 0, broadcast back into
    the shards), under bf16 weights, --fsdp-keep-gathered, activation checkpointing and gradient clipping.
    Killed (launcher and workers, SIGKILL) once step 1's state is saved, resumed under FSDP."""
    kw = dict(
        objective="sft",
        micro_batch_size=2,
        device="cpu",
        batch_size=8,
        max_steps=3,
        fsdp=True,
        param_dtype="bf16",
        fsdp_keep_gathered=True,
        grad_checkpointing=True,
    )
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    proc = torchrun(
        [ROOT / "03_train_cuset.py"],
        base_args(data8, straight, **kw),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.wait(timeout=900) == 0, proc.stderr.read()[-3000:]
    argv = base_args(data8, killed, **kw)
    proc = torchrun([ROOT / "03_train_cuset.py"], argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state_log, deadline, pids = killed / "resume" / "log.jsonl", time.time() + 600, []
    while time.time() < deadline and proc.poll() is None:
        if state_log.exists() and len(state_log.read_text().splitlines()) >= 1:
            pids = [
                proc.pid,
                *map(int, Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()),
            ]
            kill_tree(proc.pid)
            break
        time.sleep(0.02)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    while not all(gone(p) for p in pids):
        time.sleep(0.05)
    assert not (killed / "model.safetensors").exists()
    resumed = torchrun(
        [ROOT / "03_train_cuset.py"], argv + ["--resume"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stdout, stderr = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, stderr[-3000:]
    assert "resumed at step" in stdout and "weights bf16" in stdout
    assert [r["step"] for r in log_of(killed)] == [1, 2, 3]
    assert [r["loss"] for r in log_of(killed)] == [r["loss"] for r in log_of(straight)]
    want = weights_of(straight)
    assert {w.dtype for w in want.values()} == {torch.float32}  # the float32 master weights are saved
    for name, w in weights_of(killed).items():
        torch.testing.assert_close(w, want[name], atol=0, rtol=0, msg=name)


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """A random Llama wide enough that weights, gradients and AdamW state dominate: 50M parameters, 2
    layers."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=8192,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=2,
    )
    path = tmp_path_factory.mktemp("wide") / "model"
    LlamaForCausalLM(cfg).save_pretrained(path)
    AutoTokenizer.from_pretrained(MODEL).save_pretrained(path)
    return path


@pytest.mark.parametrize("which", ["tiny", "wide"])
def test_the_memory_plan_matches_measured_peak_memory(which, data8, tmp_path, request):
    """One process, AdamW, 2 steps (the second runs with the optimizer state): the peak of live tensor bytes
    against the plan's total."""
    model, batch = (MODEL, 4) if which == "tiny" else (request.getfixturevalue("wide_model"), 1)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    argv = base_args(
        data8,
        tmp_path / "out",
        model=model,
        objective="sft",
        max_steps=2,
        batch_size=batch,
        micro_batch_size=batch,
        device="cpu",
        save_every=100,
    )
    r = subprocess.run(
        [sys.executable, str(driver), str(ROOT), *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (rec,) = memory_records(Path(argv[argv.index("--out") + 1]))
    assert "memory plan per process (one process" in r.stdout and "optimizer" in r.stdout
    check_plan(rec, padding_only_bytes(model, batch * MAX_LENGTH))


# ---------------------------------------------------------------------------------------
# The plan's arithmetic at the README's scale, and the refusals (no training run).
# ---------------------------------------------------------------------------------------


def qwen_7b_on_meta():
    """Qwen2.5-Coder-7B's shape (config.json of the hub model), parameters on the meta device: no memory."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def test_the_memory_plan_at_7b_shards_state_by_processes():
    model = qwen_7b_on_meta()
    p = sum(x.numel() for x in model.parameters())
    assert 7.5e9 < p < 7.7e9
    one = memory_plan(model, train.parse_args(["--micro-batch-size", "1"]), 1, "cuda", 2048, "bf16")
    assert one["weights"][0] + one["gradients"][0] + one["optimizer"][0] == 16 * p  # > 112 GB: not one GPU
    args = train.parse_args(
        ["--micro-batch-size", "1", "--fsdp", "--param-dtype", "bf16", "--grad-checkpointing"]
    )
    eight = memory_plan(model, args, 8, "cuda", 2048, "bf16")
    assert eight["optimizer"][0] == 8 * p / 8 and eight["step"][0] == 4 * p / 8
    root = 2 * 152064 * 3584 + 3584  # embeddings, output layer, final norm
    layer = (p - root) / 28
    assert eight["weights"][0] == pytest.approx(4 * p / 8 + 2 * (root + 2 * layer))
    assert eight["gradients"][0] == pytest.approx(4 * p / 8 + 2 * (root + layer))
    assert eight["total"][0] < 40 * 2**30  # fits an 80 GB GPU with room for the allocator
    assert eight["load (host)"][0] == 4 * p and "rank 0" in eight["load (host)"][1]  # 30 GB, one host copy
    text = format_memory_plan(eight, args, 8)
    assert "fsdp over 8" in text and "weights bf16" in text and "total" in text


def test_fsdp_outside_torchrun_is_refused(data8, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    code = train.run_main(
        train.main, list(map(str, base_args(data8, tmp_path / "o", objective="sft", fsdp=True)))
    )
    assert code == 2 and "--fsdp runs under torchrun" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_bf16_weights_need_fsdp():
    with pytest.raises(SystemExit):
        train.parse_args(["--param-dtype", "bf16"])
