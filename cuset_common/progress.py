"""The one progress display of every long loop: stage 01's batches, stage 03's steps, stage 04's builds,
runs and generation, the comparison's runs.

    progress = Progress("profile", total=len(batches), done=resumed_at)
    for batch in batches: ...; progress(1, detail=f" | {rate:,.0f} tok/s")

One line on stderr, `what: done/total<detail> | elapsed | ETA`: on a terminal it is redrawn in place at
each update; elsewhere (a log file, a pipe, CI) a line is written at most every `every_s` seconds and at
the end, so that logs stay short. The ETA counts only the work done since this run started (a resumed run
does not credit itself with what an earlier one did). Lines printed meanwhile start on a fresh line
(cuset_common/cli.py, say_last, closes the open one).
"""

from __future__ import annotations

import sys
import time

from cuset_common.cli import PROGRESS_LINE

QUIET_EVERY_S = 30.0  # off a terminal, the least time between two progress lines


def duration(seconds: float) -> str:
    """1h02m, 3m05s, 42s: what a person reads at a glance."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress:
    """done/total of one loop, drawn as the module's docstring says."""

    def __init__(self, what: str, total: int, done: int = 0, every_s: float = QUIET_EVERY_S, stream=None):
        self.what, self.total, self.done, self.start_done = what, total, done, done
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.every_s, self.t0, self.last = every_s, time.monotonic(), float("-inf")

    def eta(self) -> str:
        """The time left at the rate of this run so far ("?" before its first unit)."""
        worked = self.done - self.start_done
        if worked <= 0:
            return "?"
        return duration((time.monotonic() - self.t0) / worked * max(self.total - self.done, 0))

    def __call__(self, n: int = 1, detail: str = "") -> None:
        self.done += n
        now, finished = time.monotonic(), self.done >= self.total
        if not (self.live or finished or now - self.last >= self.every_s):
            return
        self.last = now
        line = f"{self.what}: {self.done}/{self.total}{detail} | {duration(now - self.t0)} | ETA {self.eta()}"
        if self.live:
            print(f"\r{line}   ", end="\n" if finished else "", file=self.stream, flush=True)
            PROGRESS_LINE["open"] = not finished
        else:
            print(line, file=self.stream, flush=True)
