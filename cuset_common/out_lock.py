"""One run per output folder: a lock on --out for the life of a run.

Two runs writing into one --out would each replace or append to what the other wrote, and both would
succeed. So every stage takes the lock of its --out before it looks inside (check_out_dir), and holds it
until its main returns (finishes_out releases it) or its process ends; a second run refuses at once, in
one line naming the process that holds it. --resume takes the lock as any run does.

The lock is fcntl.flock on a file beside --out, `.<out-name>.lock` in its parent folder: not inside it,
since stages replace --out as a whole (write_artifact) and --force moves it aside (open_out), and a lock
file inside would go with it. The kernel releases a flock when its process ends, however it ends, so a
killed run never blocks the next: its lock file stays behind, naming a process that is gone, and the
next run takes it over. The holder writes its pid, host and start time into the file for the message.
Under torchrun only rank 0 takes the lock (RANK): the other ranks belong to the same run.

File systems: on local ones (ext4, xfs, btrfs, tmpfs) flock is exact. On NFS, Linux emulates flock
with the protocol's byte-range locks, which exclude runs on different clients only if the server does
locking (NFSv4, or NFSv3 with its lock manager); a mount with `local_lock=flock` or `nolock` keeps the
lock on the client, so two machines could still write into one --out there. On such a mount start the
runs of one --out from one machine.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from .cli import UserError
from .files import real_path

# The lock files this process holds, each with its open file (closing it releases the lock).
_HELD: dict[Path, int] = {}


def lock_file(out: Path) -> Path:
    """The lock file of `out`: beside the real folder (a link as --out locks the folder it points to)."""
    real = real_path(out, "--out")
    return real.with_name(f".{real.name}.lock")


def lock_out(out: Path) -> None:
    """Take the lock of `out` for this run, or refuse (UserError) if another live process holds it.

    Taking it again in the same process is a no-op; a lock file left by a process that is gone is taken
    over (with a note on stderr)."""
    if os.environ.get("RANK", "0") != "0":  # a torchrun rank other than 0: rank 0 holds it for the run
        return
    path = lock_file(out)
    if path in _HELD:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_locked(path, out)
    except OSError as e:  # a parent folder that is read-only, or a file
        raise UserError(
            f"--out {out}: cannot make its lock file {path} ({e.strerror}); name a folder you can write to"
        ) from None
    left_by = os.read(fd, 1024).decode("utf-8", "replace").strip()
    if left_by:
        print(
            f"note: --out {out}: taking over the lock left by a run that is gone ({left_by})", file=sys.stderr
        )
    holder = f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder.encode() + b"\n", 0)
    _HELD[path] = fd


def open_locked(path: Path, out: Path) -> int:
    """An open file of `path` that this process holds the flock of; UserError if another process holds it.

    The holder removes the file when it releases the lock, so a file opened just before that is no longer
    the lock file once locked: then open it again (otherwise two runs could each lock a file of their own)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 1024).decode("utf-8", "replace").strip() or "a process starting up"
            os.close(fd)
            raise UserError(
                f"--out {out}: another run is writing there ({holder}; lock file {path}); wait for it to "
                f"finish, or name another --out"
            ) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def release_out_locks() -> None:
    """Release every lock this process holds, removing its file (before the lock goes: see open_locked)."""
    for path, fd in _HELD.items():
        path.unlink(missing_ok=True)
        os.close(fd)
    _HELD.clear()
