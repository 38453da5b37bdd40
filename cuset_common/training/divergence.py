"""A run that diverges stops: stage 03 (and research/trl_sft.py) never write a model with NaN or infinite
weights, nor a log that is not JSON.

What is checked, and what it costs:
  the loss      every step; it is summed over processes already (the step's log line), free
  the gradient  every step, its global norm (the one --grad-clip clips by), before the update, so that a
                non-finite gradient never reaches the weights: one pass over the gradients, which clipping
                makes anyway (computed as well where --grad-clip is 0)
  the weights   before each resume state is written (every --save-every steps and at the last step, which
                the final checkpoint is made from): one read of the weights, less than the save writes.
                Between saves a non-finite weight shows in the next step's loss (every weight of the body
                and the output layer enters it); an embedding row no token of the data uses would not, and
                the next save finds it before it is kept.
A step whose loss or gradient is not finite skips its update, so the weights stay the last step's. Every
process sees the same values (the loss and the norm are global, the weight count is summed over processes),
so under DDP and FSDP all stop at the same step.

The stop is an error line and exit status 2, as for bad input (cuset_common.cli.UserError), not 1: the
program did not fail; the run's own settings (its --lr, --warmup-steps, --grad-clip, its data) made it
diverge, and changing them is the user's fix. No model is written; the last resume state in --out stays (all
of them were checked finite) and may be continued with another --lr (check_resume, DIVERGED_FILE).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from cuset_common.cli import UserError
from cuset_common.files import write_text_atomic
from cuset_common.training.scale import all_reduce_stats

# How the error line starts: research/comparison reads it to report a run as diverged.
DIVERGED = "training diverged"
# Written into the resume state a diverged run leaves: --resume may then change --lr (RESUME_AFTER_DIVERGING);
# the next resume state, written without it, ends that.
DIVERGED_FILE = "diverged.json"
RESUME_AFTER_DIVERGING = {"lr"}


class Diverged(UserError):
    """A loss, gradient or weight that is not finite: one line and exit status 2 (the module's docstring)."""


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a tensor: its shard under FSDP (a DTensor), else the tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


def grad_norm(model: torch.nn.Module, clip: float) -> float:
    """The global norm of the gradients, as clip_grad_norm_ computes it, clipping them to `clip` when it is
    above 0 (--grad-clip: the same call as without this check); the same norm without clipping otherwise.
    Under FSDP the norm of the whole gradient (each process holds shards: full_tensor sums them)."""
    if clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    return float((norm.full_tensor() if isinstance(norm, DTensor) else norm).item())


def nonfinite_step(stats: dict) -> str | None:
    """What of a step's sums (the loss, and the gradient norm where computed) is not finite, in words for
    the error line; None for a step that may update the weights."""
    if not math.isfinite(stats["loss"]):
        return f"the loss is {stats['loss']}"
    if not math.isfinite(stats.get("grad_norm", 0.0)):
        return f"the gradient norm is {stats['grad_norm']}"
    return None


# Elements tested at a time: the test's boolean temporary is at most this many bytes (16 MiB), not the size
# of the largest weight (a 150k x 4096 embedding would take 600 MB).
FINITE_CHUNK = 1 << 24


def nonfinite_tensors(model: torch.nn.Module) -> int:
    """How many of this process's parameter tensors (its shards under FSDP) hold a NaN or an infinity: one
    read of the weights in chunks of FINITE_CHUNK elements, one synchronisation."""
    flags = [
        torch.stack(
            [~torch.isfinite(c).all() for c in local(p).detach().reshape(-1).split(FINITE_CHUNK)]
        ).any()
        for p in model.parameters()
        if p.numel()
    ]
    return int(torch.stack(flags).sum().item()) if flags else 0


def nonfinite_weights(model: torch.nn.Module, world: int, device: str) -> str | None:
    """The weights' part of the check, in words for the error line, or None: nonfinite_tensors summed over
    the processes (each holds the whole model, or its shards under FSDP), so that all decide alike."""
    bad = int(all_reduce_stats({"bad": nonfinite_tensors(model)}, world, device)["bad"])
    return f"{bad} weight tensor(s) hold NaN or infinite values" if bad else None


def refuse_nonfinite_model(model: torch.nn.Module, name: str) -> None:
    """Refuse a model to train whose weights are not all finite (the checkpoint of a run that diverged before
    stage 03 stopped such runs): every step's loss would be NaN."""
    if bad := nonfinite_tensors(model):
        raise UserError(
            f"--model {name}: {bad} weight tensor(s) hold NaN or infinite values (a checkpoint of a run "
            "that diverged?); train from the model it started from, with a lower --lr"
        )


def json_row(row: dict) -> str:
    """A log.jsonl line: a non-finite number as null (strict JSON has no NaN; allow_nan=False makes sure)."""
    finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
    return json.dumps(finite, allow_nan=False) + "\n"


def lower_lr(lr: float) -> str:
    """The --lr the error line suggests: a tenth of the run's."""
    return f"{lr / 10:g}"


def diverged_error(
    what: str,
    step: int,
    total: int,
    lr: float,
    out: Path,
    resume_step: int | None = None,
    restored: bool = False,
    resumable: bool = True,
) -> Diverged:
    """The error line: where the run diverged, that no model was written, and how to go on from what --out
    holds: the resume state of `resume_step`, the previous content put back (restored: --force started
    over), or nothing (it diverged before its first resume state; resumable False: a run that keeps none,
    research/trl_sft.py)."""
    where = f"{DIVERGED} at step {step}/{total}: {what} (--lr {lr:g}); no model written"
    lower = f"--lr {lower_lr(lr)}"
    if resume_step is not None:
        how = (
            f"--out {out} keeps the resume state of step {resume_step}: continue from it with a lower --lr "
            f"(e.g. --resume {lower}), or start over (--force {lower})"
        )
    elif restored:
        how = f"--out {out} holds what it held before; start over with a lower --lr, e.g. --force {lower}"
    else:
        kept = " before its first resume state (--save-every)" if resumable else ""
        how = f"it kept nothing{kept}; start over with a lower --lr, e.g. {lower}"
    return Diverged(f"{where}; {how}")


def mark_resume_state(state_dir: Path, what: str, step: int, lr: float) -> None:
    """Record in the resume state left behind that the run diverged after it: --resume may change --lr."""
    record = {"diverged_at_step": step, "what": what, "lr": lr}
    write_text_atomic(state_dir / DIVERGED_FILE, json.dumps(record, allow_nan=False) + "\n")
