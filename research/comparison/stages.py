"""The four stages as the comparison calls them: their scripts, their own parsers (to check a call before
it runs) and a call written as a user types it. The method lives in the stages; the comparison only
decides what to run."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys
from pathlib import Path

from cuset_common.cli import UserError
from cuset_common.labeling.options import parse_args as regions_args
from cuset_common.paths import ROOT
from cuset_common.profiler.options import RESUME_MAY_CHANGE as PROFILE_RESUME_MAY_CHANGE
from cuset_common.profiler.options import parse_args as profile_args
from cuset_common.training.options import RESUME_MAY_CHANGE as TRAIN_RESUME_MAY_CHANGE
from harness.eval_options import parse_args as eval_args
from research.stage_modules import STAGE_FILES as STAGES
from research.stage_modules import stage_module

# The stage whose arguments each --<name>-args forwards (standalone: stage 04, after --eval-args).
FORWARDED = {"profile": "01", "regions": "02", "train": "03", "eval": "04", "standalone": "04"}
# The stages' own parsers, where they live in the package; stage 03's takes the stage's objectives, so it is
# read from the stage (research/stage_modules.py)
PARSERS = {"01": profile_args, "02": regions_args, "04": eval_args}
# The arguments a stage's --resume may change (the stages that resume)
RESUME_MAY_CHANGE = {"01": PROFILE_RESUME_MAY_CHANGE, "03": TRAIN_RESUME_MAY_CHANGE}


def command(step: dict, extra: tuple[str, ...] = ()) -> list[str]:
    """A step's stage call: this Python, the stage script, its arguments, then `extra` (--resume, ...)."""
    return [sys.executable, str(ROOT / STAGES[step["stage"]]), *step["argv"], *extra]


def typed(arg) -> str:
    """A path inside the repository as a user types it (relative), anything else unchanged."""
    arg = str(arg)
    inside = os.path.isabs(arg) and Path(arg).is_relative_to(ROOT)
    return os.path.relpath(arg) if inside else arg


def shown(cmd: list[str]) -> str:
    """A command as a user types it: `python 03_train_cuset.py ...`."""
    return shlex.join(["python", *map(typed, cmd[1:])])


def stage_args(key: str, argv: list[str]):
    """Stage `key`'s arguments as its own parser reads them (SystemExit or UserError where it refuses)."""
    return PARSERS[key](argv) if key in PARSERS else stage_module(key).parse_args(argv)


def stage_refusal(key: str, argv: list[str]) -> str | None:
    """What stage `key`'s own parse_args (its parser and range checks) says of argv; None if it takes it."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            stage_args(key, argv)
    except SystemExit as e:
        if e.code == 0:
            return "it asks for --help"
        last = said.getvalue().strip().splitlines()[-1:] or [f"exit status {e.code}"]
        return last[0].removeprefix("error: ").removesuffix("; see --help")
    except UserError as e:
        return str(e)
    return None
