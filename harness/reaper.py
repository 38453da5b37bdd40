"""Runs a command and takes its whole process tree down with it when our parent dies: what keeps stage 04's
unsandboxed commands (--no-sandbox; harness/sandbox.py, isolate=False) from outliving a stage 04 that was
killed, even by SIGKILL, which no clean-up of its own survives.

    python reaper.py PARENT_PID -- COMMAND [ARGS...]

Under bubblewrap the sandbox dies with stage 04 (--die-with-parent), and its PID namespace with all in it.
Without one, two settings of the kernel do that work here:

  * PR_SET_PDEATHSIG: the kernel sends us SIGTERM when our parent dies;
  * PR_SET_CHILD_SUBREAPER: a process of the tree whose parent dies is re-parented to us, not to init,
    so that nothing of the tree can leave it (double fork, setsid) while we live.

On SIGTERM we stop and kill everything below us and exit. When the command ends by itself, we kill
what it left behind (its background children, now ours) the same way and end as it did: its exit
status, or its signal. Only the standard library is used, and no module that needs site-packages, so
that the interpreter can start with -S (the cost is one small Python start per command).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # <linux/prctl.h>
# Python ignores these at its start; the command gets them back at their defaults, as subprocess gives
# them (restore_signals): a broken pipe ends it, as does a file past RLIMIT_FSIZE (harness/sandbox.py:
# _limits).
RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)
USAGE = "usage: reaper.py PARENT_PID -- COMMAND [ARGS...]"


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def _live_processes() -> dict[int, int]:
    """pid -> parent pid of every process that is not a zombie, read from /proc."""
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:  # gone meanwhile
            continue
        state, ppid = text[text.rindex(")") + 2 :].split()[:2]
        if state != "Z":
            parents[int(pid)] = int(ppid)
    return parents


def _descendants() -> set[int]:
    parents = _live_processes()
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_tree() -> None:
    """Kill every process below us and reap them. The tree is stopped first (a stopped process cannot
    fork), then killed; what dies re-parents its children to us, so the tree is gone once we have no
    child left to reap."""
    stopped: set[int] = set()
    while new := _descendants() - stopped:
        _signal(new, signal.SIGSTOP)
        stopped |= new
    _signal(stopped, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _parent_died(signum, frame) -> None:
    kill_tree()
    os._exit(128 + signum)


def _wait_for(child: int) -> int:
    """The command's wait status; the orphans re-parented to us meanwhile are reaped as they end."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            return status


def _end_as(status: int) -> int:
    """End as the command did: die of its signal (what a caller of the command itself would have seen),
    else return its exit status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:  # SIGKILL's action cannot be set, nor needs to be: it always ends us
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig  # a signal that does not end a process
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    parent, cmd = int(argv[0]), argv[2:]
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGTERM, _parent_died)
    # The kernel signals us when the *thread* that forked us ends, not the whole process: stage 04 starts
    # each command from a worker thread that waits for it to end (harness/sandbox.py: _run), so that
    # thread outlives us unless the process dies.
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before PR_SET_PDEATHSIG: no signal will come
        return 128 + signal.SIGTERM
    try:
        child = os.posix_spawnp(cmd[0], cmd, os.environ, setsigdef=RESTORED)
    except OSError as e:  # as a shell says it: 127 not found, 126 found but not runnable
        print(f"{cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126
    status = _wait_for(child)
    kill_tree()
    return _end_as(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
