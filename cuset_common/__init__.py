"""Plumbing shared by the stages and the data builders, and the method's formulas that two stages share.

Each stage file tells its part of the method; what two stages must compute alike (the per-sample
threshold, the chunked gold log-prob head) is defined once in method.py, and the plumbing a stage
needs but the method does not (resume state, FSDP sharding and the memory plan, stage 02's report
and HTML page) lives here so that the stage reads as one story. Modules:

  paths      where the project's files are; nvcc flags, prompt levels and modes
  cli        UserError, run_main, the argument parser and its range checks, the device
  files      atomic writes, JSONL reading with file:line errors, sha256
  tasks      CUDABench tasks and the prompt builder (data/build_sft.py and 04_eval_kernels.py word alike)
  artifacts  artifact folders (tensors + meta.json), the checks on them, the rules for --out folders
  data       SFT records in any supported form, and the tokenization every stage uses
  models     loading models and tokenizers with one-line errors; the plain-head check
  method     formulas stages 01-03 share: sample_threshold, gold_logprobs, and their defaults
  data_sources --data as a table, dataset folder or hub id, with --data-fields and --data-where
              (imported as cuset_common.data_sources)

`from cuset_common import X` names every public name of these modules but data_sources. Stage 01's helpers
(batching, resume shards, the tagger and its C++ reading) are in profiler/.
"""
from .artifacts import (EVAL_RUN_FILES, SCHEMA_VERSION, STAGES, TRAIN_RUN_FILES, args_to_json,
                        artifact_stage, aside_dir, check_flat_tensors, check_meta_matches, check_out_dir,
                        check_resume_args, check_room, check_train_out, finishes_out, library_versions,
                        open_out, read_artifact, tokenizer_fingerprint, write_artifact)
from .cli import (ArgumentParser, UserError, check_ranges, describe, load_script, pick_device, run_main,
                  within)
from .data import (PLAIN_PROMPT_TEMPLATE, close_turn, encode_sample, end_of_turn_ids, load_sft,
                   normalize_record, render_prompt_and_response, special_token_strings, strings)
from .files import (append_jsonl, open_input, parse_json_line, read_appended_jsonl, read_jsonl,
                    replace_dir_atomic, sha256_file, write_jsonl_atomic, write_text_atomic)
from .models import (MODEL_PARTS, check_head_is_plain, check_hub_id, check_model_source, load_causal_lm,
                     load_tokenizer, output_head)
from .paths import (DATA, EVAL_SFT_FILE, EVAL_SFT_KERNEL_FILE, LEVELS, MODES, NVCC_DEFAULT_ARCH, NVCC_FLAGS,
                    NVCC_NATIVE_ARCH, ROOT, SFT_FILE, SFT_KERNEL_FILE, SFT_KERNEL_ORIGINALS_FILE,
                    SMOLLM2_MODEL, SYSTEM_PROMPT, TASKS_FILE, TINY_MODEL)
from .tasks import (KERNEL_SIGNATURE, TASK_REQUIRED, build_messages, build_prompt, fence, load_tasks,
                    signature_parts)


# Modules that import torch at once load on first use, so that `from cuset_common import ...` stays as light
# as a plain module (the data builders and bench scripts import it; bench/profile.py would even shadow
# the standard library's `profile`, which torch.distributed imports).
_LAZY = {
    **dict.fromkeys(("RHO", "TAU_MAX", "entropy_of", "gold_logprob_entropy", "gold_logprobs", "head_logits",
                     "row_chunks", "sample_threshold"), "method"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)

__all__ = ["EVAL_RUN_FILES", "SCHEMA_VERSION", "STAGES", "TRAIN_RUN_FILES", "args_to_json", "artifact_stage",
           "aside_dir", "check_flat_tensors", "check_meta_matches", "check_out_dir", "check_resume_args",
           "check_room", "check_train_out", "finishes_out", "library_versions", "open_out", "read_artifact",
           "tokenizer_fingerprint", "write_artifact", "ArgumentParser", "UserError", "check_ranges",
           "describe", "load_script", "pick_device", "run_main", "within", "PLAIN_PROMPT_TEMPLATE",
           "close_turn", "encode_sample", "end_of_turn_ids", "load_sft", "normalize_record",
           "render_prompt_and_response", "special_token_strings", "strings", "append_jsonl", "open_input",
           "parse_json_line", "read_appended_jsonl", "read_jsonl", "replace_dir_atomic", "sha256_file",
           "write_jsonl_atomic", "write_text_atomic", "RHO", "TAU_MAX", "entropy_of", "gold_logprob_entropy",
           "gold_logprobs", "head_logits", "row_chunks", "sample_threshold", "MODEL_PARTS",
           "check_head_is_plain", "check_hub_id", "check_model_source", "load_causal_lm", "load_tokenizer",
           "output_head", "DATA", "EVAL_SFT_FILE", "EVAL_SFT_KERNEL_FILE", "LEVELS", "MODES",
           "NVCC_DEFAULT_ARCH", "NVCC_FLAGS", "NVCC_NATIVE_ARCH", "ROOT", "SFT_FILE", "SFT_KERNEL_FILE",
           "SFT_KERNEL_ORIGINALS_FILE", "SMOLLM2_MODEL", "SYSTEM_PROMPT", "TASKS_FILE", "TINY_MODEL",
           "KERNEL_SIGNATURE", "TASK_REQUIRED", "build_messages", "build_prompt", "fence",
           "load_tasks", "signature_parts"]
