"""A run that diverges, and the damage around it, on the bundled tiny model: stage 03 stops on a loss,
gradient or weight that is not finite (one line, exit 2, no NaN model, log.jsonl strict JSON, the last
resume state kept and continued with a lower --lr; every process alike under DDP), so does the TRL port;
a NaN model or a damaged resume state is refused in one line; a full disk while a resume state is written
is one line and keeps the previous state, and --resume on that disk counts the state it replaces as room;
the comparison reports a diverged run as "diverged", not as numbers."""

from __future__ import annotations

import collections
import errno
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script, refused
from safetensors.torch import load_file

import cuset_common.training.checkpoint
from cuset_common.cli import UserError
from cuset_common.models import load_causal_lm, load_tokenizer
from cuset_common.out_dir import size_text
from cuset_common.paths import EVAL_SFT_KERNEL_FILE, ROOT, SFT_FILE, SFT_KERNEL_FILE, TINY_MODEL
from cuset_common.training.divergence import DIVERGED, DIVERGED_FILE

train = load_script("03_train_cuset.py")


@pytest.fixture
def data(tmp_path) -> Path:
    """The first 8 records of the bundled SFT data."""
    path = tmp_path / "sft8.jsonl"
    path.write_text("".join(SFT_FILE.read_text().splitlines(keepends=True)[:8]))
    return path


def args_of(data: Path, out: Path, *extra) -> list[str]:
    """Stage 03 (sft: no regions) on the 8 records in fp32 on the CPU, steps of 4 samples in one
    micro-batch, a resume state after every step; `extra` last (argparse keeps the last of a flag)."""
    flags = ["--data", data, "--out", out, "--objective", "sft", "--max-length", 384, "--batch-size", 4]
    flags += ["--micro-batch-size", 4, "--device", "cpu", "--precision", "fp32", "--save-every", 1]
    return [*map(str, flags), "--lr", "1e-3", *map(str, extra)]


def strict_log(out: Path) -> list[dict]:
    """log.jsonl as strict JSON: a bare NaN or Infinity is refused."""

    def no_constant(name):
        raise AssertionError(f"log.jsonl holds {name}")

    return [
        json.loads(line, parse_constant=no_constant) for line in (out / "log.jsonl").read_text().splitlines()
    ]


def state_of(out: Path) -> dict:
    return torch.load(out / "resume" / "state.pt", map_location="cpu", weights_only=False)


def all_finite(tensors) -> bool:
    return all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


# ---------------------------------------------------------------------------------------
# Stage 03 stops a run that diverges
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("save_every", [1, 50])
def test_a_learning_rate_that_diverges_stops_in_one_line_and_writes_no_nan_model(
    tmp_path, data, capsys, save_every
):
    """--lr 1e30 gave `loss nan`, `done`, exit 0 and a model of NaN. Now: exit 2, one line, no model; with a
    resume state (after step 1) it stays, finite and marked, beside a strict-JSON log; without one (the
    first would come at step 50) --out is left empty, as it was opened."""
    out = tmp_path / "o"
    argv = args_of(data, out, "--max-steps", 3, "--lr", "1e30", "--save-every", save_every)
    line, printed = refused(train.main, argv, capsys)
    assert line.startswith(f"error: {DIVERGED} at step ") and "no model written" in line, line
    assert "train (steps): 1/3" in printed  # the steps before it were shown as they ran
    assert not (out / "model.safetensors").exists() and not (out / "meta.json").exists()
    if save_every == 50:
        assert "start over with a lower --lr, e.g. --lr 1e+29" in line and list(out.iterdir()) == []
        return
    assert "--resume --lr 1e+29" in line
    log = strict_log(out)
    assert log[-1]["step"] == int(line.split(" at step ")[1].split("/")[0])
    state = state_of(out)
    assert state["step"] == len(log) - 1 and all_finite(state["model"].values())
    assert (out / "resume" / DIVERGED_FILE).exists()


def nan_at_call(monkeypatch, call: int) -> None:
    """Stage 03's micro-batch loss is NaN at its `call`-th call (one micro-batch per step here: that step)."""
    original, calls = train.micro_batch_loss, [0]

    def loss(*a, **kw):
        calls[0] += 1
        value, stats = original(*a, **kw)
        return (value * math.nan, stats) if calls[0] == call else (value, stats)

    monkeypatch.setattr(train, "micro_batch_loss", loss)


def test_a_nan_loss_keeps_the_last_resume_state_and_resume_goes_on_with_a_lower_lr(
    tmp_path, data, capsys, monkeypatch
):
    """NaN at step 3 of 4: the weights of step 2 are not touched, the resume state of step 2 stays, the
    diverged step is logged with null; --resume with a lower --lr (allowed only after a divergence)
    continues from step 2 to a finite model, its log the first two steps and the resumed ones."""
    out = tmp_path / "o"
    nan_at_call(monkeypatch, 3)
    line, _ = refused(train.main, args_of(data, out, "--max-steps", 4), capsys)
    assert f"{DIVERGED} at step 3/4: the loss is nan" in line and "resume state of step 2" in line
    before = strict_log(out)
    assert [r["step"] for r in before] == [1, 2, 3] and before[2]["loss"] is None
    assert state_of(out)["step"] == 2
    monkeypatch.undo()
    assert train.main(args_of(data, out, "--max-steps", 4, "--lr", "1e-4", "--resume")) == 0
    after = strict_log(out)
    assert after[:2] == before[:2] and [r["step"] for r in after] == [1, 2, 3, 4]
    assert all(r["lr"] < 1e-4 + 1e-12 for r in after[2:]) and all(math.isfinite(r["loss"]) for r in after)
    assert all_finite(load_file(str(out / "model.safetensors")).values())
    assert not (out / "resume" / DIVERGED_FILE).exists()  # the next state ends the exception


def test_weights_that_turn_nonfinite_are_caught_before_a_resume_state_keeps_them(
    tmp_path, data, capsys, monkeypatch
):
    """A weight that is infinite after step 2's update, with the step's loss and gradient finite: the check
    before the save stops the run; the state of step 1 stays."""
    out, original = tmp_path / "o", train.optimizer_step
    steps = [0]

    def step_then_poison(t, batch):
        stats, steps[0] = original(t, batch), steps[0] + 1
        if steps[0] == 2:
            with torch.no_grad():
                next(t.model.parameters()).view(-1)[-1] = math.inf
        return stats

    monkeypatch.setattr(train, "optimizer_step", step_then_poison)
    line, _ = refused(train.main, args_of(data, out, "--max-steps", 3), capsys)
    assert "at step 2/3: 1 weight tensor(s) hold NaN or infinite values" in line, line
    assert state_of(out)["step"] == 1 and not (out / "model.safetensors").exists()


def test_a_nonfinite_model_is_refused_at_load(tmp_path, data, capsys):
    """A checkpoint of a run that diverged before this check (all its weights NaN) as --model: one line."""
    model = load_causal_lm(str(TINY_MODEL), torch.float32)
    with torch.no_grad():
        next(model.parameters()).fill_(math.nan)
    folder = tmp_path / "nan-model"
    model.save_pretrained(folder)
    load_tokenizer(str(TINY_MODEL)).save_pretrained(folder)
    line, _ = refused(train.main, args_of(data, tmp_path / "o", "--max-steps", 1, "--model", folder), capsys)
    assert line.startswith(f"error: --model {folder}: 1 weight tensor(s) hold NaN"), line


def test_under_ddp_every_process_stops_at_the_same_step(tmp_path, data):
    """Two processes (gloo): both stop at the diverged step, none writes a model, the log is strict JSON."""
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29541"]
    cmd += [str(ROOT / "03_train_cuset.py"), *args_of(data, out, "--max-steps", 3, "--lr", "1e30")]
    cmd += ["--micro-batch-size", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode != 0
    # each rank that printed before torchrun ended the other: the same line
    lines = {x for x in r.stderr.splitlines() if x.startswith(f"error: {DIVERGED} at step 2/3")}
    assert len(lines) == 1, r.stderr[-3000:]
    assert not (out / "model.safetensors").exists() and [x["step"] for x in strict_log(out)] == [1, 2]
    assert state_of(out)["step"] == 1 and all_finite(state_of(out)["model"].values())


# ---------------------------------------------------------------------------------------
# --resume: a damaged state, a full disk
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> tuple[Path, Path]:
    """(data, --out) of a run of 2 steps stopped after step 1 (--stop-after 1), with its resume state."""
    root = tmp_path_factory.mktemp("stopped")
    data = root / "sft8.jsonl"
    data.write_text("".join(SFT_FILE.read_text().splitlines(keepends=True)[:8]))
    assert train.main(args_of(data, root / "o", "--max-steps", 2, "--stop-after", 1)) == 0
    return data, root / "o"


def copy_of(run: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    data, out = run
    shutil.copytree(out, tmp_path / "o")
    return data, tmp_path / "o"


@pytest.mark.parametrize("damage", ["cut short", "empty", "not a state", "NaN weights"])
def test_a_damaged_resume_state_is_one_line_naming_it(stopped_run, tmp_path, capsys, damage):
    data, out = copy_of(stopped_run, tmp_path)
    state = out / "resume" / "state.pt"
    if damage == "cut short":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    elif damage == "empty":
        state.write_bytes(b"")
    elif damage == "not a state":
        torch.save([1, 2, 3], state)
    else:
        saved = torch.load(state, weights_only=False)
        next(iter(saved["model"].values())).fill_(math.nan)
        torch.save(saved, state)
    line, _ = refused(train.main, args_of(data, out, "--max-steps", 2, "--resume"), capsys)
    assert line.startswith(f"error: {state}: ") and "--force" in line, line


def test_resume_counts_the_state_it_replaces_as_room(stopped_run, tmp_path, capsys, monkeypatch):
    """A disk with room for the run less the resume state it holds: --resume goes on (the state is one of
    the two the peak counts); a run starting over there is refused, as it needs the whole peak."""
    data, out = copy_of(stopped_run, tmp_path)
    model = load_causal_lm(str(TINY_MODEL), torch.float32)
    held = sum(f.stat().st_size for f in (out / "resume").iterdir())
    free = cuset_common.training.checkpoint.checkpoint_room(model, "adamw") - held + 4096
    real, usage = shutil.disk_usage, collections.namedtuple("usage", "total used free")

    def disk_usage(path):
        inside = Path(path).resolve().is_relative_to(tmp_path.resolve())
        return usage(free * 4, free * 3, free) if inside else real(path)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    assert train.main(args_of(data, out, "--max-steps", 2, "--resume")) == 0
    line, _ = refused(train.main, args_of(data, tmp_path / "new", "--max-steps", 2), capsys)
    assert "needs about" in line


def test_a_full_disk_while_saving_a_resume_state_is_one_line_and_keeps_the_previous(
    stopped_run, tmp_path, capsys, monkeypatch
):
    """ENOSPC halfway through state.pt: one line naming it, no .resume.tmp left, the state of step 1 as it
    was; --resume on a disk with room finishes the run."""
    data, out = copy_of(stopped_run, tmp_path)
    before = (out / "resume" / "state.pt").read_bytes()

    class FullDisk:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            if self.written > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(
        cuset_common.training.checkpoint, "open", lambda p, mode: FullDisk(open(p, mode)), raising=False
    )
    line, _ = refused(train.main, args_of(data, out, "--max-steps", 2, "--resume"), capsys)
    tmp_state = out / ".resume.tmp" / "state.pt"
    assert line == f"error: no space left on device writing {tmp_state}: free space or choose another --out"
    assert not (out / ".resume.tmp").exists() and (out / "resume" / "state.pt").read_bytes() == before
    monkeypatch.undo()
    assert train.main(args_of(data, out, "--max-steps", 2, "--resume")) == 0
    assert [r["step"] for r in strict_log(out)] == [1, 2]


# ---------------------------------------------------------------------------------------
# The TRL port
# ---------------------------------------------------------------------------------------


def test_the_trl_port_stops_a_run_that_diverges_and_writes_no_model(tmp_path, data, capsys):
    pytest.importorskip("trl")
    trl_train = load_script("research/trl_sft.py")
    out = tmp_path / "trl"
    argv = ["--data", data, "--out", out, "--objective", "sft", "--max-length", 384, "--batch-size", 4]
    argv += [
        "--micro-batch-size",
        4,
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--max-steps",
        3,
        "--lr",
        1e30,
    ]
    line, _ = refused(trl_train.main, argv, capsys)
    assert line.startswith(f"error: {DIVERGED} at step ") and "start over with a lower --lr" in line, line
    assert not (out / "model.safetensors").exists()


# ---------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------


def test_the_comparison_records_a_diverged_training_and_goes_on(tmp_path):
    """A stage-03 call that stopped so is recorded (its run done, as diverged) instead of failing the whole
    comparison; any other failure still does."""
    from research.comparison.runner import after_step
    from research.comparison.steps import diverged, group_done

    out = tmp_path / "run" / "ckpt"
    step = {"stage": "03", "out": out, "inputs": [], "argv": ["--lr", "1e30", "--out", str(out)]}
    profile = {"stage": "01", "out": tmp_path / "run" / "profile-heldout", "inputs": [], "argv": []}
    log = tmp_path / "run" / "log.txt"
    log.parent.mkdir()
    log.write_text("step 1/3 | loss nan\nerror: something else\n")
    with pytest.raises(UserError):
        after_step(step, ["python", "03_train_cuset.py"], 2, log.parent)
    message = f"{DIVERGED} at step 2/3: the loss is nan (--lr 1e+30); no model written"
    log.write_text(f"step 1/3 | loss nan\nerror: {message}\n")
    assert after_step(step, ["python", "03_train_cuset.py"], 2, log.parent) is True
    assert diverged(step) == message and group_done([step, profile])
    assert diverged(step | {"argv": ["--lr", "1e-4", "--out", str(out)]}) is None  # other arguments: train


def per_run_with(diverged: dict[str, bool]) -> dict:
    """Synthetic runs: two sft seeds and two cuset seeds, with one token metric and per-sample units; a
    diverged run has no numbers (as aggregate records it)."""
    runs = {}
    for name, gone in diverged.items():
        objective, seed = name.split("-seed")
        value = 1.0 if objective == "sft" else 0.5
        numbers = {"metrics": {"all.nll": value}, "units": {"all.nll": [value, value + 0.1]}}
        runs[name] = {"objective": objective, "seed": int(seed)}
        runs[name] |= (
            {"diverged": "training diverged at step 2/3", "metrics": {}, "units": {}} if gone else numbers
        )
    return runs


def test_the_report_says_diverged_instead_of_a_number():
    """An objective whose every seed diverged: "diverged" in its cells and no paired row, never 0.000; one
    seed of two: the other seed's numbers, and its row says how many diverged."""
    from types import SimpleNamespace

    from research.comparison.bootstrap import paired
    from research.comparison.metrics import seed_table
    from research.comparison.report import row_name, table_cell

    args = SimpleNamespace(objectives=["sft", "cuset"], eval_base=False, bootstrap=20)
    per_run = per_run_with({"sft-seed0": False, "sft-seed1": True, "cuset-seed0": True, "cuset-seed1": True})
    table = seed_table(per_run, ["sft", "cuset"])
    res = {"per_run": per_run, "table": table}
    assert table_cell(table, "cuset", "all.nll") == "diverged"
    assert row_name(res, "cuset") == "cuset (every seed diverged)"
    assert table_cell(table, "sft", "all.nll") == "1.000" and table["sft"]["all.nll"]["n"] == 1
    assert row_name(res, "sft") == "sft (1 of 2 seeds diverged)"
    assert paired(args, per_run) == {}  # cuset has no seed to pair
    per_run = per_run_with({"sft-seed0": False, "cuset-seed0": False, "cuset-seed1": True})
    assert paired(args, per_run)["cuset"]["all.nll"]["diff"] == pytest.approx(-0.5)


def test_a_comparison_whose_trainings_diverge_reports_them_as_diverged(tmp_path):
    """End to end: both objectives diverge (--lr 1e30); the comparison finishes (exit 0), skips their
    profiles and evaluations, and comparison.md names them "diverged"; a second call trains nothing."""
    train8, held3 = tmp_path / "train8.jsonl", tmp_path / "eval3.jsonl"
    train8.write_text("".join(SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:8]))
    held3.write_text("".join(EVAL_SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:3]))
    argv = [sys.executable, str(ROOT / "research" / "compare_objectives.py"), "--preset", "cpu-quick"]
    argv += ["--objectives", "sft,cuset", "--seeds", "1", "--max-length", "512", "--modes", "kernel"]
    argv += ["--regions-args", "--permutations 10 --html-samples 1", "--data", str(train8)]
    argv += ["--train-args", "--max-steps 2 --batch-size 4 --micro-batch-size 4 --save-every 1 --lr 1e30"]
    argv += ["--eval-data", str(held3), "--out", str(tmp_path / "out")]
    first = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "## Runs that diverged" in md and "| cuset (every seed diverged) | diverged |" in md
    assert not (tmp_path / "out" / "sft-seed0" / "profile-heldout").exists()
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and "run 1/2 sft-seed0: diverged, skipped" in again.stdout, again.stdout


def test_room_messages_give_sizes_in_a_unit_that_shows_them():
    assert [size_text(n) for n in (512, 2048, 146.6e6, 1.2e9)] == ["512 B", "2.0 KB", "146.6 MB", "1.2 GB"]
