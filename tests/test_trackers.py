"""--report-to (cuset_common/trackers.py): what a stage logs reaches TensorBoard, Trackio and
wandb (offline) as it is in the stage's own files, read back with each tracker's reader; a tracker that is
not installed, or unknown, is one line and exit 2 before any work. Stage 03 also draws its curves, and
its MFU is its model FLOPs (cuset_common/training/mfu.py, tests/test_mfu.py) over the step's seconds and
the peak given."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ARGS, MADE, load_script, refused
from safetensors.numpy import load_file
from test_mfu import by_hand

import cuset_common.trackers
from cuset_common.data import encode_sample, load_sft
from cuset_common.paths import ROOT, SFT_FILE, TINY_MODEL

STAGE = {
    key: load_script(script)
    for key, script in [("01", "01_profile.py"), ("03", "03_train_cuset.py"), ("04", "04_eval_kernels.py")]
}
PEAK_TFLOPS = 0.5  # any positive peak: MFU is then defined on a CPU
FLOAT32 = 2.0**-24  # TensorBoard keeps a scalar as float32: relative rounding at most this


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_stage_03(w: dict, out: Path, report_dir: Path, trackers: str, env: dict) -> str:
    """Stage 03 of 3 steps on the world's data as a command (the trackers start in a process of their own),
    TRACKIO_DIR unset (the stage keeps Trackio's files in --report-dir) and `env` set; returns its
    stdout."""
    argv = [*ARGS["03"](w | {"new": out}), "--max-steps", "3", "--batch-size", "2", "--micro-batch-size", "2"]
    argv += ["--report-to", trackers, "--report-dir", report_dir, "--peak-tflops", PEAK_TFLOPS]
    done = subprocess.run(
        [sys.executable, str(ROOT / "03_train_cuset.py"), *map(str, argv)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "TRACKIO_DIR"} | {"OMP_NUM_THREADS": "1"} | env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_name(stdout: str, tracker: str) -> str:
    """The run's name, as the stage says where each tracker keeps it."""
    return re.search(rf"^\[report\] {tracker}: .* \(run (\S+)\)$", stdout, re.M).group(1)


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of the event files in `folder`, read with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def trackio_rows(trackio_dir: Path, run: str) -> list[dict]:
    """The run's rows in a Trackio project, read by Trackio's storage in a process of its own (it takes its
    folder from TRACKIO_DIR when imported)."""
    code = (
        "import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
        f"print(json.dumps(SQLiteStorage.get_logs('cuset', {run!r})))"
    )
    env = os.environ | {"TRACKIO_DIR": str(trackio_dir)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows of a .wandb file: wandb's Record protobufs in LevelDB's log format (blocks of
    32768 bytes, each record in chunks with a 7-byte header: crc32 <I, length <H, type <B, 1 full,
    2 first, 3 middle, 4 last), after the file's 7-byte header (":W&B", a version)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, pending, rows = run_file.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = record.history.item  # a key, or one in parts (wandb's own: _step, _runtime)
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def test_stage_03_reports_its_log_to_tensorboard_and_trackio_and_draws_its_curves(world, tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("trackio")
    out, report = tmp_path / "ckpt", tmp_path / "runs"
    stdout = run_stage_03(world, out, report, "tensorboard,trackio", {})
    log = rows_of(out / "log.jsonl")
    assert [r["step"] for r in log] == [1, 2, 3]
    for row in log:  # MFU: the step's model FLOPs over its seconds and the peak given
        mfu = row["flops"] / row["seconds"] / (PEAK_TFLOPS * 1e12)
        assert row["mfu"] == pytest.approx(mfu, rel=1e-3, abs=1e-5)  # seconds and MFU are rounded
        assert row["tokens_per_s"] == pytest.approx(row["sequence_tokens"] / row["seconds"], rel=1e-3)

    scalars = tensorboard_scalars(report / "tensorboard" / run_name(stdout, "tensorboard"))
    for row in log:
        for key, value in cuset_common.trackers.tracked(row).items():
            assert scalars[key][row["step"]] == pytest.approx(value, rel=FLOAT32, abs=0), (key, row["step"])

    rows = trackio_rows(report / "trackio", run_name(stdout, "trackio"))
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row, got in zip(log, rows):
        expected = cuset_common.trackers.tracked(row)
        assert {k: got[k] for k in expected} == expected  # JSON: exact

    if importlib.util.find_spec("matplotlib"):
        assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"curves (loss, masked share): {out / 'curves.png'}" in stdout


def test_stage_03_reports_to_wandb_offline(world, tmp_path):
    pytest.importorskip("wandb")
    out, report = tmp_path / "ckpt", tmp_path / "runs"
    run_stage_03(world, out, report, "wandb", {"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    (run_file,) = report.glob("wandb/offline-run-*/run-*.wandb")  # wandb makes its wandb/ in --report-dir
    history = wandb_history(run_file)
    log = rows_of(out / "log.jsonl")
    assert [h["_step"] for h in history] == [r["step"] for r in log]
    for row, got in zip(log, history):
        expected = cuset_common.trackers.tracked(row)
        assert {k: got[k] for k in expected} == expected


def test_stage_01_reports_its_throughput_and_findings(world, tmp_path):
    pytest.importorskip("tensorboard")
    out, report = tmp_path / "profile", tmp_path / "runs"
    argv = [*ARGS["01"](world | {"new": out}), "--report-to", "tensorboard", "--report-dir", report]
    assert STAGE["01"].main([*map(str, argv)]) == 0
    (folder,) = (report / "tensorboard").iterdir()
    scalars = tensorboard_scalars(folder)
    batches = sorted(scalars["tokens_per_s"])
    assert batches == list(range(1, len(batches) + 1))  # a row per batch
    tensors, meta = load_file(str(out / "tensors.safetensors")), json.loads((out / "meta.json").read_text())
    last = batches[-1]  # the findings, beside the last batch
    assert scalars["samples"][last] == meta["counts"]["samples"]
    done = [scalars["tokens_done"][b] for b in batches]
    assert done == sorted(done) and done[0] > 0
    p0 = tensors["p0"].astype(np.float64)
    assert scalars["mean_confidence"][last] == pytest.approx(p0.mean(), rel=1e-3)  # p0 is stored in fp16


def test_stage_04_reports_its_summary(world, tmp_path):
    pytest.importorskip("tensorboard")
    out, report = tmp_path / "run", tmp_path / "runs"
    argv = [*ARGS["04"](world | {"new": out}), "--report-to", "tensorboard", "--report-dir", report]
    assert STAGE["04"].main([*map(str, argv)]) == 0
    (folder,) = (report / "tensorboard").iterdir()
    scalars = tensorboard_scalars(folder)
    summary = json.loads((out / "summary.json").read_text())
    expected = cuset_common.trackers.numbers(summary)
    assert "overall/pass@1" in expected and "outcomes/no_code" in expected
    assert {k: v[0] for k, v in scalars.items()} == pytest.approx(expected, rel=FLOAT32)


@pytest.mark.parametrize("stage", ["01", "03", "04"])
def test_a_missing_tracker_package_is_one_line_before_any_work(stage, world, tmp_path, capsys, monkeypatch):
    """wandb as if not installed (find_spec finds no such module): refused while the arguments are read."""
    real = cuset_common.trackers.importlib.util.find_spec
    monkeypatch.setattr(
        cuset_common.trackers.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "wandb" else real(name, *a),
    )
    out = tmp_path / MADE[stage]
    argv = [*ARGS[stage](world | {"new": out}), "--report-to", "tensorboard,wandb"]
    line, printed = refused(STAGE[stage].main, argv, capsys)
    assert "--report-to" in line and "wandb not installed: pip install wandb" in line, line
    assert printed == "" and not out.exists()


def test_an_unknown_tracker_is_one_line(world, tmp_path, capsys):
    out = tmp_path / "run"
    line, _ = refused(STAGE["04"].main, [*ARGS["04"](world | {"new": out}), "--report-to", "mlflow"], capsys)
    assert "unknown mlflow: choose none, or one or more of trackio, tensorboard, wandb" in line, line
    assert not out.exists()


def test_the_comparison_reports_its_table(tmp_path):
    """--report-only on a copy of the committed cpu-real record: the trackers get the table and the paired
    differences of comparison.json (a figure that is null there, a diverged objective's, is NaN)."""
    pytest.importorskip("tensorboard")
    record, report = tmp_path / "cpu-real", tmp_path / "runs"
    shutil.copytree(ROOT / "docs" / "records" / "cpu-real", record)
    script = ROOT / "research" / "compare_objectives.py"
    argv = ["--preset", "cpu-real", "--report-only", "--out", record]
    argv += ["--report-to", "tensorboard", "--report-dir", report]
    done = subprocess.run([sys.executable, str(script), *map(str, argv)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    (folder,) = (report / "tensorboard").iterdir()
    tracked = {k: v[0] for k, v in tensorboard_scalars(folder).items()}
    res = json.loads((record / "comparison.json").read_text())
    expected = cuset_common.trackers.numbers({"table": res["table"], "paired": res["paired"]})
    assert any(k.startswith("table/") for k in expected) and any(k.startswith("paired/") for k in expected)
    assert {k: tracked[k] for k in expected} == pytest.approx(expected, rel=FLOAT32)
    assert all(math.isnan(v) for k, v in tracked.items() if k not in expected)


def test_stage_03s_flops_are_the_configs_by_hand(tmp_path, tiny_tokenizer):
    """One step on one sample: the row's tokens are the sample's (T read, R scored, from the stage's own
    tokenization of it), and its flops the count by hand from the tiny model's config (tests/test_mfu.py)."""
    data, out = tmp_path / "one.jsonl", tmp_path / "ckpt"
    data.write_text(SFT_FILE.read_text().splitlines(keepends=True)[0])
    enc = encode_sample(tiny_tokenizer, load_sft(data)[0], 2048)
    T, R = len(enc["input_ids"]), len(enc["input_ids"]) - enc["response_start"]
    argv = ["--data", data, "--objective", "sft", "--max-steps", 1, "--batch-size", 1, "--device", "cpu"]
    assert STAGE["03"].main([*map(str, [*argv, "--max-length", 2048, "--out", out])]) == 0
    (row,) = rows_of(out / "log.jsonl")
    config = json.loads((TINY_MODEL / "config.json").read_text())
    assert (row["sequence_tokens"], row["tokens"]) == (T, R)
    assert row["flops"] == by_hand(config, T, R) and row["mfu"] is None  # a CPU: no peak, no MFU
