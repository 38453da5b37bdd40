"""--report-to: the figures a stage logs also go to the trackers the field follows runs in.

    trackers = open_trackers(args, stage="03", out=args.out, config=...)
    trackers.log(row, step)      # a log.jsonl row (its numbers)
    trackers.finish()            # also at exit, for a run that stops on an error

`none` (the default), or one or more of, separated by commas:
  trackio      local-first (TRL's recommendation): a SQLite project "cuset" in <report-dir>/trackio, unless
               TRACKIO_DIR names another folder; `TRACKIO_DIR=data/runs/trackio trackio show` draws it.
  tensorboard  event files in <report-dir>/tensorboard/<run> (torch's SummaryWriter, from the tensorboard
               package): `tensorboard --logdir data/runs/tensorboard`.
  wandb        Weights & Biases, its files in <report-dir>/wandb: it sends the run to its server unless
               WANDB_MODE=offline (or disabled), which it honours; `wandb sync` sends an offline run later.
Only wandb, and only online, sends anything off the machine. Each tracker is an optional package, imported
only when named; a missing one is refused when the arguments are read, before any work. A run is named
<stage>-<--out folder>-<start time>: a rerun or a resumed run is a run of its own, from the step it starts
at. Its config is the run's arguments and fingerprint. Only numbers are logged (a row's texts stay in its
files).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.util
import os
import sys
import time
from pathlib import Path

from cuset_common.artifacts import path_text
from cuset_common.cli import UserError
from cuset_common.paths import DATA

TRACKERS = ("trackio", "tensorboard", "wandb")  # each the name of its package
REPORT_DIR = DATA / "runs"
PROJECT = "cuset"


def report_to(text: str) -> tuple[str, ...]:
    """--report-to's value (an argparse type): () for none, else the trackers named, each installed."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if names in ((), ("none",)):
        return ()
    if unknown := [n for n in names if n not in TRACKERS]:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(unknown)}: choose none, or one or more of {', '.join(TRACKERS)}"
        )
    if missing := [n for n in names if importlib.util.find_spec(n) is None]:
        raise argparse.ArgumentTypeError(
            f"{', '.join(missing)} not installed: pip install {' '.join(missing)}, or leave it out"
        )
    return names


def add_report_arguments(ap: argparse.ArgumentParser) -> None:
    """--report-to and --report-dir, the same on every stage that reports."""
    g = ap.add_argument_group("trackers (cuset_common/trackers.py)")
    g.add_argument(
        "--report-to",
        type=report_to,
        default=(),
        metavar="none|trackio,tensorboard,wandb",
        help="also log the run's figures to these trackers (default: none)",
    )
    g.add_argument(
        "--report-dir",
        type=Path,
        default=REPORT_DIR,
        help="where the trackers keep their local files (default: data/runs)",
    )


def numbers(row: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a row, nested dicts flattened to "a/b" keys; texts, lists, bools and None left out."""
    flat = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat |= numbers(value, f"{prefix}{key}/")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            flat[f"{prefix}{key}"] = value
    return flat


def tracked(row: dict) -> dict[str, float]:
    """What a tracker gets of a row: its numbers, but a "step" field, which is the step it is logged at."""
    return numbers({k: v for k, v in row.items() if k != "step"})


class Trackers:
    """The trackers of one run; each gets the same rows. Finished once, by finish or at exit."""

    def __init__(self, loggers: list):
        self.loggers, self.step = loggers, 0
        if loggers:  # a run that stops on an error still closes its trackers' files
            atexit.register(self.finish)

    def log(self, row: dict, step: int | None = None) -> None:
        """The row's numbers at `step`, by default the last step logged (0 at first): a run's closing
        figures go beside its last row."""
        self.step = self.step if step is None else step
        if values := tracked(row):
            for logger in self.loggers:
                logger.log(values, self.step)

    def finish(self) -> None:
        loggers, self.loggers = self.loggers, []
        for logger in loggers:
            logger.finish()


class TrackioRun:
    def __init__(self, name: str, config: dict, folder: Path):
        os.environ.setdefault("TRACKIO_DIR", str((folder / "trackio").resolve()))  # read at its import
        import trackio  # optional

        self.trackio, self.where = trackio, os.environ["TRACKIO_DIR"]
        with contextlib.redirect_stdout(sys.stderr):  # its banner stays out of the stage's stdout
            trackio.init(project=PROJECT, name=name, config=config, embed=False, auto_log_cpu=False)

    def log(self, values: dict, step: int) -> None:
        self.trackio.log(values, step=step)

    def finish(self) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            self.trackio.finish()


class TensorBoardRun:
    def __init__(self, name: str, config: dict, folder: Path):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.where = folder / "tensorboard" / name
        self.writer = SummaryWriter(str(self.where))
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in config.items()))

    def log(self, values: dict, step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a row at a time: the file holds every step a stopped run logged

    def finish(self) -> None:
        self.writer.close()


class WandbRun:
    def __init__(self, name: str, config: dict, folder: Path):
        import wandb  # optional

        folder.mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(project=PROJECT, name=name, config=config, dir=str(folder))
            self.where = self.run.dir
        except Exception as e:  # no API key, no network: its message, and the way to stay offline
            raise UserError(
                f"--report-to wandb: {str(e).strip().splitlines()[0]}; WANDB_MODE=offline keeps the run on "
                "this machine (wandb sync sends it later)"
            ) from None

    def log(self, values: dict, step: int) -> None:
        self.run.log(values, step=step)

    def finish(self) -> None:
        self.run.finish()


RUNS = {"trackio": TrackioRun, "tensorboard": TensorBoardRun, "wandb": WandbRun}


def run_name(stage: str, out: Path) -> str:
    """<stage>-<--out folder>-<start time>, e.g. 03-ckpt-cuset-20261205-221500."""
    return f"{stage}-{Path(out).name}-{time.strftime('%Y%m%d-%H%M%S')}"


def open_trackers(args, stage: str, out: Path, config: dict) -> Trackers:
    """The trackers --report-to names, for a run of `stage` writing to `out`, configured with `config`
    (JSON-able: the run's arguments and fingerprint). Says where each keeps its files."""
    name = run_name(stage, out)
    loggers = [RUNS[tracker](name, config, args.report_dir) for tracker in args.report_to]
    for tracker, logger in zip(args.report_to, loggers):
        print(f"[report] {tracker}: {path_text(logger.where)} (run {name})", flush=True)
    return Trackers(loggers)
