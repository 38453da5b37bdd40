"""What a killed run continues from with --resume, checked against the run before any work.

Stage 01 keeps its finished batches as shards in <out>.partial/ (state.json: what the result depends on);
stage 03 keeps model, optimizer, step and log in <out>/resume/ (args.json: the arguments). Both refuse
to resume another run (check_resume_args) and replace a state only by a whole new one (docs/scale.md)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from .artifacts import args_to_json, check_resume_args
from .cli import UserError
from .files import replace_dir_atomic, write_text_atomic

# ---------------------------------------------------------------------------------------
# Stage 01: shards of finished batches in <out>.partial/
# ---------------------------------------------------------------------------------------


def partial_dir(out: Path) -> Path:
    """Where a run keeps its finished batches until the artifact is written: `<out>.partial/` beside
    --out."""
    return out.with_name(out.name + ".partial")


def check_partial(partial: Path, run: dict, resume: bool, may_change: set[str]) -> None:
    """--resume continues the same run (arguments, data, tokenizer, device); without it, a killed run's
    partial results are neither reused nor deleted. may_change: the arguments that do not change the
    result."""
    state = partial / "state.json"
    if not resume:
        if state.exists():
            raise UserError(f"{partial}: a stopped run left partial results here; pass --resume (with the "
                            f"same arguments) to continue it, or delete that folder to start over")
        return
    if not state.exists():
        raise UserError(f"--resume: no partial run in {partial}; run without --resume")
    saved = json.loads(state.read_text())
    check_resume_args(saved["args"], run["args"], may_change, partial, restart=f"delete {partial}")
    wrong = [f"{k}: the run has {saved.get(k)!r}, now {v!r}" for k, v in run.items()
             if k != "args" and saved.get(k) != v]
    if wrong:
        raise UserError(f"{partial}: --resume on other inputs than the run's own ({'; '.join(wrong)}); "
                        f"resume with the same inputs, or delete {partial} to start over")


def save_shard(partial: Path, run: dict, batches: list[list[int]], b0: int, b1: int, results: list) -> None:
    """Results of batches [b0, b1) as one shard, written to a temp name and renamed (never half a shard)."""
    from safetensors.numpy import save_file

    if not (partial / "state.json").exists():
        write_text_atomic(partial / "state.json", json.dumps(run, indent=2) + "\n")
    order = [i for b in batches[b0:b1] for i in b]
    tmp = partial / ".shard.tmp"
    save_file({"samples": np.asarray(order, dtype=np.int64),  # [m] sample indices, batch order
               "confidence": np.concatenate([results[i][0] for i in order]).astype(np.float32),  # [n]
               "entropy": np.concatenate([results[i][1] for i in order]).astype(np.float32),  # [n]
               "argmax_correct": np.concatenate([results[i][2] for i in order]).astype(np.uint8)},  # [n]
              str(tmp))
    os.replace(tmp, partial / f"batches-{b0:06d}-{b1:06d}.safetensors")


def load_shards(partial: Path, batches: list[list[int]], encs: list[dict], results: list) -> int:
    """Put the shards' results in place; returns the first batch still to do."""
    from safetensors.numpy import load_file

    done = 0
    for f in sorted(partial.glob("batches-*.safetensors")):  # zero-padded names sort in batch order
        b0, b1 = map(int, f.stem.split("-")[1:])
        t, order = load_file(str(f)), [i for b in batches[b0:b1] for i in b]
        cuts = np.cumsum([0] + [len(encs[i]["spans"]) for i in order])
        if "argmax_correct" not in t:
            raise UserError(f"{f}: written by an older version of this stage (no argmax_correct); delete "
                            f"{partial} to start over")
        if b0 != done or t["samples"].tolist() != order or len(t["confidence"]) != cuts[-1]:
            raise UserError(f"{f}: does not continue batch {done} of this run's plan; "
                            f"delete {partial} to start over")
        for k, i in enumerate(order):
            results[i] = tuple(t[name][cuts[k]:cuts[k + 1]]
                               for name in ("confidence", "entropy", "argmax_correct"))
        done = b1
    return done


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
