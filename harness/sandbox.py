"""Whitelist sandbox for stage 04 (docs/evaluation.md, "Sandbox"): runs untrusted code (nvcc or g++ on
model-written source, and the program they built) and the task author's trusted scripts.

Why bubblewrap: it exists to build exactly such a view of the file system from an unprivileged
user namespace, together with PID, network, IPC and UTS namespaces, a fresh /proc, a minimal
/dev and die-with-parent; an `unshare` + private-root shell construction would reimplement it.

Untrusted code sees, read-only: /usr (with /bin, /lib... as on the host), the loader's and
alternatives' files of /etc, the CUDA toolkit when it lies outside /usr, a minimal /dev (on the GPU
backend also the GPU's nodes, the driver's library folders and /sys: gpu_node_binds, driver_binds); a
/proc of its own PID namespace; an empty private /tmp and /dev/shm of bounded size; its folder,
read-write at its own path.
Nothing else: not the project, the task file, /home, /root, /run, /var, /opt, host processes, the
network (only its own loopback, so no abstract unix sockets either), nor new user namespaces (bwrap's
--disable-userns; a bwrap older than 0.8.0 lacks it, and gets our seccomp filter instead,
harness/userns_filter.py). As root each call runs as an unprivileged uid of its own, taken from
SANDBOX_UIDS for the call's lifetime (hold_uid: a lock per uid), then setpriv, then bwrap in a user
namespace of that uid: it holds no capability over host files, and the per-uid process limit, the
clean-up and the check that nothing of it is left concern that call alone, whatever runs beside it. As
another user every sandbox runs as that user, with a process limit counted from what the user runs at
its start. Trusted scripts keep our uid and file system but get no network and their own PID namespace.
All runs get their own session, resource limits, a scrubbed environment and a wall-clock timeout that
kills everything they started. Unisolated commands (isolate=False) run under harness/reaper.py, which
kills their whole tree when this process dies, as bwrap's --die-with-parent does for a sandbox. The
bwrap is the one on PATH, or the one use_bwrap names; every option it needs exists from bubblewrap 0.4.0
on (NEEDED_OPTIONS), and the probe says which mechanisms it uses.

    if not probe_isolation().available: ...        # refuse, or isolate=False if the user said so
    code, log = run_sandboxed(["./prog"], run_dir, 30, untrusted=True, stdin=nonce, wait_s=30)
    # or SandboxBusy (no process or uid to be had within wait_s), or SandboxError (a broken setup)

Limits: the GPU binds are tested with stand-in nodes, not on a GPU; there is no seccomp filter beyond
the one against new user namespaces on a bwrap older than 0.8.0 (the kernel's namespaces are the trust
base); a bwrap older than 0.7.0 has no --size, so /tmp and /dev/shm are plain tmpfs, as large as the
kernel's default (half the memory), and the probe's line says so; attacks inside one process on a
harness compiled into it are out of scope; memory is not limited (RLIMIT_AS breaks CUDA and ASan), nor
the number of files in the folder (only their size). With isolate=False what a command has another
service start (at, systemd-run) is not of its tree, and outlives it. Not root, the process budget is the
user's: a job's limit leaves it `nproc` processes beyond what the user ran when it started, and a
neighbour that forks later draws on the same budget.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import os
import pwd
import re
import resource
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

# As root, untrusted code runs as one of these uids (no passwd entry needed), one per sandbox at a time.
# Size: a stage-04 run holds at most --jobs at once (default: the CPU count) plus its start-up probe, so
# 1024 covers, e.g., four runs at the default on a 256-CPU machine; lock files are made lowest uid first,
# so a small machine only ever makes a few. The range stays below 65000, where Debian reserves uids
# (65534 is nobody); uids of an account (systemd's dynamic users overlap it) are skipped.
SANDBOX_UIDS = range(61234, 61234 + 1024)
UID_LOCKS = Path("/run/cuset-sandbox-uids")  # root's alone: no one else can hold, plant or remove a lock
UID_CLEAR_S = 10  # how long the processes left of a job's uid may take to die once killed
# How a sandbox that cannot start for want of processes says so (EAGAIN from fork, clone or execve after
# setuid); the messages are in English because the scrubbed environment sets LC_MESSAGES=C.
SHORTAGE = os.strerror(errno.EAGAIN)  # "Resource temporarily unavailable"
ENV_KEEP = ("PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES", "LANG")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The dynamic loader's cache and configuration; alternatives holds the links behind cc, c++, g++ on Debian.
ETC_KEEP = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")
TMP_MB, SHM_MB = 512, 64  # the private /tmp and /dev/shm live in memory: bounded (where bwrap has --size)
# The options of bwrap the sandboxes use that every bubblewrap from 0.4.0 on has (its usage text; 0.4.0 added
# the --*-try binds). Two newer ones are used where the bwrap has them: --size (0.7.0), the bound of a
# tmpfs, and --disable-userns (0.8.0), else a seccomp filter that forbids new user namespaces (--seccomp).
NEEDED_OPTIONS = (
    "--unshare-all",
    "--unshare-user",
    "--unshare-net",
    "--unshare-pid",
    "--die-with-parent",
    "--new-session",
    "--hostname",
    "--symlink",
    "--bind",
    "--ro-bind",
    "--ro-bind-try",
    "--dev-bind",
    "--dev",
    "--proc",
    "--tmpfs",
    "--chdir",
    "--remount-ro",
    "--seccomp",
)
# Runs an unsandboxed command (isolate=False) so that its whole tree dies with us, even killed by SIGKILL.
REAPER = Path(__file__).with_name("reaper.py")
# The bwrap the sandboxes run (use_bwrap); None: the one on PATH, looked up at each use.
CHOSEN_BWRAP: dict[str, str | None] = {"path": None}
PRLIMIT = shutil.which("prlimit") or "prlimit"  # util-linux's, on every Debian and Ubuntu system (_limits)
STDIN_MAX = 65536  # stdin bytes are written into a pipe before the program starts: at most one pipe buffer
HOST_DEV = Path("/dev")  # where the GPU backend's nodes come from (run_sandboxed's gpu_dev)
# The NVIDIA nodes a CUDA program opens: the control node, one per GPU, unified memory and its tools node
# (profilers); MIG's capability nodes lie in nvidia-caps/. Not nvidia-modeset: that is the display's.
GPU_NODE = re.compile(r"nvidia(ctl|\d+|-uvm|-uvm-tools)")
# The driver's user-space libraries that CUDA loads: libcuda.so.1, libnvidia-ptxjitcompiler.so.1, ...
DRIVER_LIBRARY = re.compile(r"lib(cuda|nvidia-[\w-]+)\.so[.\d]*")
LDCONFIG_ENTRY = re.compile(r"\s+(\S+) \(.*\) => (\S.*)")  # a library in `ldconfig -p`: name, path


@dataclass(frozen=True)
class Isolation:
    available: bool
    how: str  # what is used, or why nothing is possible and how to get it


class SandboxError(RuntimeError):
    """The sandbox could not be set up, so the command never ran; the message is bwrap's or setpriv's."""


class SandboxBusy(SandboxError):
    """The sandbox could not start for want of a resource that others hold for now: every uid of
    SANDBOX_UIDS, or processes (SHORTAGE). Worth retrying; not a broken setup."""


class Interrupted(Exception):
    """The command was killed, or never started, because the stage is stopping (stop_programs): it has
    no result, and the caller records none, so that a resumed run does it again."""


# Stopping (Ctrl-C, SIGTERM): every run_sandboxed waiting on its command wakes at once through this pipe
# (stop_programs writes a byte that nobody reads, so it stays readable), kills it and raises Interrupted.
STOPPING = threading.Event()
_WAKE_READ, _WAKE_WRITE = os.pipe()


def stop_programs() -> None:
    """End every running command now, and refuse new ones, until allow_programs."""
    if not STOPPING.is_set():
        STOPPING.set()
        os.write(_WAKE_WRITE, b"!")


def allow_programs() -> None:
    """Undo stop_programs, once nothing runs any more."""
    if STOPPING.is_set():
        os.read(_WAKE_READ, 1)
        STOPPING.clear()


def _is_root() -> bool:
    return os.geteuid() == 0


def _uids_said() -> str:
    """Which uid untrusted code runs as, in words."""
    if _is_root():
        return f"uids {SANDBOX_UIDS[0]}-{SANDBOX_UIDS[-1]}, one per job"
    return f"uid {os.getuid()}"


# ---------------------------------------------------------------------------------------
# Which bwrap, and what it can do
# ---------------------------------------------------------------------------------------


def use_bwrap(path: str | os.PathLike | None) -> None:
    """Run every sandbox of this process with the bwrap at `path` (None: the one on PATH, the default),
    e.g. a newer bubblewrap than the system's. What is probed of a bwrap is kept per path (_bwrap_about,
    _probe), so choosing again, or PATH changing, probes the bwrap then chosen."""
    CHOSEN_BWRAP["path"] = None if path is None else os.path.abspath(path)


def _bwrap() -> str | None:
    """The bwrap to run: the one use_bwrap chose, else the one on PATH, else None."""
    return CHOSEN_BWRAP["path"] or shutil.which("bwrap")


@cache
def _bwrap_about(bwrap: str) -> tuple[str, frozenset[str]]:
    """(its --version line, e.g. "bubblewrap 0.6.1"; the options its --help lists). A bwrap that does not
    run gives ("", no options): the probe then says what it lacks."""
    try:
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip()
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True).stdout
    except OSError:
        return "", frozenset()
    return version, frozenset(re.findall(r"^\s+(--[\w-]+)", usage, re.M))


def _has(option: str) -> bool:
    """Whether the bwrap to run has `option`."""
    bwrap = _bwrap()
    return bwrap is not None and option in _bwrap_about(bwrap)[1]


def _userns_filter_fd() -> int:
    """A pipe that holds the seccomp filter against new user namespaces (harness/userns_filter.py),
    closed for writing: bwrap's --seccomp reads it to its end."""
    # Imported where it is used: sandbox.py needs nothing else of the project where bwrap has
    # --disable-userns (tests/test_sandbox.py runs a copy of it alone, as another user).
    from harness.userns_filter import program

    read_end, write_end = os.pipe()
    os.write(write_end, program())  # a few hundred bytes: far less than a pipe holds
    os.close(write_end)
    return read_end


# ---------------------------------------------------------------------------------------
# The view: bwrap arguments
# ---------------------------------------------------------------------------------------


def _system_binds() -> list[str]:
    """/usr read-only; /bin, /lib... as the links they are on the host (merged /usr) or read-only binds."""
    args = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ETC_KEEP:
        args += ["--ro-bind-try", path, path]
    return args


def _outside_system_dirs(folder: Path) -> bool:
    """True when `folder` (a real path) lies in none of SYSTEM_DIRS: the sandbox needs a bind of it."""
    system = [Path(os.path.realpath(d)) for d in SYSTEM_DIRS if os.path.isdir(d)]
    return not any(folder.is_relative_to(d) for d in system)


def _toolkit_binds() -> list[str]:
    """The CUDA toolkit read-only where it lies outside /usr: found from nvcc on PATH (links resolved)
    and CUDA_HOME."""
    nvcc = shutil.which("nvcc")
    roots = {Path(os.path.realpath(nvcc)).parents[1]} if nvcc else set()
    if os.environ.get("CUDA_HOME"):
        roots.add(Path(os.path.realpath(os.environ["CUDA_HOME"])))
    outside = sorted(str(r) for r in roots if r.is_dir() and _outside_system_dirs(r))
    return [arg for root in outside for arg in ("--ro-bind", root, root)]


def gpu_nodes(dev: Path) -> list[Path]:
    """The NVIDIA nodes in `dev` that CUDA opens (GPU_NODE), then MIG's capability nodes, those that exist:
    nvidia-uvm appears only once CUDA has been used (harness/gpu_probe.py makes sure it has)."""
    nodes = sorted(p for p in dev.glob("nvidia*") if GPU_NODE.fullmatch(p.name))
    return nodes + sorted((dev / "nvidia-caps").glob("*"))


def gpu_node_binds(dev: Path) -> list[str]:
    """bwrap arguments that put each of gpu_nodes(dev) at its name under the sandbox's /dev."""
    return [
        arg for node in gpu_nodes(dev) for arg in ("--dev-bind", str(node), f"/dev/{node.relative_to(dev)}")
    ]


def _openable(node: Path) -> bool:
    """Whether the sandboxed program may open `node` for reading and writing. As root it runs as a uid of
    its own without groups (setpriv --clear-groups), a stranger to every file: only the bits for others
    count. As another user it runs as that user, groups and all."""
    if not _is_root():
        return os.access(node, os.R_OK | os.W_OK)
    both = stat.S_IROTH | stat.S_IWOTH
    return node.stat().st_mode & both == both


def gpu_access_problem(dev: Path) -> str | None:
    """Why the sandboxed program could not use the GPU's nodes in `dev`, with what to change; None when it
    can. Refused up front rather than handled (e.g. by giving the sandbox uid the node's group): the
    driver makes its nodes world read-write unless told otherwise, and a machine that limits them to a
    group has chosen who may use the GPU, which untrusted code should not be let into behind its back.
    MIG's capability nodes are left out: CUDA reads those a MIG instance needs, and the driver keeps
    its administrative ones to root."""
    closed = [node for node in gpu_nodes(dev) if node.parent == dev and not _openable(node)]
    if not closed:
        return None
    said = ", ".join(f"{n} is {stat.filemode(n.stat().st_mode)} (gid {n.stat().st_gid})" for n in closed)
    who = _uids_said() + (", no groups" if _is_root() else "")
    return (
        f"{said}: the sandboxed program cannot open it (as {who});"
        f" make the GPU's nodes readable and writable by all (chmod 666 {dev}/nvidia*, or the driver's "
        f"option NVreg_DeviceFileMode=0666)"
    )


def driver_library_folders(ldconfig_listing: str) -> set[Path]:
    """The real folders of the driver's libraries (DRIVER_LIBRARY) that `ldconfig -p` lists: each listed
    path's folder and, the listed file being a link, its target's."""
    folders = set()
    for entry in map(LDCONFIG_ENTRY.fullmatch, ldconfig_listing.splitlines()):
        if entry and DRIVER_LIBRARY.fullmatch(entry.group(1)):
            path = entry.group(2)
            folders |= {Path(os.path.realpath(os.path.dirname(path))), Path(os.path.realpath(path)).parent}
    return folders


def driver_binds(folders: set[Path]) -> list[str]:
    """bwrap arguments that show those of `folders` that lie outside the system folders, read-only: a
    container's /usr/local/nvidia/lib64 is in /usr already, a driver container's /run/nvidia/driver is not."""
    outside = sorted(str(f) for f in folders if _outside_system_dirs(f))
    return [arg for folder in outside for arg in ("--ro-bind", folder, folder)]


@cache
def _driver_library_folders() -> set[Path]:
    """driver_library_folders of this machine (the loader's cache, as the sandbox's loader reads it)."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"  # in /sbin, which a user's PATH may lack
    return driver_library_folders(subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout)


def _gpu_binds(dev: Path) -> list[str]:
    """The GPU backend's part of the view: the GPU's nodes from `dev`, the driver's libraries, and the
    read-only /sys the CUDA driver reads topology from (its /proc/driver/nvidia comes with any /proc)."""
    return [*gpu_node_binds(dev), *driver_binds(_driver_library_folders()), "--ro-bind", "/sys", "/sys"]


def _sized(megabytes: int) -> list[str]:
    """The bound of the tmpfs that follows, where bwrap has --size; else none: the kernel's default for a
    tmpfs, half of the memory."""
    return ["--size", str(megabytes << 20)] if _has("--size") else []


def _untrusted_argv(
    cmd: list[str], folder: str, uid: int | None, gpu_dev: Path | None, filter_fd: int | None
) -> list[str]:
    """The whitelist sandbox around cmd. New user namespaces: --disable-userns, or where bwrap lacks it
    the seccomp filter readable at `filter_fd`."""
    argv = [
        _bwrap() or "bwrap",
        "--unshare-all",
        "--unshare-user",
        *(["--disable-userns"] if filter_fd is None else ["--seccomp", str(filter_fd)]),
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        *_system_binds(),
        *_toolkit_binds(),
        "--dev",
        "/dev",
        *(_gpu_binds(gpu_dev) if gpu_dev else []),
        *_sized(SHM_MB),
        "--tmpfs",
        "/dev/shm",
        "--proc",
        "/proc",
        *_sized(TMP_MB),
        "--tmpfs",
        "/tmp",
        "--bind",
        folder,
        folder,
        "--chdir",
        folder,
        # bwrap's own tmpfs at / and /dev, memory too: read-only once the mount points exist
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--",
        *cmd,
    ]
    if uid is None:
        return argv
    # Drop to the job's uid before bwrap: its user namespace then maps only that uid.
    return [
        shutil.which("setpriv") or "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--no-new-privs",
        "--",
        *argv,
    ]


def _announced(cmd: list[str], marker: str) -> list[str]:
    """cmd behind a shell that first prints `marker`, inside the finished sandbox: output that starts
    with it proves the setup worked, whatever the program prints (its own "bwrap: ..." included)."""
    return ["/bin/sh", "-c", 'printf %s "$1" && shift && exec "$@"', "sh", marker, *cmd]


def _trusted_argv(cmd: list[str], folder: str) -> list[str]:
    """Our uid and whole file system (the interpreter may be a venv anywhere); no network, own PIDs."""
    return [
        _bwrap() or "bwrap",
        "--dev-bind",
        "/",
        "/",
        "--unshare-net",
        "--unshare-pid",
        "--proc",
        "/proc",
        "--die-with-parent",
        "--new-session",
        "--chdir",
        folder,
        "--",
        *cmd,
    ]


def _hand_over(folder: Path, uid: int) -> None:
    """Hand `folder` and everything in it to the job's `uid` (whatever uid earlier jobs left on it),
    and give its ancestors search permission (not listing) for all: bwrap runs as that uid and must
    reach the folder to bind it. Files with hard links elsewhere (shared inputs) keep their owner:
    readable, not writable."""
    for top, dirs, files in os.walk(folder):  # symbolic links are not followed
        for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
            info = os.lstat(name)
            if stat.S_ISDIR(info.st_mode) or info.st_nlink == 1:
                os.chown(name, uid, uid, follow_symlinks=False)
    for parent in folder.parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(parent, mode | stat.S_IXOTH)


# ---------------------------------------------------------------------------------------
# One uid per job (as root), and the processes of a uid
# ---------------------------------------------------------------------------------------


def _process_table() -> dict[int, tuple[bool, list[int], int]]:
    """pid -> (whether it is a zombie; its real, effective, saved and file-system uid; its threads)."""
    table = {}
    for path in glob.glob("/proc/[0-9]*/status"):
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:  # gone meanwhile
            continue
        field = dict(line.split(":\t", 1) for line in lines if line.startswith(("State", "Uid", "Threads")))
        uids = [int(u) for u in field["Uid"].split()]
        table[int(path.split("/")[2])] = field["State"].startswith("Z"), uids, int(field["Threads"])
    return table


def _live_processes_of(uid: int) -> set[int]:
    """The processes, zombies aside, that have `uid` as any of their uids."""
    return {pid for pid, (zombie, uids, _) in _process_table().items() if uid in uids and not zombie}


def _tasks_of(uid: int) -> int:
    """What RLIMIT_NPROC counts for `uid`: the tasks (threads, zombies too) whose real uid it is."""
    return sum(threads for _, uids, threads in _process_table().values() if uids[0] == uid)


@cache
def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _uid_locks() -> Path:
    """UID_LOCKS, made on first use; refused when anyone but root could have put or opened a file in it."""
    try:
        UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(UID_LOCKS)
    except OSError as e:
        raise SandboxError(f"cannot make the folder of sandbox uid locks: {e}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        raise SandboxError(f"{UID_LOCKS} is not a folder that only root may use (mode 700): remove it")
    return UID_LOCKS


@contextmanager
def hold_uid(pool: range = SANDBOX_UIDS) -> Iterator[int]:
    """As root: the lowest uid of `pool` that no one holds, held until the block ends. Holding is an
    exclusive flock on the uid's file in UID_LOCKS; the kernel drops it when the holder's process dies,
    however it dies, so a killed run frees its uids. Never taken: a uid that belongs to an account, or
    has processes: someone else's, or left by a holder killed before its clean-up, or the zombies of
    the last job, until init reaps them (they still count against the uid's process limit).
    Raises SandboxBusy when every uid is held or in use."""
    folder, in_use = _uid_locks(), {u for _, uids, _ in _process_table().values() for u in uids}
    for uid in pool:
        if uid in in_use or _has_account(uid):
            continue
        lock = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # per open file: threads of one run exclude too
        except BlockingIOError:
            os.close(lock)
            continue
        try:
            yield uid
        finally:
            os.close(lock)
        return
    raise SandboxBusy(
        f"no free sandbox uid: each of {pool[0]}-{pool[-1]} is held by a running job or has processes"
    )


def _clear(uid: int) -> None:
    """Kill whatever of the job's `uid` still lives after it (stopped first, so that nothing forks
    meanwhile) and wait, at most UID_CLEAR_S, until none does. What cannot die keeps the uid out of use
    (hold_uid skips it) instead of counting against the next job's process limit."""
    stopped: set[int] = set()
    while new := _live_processes_of(uid) - stopped:
        _signal(new, signal.SIGSTOP)
        stopped |= new
    _signal(stopped, signal.SIGKILL)
    deadline = time.monotonic() + UID_CLEAR_S
    while _live_processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------
# Probe
# ---------------------------------------------------------------------------------------


def _userns_disabled() -> str | None:
    """The sysctls that forbid user namespaces outright, as the reason to report."""
    for path, off, fix in (
        ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces=10000"),
        ("/proc/sys/kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone=1"),
    ):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value == off:
            return f"user namespaces are disabled ({path} = {value}): sysctl -w {fix}"
    return None


def _failure_hint() -> str:
    try:
        restricted = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").read_text().strip() == "1"
    except OSError:
        restricted = False
    return " (AppArmor restricts unprivileged user namespaces: give bwrap a profile)" if restricted else ""


def _version_word(version: str, bwrap: str) -> str:
    """How the probe names a bwrap: "bwrap 0.6.1" from its --version line, else its path."""
    return f"bwrap {version.split()[-1]}" if version else bwrap


def _userns_said(bwrap: str) -> str:
    """What forbids new user namespaces in the sandbox, and what of the isolation this bwrap lacks."""
    version, options = _bwrap_about(bwrap)
    said = _version_word(version, bwrap)
    if "--disable-userns" in options:
        parts = ["new user namespaces: --disable-userns"]
    else:
        parts = [f"new user namespaces: seccomp filter ({said} has no --disable-userns)"]
    if "--size" not in options:
        parts.append(f"/tmp and /dev/shm: no size bound ({said} has no --size)")
    return "; ".join(parts)


def probe_isolation() -> Isolation:
    """Whether untrusted code can be isolated here with the bwrap to run (use_bwrap), and how, or why not."""
    return _probe(_bwrap())


@cache
def _probe(bwrap: str | None) -> Isolation:
    """Runs `true` through exactly the untrusted construction, as the same uid; once per bwrap and
    process."""
    if bwrap is None:
        return Isolation(
            False, "bwrap not found: apt-get install bubblewrap (or your distribution's package)"
        )
    version, options = _bwrap_about(bwrap)
    lacking = [option for option in NEEDED_OPTIONS if option not in options]
    if lacking:
        return Isolation(
            False,
            f"{_version_word(version, bwrap)} has no {', '.join(lacking)}: install bubblewrap 0.4.0 or later",
        )
    if _is_root() and shutil.which("setpriv") is None:
        return Isolation(False, "setpriv not found: apt-get install util-linux")
    disabled = _userns_disabled()
    if disabled:
        return Isolation(False, disabled)
    with tempfile.TemporaryDirectory(prefix="cuset-probe-") as tmp:
        try:
            code, log = run_sandboxed(["true"], Path(tmp), 60, untrusted=True, wait_s=60)
        except OSError as e:
            return Isolation(False, f"cannot start the sandbox as {_uids_said()}: {e}")
        except SandboxError as e:
            return Isolation(False, f"{str(e).splitlines()[-1]}{_failure_hint()}")
    if code != 0:
        status = "timeout" if code is None else f"exit status {code}"
        return Isolation(False, f"`true` in the sandbox: {status} {log}")
    return Isolation(
        True,
        f"{version}: {_userns_said(bwrap)}; user, mount, PID, network, IPC, UTS namespaces; {_uids_said()}",
    )


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------


def _process_limit(nproc: int) -> int:
    """RLIMIT_NPROC that lets a command start `nproc` processes. The kernel counts every task (threads
    too) of the real uid: as root that uid is the job's own, with none at the start (root's own are not
    limited), so `nproc`; as another user it is the user's, so what the user runs now plus `nproc`,
    within the hard limit."""
    if _is_root():
        return nproc
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    wanted = _tasks_of(os.getuid()) + nproc
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def _limits(cpu_s: int, file_mb: int, nproc: int) -> list[str]:
    """The command prefix that sets the resource limits for what it runs (util-linux's prlimit, which
    execs the command with them). Not a preexec_fn: Python code between fork and exec is unsafe while
    other threads run (stage 04 builds and runs on a pool of threads), and a child of this process did
    crash there under load."""
    nproc = _process_limit(nproc)  # counted here, in the parent
    return [
        PRLIMIT,
        f"--cpu={cpu_s}",
        f"--fsize={file_mb << 20}",
        f"--nproc={nproc}",
        "--core=0",
        "--",
    ]


def _reaped(cmd: list[str]) -> list[str]:
    """cmd run by harness/reaper.py, which kills its whole tree when this process dies: what bwrap's
    --die-with-parent and PID namespace do for a sandbox. Python without site (-S) starts in tens of ms.
    The kernel tells the reaper of the death of the thread that started it, not of the process: _run
    starts it and waits for it in one thread."""
    return [sys.executable, "-I", "-S", str(REAPER), str(os.getpid()), "--", *cmd]


def _scrubbed_env(home: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env.update(HOME=home, TMPDIR="/tmp", PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1", LC_MESSAGES="C")
    return env


def _stdin_pipe(data: bytes) -> int:
    """A pipe that holds `data` and is closed for writing: the program reads it, then end of file."""
    if len(data) > STDIN_MAX:
        raise ValueError(f"stdin of {len(data)} bytes: at most {STDIN_MAX}")
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    return read_end


class _Capture:
    """Keeps the first and last `keep` bytes of a stream; the bytes between are only counted."""

    def __init__(self, keep: int):
        self.keep, self.head, self.tail, self.total = keep, b"", b"", 0
        self.started = False  # the start marker came first

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep - len(self.head)
        self.head += chunk[:room]
        self.tail = (self.tail + chunk[room:])[-self.keep :] if self.keep else b""

    def text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {cut} bytes cut ...]\n" if cut else ""
        return self.head.decode(errors="replace") + middle + self.tail.decode(errors="replace")


def _drain(stream, capture: _Capture, marker: bytes) -> None:
    """Read the command's output to the end; the start marker, when it comes first, is not output."""
    first = b""
    while len(first) < len(marker) and (chunk := stream.read1(65536)):
        first += chunk
    capture.started = first.startswith(marker)
    capture.feed(first[len(marker) :] if capture.started else first)
    for chunk in iter(lambda: stream.read1(65536), b""):
        capture.feed(chunk)


def _live_processes() -> dict[int, int]:
    """pid -> parent pid of every process that is not a zombie."""
    parents = {}
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(path).read_text()
        except OSError:  # gone meanwhile
            continue
        state, ppid = text[text.rindex(")") + 2 :].split()[:2]
        if state != "Z":
            parents[int(path.split("/")[2])] = int(ppid)
    return parents


def _descendants(pid: int) -> set[int]:
    parents = _live_processes()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _signal(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_tree(proc: subprocess.Popen) -> set[int]:
    """SIGKILL a command that is not reaped yet, every process under it, and its process group; return the
    pids killed. A group kill alone misses what started a session of its own (torchrun's workers), so the
    tree is walked from /proc, and stopped first: a stopped process cannot fork a child the walk would
    miss, nor, killed before its children, leave them to init, out of the tree."""
    stopped: set[int] = set()
    while new := ({proc.pid} | _descendants(proc.pid)) - stopped:
        _signal(new, signal.SIGSTOP)
        stopped |= new
    _signal(stopped, signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # proc is not reaped yet, so its pid is still this group's id
    except ProcessLookupError:  # the group has ended meanwhile
        pass
    return stopped


def _kill_everything(proc: subprocess.Popen) -> None:
    """Kill the command's tree and process group (kill_tree); return once they are gone and the command is
    reaped. Under bwrap the tree holds the PID namespace's init: the kernel kills all of that namespace,
    processes that called setsid too, and bwrap exits only once it is empty.
    """
    stopped = kill_tree(proc)
    proc.wait()
    deadline = time.monotonic() + 10
    while stopped & _live_processes().keys() and time.monotonic() < deadline:
        time.sleep(0.01)


def _exited(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait for the command without reaping it (a pidfd is readable once the process exited), or for
    stop_programs; True: it exited."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        waiter = select.poll()
        waiter.register(pidfd, select.POLLIN)
        waiter.register(_WAKE_READ, select.POLLIN)
        ready = waiter.poll(min(timeout * 1000, 2**31 - 1))  # poll's C int of milliseconds
        return any(fd == pidfd for fd, _ in ready)
    finally:
        os.close(pidfd)


def run_sandboxed(
    cmd: list[str],
    cwd: Path,
    timeout: float,
    *,
    untrusted: bool,
    isolate: bool = True,
    cpu_s: int = 120,
    file_mb: int = 512,
    nproc: int = 256,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    log_keep: int = 2000,
    uid: int | None = None,
    wait_s: float = 0.0,
    gpu_dev: Path | None = None,
) -> tuple[int | None, str]:
    """Run cmd in cwd; returns (exit status, or None on wall-clock timeout; the first and last
    `log_keep` bytes of its combined stdout and stderr).

    untrusted: the whitelist sandbox; else a trusted script's view (ours, without network).
    isolate=False runs cmd as it is: only the limits, the timeout, the scrubbed environment and the
    reaper that kills its tree if we die (where probe_isolation() says no isolation is possible).
    Untrusted and isolated as root, cmd runs as `uid`, which the caller holds (hold_uid), or else as a
    uid held for this call alone; that uid gets cwd and everything in it, and after the call loses
    every process left.
    wait_s: how long to retry a sandbox that cannot start for want of a resource.
    gpu_dev: untrusted, the folder whose GPU nodes it gets with the driver's libraries (HOST_DEV on the
    GPU backend; a test's stand-ins); None: no GPU.
    Raises SandboxBusy when it still cannot after wait_s, SandboxError when the sandbox could not be
    set up otherwise (either way the command never ran), Interrupted after stop_programs.
    """
    folder = cwd.resolve()
    attempt = partial(
        _run,
        cmd,
        folder,
        timeout,
        untrusted=untrusted,
        isolate=isolate,
        cpu_s=cpu_s,
        file_mb=file_mb,
        nproc=nproc,
        env=env,
        stdin=stdin,
        log_keep=log_keep,
        gpu_dev=gpu_dev,
    )
    give_up, pause = time.monotonic() + wait_s, 0.1
    while True:
        try:
            if not (untrusted and isolate and _is_root()):
                return attempt(uid=None)
            with nullcontext(uid) if uid is not None else hold_uid() as job_uid:
                _hand_over(folder, job_uid)
                try:
                    return attempt(uid=job_uid)
                finally:
                    _clear(job_uid)
        except SandboxBusy:
            left = give_up - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(pause, left))  # a last attempt at wait_s
            pause = min(2 * pause, 2.0)  # others' fork loops end at their timeouts: seconds, not ms


def _run(
    cmd: list[str],
    folder: Path,
    timeout: float,
    *,
    untrusted: bool,
    isolate: bool,
    uid: int | None,
    cpu_s: int,
    file_mb: int,
    nproc: int,
    env: dict[str, str] | None,
    stdin: bytes | None,
    log_keep: int,
    gpu_dev: Path | None,
) -> tuple[int | None, str]:
    """One attempt of run_sandboxed, as `uid` (None: as we are)."""
    if STOPPING.is_set():
        raise Interrupted(f"not started: stopping ({cmd[0]})")
    marker = secrets.token_hex(16) if isolate else ""  # without a sandbox, nothing can fail to set up
    stdin_fd = _stdin_pipe(stdin) if stdin is not None else subprocess.DEVNULL
    filter_fd = _userns_filter_fd() if isolate and untrusted and not _has("--disable-userns") else None
    if not isolate:
        argv = _reaped(cmd)
    elif untrusted:
        argv = _untrusted_argv(_announced(cmd, marker), str(folder), uid, gpu_dev, filter_fd)
    else:
        argv = _trusted_argv(_announced(cmd, marker), str(folder))
    try:
        proc = subprocess.Popen(
            [*_limits(cpu_s, file_mb, nproc), *argv],
            cwd=folder,
            env=_scrubbed_env(str(folder)) | (env or {}),
            stdin=stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=() if filter_fd is None else (filter_fd,),  # prlimit and setpriv exec, keeping it
        )
    except BlockingIOError as e:  # we could not fork either: the machine (or this user) is out of processes
        raise SandboxBusy(f"cannot start {argv[0]}: {e}") from None
    except FileNotFoundError:
        if shutil.which(PRLIMIT) is None:
            raise SandboxError("prlimit is not installed: apt-get install util-linux") from None
        raise
    finally:
        if stdin is not None:
            os.close(stdin_fd)
        if filter_fd is not None:
            os.close(filter_fd)
    capture = _Capture(log_keep)
    reader = threading.Thread(target=_drain, args=(proc.stdout, capture, marker.encode()), daemon=True)
    reader.start()
    exited = _exited(proc, timeout)
    _kill_everything(proc)
    reader.join(timeout=5)  # only a process that escaped (isolate=False, via another service) can hold it
    if STOPPING.is_set() and not exited:
        raise Interrupted(f"killed: stopping ({cmd[0]})")
    if not capture.started and not exited and not capture.text().strip():
        # the budget ran out before the program could start (a budget shorter than the sandbox's start on
        # a busy machine): a timeout like any other, not a broken setup
        return None, f"the sandbox did not start within {timeout:g} s"
    if not capture.started:
        why = capture.text().strip() or f"the sandbox did not start within {timeout} s"
        raise (SandboxBusy if SHORTAGE in why else SandboxError)(why)
    return (proc.returncode if exited else None), capture.text()
