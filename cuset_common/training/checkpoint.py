"""Stage 03's checkpoints: the resume state a killed run continues from, and the final checkpoint.

<out>/resume/ holds the model, the optimizer, the step and the log so far (state.pt, log.jsonl) and the
arguments (args.json): --resume refuses another run's arguments before any work (check_resume), and a state
is replaced only by a whole new one, so a kill mid-save keeps the previous state (docs/scale.md). Under
--fsdp the state is gathered to rank 0 and written as without it (state_options): a run may resume with or
without --fsdp. The final checkpoint is a Hugging Face model folder in <out> itself, beside resume/.

What --resume reads is checked: a state.pt that is cut short or damaged, or holds weights that are not finite,
is one line naming it (start over with --force). A full disk while a state is written removes the half-written
one (.resume.tmp) and is one line; the previous state stays. A run that diverged leaves its last resume state
marked (cuset_common/training/divergence.py): --resume from it may lower --lr.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from cuset_common.artifacts import args_to_json, artifact_meta, check_resume_args, disk_full
from cuset_common.cli import UserError
from cuset_common.data import end_of_turn_ids
from cuset_common.files import (
    give_user_modes,
    read_json_object,
    replace_dir_atomic,
    sha256_file,
    write_text_atomic,
)
from cuset_common.models import TRAIN_STAGE
from cuset_common.out_dir import aside_dir
from cuset_common.training.divergence import (
    DIVERGED_FILE,
    RESUME_AFTER_DIVERGING,
    diverged_error,
    mark_resume_state,
    nonfinite_weights,
)
from cuset_common.training.samples import Inputs
from cuset_common.training.scale import wait_for_checkpoint


def checkpoint_room(model, optimizer: str, resumed_out: Path | None = None) -> int:
    """Free bytes stage 03's --out needs: its peak, the float32 weights (4 per parameter) and two resume
    states while one replaces the other (weights, and AdamW's two moments: 4 + 8 per parameter), less the
    room a resumed run (resumed_out: its --out) holds there already: the state it resumes from is one of the
    two, and what a full disk left half-written (.resume.tmp, .final.tmp) is removed before the next of its
    kind is written. Without that, a run that filled its disk could never resume on it."""
    state = 4 + (8 if optimizer == "adamw" else 0)
    peak = sum(p.numel() for p in model.parameters()) * (4 + 2 * state)
    if resumed_out is None:
        return peak
    held = [resume_dir(resumed_out), resumed_out / ".resume.tmp", resumed_out / ".final.tmp"]
    return max(0, peak - sum(map(tree_bytes, held)))


def tree_bytes(path: Path) -> int:
    """Bytes of the files at `path` (a file, or a folder and everything in it); 0 where there is none."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def resume_dir(out: Path) -> Path:
    """The resume state to read: resume/, or .resume.old/ after a kill between save_resume's two renames."""
    return out / "resume" if (out / "resume").exists() else out / ".resume.old"


def check_resume(args, may_change: set[str]) -> None:
    """--resume continues the same run: refuse other arguments (all but may_change) before any work. From
    the state a diverged run left (DIVERGED_FILE), --lr may change too: continuing with a lower one is how
    such a run goes on (the log records each step's lr)."""
    path = resume_dir(args.out) / "args.json"
    if not path.exists():
        raise UserError(f"--resume: no resume state with its arguments in {args.out}; start without --resume")
    saved = read_json_object(path, f"start over with --force (the resume state in {args.out} is damaged)")
    if (resume_dir(args.out) / DIVERGED_FILE).exists():
        may_change = may_change | RESUME_AFTER_DIVERGING
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
    """Everything --resume needs, swapped in atomically: a kill mid-save keeps the previous state, and so does
    a full disk (writing: one line, the half-written state removed).
    Called on every process (under --fsdp gathering the state is collective); rank 0 writes, and the others
    wait for it outside NCCL's watchdog (cuset_common/training/scale.py, CHECKPOINT_WAIT)."""
    state = {
        "model": get_model_state_dict(model, options=state_options(args)),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=state_options(args)),
        "step": step,
    }
    if rank != 0:
        return
    tmp = out / ".resume.tmp"
    with writing(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_state(state, tmp / "state.pt")
        (tmp / "log.jsonl").write_text("".join(log_lines))
        (tmp / "args.json").write_text(json.dumps(args_to_json(args), indent=2) + "\n")
    replace_dir_atomic(
        tmp, out / "resume"
    )  # the previous state waits in .resume.old until the new is in place


@contextlib.contextmanager
def writing(folder: Path):
    """Within: the files of a temp folder are written (.resume.tmp, .final.tmp). Any failure removes the
    folder, so that nothing half-written stays and what it was to replace is as it was; a full disk or
    quota (disk_full) is one line naming the file (or the folder) being written."""
    try:
        yield
    except BaseException as e:
        shutil.rmtree(folder, ignore_errors=True)
        if disk_full(e):
            path = e.filename if isinstance(e, OSError) and e.filename else folder
            raise UserError(
                f"no space left on device writing {path}: free space or choose another --out"
            ) from None
        raise


class KeepsWriteErrors:
    """The file torch.save writes to, keeping the OSError of a failed write: torch.save replaces it with a
    RuntimeError of its own ("unexpected pos"), which does not say that the disk is full."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def save_state(state: dict, path: Path) -> None:
    """torch.save into `path`; a failed write raises its OSError, naming `path`."""
    try:
        with open(path, "wb") as f:
            sink = KeepsWriteErrors(f)
            try:
                torch.save(state, sink)
            except RuntimeError:
                if sink.error is None:
                    raise
                raise sink.error from None
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from None


# What torch.load raises on a state.pt cut short or damaged: the zip reader's RuntimeError, mmap's OSError
# past the end of a truncated file, the unpickler's errors.
DAMAGED_STATE = (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError)


def read_state(path: Path) -> dict:
    """The resume state in state.pt; one that is missing, cut short or damaged is one line naming it."""
    fix = "start over with --force (the run cannot continue from it)"
    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except FileNotFoundError:
        raise UserError(f"{path}: missing from the resume state; {fix}") from None
    except DAMAGED_STATE as e:
        raise UserError(f"{path}: cannot be read ({type(e).__name__}; cut short or damaged); {fix}") from None
    if not isinstance(state, dict) or not {"model", "optimizer", "step"} <= state.keys():
        raise UserError(f"{path}: not a resume state of stage 03 (damaged); {fix}")
    return state


def load_resume(args, model, optimizer, rank: int) -> tuple[int, list[str]]:
    """(step, log lines) of the run in --out; model and optimizer state loaded in place. A state that cannot
    be read, or whose weights are not all finite (saved before stage 03 stopped diverged runs), is refused
    in one line on every process."""
    state_dir = resume_dir(args.out)
    state = read_state(state_dir / "state.pt")
    if args.fsdp and rank != 0:  # broadcast from rank 0: one copy of the full state in host memory
        state = {"model": {}, "optimizer": {}, "step": state["step"]}
    set_model_state_dict(model, state["model"], options=state_options(args))
    if args.optimizer == "adamw":  # plain SGD keeps no state (and DCP's loader wants a tensor in it)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=state_options(args))
    world = dist.get_world_size() if dist.is_initialized() else 1
    if what := nonfinite_weights(model, world, str(next(model.parameters()).device)):
        raise UserError(
            f"{state_dir / 'state.pt'}: {what} (saved by a run that diverged); start over with --force and "
            "a lower --lr"
        )
    try:
        log = (state_dir / "log.jsonl").read_text().splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        raise UserError(f"{state_dir / 'log.jsonl'}: cannot be read; start over with --force") from None
    return state["step"], log


def stop_diverged(args, rank: int, group, what: str, step: int, total: int, log_lines, resume_step) -> None:
    """Stop a run that diverged (cuset_common/training/divergence.py), on every process alike: raises
    Diverged.

    Where --out keeps this run's last resume state (resume_step: its step, None for none), rank 0 writes
    log.jsonl beside it (every step so far, the diverged one's non-finite numbers as null) and marks the
    state (DIVERGED_FILE), so that --resume from it may lower --lr. Where it keeps none, nothing is written: a
    folder holding a log alone would be no stage-03 run to the next command. After --force, finishes_out
    puts the previous content back (the run's resume state goes with the rest of it)."""
    restored = not args.resume and aside_dir(args.out).exists()
    kept = None if restored else resume_step
    if rank == 0 and kept is not None:
        write_text_atomic(args.out / "log.jsonl", "".join(log_lines))
        mark_resume_state(resume_dir(args.out), what, step, args.lr)
    wait_for_checkpoint(group)  # the others wait for rank 0's writing, then all stop
    raise diverged_error(what, step, total, args.lr, args.out, kept, restored)


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
    with writing(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        # generate() stops at the end of the assistant's turn, as trained (close_turn), not only at eos
        model.generation_config.eos_token_id = end_of_turn_ids(tokenizer)
        model.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        (tmp / "meta.json").write_text(json.dumps(artifact_meta(meta, tmp), indent=2, allow_nan=False) + "\n")
    give_user_modes(tmp)  # safetensors writes model.safetensors 0600; others may read what the umask allows
    for f in tmp.iterdir():
        os.replace(f, args.out / f.name)
    tmp.rmdir()


def checkpoint_meta(
    args, inputs: Inputs, step: int, precision: str, memory: dict | None, uses_regions: bool
) -> dict:
    """The final checkpoint's meta.json fields: what was trained, from what inputs, how far, and the memory
    planned beside the peak measured on a GPU (scale.py, memory_record). uses_regions: the objective reads
    stage 02's artifact (its r_it or w_i), whose sha256 is then recorded."""
    regions_file = args.regions / "tensors.safetensors"
    trained_on_regions = regions_file.exists() and uses_regions
    return {
        "stage": TRAIN_STAGE,
        "objective": args.objective,
        "args": args_to_json(args),
        "model": args.model,
        "tokenizer_fingerprint": inputs.tok_fp,
        "data": inputs.data_id,
        "regions": {
            "path": str(args.regions),
            "sha256": sha256_file(regions_file) if trained_on_regions else None,
        },
        "max_length": inputs.max_length,
        "precision": precision,  # --precision resolved on this device: fp32 or bf16
        "final_step": step,
        "memory": memory,
    }
