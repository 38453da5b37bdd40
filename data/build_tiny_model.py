"""Build the bundled tiny CUDA base model data/models/tiny-cuda-lm, so the whole pipeline runs
offline on a CPU.

What it does, top to bottom:
  1. corpus, only from sources whose licence we can name: the `pretrain` split of
     data/tasks/tasks.jsonl (our own; bench.cu, the kernel-mode reference kernels, and chat
     examples in the exact prompt format of the stages, levels 1-3, both modes) plus a
     deterministic, device-code-first sample of the CCCL headers the CUDA toolkit ships under
     include/cccl (CUB, Thrust, libcu++). Each header's licence is read from its own banner;
     only files under a permissive licence are used, the banners themselves are kept out of the
     training text, and what was used and left out is recorded per source and licence. The
     `train` and `eval` splits are never trained on: they are what the pipeline fine-tunes and
     evaluates on.
  2. a byte-level BPE tokenizer (no normalization, exact round trip, character offsets) with
     ChatML special tokens and chat template;
  3. a small Llama-architecture causal LM trained from scratch, logging train / validation loss
     (validation = held-out CCCL header files);
  4. quality: mean NLL of the eval split's reference programs and kernels (never seen), per
     token against uniform ln(vocab) and per byte (comparable across tokenizers), and a greedy
     answer to an eval kernel prompt;
  5. save everything to a temp folder, reload it from there, and rename it into place.

Deterministic: the same tasks file, CCCL headers, arguments and thread count give the same
tokenizer and the same weights (on the same CPU type). bf16 autocast is on by default only where
the CPU computes bfloat16 natively; the bundled model was built with it on, so pass --bf16 to
reproduce it. --max-minutes is a wall-clock safety cap; a build that hits it stops early, says so,
and is no longer the deterministic default. How long a full build takes, with and without native
bf16: docs/performance.md, "Building the models".

    python data/build_tiny_model.py                                  # full build
    python data/build_tiny_model.py --threads 2                      # float32 on a CPU without bf16
    python data/build_tiny_model.py --steps 60 --out /tmp/tiny       # quick check
    python data/build_tiny_model.py --cuda-include /opt/cuda/include # toolkit elsewhere

Inputs: data/tasks/tasks.jsonl (read at build time), the CUDA toolkit's include folder with the
CCCL headers under cccl/ (found from --cuda-include, CUDA_HOME / CUDA_PATH, nvcc on PATH, or
/usr/local/cuda); the build refuses to run without them.
Output: --out (default data/models/tiny-cuda-lm) with config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja,
build_report.json and README.md (the model card).
"""

from __future__ import annotations

import os

# Everything is local: never let transformers reach for the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import math
import re
import shutil
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

transformers.utils.logging.disable_progress_bar()  # one line per step is the log; no shard bars

# The shared plumbing lives at the repo root; this builder lives in data/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cuset_common.cli import UserError
from cuset_common.files import replace_dir_atomic, sha256_file, write_text_atomic
from cuset_common.paths import LEVELS, MODES, ROOT, TASKS_FILE, TINY_MODEL
from cuset_common.progress import duration
from cuset_common.tasks import build_messages, fence, load_tasks
from cuset_common.training import schedule  # stage 03's: the tiny model trained on its lr_at

EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [EOT, IM_START, IM_END]  # ids 0, 1, 2
# ChatML. The rendered prompt (add_generation_prompt) is a prefix of the rendered conversation,
# which is what the stages rely on to mask prompt tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MAX_DISK_BYTES = 25 * 1000 * 1000

# The CCCL libraries the header corpus is drawn from: folder under the toolkit's include/cccl
# (CUDA 13 layout) -> library. nv/ is libcu++'s target-macro layer (its banner says so).
CCCL_LIBRARIES = {"cub": "CUB", "thrust": "Thrust", "cuda": "libcu++", "nv": "libcu++"}
# Headers by priority, relative to include/cccl: device code (block/warp/thread collectives,
# atomics, barriers, PTX wrappers, Thrust's CUDA backend) before host-side and metaprogramming
# headers; the last group takes the rest, so a larger --header-bytes can use all of it.
HEADER_PRIORITY = [
    ["cub/block/**/*", "cub/warp/**/*", "cub/thread/**/*", "cub/grid/**/*"],
    [
        "cuda/__atomic/**/*",
        "cuda/__barrier/**/*",
        "cuda/__warp/**/*",
        "cuda/__memcpy_async/**/*",
        "cuda/__ptx/**/*",
    ],
    ["cub/agent/**/*", "thrust/system/cuda/detail/**/*"],
    ["cub/device/**/*", "cub/detail/**/*", "cub/iterator/**/*"],
    ["**/*"],
]
# A leading comment block that is a license banner: /* ... */ or a run of // lines.
LICENSE_BANNER = re.compile(r"\A\s*(/\*.*?\*/|(?://[^\n]*\n)+)", re.DOTALL)
# A header's licence is what its own banner states. Only permissive licences are recognized;
# a file whose banner states none of them, or names another licence (a few libcu++ headers
# carry the NVIDIA Software License), is left out and counted.
SPDX_LINE = re.compile(r"SPDX-License-Identifier:\s*(.*?)\s*(?:\*/)?\s*$", re.MULTILINE)
PERMISSIVE_SPDX = {"Apache-2.0", "Apache-2.0 WITH LLVM-exception", "BSD-3-Clause", "BSL-1.0", "MIT"}
LICENSE_STATEMENTS = [  # (SPDX id, statement) for banners without an SPDX line
    ("Apache-2.0 WITH LLVM-exception", re.compile(r"under the Apache License v2\.0 with LLVM Exceptions")),
    ("Apache-2.0", re.compile(r"Licensed under the Apache License, Version 2\.0")),
    (
        "BSD-3-Clause",
        re.compile(r"Redistribution and use in source and binary forms.*Neither the name", re.DOTALL),
    ),
    ("BSL-1.0", re.compile(r"Distributed under the Boost Software License")),
]
OTHER_LICENSE = re.compile(r"NVIDIA SOFTWARE LICENSE|proprietary|LicenseRef-", re.IGNORECASE)
POOL_LICENSE = "own work (generated by data/build_tasks.py)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=Path, default=TASKS_FILE, help="task file (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=TINY_MODEL, help="output model folder (default: %(default)s)")
    ap.add_argument(
        "--cuda-include",
        type=Path,
        default=None,
        help="CUDA toolkit include folder (default: from CUDA_HOME, CUDA_PATH, nvcc, /usr/local/cuda)",
    )
    # corpus
    ap.add_argument(
        "--header-bytes", type=int, default=3_000_000, help="header text to train on (default: %(default)s)"
    )
    ap.add_argument(
        "--val-header-bytes",
        type=int,
        default=200_000,
        help="held-out header text for validation loss (default: %(default)s)",
    )
    ap.add_argument(
        "--pool-weight",
        type=float,
        default=0.6,
        help="share of training windows drawn from the pretrain-task pool; it is small but "
        "closest to the target, so it is upweighted (default: %(default)s)",
    )
    ap.add_argument(
        "--min-corpus-bytes",
        type=int,
        default=50_000,
        help="fail if the training corpus is smaller (default: %(default)s)",
    )
    # tokenizer and model
    ap.add_argument(
        "--vocab-size",
        type=int,
        default=8192,
        help="BPE vocabulary incl. special tokens (default: %(default)s)",
    )
    ap.add_argument("--hidden", type=int, default=256, help="model width (default: %(default)s)")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (default: %(default)s)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (default: %(default)s)")
    ap.add_argument(
        "--kv-heads",
        type=int,
        default=2,
        help="key/value heads, grouped-query attention (default: %(default)s)",
    )
    ap.add_argument("--ffn", type=int, default=768, help="MLP width (default: %(default)s)")
    # training
    ap.add_argument("--steps", type=int, default=550, help="optimizer steps (default: %(default)s)")
    ap.add_argument(
        "--seq-len", type=int, default=1024, help="training window in tokens (default: %(default)s)"
    )
    ap.add_argument("--batch-size", type=int, default=4, help="windows per step (default: %(default)s)")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=50, help="linear warmup steps (default: %(default)s)")
    ap.add_argument(
        "--weight-decay",
        type=float,
        default=0.1,
        help="AdamW weight decay on matrices (default: %(default)s)",
    )
    ap.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bfloat16 autocast for training matmuls, faster on CPUs with AVX512-BF16 or AMX but slower "
        "than float32 on CPUs without (emulated); weights stay float32 (default: on where this CPU "
        "computes bfloat16 natively, off elsewhere)",
    )
    ap.add_argument(
        "--seed", type=int, default=1234, help="seed for init and batch order (default: %(default)s)"
    )
    # One thread: on a shared machine two threads wait on each other whenever another process takes
    # a core, where one thread keeps its pace (docs/performance.md, "Building the models").
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; part of the determinism contract (default: %(default)s)",
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=20.0,
        help="wall-clock cap for the whole build; training stops early to fit (default: %(default)s)",
    )
    ap.add_argument(
        "--log-every", type=int, default=10, help="steps between train-loss lines (default: %(default)s)"
    )
    ap.add_argument(
        "--eval-every", type=int, default=100, help="steps between validation losses (default: %(default)s)"
    )
    ap.add_argument(
        "--sample-tokens",
        type=int,
        default=160,
        help="greedy tokens for the quality sample (default: %(default)s)",
    )
    args = ap.parse_args(argv)

    if not 4096 <= args.vocab_size <= 16384:
        ap.error("--vocab-size must be between 4096 and 16384")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        ap.error("--hidden must be divisible by --heads, and --heads by --kv-heads")
    if not 0.0 <= args.pool_weight <= 1.0:
        ap.error("--pool-weight must be in [0, 1]")
    for name in ("steps", "seq_len", "batch_size", "threads", "log_every", "eval_every", "max_minutes"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.bf16 is None:  # resolved here, so the report records what the build used
        args.bf16 = native_bf16()
    return args


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX). Without it autocast
    emulates bf16 and trains slower than float32, enough to run the default build past --max-minutes
    (the measurement: docs/performance.md, "Building the models")."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu, private but long-standing
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


# ---------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------


def missing_cccl(include: Path) -> list[str]:
    """The CCCL library folders that `include` lacks."""
    return [f"cccl/{name}/" for name in CCCL_LIBRARIES if not (include / "cccl" / name).is_dir()]


def find_cuda_include(explicit: Path | None) -> Path:
    """The toolkit's include folder that holds the CCCL headers; without them there is no corpus
    we may use besides the small task pool, so refuse rather than build a weaker model silently."""
    if explicit is not None:
        if missing := missing_cccl(explicit):
            raise UserError(
                f"--cuda-include {explicit}: no CCCL headers there (missing {', '.join(missing)}); "
                f"point it at a CUDA 13+ toolkit's include folder"
            )
        return explicit
    candidates = [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        # nvcc may be a wrapper script outside the toolkit, so also try the usual install path.
        candidates.append(Path(nvcc).resolve().parents[1] / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    found = next((c for c in candidates if not missing_cccl(c)), None)
    if found is None:
        raise UserError(
            f"no CUDA toolkit with the CCCL headers ({', '.join(f'cccl/{n}/' for n in CCCL_LIBRARIES)}) "
            f"in {', '.join(map(str, candidates))}: install a CUDA 13+ toolkit or pass --cuda-include"
        )
    return found


def split_license(text: str) -> tuple[str, str]:
    """(leading license banners, the rest). The banners are identical boilerplate in every file,
    no CUDA to learn, so they stay out of the training text; they are what states the licence."""
    banners = []
    while (m := LICENSE_BANNER.match(text)) and re.search(r"copyright|license|SPDX", m.group(1), re.I):
        banners.append(m.group(1))
        text = text[m.end() :]
    return "\n".join(banners), text.lstrip("\n")


def line_at(text: str, pos: int) -> str:
    """The line of `text` holding position `pos`, without comment markers."""
    end = text.find("\n", pos)
    return text[text.rfind("\n", 0, pos) + 1 : end if end >= 0 else len(text)].strip(" \t/*")


def banner_license(banner: str) -> tuple[str | None, str]:
    """(SPDX id, evidence): the permissive licence a banner states and the line stating it, or
    (None, why the file is left out)."""
    if m := OTHER_LICENSE.search(banner):
        return None, f"other license: {line_at(banner, m.start())}"
    if ids := sorted(set(SPDX_LINE.findall(banner))):
        spdx = " AND ".join(ids)
        return (spdx if set(ids) <= PERMISSIVE_SPDX else None), f"SPDX-License-Identifier: {spdx}"
    stated = [(spdx, m) for spdx, statement in LICENSE_STATEMENTS if (m := statement.search(banner))]
    if not stated:
        return None, "no license statement in the banner"
    return " AND ".join(sorted({spdx for spdx, _ in stated})), " + ".join(
        line_at(banner, m.start()) for _, m in stated
    )


@dataclass
class Header:
    path: str  # relative to the include folder, e.g. cccl/cub/block/block_reduce.cuh
    library: str  # CUB, Thrust, libcu++
    license: str | None  # SPDX id; None: not established as permissive, so never used
    evidence: str  # the banner line stating the licence, or why the file is left out
    text: str  # the file without its license banners
    use: str = "unused"  # train, val, unused (over the byte budget) or excluded

    @property
    def bytes(self) -> int:
        return len(self.text.encode())


def select_headers(include: Path, train_bytes: int, val_bytes: int) -> list[Header]:
    """Every CCCL header, in priority then path order, with its licence and use.

    A permissive file goes to validation when crc32(path) % 20 == 0, so the split does not depend
    on the budgets; each side takes files in order while they fit its budget.
    """
    cccl = include / "cccl"
    seen: set[Path] = set()
    headers: list[Header] = []
    budget = {"train": train_bytes, "val": val_bytes}
    for group in HEADER_PRIORITY:
        paths = sorted(
            {
                p
                for pattern in group
                for p in cccl.glob(pattern)
                if p.is_file() and p.relative_to(cccl).parts[0] in CCCL_LIBRARIES
            }
            - seen
        )
        for path in paths:
            seen.add(path)
            rel = path.relative_to(include).as_posix()
            library = CCCL_LIBRARIES[path.relative_to(cccl).parts[0]]
            try:
                banner, text = split_license(path.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                headers.append(Header(rel, library, None, "not UTF-8", "", "excluded"))
                continue
            license, evidence = banner_license(banner)
            header = Header(
                rel, library, license, evidence, text, "excluded" if license is None else "unused"
            )
            side = "val" if zlib.crc32(rel.encode()) % 20 == 0 else "train"
            if license is not None and header.bytes <= budget[side]:
                budget[side] -= header.bytes
                header.use = side
            headers.append(header)
    return headers


def split_tasks(tasks_path: Path) -> dict[str, list[dict]]:
    tasks = load_tasks(tasks_path)
    splits: dict[str, list[dict]] = {"train": [], "eval": [], "pretrain": []}
    for t in tasks:
        if t.get("split") in splits:
            splits[t["split"]].append(t)
    return splits


def pool_material(pretrain: list[dict]) -> tuple[list[str], list[list[dict]]]:
    """Code documents and chat conversations from the pretrain tasks.

    Chats use the stages' own prompt builder, so the model learns the exact prompt format and
    to answer with one ```cpp block: the whole program (standalone) or the kernels (kernel).
    """
    code, chats = [], []
    for task in pretrain:
        kernels = (task.get("kernel_mode") or {}).get("reference_kernels")
        code.append(task["bench.cu"])
        if kernels:
            code.append(kernels)
        for level in LEVELS:
            for mode in MODES:
                answer = task["bench.cu"] if mode == "standalone" else kernels
                if answer:
                    chats.append(
                        build_messages(task, level, mode) + [{"role": "assistant", "content": fence(answer)}]
                    )
    return code, chats


def check_no_leak(docs: list[str], held_out: list[dict]) -> None:
    """Refuse to train on any train/eval reference program or kernel: they are what the
    pipeline fine-tunes and evaluates on, so the base model must not have seen them."""
    for task in held_out:
        refs = [task["bench.cu"], (task.get("kernel_mode") or {}).get("reference_kernels") or ""]
        for ref in filter(None, (r.strip() for r in refs)):
            if any(ref in d for d in docs):
                raise UserError(
                    f"task {task['id']} ({task['split']}): its reference code also appears in the "
                    f"pretrain pool; fix the splits in the tasks file"
                )


@dataclass
class Corpus:
    splits: dict[str, list[dict]]
    code_docs: list[str]  # pretrain-pool code: bench.cu and reference kernels
    chats: list[list[dict]]  # pretrain-pool conversations (system, user, assistant)
    include: Path  # the toolkit include folder
    headers: list[Header]  # every CCCL header looked at, with its licence and use
    pool_bytes: int = 0
    pool_tokens: int = 0  # filled in once tokenized
    header_tokens: int = 0
    val_name: str = "held-out CCCL headers"

    def used(self, use: str) -> list[Header]:
        return [h for h in self.headers if h.use == use]

    def tokenizer_texts(self) -> list[str]:
        return (
            self.code_docs
            + [m["content"] for c in self.chats for m in c]
            + [h.text for h in self.used("train")]
        )


def collect_corpus(args: argparse.Namespace) -> Corpus:
    """Read the tasks and headers, check that every source is there and nothing held out leaks
    in, and say what was found."""
    splits = split_tasks(args.tasks)
    print(f"tasks {shown(args.tasks)}: " + ", ".join(f"{k}={len(v)}" for k, v in splits.items()))
    if not splits["pretrain"]:
        raise UserError(
            f"{args.tasks}: no tasks with split 'pretrain'; the pool is the core of the corpus "
            f"(run data/build_tasks.py)"
        )
    if not any(t.get("kernel_mode") for t in splits["eval"]):
        raise UserError(
            f"{args.tasks}: no 'eval' task with a kernel_mode harness; the held-out quality check needs one"
        )
    code_docs, chats = pool_material(splits["pretrain"])
    include = find_cuda_include(args.cuda_include)
    headers = select_headers(include, args.header_bytes, args.val_header_bytes)
    for folder, library in CCCL_LIBRARIES.items():
        if not any(h.license and h.path.startswith(f"cccl/{folder}/") for h in headers):
            raise UserError(
                f"{include / 'cccl' / folder}: no header there states a permissive licence, so "
                f"{library} cannot be used; check the toolkit or pass --cuda-include"
            )
    corpus = Corpus(splits, code_docs, chats, include, headers)
    check_no_leak(corpus.tokenizer_texts(), splits["train"] + splits["eval"])

    corpus.pool_bytes = sum(len(d.encode()) for d in code_docs) + sum(
        len(m["content"].encode()) for c in chats for m in c
    )
    header_bytes = sum(h.bytes for h in corpus.used("train"))
    excluded = corpus.used("excluded")
    print(
        f"pretrain pool: {len(splits['pretrain'])} tasks -> {len(code_docs)} code docs + {len(chats)} chats, "
        f"{corpus.pool_bytes:,} bytes"
    )
    print(
        f"CCCL headers in {include / 'cccl'}: {len(corpus.used('train'))} files, {header_bytes:,} bytes for "
        f"training; {len(corpus.used('val'))} files, {sum(h.bytes for h in corpus.used('val')):,} bytes for "
        f"validation; {len(excluded)} files left out (licence not established as permissive)"
    )
    if corpus.pool_bytes + header_bytes < args.min_corpus_bytes:
        raise UserError(
            f"corpus has {corpus.pool_bytes + header_bytes:,} bytes, below --min-corpus-bytes "
            f"{args.min_corpus_bytes:,}: raise --header-bytes or add pretrain tasks"
        )
    if not corpus.used("val"):  # validation needs text the model never trains on
        corpus.val_name = "eval programs"
    return corpus


def source_table(corpus: Corpus, tasks_file: Path) -> tuple[list[dict], list[dict]]:
    """(sources used, files left out): one row per library and licence, with the banner evidence."""
    pool = {
        "source": "CuSeT pretrain task pool",
        "location": f"{shown(tasks_file)} (split pretrain)",
        "license": POOL_LICENSE,
        "evidence": {"written for this repository by data/build_tasks.py": 1},
        "files": 1,
        "tasks": len(corpus.splits["pretrain"]),
        "bytes": corpus.pool_bytes,
        "tokens": corpus.pool_tokens,
    }
    groups: dict[tuple[str, str], list[Header]] = {}
    for h in corpus.headers:
        groups.setdefault((h.library, h.license or h.evidence), []).append(h)
    used, left_out = [pool], []
    for (library, license), hs in sorted(groups.items()):
        folders = ", ".join(sorted({"/".join(h.path.split("/")[:2]) for h in hs}))
        if hs[0].license is None:
            left_out.append(
                {
                    "source": library,
                    "location": folders,
                    "reason": license,
                    "files": len(hs),
                    "bytes": sum(h.bytes for h in hs),
                    "paths": [h.path for h in hs],
                }
            )
            continue
        evidence: dict[str, int] = {}
        for h in hs:
            evidence[h.evidence] = evidence.get(h.evidence, 0) + 1
        by_use = {use: [h for h in hs if h.use == use] for use in ("train", "val")}
        used.append(
            {
                "source": library,
                "location": folders,
                "license": license,
                "evidence": evidence,
                "files": len(by_use["train"]),
                "bytes": sum(h.bytes for h in by_use["train"]),
                "val_files": len(by_use["val"]),
                "val_bytes": sum(h.bytes for h in by_use["val"]),
                "available_files": len(hs),
                "available_bytes": sum(h.bytes for h in hs),
            }
        )
    return used, left_out


# ---------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE: every byte is in the alphabet, no normalization and no prefix space, so
    decode(encode(x)) == x for any text; trim_offsets=False keeps offsets covering whitespace,
    so they tile the text (the stages map character spans to tokens with them)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=EOT, chat_template=CHAT_TEMPLATE
    )


def encode_docs(tok: PreTrainedTokenizerFast, docs: list[str]) -> np.ndarray:
    """All documents as one token stream, each followed by <|endoftext|>."""
    eot = tok.convert_tokens_to_ids(EOT)
    ids: list[int] = []
    for d in docs:
        ids += tok(d, add_special_tokens=False)["input_ids"] + [eot]
    return np.asarray(ids, dtype=np.int64)


def tokenize_corpus(
    args: argparse.Namespace, corpus: Corpus
) -> tuple[PreTrainedTokenizerFast, list[np.ndarray], list[float], torch.Tensor]:
    """Train the tokenizer; return it, the training streams with their sampling weights, and the
    fixed validation windows [n, seq_len + 1]."""
    t_tok = time.time()
    tok = train_tokenizer(corpus.tokenizer_texts(), args.vocab_size)
    if len(tok) < args.vocab_size:
        print(
            f"note: the corpus supports only {len(tok)} of the {args.vocab_size} vocabulary entries asked for"
        )
    chat_docs = [tok.apply_chat_template(c, tokenize=False) for c in corpus.chats]
    streams, weights = [encode_docs(tok, corpus.code_docs + chat_docs)], [1.0]
    if corpus.used("train"):
        streams.append(encode_docs(tok, [h.text for h in corpus.used("train")]))
        weights = [args.pool_weight, 1.0 - args.pool_weight]
    corpus.pool_tokens = int(len(streams[0]))
    corpus.header_tokens = int(len(streams[1])) if len(streams) > 1 else 0
    val_stream = encode_docs(
        tok, [h.text for h in corpus.used("val")] or [t["bench.cu"] for t in corpus.splits["eval"]]
    )
    print(
        f"tokenizer: vocab {len(tok)} in {time.time() - t_tok:.1f}s; tokens: pool {corpus.pool_tokens:,}, "
        f"headers {corpus.header_tokens:,}, validation {len(val_stream):,}"
    )
    for s in streams + [val_stream]:
        if len(s) <= args.seq_len + 1:
            raise UserError(
                f"a token stream has {len(s)} tokens, not more than --seq-len {args.seq_len}; "
                f"lower --seq-len or add data"
            )
    n_val = min(16, len(val_stream) // (args.seq_len + 1))  # evenly spaced, the same at every evaluation
    starts = np.linspace(0, len(val_stream) - args.seq_len - 1, n_val).astype(np.int64)
    val_windows = torch.from_numpy(np.stack([val_stream[s : s + args.seq_len + 1] for s in starts]))
    return tok, streams, weights, val_windows


# ---------------------------------------------------------------------------------------
# Model and training
# ---------------------------------------------------------------------------------------


def make_model(args: argparse.Namespace, tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        # Trained on seq_len windows; RoPE runs past that (worse) for the stages' longer samples.
        max_position_embeddings=max(2048, args.seq_len),
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids(IM_END),
        pad_token_id=tok.convert_tokens_to_ids(EOT),
    )
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(config)


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    # Decay matrices only, not norms (nanoGPT's convention); betas for short runs.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Stage 03's schedule (cuset_common/training/schedule.py: lr_at): linear warmup, then cosine decay to 10%
    of the peak at --steps."""
    return schedule.lr_at(step, args.steps, args.warmup, args.lr, 0.1)


def sample_batch(
    rng: np.random.Generator, streams: list[np.ndarray], weights: list[float], batch_size: int, seq_len: int
) -> torch.Tensor:
    """[batch, seq_len + 1] windows at random offsets; each row's stream is drawn by weight."""
    rows = []
    for source in rng.choice(len(streams), size=batch_size, p=weights):
        stream = streams[source]
        start = rng.integers(0, len(stream) - seq_len - 1)
        rows.append(stream[start : start + seq_len + 1])
    return torch.from_numpy(np.stack(rows))


def lm_loss(model: torch.nn.Module, window: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of [batch, seq+1] windows."""
    logits = model(input_ids=window[:, :-1]).logits  # [batch, seq, vocab]
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())


@torch.no_grad()
def mean_loss(model: torch.nn.Module, windows: torch.Tensor, batch_size: int) -> float:
    model.eval()
    losses = [lm_loss(model, windows[i : i + batch_size]).item() for i in range(0, len(windows), batch_size)]
    model.train()
    return float(np.mean(losses))


def train(
    model: LlamaForCausalLM,
    args: argparse.Namespace,
    streams: list[np.ndarray],
    weights: list[float],
    val_windows: torch.Tensor,
    val_name: str,
    deadline: float,
) -> dict:
    """The training loop; returns the loss history and whether the time cap cut it short."""
    rng = np.random.default_rng(args.seed)
    opt = make_optimizer(model, args)
    model.train()
    history: dict = {"train": [], "val": []}
    recent: list[float] = []
    t_start = time.time()
    step = 0
    while step < args.steps:
        if time.time() > deadline:
            print(
                f"!! --max-minutes reached at step {step}/{args.steps}: stopping early; this build is "
                f"NOT the deterministic default"
            )
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        batch = sample_batch(rng, streams, weights, args.batch_size, args.seq_len)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = lm_loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recent.append(loss.item())
        step += 1

        if step % args.log_every == 0 or step == args.steps:
            elapsed = time.time() - t_start
            tok_s = step * args.batch_size * args.seq_len / elapsed
            history["train"].append((step, float(np.mean(recent))))
            print(
                f"step {step:5d}/{args.steps} | loss {np.mean(recent):.3f} | "
                f"lr {lr_at(step - 1, args):.2e} | {tok_s:,.0f} tok/s | {duration(elapsed)} elapsed, "
                f"ETA {duration(elapsed / step * (args.steps - step))}",
                flush=True,
            )
            recent = []
        if step % args.eval_every == 0 or step == args.steps:
            history["val"].append((step, mean_loss(model, val_windows, args.batch_size)))
            print(f"step {step:5d} | val loss {history['val'][-1][1]:.3f} ({val_name})", flush=True)
    if not history["val"] or history["val"][-1][0] != step:  # stopped early: validate where it stopped
        history["val"].append((step, mean_loss(model, val_windows, args.batch_size)))
    history["steps_done"] = step
    history["stopped_early"] = step < args.steps
    history["train_seconds"] = time.time() - t_start
    return history


# ---------------------------------------------------------------------------------------
# Quality
# ---------------------------------------------------------------------------------------


@torch.no_grad()
def heldout_nll(
    model: torch.nn.Module, tok: PreTrainedTokenizerFast, texts: list[str], seq_len: int
) -> tuple[float, int]:
    """Mean per-token NLL over texts, each read after <|endoftext|> in windows of seq_len tokens
    (no context carried across a window boundary), in float32."""
    model.eval()
    eot = tok.convert_tokens_to_ids(EOT)
    total, count = 0.0, 0
    for text in texts:
        ids = torch.tensor([eot] + tok(text, add_special_tokens=False)["input_ids"])
        for start in range(0, len(ids) - 1, seq_len):
            window = ids[start : start + seq_len + 1][None]  # [1, <= seq_len + 1]
            n = window.shape[1] - 1
            total += lm_loss(model, window).item() * n
            count += n
    return total / count, count


@torch.no_grad()
def greedy_sample(
    model: torch.nn.Module, tok: PreTrainedTokenizerFast, task: dict, max_new_tokens: int
) -> str:
    """The model's greedy answer to a level-1 kernel-mode prompt, as the stages would ask it."""
    prompt = tok.apply_chat_template(
        build_messages(task, 1, "kernel"), add_generation_prompt=True, tokenize=False
    )
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
    )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def measure(
    model: torch.nn.Module, tok: PreTrainedTokenizerFast, eval_tasks: list[dict], args: argparse.Namespace
) -> dict:
    """Held-out NLL of the eval split's programs and kernels, and one greedy answer. Per token is
    what the stages see; per byte (the same total over the texts' UTF-8 bytes) does not depend on
    the tokenizer, so it compares models whose tokenizers differ."""
    programs = [t["bench.cu"] for t in eval_tasks]
    kernels = [t["kernel_mode"]["reference_kernels"] for t in eval_tasks if t.get("kernel_mode")]
    bench_nll, bench_n = heldout_nll(model, tok, programs, args.seq_len)
    kernel_nll, kernel_n = heldout_nll(model, tok, kernels, args.seq_len)
    bench_bytes, kernel_bytes = (sum(len(t.encode()) for t in texts) for texts in (programs, kernels))
    sample_task = next(t for t in eval_tasks if t.get("kernel_mode"))
    sample = greedy_sample(model, tok, sample_task, args.sample_tokens)
    print(
        f"held-out NLL per token (per byte): eval programs {bench_nll:.3f} "
        f"({bench_nll * bench_n / bench_bytes:.4f}) over {bench_n:,} tokens, eval kernels {kernel_nll:.3f} "
        f"({kernel_nll * kernel_n / kernel_bytes:.4f}) over {kernel_n:,} tokens; "
        f"uniform ln({len(tok)}) = {math.log(len(tok)):.3f}"
    )
    print(f"greedy sample (eval task {sample_task['id']}, level 1, kernel mode):\n{sample}\n")
    return {
        "uniform_nll": math.log(len(tok)),
        "eval_bench_nll": bench_nll,
        "eval_bench_tokens": bench_n,
        "eval_bench_bytes": bench_bytes,
        "eval_bench_nll_per_byte": bench_nll * bench_n / bench_bytes,
        "eval_kernel_nll": kernel_nll,
        "eval_kernel_tokens": kernel_n,
        "eval_kernel_bytes": kernel_bytes,
        "eval_kernel_nll_per_byte": kernel_nll * kernel_n / kernel_bytes,
        "sample_task": sample_task["id"],
        "greedy_sample": sample,
    }


# ---------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------


def save_tokenizer(tok: PreTrainedTokenizerFast, folder: Path) -> None:
    tok.save_pretrained(folder)
    # Record the class by its long-standing name so transformers 4.x loads it too (5.x aliases it).
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def shown(path: Path) -> str:
    """A path as the report shows it: relative to the repo when inside it, so reports are portable."""
    path = Path(path).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def toolkit_versions(include: Path) -> dict:
    """CUDA '13.0' from cuda.h's CUDA_VERSION (13000), CCCL '3.0.1' from CCCL_VERSION (3000001)."""

    def define(path: Path, name: str) -> int | None:
        m = path.exists() and re.search(rf"#define\s+{name}\s+(\d+)", path.read_text(errors="replace"))
        return int(m.group(1)) if m else None

    cuda = define(include / "cuda.h", "CUDA_VERSION")
    cccl = define(include / "cccl" / "cuda" / "std" / "__cccl" / "version.h", "CCCL_VERSION")
    return {
        "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "cccl_version": f"{cccl // 1000000}.{cccl // 1000 % 1000}.{cccl % 1000}" if cccl else None,
    }


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def nll_row(q: dict, name: str, label: str) -> str:
    """One row of the model card's held-out NLL table, from the quality fields `<name>_...`."""
    return (
        f"| {label} | {q[f'{name}_tokens']:,} | {q[f'{name}_bytes']:,} | {q[f'{name}_nll']:.3f} "
        f"| {q[f'{name}_nll_per_byte']:.4f} |"
    )


def model_card(r: dict) -> str:
    """The model's README.md, from its build report. A backslash at the end of a template line joins
    the next one to it, for card lines longer than the source's 110 columns."""
    c, m, t, q, a = r["corpus"], r["model"], r["training"], r["quality"], r["args"]
    pool, headers = c["sources"][0], c["sources"][1:]
    rows = [
        f"| {pool['source']} | `{pool['location']}` | {pool['license']} | 1 ({pool['tasks']} tasks) "
        f"| {pool['bytes']:,} |"
    ]
    rows += [
        f"| {h['source']} | `{h['location']}` | {h['license']} "
        f"({', '.join(f'`{e}`: {n}' for e, n in h['evidence'].items())}) | {h['files']} | {h['bytes']:,} |"
        for h in headers
        if h["files"]
    ]
    left_out = "; ".join(
        f"{x['source']} `{x['location']}`: {x['files']} ({x['reason']})" for x in c["left_out"]
    )
    val_files, val_bytes = sum(h["val_files"] for h in headers), sum(h["val_bytes"] for h in headers)
    spare_files = sum(h["available_files"] - h["files"] - h["val_files"] for h in headers)
    header_files, header_bytes = sum(h["files"] for h in headers), sum(h["bytes"] for h in headers)
    bf16 = "on" if a["bf16"] else "off"
    stopped_early = ", STOPPED EARLY by --max-minutes" if t["stopped_early"] else ""
    return f"""# tiny-cuda-lm

A tiny CUDA base model bundled with CuSeT so that every stage runs offline on a CPU in minutes.

**This model only demonstrates the pipeline.** It is {m["params"] / 1e6:.1f}M parameters trained for
{duration(t["train_seconds"])} on a CPU; it cannot write working kernels and cannot reproduce the
paper's numbers. For a real replication pass `--model` with a real instruction model.

Built by `{r["command"]}`; the build is deterministic for the same tasks file, CCCL
headers, arguments and thread count (details in `build_report.json`).

## Corpus

Only text whose licence we can name. Training text per source and licence: each header's licence
is what its own banner states (evidence: the line that states it, and how many of the library's
files under that licence carry it, used or not); the banners are kept out of the training text.
Per-file licences are in `build_report.json`.

| source | where | licence (evidence: files) | files trained on | bytes trained on |
|---|---|---|---|---|
{chr(10).join(rows)}

- Pretrain pool (sha256 of the tasks file `{c["tasks_sha256"][:16]}...`): {c["pretrain_tasks"]} tasks ->
  {c["pool_code_docs"]} code documents (bench.cu, reference kernels) and {c["pool_chats"]} chat examples
  (levels 1-3, standalone and kernel mode, prompts from `cuset_common.tasks.build_messages`, answers in one
  ```cpp block), {pool["tokens"]:,} tokens, drawn for {a["pool_weight"]:.0%} of the training \
windows.
- CCCL headers from `{c["cuda_include"]}/cccl` (CUDA {c["cuda_version"]}, CCCL {c["cccl_version"]}), \
device code
  first, up to {a["header_bytes"]:,} bytes: {header_files} files, {header_bytes:,} bytes,
  {c["header_train_tokens"]:,} tokens; {val_files} other
  permissive files ({val_bytes:,} bytes) held out for validation; {spare_files} permissive files over the \
budget unused.
- Left out, licence not established as permissive: {left_out or "none"}.
- Never trained on: the reference programs and kernels of the `train` ({c["train_tasks"]} tasks) and `eval`
  ({c["eval_tasks"]} tasks) splits.

## Model

{m["architecture"]}: {m["params"]:,} parameters, vocabulary {m["vocab_size"]} (byte-level BPE trained on
the corpus; special tokens `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (end of turn = eos)),
hidden {m["hidden"]}, {m["layers"]} layers, {m["heads"]} heads ({m["kv_heads"]} key/value heads), \
MLP {m["ffn"]},
tied embeddings, float32 weights ({r["weights_bytes"] / 1e6:.1f} MB). ChatML chat template.

## Training

Seed {a["seed"]}, {t["steps_done"]} steps of {a["batch_size"]} x {a["seq_len"]} tokens
({t["tokens_seen"]:,} tokens), AdamW, peak lr {a["lr"]}, warmup {a["warmup"]}, cosine to 10%,
bf16 autocast {bf16}, CPU threads: {a["threads"]}, {duration(t["train_seconds"])} of training
({duration(r["build_seconds"])} for the whole build){stopped_early}.
Final train loss {t["final_train_loss"]:.3f}, validation loss ({t["val_name"]}) {t["final_val_loss"]:.3f}.

## Quality

Mean NLL (nats, float32) on never-seen CUDA, per token (against uniform \
ln({m["vocab_size"]}) = {q["uniform_nll"]:.3f})
and per byte of text (the same total over the UTF-8 bytes: does not depend on the tokenizer, so it
compares models with different tokenizers):

| held-out text | tokens | bytes | NLL per token | NLL per byte |
|---|---|---|---|---|
{nll_row(q, "eval_bench", "`eval` split reference programs (bench.cu)")}
{nll_row(q, "eval_kernel", "`eval` split reference kernels only")}

The programs share host boilerplate with the pretrain pool, so their NLL is lower than the
kernels'. Greedy answer to the level-1 kernel-mode prompt of eval task `{q["sample_task"]}`:

````
{q["greedy_sample"]}
````
"""


def make_report(
    args: argparse.Namespace,
    argv: list[str] | None,
    corpus: Corpus,
    tok: PreTrainedTokenizerFast,
    n_params: int,
    history: dict,
    quality: dict,
    t0: float,
    folder: Path,
) -> dict:
    sources, left_out = source_table(corpus, args.tasks)
    return {
        "command": " ".join(
            ["python", "data/build_tiny_model.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "args": {k: shown(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "numpy": np.__version__,
        },
        "corpus": {
            "tasks_file": shown(args.tasks),
            "tasks_sha256": sha256_file(args.tasks),
            "pretrain_tasks": len(corpus.splits["pretrain"]),
            "train_tasks": len(corpus.splits["train"]),
            "eval_tasks": len(corpus.splits["eval"]),
            "pool_code_docs": len(corpus.code_docs),
            "pool_chats": len(corpus.chats),
            "cuda_include": str(corpus.include),
            **toolkit_versions(corpus.include),
            "header_train_tokens": corpus.header_tokens,
            "sources": sources,
            "left_out": left_out,
            "header_files": {use: {h.path: h.license for h in corpus.used(use)} for use in ("train", "val")},
        },
        "model": {
            "architecture": "LlamaForCausalLM",
            "params": n_params,
            "vocab_size": len(tok),
            "hidden": args.hidden,
            "layers": args.layers,
            "heads": args.heads,
            "kv_heads": args.kv_heads,
            "ffn": args.ffn,
        },
        "training": {
            "val_name": corpus.val_name,
            "steps_done": history["steps_done"],
            "stopped_early": history["stopped_early"],
            "tokens_seen": history["steps_done"] * args.batch_size * args.seq_len,
            "train_seconds": round(history["train_seconds"], 1),
            "final_train_loss": history["train"][-1][1] if history["train"] else float("nan"),
            "final_val_loss": history["val"][-1][1],
            "train_loss": history["train"],
            "val_loss": history["val"],
        },
        "quality": quality,
        "build_seconds": round(time.time() - t0, 1),
        "weights_bytes": (folder / "model.safetensors").stat().st_size,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    deadline = t0 + args.max_minutes * 60 - 45  # leave time to evaluate, save and reload
    torch.set_num_threads(args.threads)

    corpus = collect_corpus(args)
    tok, streams, weights, val_windows = tokenize_corpus(args, corpus)

    model = make_model(args, tok)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: Llama, {n_params:,} params, hidden {args.hidden}, {args.layers} layers, {args.heads} heads "
        f"({args.kv_heads} kv), ffn {args.ffn}; "
        f"{args.steps} steps x {args.batch_size} x {args.seq_len} tokens; "
        f"uniform loss ln({len(tok)}) = {math.log(len(tok)):.3f}"
    )
    history = train(model, args, streams, weights, val_windows, corpus.val_name, deadline)

    # Save to a temp folder beside the output, measure the model reloaded from there (what users
    # will load), and only then rename it into place.
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        save_tokenizer(tok, tmp)
        GenerationConfig(
            eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id, bos_token_id=None
        ).save_pretrained(tmp)
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(tmp)
        quality = measure(model, tok, corpus.splits["eval"], args)

        report = make_report(args, argv, corpus, tok, n_params, history, quality, t0, tmp)
        write_text_atomic(tmp / "build_report.json", json.dumps(report, indent=2) + "\n")
        write_text_atomic(tmp / "README.md", model_card(report))
        if folder_bytes(tmp) > MAX_DISK_BYTES:
            raise UserError(
                f"model folder would be {folder_bytes(tmp) / 1e6:.1f} MB, over the "
                f"{MAX_DISK_BYTES / 1e6:.0f} MB limit: shrink --hidden, --layers, --ffn or --vocab-size"
            )
        replace_dir_atomic(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)

    t = report["training"]
    print(
        f"wrote {out} ({folder_bytes(out) / 1e6:.1f} MB) in {duration(time.time() - t0)}: "
        f"{t['steps_done']} steps, train loss {t['final_train_loss']:.3f}, "
        f"val loss {t['final_val_loss']:.3f}, "
        f"eval-program NLL {quality['eval_bench_nll']:.3f} vs uniform {quality['uniform_nll']:.3f}"
        + (" [STOPPED EARLY: not the deterministic build]" if t["stopped_early"] else "")
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
