"""The bundled tiny model (data/models/tiny-cuda-lm, built by data/build_tiny_model.py) loads
offline and has what the stages rely on: an exact round-trip tokenizer with character offsets,
a ChatML chat template, an end-of-turn eos, and weights that are trained, not random. Plus the
builder's corpus rules: only headers whose own banner states a permissive licence, banners kept
out of the training text but recorded, every source listed with its licence, file count and
bytes, a clear refusal when the sources are missing, train/eval reference code never trained on."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

# for the scripts this file runs as subprocesses: the tiny model is a local folder, never a hub lookup (this
# process imported huggingface_hub with conftest, before this line)
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from conftest import load_script
from transformers import AutoModelForCausalLM

from cuset_common.paths import ROOT

MODEL_DIR = ROOT / "data" / "models" / "tiny-cuda-lm"

CUDA_SNIPPETS = [
    "__global__ void add(const float* a, const float* b, float* c, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) c[i] = a[i] + b[i];\n"
    "}\n",
    "__shared__ float tile[32][33];\n\ttile[threadIdx.y][threadIdx.x] = in[idx];\n\t__syncthreads();\n",
    "add<<<(n + 255) / 256, 256>>>(d_a, d_b, d_c, n);\r\ncudaDeviceSynchronize();  \n",
    "// réduction: Σ x² — warp 🚀\nfloat v = __shfl_down_sync(0xffffffff, v, 16);\n",
    "  leading spaces, trailing tab\t\n\n\n<<<>>>",
]

FIXTURE = """#include <cuda_runtime.h>

// Grid-stride loop: each thread handles elements i, i + stride, ...
__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, float a, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = a * x[i];
    }
}

int main() {
    const int n = 1 << 20;
    float* d_x = nullptr;
    float* d_y = nullptr;
    cudaMalloc(&d_x, n * sizeof(float));
    cudaMalloc(&d_y, n * sizeof(float));
    scale_kernel<<<1024, 256>>>(d_x, d_y, 2.0f, n);
    cudaDeviceSynchronize();
    cudaFree(d_x);
    cudaFree(d_y);
    return 0;
}
"""

MESSAGES = [
    {"role": "system", "content": "You are an expert CUDA programmer."},
    {"role": "user", "content": "Write a kernel that adds two vectors."},
    {"role": "assistant", "content": "```cpp\n__global__ void add() {}\n```"},
]


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(MODEL_DIR, local_files_only=True, dtype=torch.float32).eval()


def test_folder_is_complete_and_small():
    names = {p.name for p in MODEL_DIR.iterdir()}
    for required in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        "build_report.json",
    ):
        assert required in names, f"{required} missing from {MODEL_DIR}; run python data/build_tiny_model.py"
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) <= 25_000_000
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert config["model_type"] in ("llama", "qwen2")


def test_tokenizer_is_fast_and_round_trips(tiny_tokenizer):
    assert tiny_tokenizer.is_fast
    for text in CUDA_SNIPPETS:
        ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tiny_tokenizer.decode(ids) == text


def test_offsets_map_tokens_to_their_substrings(tiny_tokenizer):
    for text in CUDA_SNIPPETS:
        enc = tiny_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        # Offsets tile the text: every character belongs to a token, in order.
        assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
        assert all(a <= b for a, b in offsets)
        assert all(prev[1] <= cur[0] or prev == cur for prev, cur in zip(offsets, offsets[1:]))
        for tid, (a, b) in zip(enc["input_ids"], offsets):
            if text[a:b].isascii():  # a token inside a multi-byte character decodes to part of it
                assert tiny_tokenizer.decode([tid]) == text[a:b]


def test_cuda_lexemes_have_exact_spans(tiny_tokenizer):
    text = CUDA_SNIPPETS[1]
    enc = tiny_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    start = text.index("__syncthreads")
    covering = [text[a:b] for a, b in enc["offset_mapping"] if a < start + len("__syncthreads") and b > start]
    assert "".join(covering).strip() == "__syncthreads"


def test_chat_template(tiny_tokenizer, model):
    full = tiny_tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    prompt = tiny_tokenizer.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    positions = [full.index(m["content"]) for m in MESSAGES]
    assert positions == sorted(positions)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert full.startswith(prompt)  # the stages mask the prompt by this prefix
    assert full.rstrip("\n").endswith(MESSAGES[2]["content"] + tiny_tokenizer.eos_token)
    assert tiny_tokenizer.eos_token == "<|im_end|>" and tiny_tokenizer.pad_token is not None
    assert model.generation_config.eos_token_id == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.pad_token_id == tiny_tokenizer.pad_token_id


def test_forward_loss_is_trained(tiny_tokenizer, model):
    ids = tiny_tokenizer(FIXTURE, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    # A random model sits at ln(vocab); trained weights must be clearly below it.
    assert math.isfinite(loss) and loss < math.log(len(tiny_tokenizer)) - 2.0, loss


@pytest.fixture(scope="module")
def builder():
    return load_script("data/build_tiny_model.py")


BSD_BANNER = (
    "/*\n * Copyright (c) 2011, NVIDIA CORPORATION.  All rights reserved.\n *\n"
    " * Redistribution and use in source and binary forms, with or without\n"
    " * modification, are permitted provided that the following conditions are met:\n"
    " *     * Neither the name of the NVIDIA CORPORATION nor the\n */\n"
)
LLVM_BANNER = (
    "//===----------------------------------------------------------------------===//\n"
    "// Part of libcu++, under the Apache License v2.0 with LLVM Exceptions.\n"
    "// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception\n"
    "//===----------------------------------------------------------------------===//\n\n"
)
NVIDIA_BANNER = (
    "/*\n * SPDX-FileCopyrightText: Copyright (c) 2021 NVIDIA CORPORATION.\n *\n"
    " * NVIDIA SOFTWARE LICENSE\n */\n"
)
CODE = "// Warp-level sum.\n#pragma once\n__device__ float warp_sum(float v);\n"


def test_split_license_keeps_code_and_ordinary_comments(builder):
    banner = (
        "/*\n * Copyright (c) 2020 NVIDIA CORPORATION.\n */\n// SPDX-License-Identifier: BSD-3-Clause\n\n"
    )
    stated, code = builder.split_license(banner + CODE)
    assert (
        code == CODE and "Copyright (c) 2020" in stated and "SPDX-License-Identifier: BSD-3-Clause" in stated
    )
    assert builder.split_license(CODE) == ("", CODE)


@pytest.mark.parametrize(
    "banner, license",
    [
        (BSD_BANNER, "BSD-3-Clause"),
        (LLVM_BANNER, "Apache-2.0 WITH LLVM-exception"),
        (
            "/*\n * Copyright 2008-2013 NVIDIA Corporation\n *\n"
            ' *  Licensed under the Apache License, Version 2.0 (the "License");\n'
            " */\n",
            "Apache-2.0",
        ),
        (
            "// Copyright (c) 2018 NVIDIA Corporation\n"
            "// Distributed under the Boost Software License v1.0\n",
            "BSL-1.0",
        ),
        (NVIDIA_BANNER, None),  # another licence
        ("// Copyright (c) 2024 NVIDIA CORPORATION.\n// SPDX-License-Identifier: GPL-2.0-only\n", None),
        ("// Copyright (c) 2024 NVIDIA CORPORATION. All rights reserved.\n", None),  # no licence stated
    ],
)
def test_banner_license_accepts_only_stated_permissive_licences(builder, banner, license):
    stated, evidence = builder.banner_license(builder.split_license(banner + CODE)[0])
    assert stated == license and evidence


def fake_include(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / "cccl" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "cccl" / rel).write_text(text)
    return root


def test_headers_are_used_only_under_a_stated_permissive_licence_and_without_banners(builder, tmp_path):
    include = fake_include(
        tmp_path,
        {
            "cub/block/block_sum.cuh": BSD_BANNER + CODE,
            "thrust/fill.h": LLVM_BANNER + CODE,
            "cuda/std/atomic": LLVM_BANNER + CODE,
            "nv/target": LLVM_BANNER + CODE,
            "cuda/pipeline": NVIDIA_BANNER + CODE,
            "cuda/__ptx/generated.h": "// Generated. Do not edit.\n" + CODE,
        },
    )
    headers = {h.path: h for h in builder.select_headers(include, 10_000, 0)}
    assert {p: h.license for p, h in headers.items()} == {
        "cccl/cub/block/block_sum.cuh": "BSD-3-Clause",
        "cccl/thrust/fill.h": "Apache-2.0 WITH LLVM-exception",
        "cccl/cuda/std/atomic": "Apache-2.0 WITH LLVM-exception",
        "cccl/nv/target": "Apache-2.0 WITH LLVM-exception",
        "cccl/cuda/pipeline": None,
        "cccl/cuda/__ptx/generated.h": None,
    }
    assert {p for p, h in headers.items() if h.use == "train"} == {p for p, h in headers.items() if h.license}
    assert all(h.text == CODE for h in headers.values() if h.use == "train")  # banners stay out
    assert headers["cccl/cuda/pipeline"].evidence == "other license: NVIDIA SOFTWARE LICENSE"


def test_builder_uses_bf16_autocast_only_where_the_cpu_has_it_unless_told(builder):
    # Emulated bf16 trains slower than float32 (docs/performance.md, "Building the models"), so it is not the
    # default there.
    assert builder.parse_args([]).bf16 is builder.native_bf16()
    assert builder.parse_args(["--bf16"]).bf16 is True and builder.parse_args(["--no-bf16"]).bf16 is False


def run_builder(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "data" / "build_tiny_model.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_builder_refuses_clearly_without_the_cccl_headers(tmp_path):
    r = run_builder("--cuda-include", str(tmp_path), "--out", str(tmp_path / "model"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr  # one line, no traceback
    for folder in ("cccl/cub/", "cccl/thrust/", "cccl/cuda/", "cccl/nv/"):
        assert folder in r.stderr
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_builder_refuses_a_library_with_no_permissive_header(tmp_path):
    include = fake_include(
        tmp_path,
        {
            "cub/a.cuh": BSD_BANNER + CODE,
            "thrust/b.h": LLVM_BANNER + CODE,
            "cuda/pipeline": NVIDIA_BANNER + CODE,
            "nv/target": LLVM_BANNER + CODE,
        },
    )
    r = run_builder("--cuda-include", str(include), "--out", str(tmp_path / "model"))
    assert r.returncode == 2 and "cccl/cuda" in r.stderr and "libc" in r.stderr, r.stderr


def test_report_and_card_list_every_source_with_licence_files_and_bytes(builder):
    report = json.loads((MODEL_DIR / "build_report.json").read_text())
    card = (MODEL_DIR / "README.md").read_text()
    corpus = report["corpus"]
    sources = [s for s in corpus["sources"] if s["files"]]
    assert sources[0]["source"] == "CuSeT pretrain task pool" and sources[0]["bytes"] > 0
    headers = sources[1:]
    assert {s["source"] for s in headers} == {"CUB", "Thrust", "libcu++"}
    for s in sources:
        assert s["license"] and s["evidence"] and s["files"] > 0 and s["bytes"] > 0
        assert f"| {s['license']} " in card and f"| {s['bytes']:,} |" in card
    for s in headers:  # every licence is one the builder accepts as permissive, and says why
        assert set(s["license"].split(" AND ")) <= builder.PERMISSIVE_SPDX
        assert sum(s["evidence"].values()) == s["available_files"]
    train = corpus["header_files"]["train"]
    assert sum(s["files"] for s in headers) == len(train) and None not in train.values()
    assert all(row["reason"] and row["files"] == len(row["paths"]) for row in corpus["left_out"])
    assert "NVIDIA SOFTWARE LICENSE" in " ".join(row["reason"] for row in corpus["left_out"])
    assert not set(train) & {p for row in corpus["left_out"] for p in row["paths"]}


def test_pool_uses_only_pretrain_tasks_and_the_stage_prompt_format(builder):
    splits = builder.split_tasks(ROOT / "data" / "tasks" / "tasks.jsonl")
    code, chats = builder.pool_material(splits["pretrain"])
    texts = code + [m["content"] for chat in chats for m in chat]
    builder.check_no_leak(texts, splits["train"] + splits["eval"])
    assert all(
        chat[-1]["content"].startswith("```cpp\n") and chat[-1]["content"].endswith("\n```") for chat in chats
    )
    assert len(chats) == 6 * len(splits["pretrain"])  # levels 1-3, standalone and kernel
    held_out = splits["eval"][0]
    with pytest.raises(builder.UserError):
        builder.check_no_leak(texts + ["// copied\n" + held_out["bench.cu"]], [held_out])
