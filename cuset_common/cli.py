"""A stage's entry point: user errors as one line (exit status 2), argument checks, the device."""
from __future__ import annotations

import argparse
from pathlib import Path

from .paths import ROOT


class UserError(Exception):
    """Bad input from the user: printed without a traceback, exit status 2."""


def run_main(main_fn, argv: list[str] | None = None) -> int:
    """Run a stage's main; a UserError prints `error: ...` to stderr and exits with status 2 (as do
    the argument parser's refusals, which exit through SystemExit)."""
    import sys

    try:
        return main_fn(argv) or 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        return e.code


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
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(Path(relpath).stem.replace("-", "_"), ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def pick_device(name: str = "auto") -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device is available; use --device cpu")
    return name
