"""Where the project's files are, and the fixed settings every part shares (nvcc flags, prompt levels)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
DATA = ROOT / "data"
TASKS_FILE = DATA / "tasks" / "tasks.jsonl"
SFT_FILE = DATA / "sft" / "train.jsonl"  # standalone mode: whole programs
# Kernel mode, with renamed copies of each train task (data/build_sft.py). The default data of
# stages 01-03: on the bundled tiny model, the only SFT data after which answers compile (README).
SFT_KERNEL_FILE = DATA / "sft" / "train_kernel.jsonl"
# The same without the copies: the training data of a real model, which needs none (--preset cpu-real).
SFT_KERNEL_ORIGINALS_FILE = DATA / "sft" / "train_kernel_originals.jsonl"
# Held-out SFT data: the same records from the `eval` split (held-out ops; no renamed copies), so that
# stage 01 can score a trained checkpoint on tasks it never saw (research/compare_objectives.py).
EVAL_SFT_FILE = DATA / "sft" / "eval.jsonl"
EVAL_SFT_KERNEL_FILE = DATA / "sft" / "eval_kernel.jsonl"
TINY_MODEL = DATA / "models" / "tiny-cuda-lm"
SMOLLM2_MODEL = DATA / "models" / "smollm2-135m-instruct"  # built by data/build_smollm2.py

# nvcc: fixed flags for every compile (reference programs, harnesses, candidates). Without a
# GPU nvcc only decides compile_error, which does not depend on the architecture, so we compile
# for one (Ampere, sm_80: every feature our tasks use exists there); on a GPU, for the GPU present.
NVCC_FLAGS = ["-O2", "-std=c++17", "-lineinfo"]
NVCC_DEFAULT_ARCH = ["-gencode", "arch=compute_80,code=sm_80"]
NVCC_NATIVE_ARCH = ["-arch=native"]

SYSTEM_PROMPT = "You are an expert CUDA programmer. You write correct, efficient CUDA C++."
LEVELS = (1, 2, 3)
MODES = ("standalone", "kernel")
