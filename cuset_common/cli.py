"""A stage's entry point: user errors as one line (exit status 2), argument checks, loading a script by path
(the device and the precision a stage computes in: cuset_common/device.py)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from .paths import ROOT


class UserError(Exception):
    """Bad input from the user: printed without a traceback, exit status 2."""


# Whether a progress line is on stderr without its newline yet (harness/report.py: Progress redraws it in
# place): run_main's last line then starts on a line of its own.
PROGRESS_LINE = {"open": False}


def say_last(text: str) -> None:
    """run_main's closing line on stderr, below a progress line left open."""
    if PROGRESS_LINE["open"]:
        print(file=sys.stderr)
        PROGRESS_LINE["open"] = False
    print(text, file=sys.stderr)


# What a script that names nothing else keeps when Ctrl-C stops it (run_main's `interrupted`).
INTERRUPTED = "stopped before it finished; run the command again"


def run_main(main_fn, argv: list[str] | None = None, interrupted: str = INTERRUPTED) -> int:
    """Run a stage's main; a UserError prints `error: ...` to stderr and exits with status 2 (as do
    the argument parser's refusals, which exit through SystemExit).

    Ctrl-C prints one line, `interrupted: ` and then `interrupted`: what the stage keeps of the stopped
    run and how to go on from it; the exit status is the shell's for a command that SIGINT ended, 130
    (128 + signal 2). A traceback there would read as a crash, though stopping is the user's choice."""
    try:
        return main_fn(argv) or 0
    except UserError as e:
        say_last(f"error: {e}")
        return 2
    except SystemExit as e:
        return e.code
    except KeyboardInterrupt:
        # Ctrl-C reaches every process of the terminal's foreground group, so under torchrun every rank
        # stops here: rank 0 alone (torchrun's RANK; a plain run has none) says so.
        if os.environ.get("RANK", "0") == "0":
            say_last(f"interrupted: {interrupted}")
        return 130


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose refusals are one line in our form (`error: ...`, exit status 2): the usage block
    argparse prints first would bury the line that says what is wrong."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; see --help\n")


def check_ranges(ap: argparse.ArgumentParser, args: argparse.Namespace, ranges: dict[str, str]) -> None:
    """Refuse each numeric argument outside its interval, before any work (ap.error: one line, exit 2).

    ranges: {dest: interval as written in mathematics}, e.g. "[1, inf)", "(0, 1]". An unset argument
    (None) passes. NaN lies in no interval, and no interval here holds infinity (it is open there).
    """
    for dest, interval in ranges.items():
        value = getattr(args, dest)
        if value is not None and not within(value, interval):
            kind = "an integer" if isinstance(value, int) else "a finite number"
            unset = ", or unset" if ap.get_default(dest) is None else ""
            ap.error(f"--{dest.replace('_', '-')} {value:g}: must be {kind} {describe(interval)}{unset}")


def within(value: float, interval: str) -> bool:
    lo, hi = (float(x) for x in interval[1:-1].split(","))
    above = value > lo if interval[0] == "(" else value >= lo
    return above and (value < hi if interval[-1] == ")" else value <= hi)


def describe(interval: str) -> str:
    """An interval in words: [1, inf) is ">= 1", (0, inf) is "> 0", [0, 1] is "in [0, 1]"."""
    lo, hi = (x.strip() for x in interval[1:-1].split(","))
    if hi == "inf":
        return f"{'>' if interval[0] == '(' else '>='} {lo}"
    return f"in {interval}"


def load_script(relpath: str):
    """Import a stage script by path, for tests and benchmarks (a stage's file name starts with a digit,
    so `import` cannot name it; the stages themselves never import each other)."""
    # named by its path (integrations/trl.py: integrations.trl), so as not to shadow a library of its stem
    name = ".".join(Path(relpath).with_suffix("").parts).replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module
