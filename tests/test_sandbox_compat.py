"""harness/sandbox.py on the bubblewrap releases users have, and without a sandbox (isolate=False).

Older bubblewraps are stand-ins: a script that answers --version and --help as that release would (the
real usage text without the options it lacks), refuses those options as bwrap does ("Unknown option"),
and else runs the real bwrap. 0.6.1 (Ubuntu 22.04) lacks --disable-userns and --size (0.7.0 added it);
0.4.0 (RHEL 9), the oldest release the sandbox supports, lacks options it does not use too.
On each, and on the real one, the probe says what is used and what is missing, a program in the sandbox
cannot make a user namespace (the seccomp filter of harness/userns_filter.py, or --disable-userns), a
stage-04 run with --bwrap passes a task's reference, as root and as another user (nobody, with the
system python). Without a sandbox, nothing a command started outlives a caller killed by SIGKILL
(harness/reaper.py), nor the command itself."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from conftest import eval_stage, refused

from cuset_common.paths import ROOT
from harness.sandbox import probe_isolation, run_sandboxed, use_bwrap

NOBODY = 65534
REAL_BWRAP = "/usr/bin/bwrap"
TEXT = {"capture_output": True, "text": True, "timeout": 120}  # subprocess.run's for a driver
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="running as nobody needs root")
pytestmark = pytest.mark.skipif(not os.access(REAL_BWRAP, os.X_OK), reason="bubblewrap is not installed")

# The options of the real bwrap's usage text that each release lacks (bubblewrap's own usage text of
# that release, compared with 0.8.0's).
LACKS = {
    "0.6.1": ("--add-seccomp-fd", "--assert-userns-disabled", "--disable-userns", "--size"),
    "0.4.0": (
        "--add-seccomp-fd",
        "--assert-userns-disabled",
        "--chmod",
        "--clearenv",
        "--disable-userns",
        "--perms",
        "--size",
    ),
}

STAND_IN = """#!/bin/sh
# bubblewrap {version} as far as its options go: the real bwrap without those it lacks
case "$1" in
--version) echo "bubblewrap {version}"; exit 0 ;;
--help) {real} --help | grep -v -w -F {greps}; exit 0 ;;
esac
for arg; do
    [ "$arg" = "--" ] && break
    for lacking in {lacks}; do
        if [ "$arg" = "$lacking" ]; then echo "bwrap: Unknown option $arg" >&2; exit 1; fi
    done
done
exec {real} "$@"
"""

# Each argument names a way to make a user namespace (or a call that must still work) and prints
# `name=ok` or `name=<the error>`; x32 and int80 call unshare through another ABI of x86_64.
USERNS = r"""
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

static std::string said(long r) { return r >= 0 ? "ok" : strerror(errno); }
static long reaped(long pid) { if (pid == 0) _exit(0); if (pid > 0) waitpid(pid, nullptr, 0); return pid; }
static void* nothing(void* arg) { return arg; }
static long act(const std::string& what) {
    if (what == "unshare") return unshare(CLONE_NEWUSER);
    if (what == "clone") return reaped(syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0));
    if (what == "clone3") {  // struct clone_args as its first version: flags, ..., exit_signal, ...
        unsigned long long args[8] = {CLONE_NEWUSER, 0, 0, 0, SIGCHLD, 0, 0, 0};
        return reaped(syscall(435, args, sizeof args));
    }
    if (what == "fork") return reaped(fork());
    if (what == "thread") {
        pthread_t t;
        int e = pthread_create(&t, nullptr, nothing, nullptr);
        if (e) { errno = e; return -1; }
        return pthread_join(t, nullptr);
    }
#ifdef __x86_64__
    if (what == "x32") return syscall(0x40000000 | SYS_unshare, CLONE_NEWUSER);
    if (what == "int80") {  // i386's unshare is 310
        long r;
        asm volatile("int $0x80" : "=a"(r) : "a"(310), "b"(CLONE_NEWUSER) : "memory");
        if (r < 0) { errno = -r; return -1; }
        return r;
    }
#endif
    errno = EINVAL;
    return -1;
}
int main(int argc, char** argv) {
    for (int i = 1; i < argc; i++) { printf("%s=%s\n", argv[i], said(act(argv[i])).c_str()); fflush(stdout); }
}
"""  # noqa: E501

# Runs one job with harness/ from the folder in argv[1] (the checkout, or a copy nobody can read):
# the probe, or one command, sandboxed or not, with the bwrap named (None: the one on PATH).
DRIVER = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from harness.sandbox import SandboxError, probe_isolation, run_sandboxed, use_bwrap
job = json.loads(sys.argv[2])
use_bwrap(job["bwrap"])
if job.get("probe"):
    print(json.dumps({"how": probe_isolation().how}))
    sys.exit()
try:
    code, log = run_sandboxed(job["cmd"], Path(job["cwd"]), job["timeout"], untrusted=True, isolate=job["isolate"])
    print(json.dumps({"code": code, "log": log}))
except SandboxError as e:
    print(json.dumps({"error": str(e)}))
"""  # noqa: E501


def stand_in(folder: Path, version: str) -> Path:
    """An executable `bwrap` in folder/version/ that acts as bubblewrap `version` (LACKS)."""
    lacks = LACKS[version]
    script = STAND_IN.format(
        version=version, real=REAL_BWRAP, lacks=" ".join(lacks), greps=" ".join(f"-e {o}" for o in lacks)
    )
    path = folder / version / "bwrap"
    path.parent.mkdir(mode=0o755)
    path.write_text(script)
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def base():
    """A folder anyone may traverse (the sandbox uids and nobody run the stand-ins and programs from it):
    the stand-ins, USERNS built, the driver and a copy of harness/'s sandbox modules."""
    path = Path(tempfile.mkdtemp(prefix="cuset-compat-test-"))
    try:
        path.chmod(0o755)
        for version in LACKS:
            stand_in(path, version)
        (path / "harness").mkdir()
        for module in ("sandbox.py", "userns_filter.py", "reaper.py"):
            shutil.copy(ROOT / "harness" / module, path / "harness" / module)
        (path / "driver.py").write_text(DRIVER)
        (path / "userns.cpp").write_text(USERNS)
        subprocess.run(["g++", "-O1", "-pthread", "-o", path / "userns", path / "userns.cpp"], check=True)
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture(autouse=True)
def bwrap_on_path_afterwards():
    """Every test leaves the module's choice as it found it: the bwrap on PATH."""
    yield
    use_bwrap(None)


def real_usage() -> str:
    return subprocess.run([REAL_BWRAP, "--help"], capture_output=True, text=True).stdout


def bwrap_path(base: Path, version: str) -> str:
    return REAL_BWRAP if version == "real" else str(base / version / "bwrap")


def as_nobody(*argv: str) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


def folder(base: Path, who: str) -> Path:
    """A fresh folder with USERNS in it, owned by `who`."""
    path = Path(tempfile.mkdtemp(dir=base))
    path.chmod(0o755)
    shutil.copy(base / "userns", path / "userns")
    if who == "nobody":
        for p in (path, path / "userns"):
            os.chown(p, NOBODY, NOBODY)
    return path


def driver(base: Path, who: str, job: dict) -> list[str]:
    """The command that runs `job` through DRIVER: as root with our interpreter and the checkout's
    harness/, or as nobody with the system python and base's copy."""
    if who == "nobody":
        return as_nobody("/usr/bin/python3", str(base / "driver.py"), str(base), json.dumps(job))
    return [sys.executable, str(base / "driver.py"), str(ROOT), json.dumps(job)]


def sandboxed(base: Path, who: str, version: str, cmd: list[str], isolate: bool = True) -> tuple[int, str]:
    """(exit status, output) of cmd in a fresh folder, sandboxed with `version`'s bwrap, as `who`."""
    cwd = folder(base, who)
    if who == "self":
        use_bwrap(bwrap_path(base, version))
        return run_sandboxed(cmd, cwd, 60, untrusted=True, isolate=isolate)
    job = {"bwrap": bwrap_path(base, version), "cmd": cmd, "cwd": str(cwd), "timeout": 60, "isolate": isolate}
    r = subprocess.run(driver(base, who, job), **TEXT)
    report = json.loads(r.stdout)
    assert "error" not in report, report["error"]
    return report["code"], report["log"]


WHO = ["self", pytest.param("nobody", marks=root_only)]


# ---------------------------------------------------------------------------------------
# The probe says what is used and what is missing
# ---------------------------------------------------------------------------------------


def test_a_bwrap_on_path_without_disable_userns_gets_the_seccomp_filter(base, monkeypatch):
    monkeypatch.setenv("PATH", f"{base / '0.6.1'}{os.pathsep}{os.environ['PATH']}")
    use_bwrap(None)
    isolation = probe_isolation()
    assert isolation.available, isolation.how
    assert isolation.how.startswith(
        "bubblewrap 0.6.1: new user namespaces: seccomp filter (bwrap 0.6.1 has no --disable-userns); "
        "/tmp and /dev/shm: no size bound (bwrap 0.6.1 has no --size); user, mount, PID, network, IPC, UTS "
        "namespaces; "
    ), isolation.how


@pytest.mark.parametrize(
    "version,said",
    [
        pytest.param("real", "new user namespaces: --disable-userns; user, mount", id="real"),
        pytest.param(
            "0.4.0",
            "new user namespaces: seccomp filter (bwrap 0.4.0 has no --disable-userns); "
            "/tmp and /dev/shm: no size bound (bwrap 0.4.0 has no --size); user, mount",
            id="0.4.0",
        ),
    ],
)
@pytest.mark.parametrize("who", WHO)
def test_the_probe_says_what_blocks_user_namespaces_and_what_is_missing(base, who, version, said):
    if version == "real" and "--disable-userns" not in real_usage():
        pytest.skip("this machine's bubblewrap is older than 0.8.0: the stand-ins' case")
    if who == "self":
        use_bwrap(bwrap_path(base, version))
        how = probe_isolation().how
    else:
        r = subprocess.run(driver(base, who, {"bwrap": bwrap_path(base, version), "probe": True}), **TEXT)
        how = json.loads(r.stdout)["how"]
    assert f": {said}" in how, how


def test_a_bwrap_that_lacks_a_needed_option_is_refused_naming_it(base, tmp_path):
    script = (base / "0.4.0" / "bwrap").read_text().replace("-e --size", "-e --size -e --remount-ro")
    (tmp_path / "bwrap").write_text(script)
    (tmp_path / "bwrap").chmod(0o755)
    use_bwrap(tmp_path / "bwrap")
    isolation = probe_isolation()
    assert not isolation.available
    assert isolation.how == "bwrap 0.4.0 has no --remount-ro: install bubblewrap 0.4.0 or later"


# ---------------------------------------------------------------------------------------
# No new user namespace in the sandbox, whatever the bwrap; the rest still works
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["real", "0.6.1", "0.4.0"])
@pytest.mark.parametrize("who", WHO)
def test_no_program_in_the_sandbox_makes_a_user_namespace(base, who, version):
    code, log = sandboxed(base, who, version, ["./userns", "unshare", "clone", "clone3", "fork", "thread"])
    assert code == 0, log
    results = dict(line.split("=", 1) for line in log.splitlines())
    assert results["fork"] == results["thread"] == "ok"  # glibc's threads fall back from clone3 to clone
    assert all(results[way] != "ok" for way in ("unshare", "clone", "clone3")), results
    if version != "real":  # the filter's own answers (--disable-userns gives ENOSPC)
        assert results["unshare"] == results["clone"] == "Operation not permitted", results
        assert results["clone3"] == "Function not implemented", results
    code, log = sandboxed(base, who, version, ["unshare", "-U", "true"])
    assert code != 0 and "unshare failed" in log, log
    if version != "real":
        assert "Operation not permitted" in log, log


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 and int 0x80 are x86_64's")
@pytest.mark.parametrize("way", ["x32", "int80"])
def test_a_call_through_another_abi_kills_the_program(base, way):
    code, log = sandboxed(base, "self", "0.6.1", ["./userns", way])
    assert (code, log) == (128 + signal.SIGSYS, ""), log  # bwrap's status for a child killed by a signal


@pytest.mark.parametrize("version", ["0.6.1", "0.4.0"])
def test_stage_04_runs_a_reference_with_the_bwrap_given(base, tmp_path, capsys, version):
    ev, out = eval_stage(), tmp_path / "ev"
    argv = ["--reference", "--split", "eval", "--levels", "1", "--limit", "1", "--out", str(out)]
    assert ev.main([*argv, "--bwrap", bwrap_path(base, version)]) == 0
    said = f"sandbox: bubblewrap {version}: new user namespaces: seccomp filter (bwrap {version} has no"
    assert said in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["pass@1"] == 1.0, summary["outcomes"]


@pytest.mark.parametrize("what", ["missing", "a folder", "not executable"])
def test_a_bwrap_that_is_no_executable_file_is_refused_in_one_line(tmp_path, capsys, what):
    path = {"missing": tmp_path / "missing", "a folder": tmp_path, "not executable": tmp_path / "notes"}[what]
    (tmp_path / "notes").write_text("not a program\n")
    line, _ = refused(eval_stage().main, ["--bwrap", path], capsys)
    assert line.startswith(f"error: --bwrap {path}: not an executable file; "), line


# ---------------------------------------------------------------------------------------
# Without a sandbox: nothing outlives the command, nor a caller killed by SIGKILL
# ---------------------------------------------------------------------------------------


def token_sleep() -> tuple[str, str]:
    """(a unique token, a sleep of about 300 s whose command line holds it)."""
    token = f"300.{uuid.uuid4().int % 10**12:012d}"
    return token, f"sleep {token}"


def survivors(token: str) -> list[list[str]]:
    """The command lines of the live (non-zombie) processes that hold `token`: the sleeps, the shell, the
    reaper."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline, status = (proc / "cmdline").read_bytes(), (proc / "stat").read_text()
        except OSError:
            continue
        if token.encode() in cmdline and status[status.rindex(")") + 2] != "Z":
            found.append(cmdline.decode().split("\0")[:-1])
    return found


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("who", WHO)
def test_an_unsandboxed_command_and_its_children_die_with_a_killed_caller(base, who):
    token, sleep = token_sleep()
    cmd = ["sh", "-c", f"{sleep} & {sleep}"]  # a background grandchild and a child
    job = {"bwrap": None, "cmd": cmd, "cwd": str(folder(base, who)), "timeout": 600, "isolate": False}
    caller = subprocess.Popen(driver(base, who, job), stdout=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: survivors(token).count(["sleep", token]) == 2, 30), survivors(token)
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    assert wait_for(lambda: not survivors(token), 5), survivors(token)


def test_nothing_an_unsandboxed_command_left_outlives_it_and_its_end_is_kept(base):
    token, sleep = token_sleep()
    leaves = f"setsid {sleep} & {sleep} & exit 3"  # one in a session of its own, out of the group's reach
    assert sandboxed(base, "self", "real", ["sh", "-c", leaves], isolate=False) == (3, "")
    assert survivors(token) == []
    for sig in (signal.SIGSEGV, signal.SIGKILL):  # a signal the reaper can take on, and one it cannot
        dies = ["sh", "-c", f"kill -{sig.name[3:]} $$"]
        assert sandboxed(base, "self", "real", dies, isolate=False)[0] == -sig
