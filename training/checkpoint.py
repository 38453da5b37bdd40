"""Stage 03's checkpoints: the resume state a killed run continues from, and the final checkpoint.

<out>/resume/ holds the model, the optimizer, the step and the log so far (state.pt, log.jsonl) and the
arguments (args.json): --resume refuses another run's arguments before any work (check_resume), and a state
is replaced only by a whole new one, so a kill mid-save keeps the previous state (docs/scale.md). Under
--fsdp the state is gathered to rank 0 and written as without it (state_options): a run may resume with or
without --fsdp. The final checkpoint is a Hugging Face model folder in <out> itself, beside resume/.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from cuset_common.artifacts import args_to_json, artifact_meta, check_resume_args
from cuset_common.cli import UserError
from cuset_common.data import end_of_turn_ids
from cuset_common.files import give_user_modes, read_json_object, replace_dir_atomic


def checkpoint_room(model, optimizer: str) -> int:
    """Peak bytes in stage 03's --out: the float32 weights (4 per parameter) and two resume states while one
    replaces the other (weights, and AdamW's two moments: 4 + 8 per parameter)."""
    state = 4 + (8 if optimizer == "adamw" else 0)
    return sum(p.numel() for p in model.parameters()) * (4 + 2 * state)


def resume_dir(out: Path) -> Path:
    """The resume state to read: resume/, or .resume.old/ after a kill between save_resume's two renames."""
    return out / "resume" if (out / "resume").exists() else out / ".resume.old"


def check_resume(args, may_change: set[str]) -> None:
    """--resume continues the same run: refuse other arguments (all but may_change) before any work."""
    path = resume_dir(args.out) / "args.json"
    if not path.exists():
        raise UserError(f"--resume: no resume state with its arguments in {args.out}; start without --resume")
    saved = read_json_object(path, f"start over with --force (the resume state in {args.out} is damaged)")
    check_resume_args(saved, args_to_json(args), may_change, args.out)


def state_options(args):
    """State keyed by parameter name; under --fsdp gathered to rank 0's CPU on save and broadcast from rank 0
    on load: the same resume state with or without --fsdp."""
    return (
        StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True)
        if args.fsdp
        else None
    )


def save_resume(out: Path, args, model, optimizer, step: int, log_lines: list[str], rank: int) -> None:
    """Everything --resume needs, swapped in atomically: a kill mid-save keeps the previous state.
    Called on every process (under --fsdp gathering the state is collective); rank 0 writes, and the others
    wait for it outside NCCL's watchdog (training/scale.py, CHECKPOINT_WAIT)."""
    state = {
        "model": get_model_state_dict(model, options=state_options(args)),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=state_options(args)),
        "step": step,
    }
    if rank != 0:
        return
    tmp = out / ".resume.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    (tmp / "log.jsonl").write_text("".join(log_lines))
    (tmp / "args.json").write_text(json.dumps(args_to_json(args), indent=2) + "\n")
    replace_dir_atomic(
        tmp, out / "resume"
    )  # the previous state waits in .resume.old until the new is in place


def load_resume(args, model, optimizer, rank: int) -> tuple[int, list[str]]:
    """(step, log lines) of the run in --out; model and optimizer state loaded in place."""
    state_dir = resume_dir(args.out)
    state = torch.load(state_dir / "state.pt", map_location="cpu", weights_only=False, mmap=True)
    if args.fsdp and rank != 0:  # broadcast from rank 0: one copy of the full state in host memory
        state = {"model": {}, "optimizer": {}, "step": state["step"]}
    set_model_state_dict(model, state["model"], options=state_options(args))
    if args.optimizer == "adamw":  # plain SGD keeps no state (and DCP's loader wants a tensor in it)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=state_options(args))
    return state["step"], (state_dir / "log.jsonl").read_text().splitlines(keepends=True)


def save_final(args, model, tokenizer, meta: dict | None, rank: int) -> None:
    """The trained model (save_pretrained, safetensors), its tokenizer and meta.json (the stage's fields
    between the schema version and the library versions: artifact_meta), by rank 0; under --fsdp every
    process takes part in gathering the weights. meta: None on the other processes.

    The files are written to <out>/.final.tmp and then moved into --out one by one: --out cannot be swapped
    as a whole folder (replace_dir_atomic), since the run's resume state lives in it."""
    weights = get_model_state_dict(model, options=state_options(args)) if args.fsdp else None
    if rank != 0:
        return
    if weights is not None:  # gathered tensors share no storage: keep tied weights once, as on one GPU
        names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        weights = {k: v for k, v in weights.items() if k in names}
    tmp = args.out / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # generate() stops at the end of the assistant's turn, as trained (close_turn), not only at eos
    model.generation_config.eos_token_id = end_of_turn_ids(tokenizer)
    model.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
    tokenizer.save_pretrained(tmp)
    (tmp / "meta.json").write_text(json.dumps(artifact_meta(meta, tmp), indent=2) + "\n")
    give_user_modes(tmp)  # safetensors writes model.safetensors 0600; others may read what the umask allows
    for f in tmp.iterdir():
        os.replace(f, args.out / f.name)
    tmp.rmdir()
