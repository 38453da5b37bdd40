"""A stage's entry point: user errors as one line (exit status 2), the file system's errors about a user's
file as one line too, secrets kept out of every closing line, argument checks, loading a script by path
(the device and the precision a stage computes in: cuset_common/device.py)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import io
import os
import re
import signal
import sys
import traceback
from pathlib import Path

from .paths import ROOT


class UserError(Exception):
    """Bad input from the user: printed without a traceback, exit status 2."""


# Whether a progress line is on stderr without its newline yet (cuset_common/progress.py: on a terminal
# Progress redraws it in place): run_main's last line then starts on a line of its own.
PROGRESS_LINE = {"open": False}


def say_last(text: str) -> None:
    """run_main's closing line on stderr, below a progress line left open, with every registered secret
    redacted (register_secret): an error may quote what holds a key, e.g. a request header."""
    if PROGRESS_LINE["open"]:
        print(file=sys.stderr)
        PROGRESS_LINE["open"] = False
    print(redact(text), file=sys.stderr)


# ---------------------------------------------------------------------------------------
# Secrets: kept out of every line run_main prints, and out of tracebacks
# ---------------------------------------------------------------------------------------

# The texts to redact, each in every form a message may quote it in (register_secret). Whoever reads a secret
# registers it at once (harness/openai_generation.py: the key of OPENAI_API_KEY), so that no message made
# afterwards, by our code or a library's, carries it to the terminal or a log.
SECRETS: set[str] = set()
REDACTED = "[redacted]"


def register_secret(value: str | None) -> None:
    """Keep `value` out of every closing line (say_last) and every traceback of this process.

    A message may quote it as it is, without the blanks around it (a key pasted with a trailing \\r or
    newline, which the HTTP library then refuses to send and quotes), or escaped as repr() writes a string
    or bytes (`Invalid header value b'Bearer sk-...\\r'`): all four forms are redacted. None or "" (no key)
    registers nothing."""
    if not value:
        return
    forms = {
        value,
        value.strip(),
        repr(value)[1:-1],
        repr(value.encode("utf-8", "backslashreplace"))[2:-1],
    }
    SECRETS.update(form for form in forms if form.strip())
    if sys.excepthook is not redacting_excepthook:
        sys.excepthook = redacting_excepthook


def redact(text: str) -> str:
    """`text` with every registered secret replaced by REDACTED, the longest first (a form that holds
    another is replaced whole)."""
    for secret in sorted(SECRETS, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redacting_excepthook(kind, value, tb) -> None:
    """sys.excepthook once a secret is registered: the traceback of an unexpected error, redacted."""
    sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))


# ---------------------------------------------------------------------------------------
# The file system's errors about a user's file: one line
# ---------------------------------------------------------------------------------------

# What to do about an OSError on a path, by errno; any other: OTHER_PATH_HINT.
PATH_HINTS = {
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder; check the path",
    errno.EISDIR: "it is a folder where a file is expected; name the file, or move the folder away",
    errno.EACCES: "this user may not use it; change its permissions (or those of a folder above it), or "
    "name another path",
    errno.EPERM: "this user may not do that to it; change its permissions, or name another path",
    errno.ENAMETOOLONG: "a name in the path is longer than 255 bytes (or the whole path longer than 4095); "
    "shorten it",
    errno.ELOOP: "its symbolic links form a loop; point them at a real file or folder",
    errno.EROFS: "the file system is read-only; name a path on a writable one",
}
OTHER_PATH_HINT = "check the path, or name another"
# A full disk or quota: never a bug, whatever the error names.
NO_SPACE = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def path_hint(code: int | None) -> str:
    return PATH_HINTS.get(code, OTHER_PATH_HINT)


def file_error_line(error: OSError | UnicodeDecodeError) -> str | None:
    """The one line (after `error: `) for an OSError or UnicodeDecodeError about a file, or None where it is
    about none: a bug's or a network's error, which keeps its traceback.

    An OSError names its file where the call that failed took a path (open, stat, rename: e.filename); a
    write that ran out of space, and text that is not UTF-8, are raised by an open file object, which names
    none: then the file is the one the traceback's innermost frames had open (file_in_traceback)."""
    if isinstance(error, UnicodeDecodeError):
        path = file_in_traceback(error, writing=False)
        if path is None:
            return None
        byte, encoding = error.object[error.start : error.start + 1].hex(), error.encoding.upper()
        return (
            f"{path}: not {encoding} text (byte 0x{byte}: {error.reason}); save it as {encoding}, or "
            "name the right file"
        )
    path = named_file(error)
    if error.errno in NO_SPACE:
        path = path or file_in_traceback(error, writing=True)
        where = f" writing {path}" if path else ""
        return f"{NO_SPACE[error.errno]}{where}: free space or choose another --out"
    if path is None:
        return None
    return f"{path}: {error.strerror or error}; {path_hint(error.errno)}"


# How Rust's std::io::Error ends its message, which libraries written in Rust (safetensors) raise as their own
# exception type with the OS error in its text alone: "No space left on device (os error 28)".
RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def no_space_line(error: Exception) -> str | None:
    """The one line for an error of a library that reports a full disk in its message alone (safetensors:
    `Error while serializing: I/O error: No space left on device (os error 28)`), or None."""
    found = RUST_OS_ERROR.search(str(error))
    code = int(found.group(1)) if found else None
    if code not in NO_SPACE:
        return None
    return f"{NO_SPACE[code]} writing a file ({type(error).__name__}): free space or choose another --out"


def named_file(error: OSError) -> str | None:
    """The path an OSError names (and the second of a rename, `a -> b`), or None."""
    names = [getattr(error, attr, None) for attr in ("filename", "filename2")]
    shown = [os.fsdecode(n) for n in names if isinstance(n, (str, bytes, os.PathLike))]
    return " -> ".join(shown) if shown else None


def file_in_traceback(error: BaseException, writing: bool) -> str | None:
    """The name of the file that the innermost frame of the error's traceback to hold one had open, for
    writing (writing=True: mode w, a, x or +) or for reading: the file whose write or decoding failed
    (Path.write_text and read_text, json.load and a loop over a file hold it in the frame that failed,
    or in the frame around the decoder's). None: no frame held one (a file object no variable holds,
    as in `open(p).read()`, is in no frame: that error keeps its traceback)."""
    frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__)]
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            name, mode = getattr(value, "name", None), getattr(value, "mode", "")
            if isinstance(value, io.IOBase) and isinstance(name, str) and isinstance(mode, str):
                if writing == any(c in mode for c in "wax+"):
                    return name
    return None


# What a script that names nothing else keeps when Ctrl-C stops it (run_main's `interrupted`).
INTERRUPTED = "stopped before it finished; run the command again"


def run_main(main_fn, argv: list[str] | None = None, interrupted: str = INTERRUPTED) -> int:
    """Run a stage's main; a UserError prints `error: ...` to stderr and exits with status 2 (as do
    the argument parser's refusals, which exit through SystemExit).

    An OSError or UnicodeDecodeError about a file (a path too long, a folder the user may not read, a
    folder where a file is expected, a file that is not UTF-8 text, a full disk) is the user's to fix
    wherever it is raised: one line naming the file, what is wrong and how to fix it (file_error_line), exit
    status 2. One about no file (a bug's, a network's) keeps its traceback, as does every other exception.

    Ctrl-C prints one line, `interrupted: ` and then `interrupted`: what the stage keeps of the stopped
    run and how to go on from it; the exit status is the shell's for a command that SIGINT ended, 130
    (128 + signal 2). A traceback there would read as a crash, though stopping is the user's choice."""
    try:
        return main_fn(argv) or 0
    except UserError as e:
        say_last(f"error: {e}")
        return 2
    except (OSError, UnicodeDecodeError) as e:
        line = file_error_line(e)
        if line is None:
            raise
        say_last(f"error: {line}")
        return 2
    except Exception as e:
        line = no_space_line(e)
        if line is None:
            raise
        say_last(f"error: {line}")
        return 2
    except SystemExit as e:
        return e.code
    except KeyboardInterrupt:
        # Ctrl-C reaches every process of the terminal's foreground group, so under torchrun every rank
        # stops here: rank 0 alone (torchrun's RANK; a plain run has none) says so.
        if os.environ.get("RANK", "0") == "0":
            say_last(f"interrupted: {interrupted}")
        return 130


@contextlib.contextmanager
def sigterm_exits():
    """SIGTERM raises SystemExit(143) in the main thread meanwhile, so that clean-up runs (finally blocks,
    harness/schedule.py's stop of running programs). Python's default for SIGTERM ends the process at once:
    vLLM's engine and worker processes then went on generating as orphans, each holding a core and gigabytes
    (research/compare_objectives.py stops a stage with SIGTERM); tests/test_engines.py kills a run to
    check."""
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose refusals are one line in our form (`error: ...`, exit status 2): the usage block
    argparse prints first would bury the line that says what is wrong."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; see --help\n")

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, after refusing an argument that is not UTF-8 text: a path with bytes that are not
        UTF-8 in its name reaches Python as a string with lone surrogates, which no UTF-8 file can hold, and
        every stage writes its arguments into its files (meta.json, summaries) only after the work."""
        args = sys.argv[1:] if args is None else list(args)
        for arg in args:
            if isinstance(arg, str) and not is_utf8_text(arg):
                self.error(
                    f"argument {printable(arg)}: holds bytes that are not UTF-8 text, which the files a "
                    "stage writes (meta.json, summaries) cannot record; rename the file or folder to a UTF-8 "
                    "name, or pass a symbolic link with one"
                )
        return super().parse_known_args(args, namespace)


def is_utf8_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable(arg: str) -> str:
    """An argument as the shell gave it, its bytes that are not UTF-8 escaped (\\xff)."""
    try:
        return os.fsencode(arg).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that came from no byte (a caller's string, not argv)
        return arg.encode("utf-8", "backslashreplace").decode("utf-8")


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
    # named by its path (research/trl_sft.py: research.trl_sft), so as not to shadow a library of its stem
    name = ".".join(Path(relpath).with_suffix("").parts).replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module
