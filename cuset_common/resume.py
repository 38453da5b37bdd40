"""What a killed run continues from with --resume, checked against the run before any work.

Stage 03 keeps model, optimizer, step and log in <out>/resume/ (args.json: the arguments); it refuses
to resume another run (check_resume_args) and replaces a state only by a whole new one (docs/scale.md).
Stage 01's shards in <out>.partial/ are profiler/shards.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from .artifacts import args_to_json, check_resume_args
from .cli import UserError
from .files import replace_dir_atomic

# ---------------------------------------------------------------------------------------
# Stage 03: model, optimizer, step and log in <out>/resume/
# ---------------------------------------------------------------------------------------


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
        raise UserError("--resume: no resume state with its arguments in "
                        f"{args.out}; start without --resume")
    check_resume_args(json.loads(path.read_text()), args_to_json(args), may_change, args.out)


def state_options(args):
    """State keyed by parameter name; under --fsdp gathered to rank 0's CPU on save and broadcast from rank 0
    on load: the same resume state with or without --fsdp."""
    return StateDictOptions(full_state_dict=True, cpu_offload=True,
                            broadcast_from_rank0=True) if args.fsdp else None


def save_resume(out: Path, args, model, optimizer, step: int, log_lines: list[str], rank: int) -> None:
    """Everything --resume needs, swapped in atomically: a kill mid-save keeps the previous state.
    Called on every process (under --fsdp gathering the state is collective); rank 0 writes."""
    state = {"model": get_model_state_dict(model, options=state_options(args)),
             "optimizer": get_optimizer_state_dict(model, optimizer, options=state_options(args)),
             "step": step}
    if rank != 0:
        return
    tmp = out / ".resume.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    (tmp / "log.jsonl").write_text("".join(log_lines))
    (tmp / "args.json").write_text(json.dumps(args_to_json(args), indent=2) + "\n")
    replace_dir_atomic(tmp,
                       out / "resume")  # the previous state waits in .resume.old until the new is in place


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
