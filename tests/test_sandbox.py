"""harness/sandbox.py against hostile programs, as root (pytest itself) and as a non-root user
(a driver run as nobody with the system python): no reading or writing outside its folder, no
host processes, no sockets, nothing survives the timeout; the compilers work in the whitelist;
the probe says why isolation is unavailable where it is. As root, one uid per job: concurrent
jobs differ, a held uid is not taken, a killed holder frees it, nothing of a job's uid survives
it; not root, the user's own processes leave a job its allowance; a sandbox that cannot start
for want of processes is a timeout of that call, not an abort."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from cuset_common.paths import ROOT
from harness.programs import Runner
from harness.sandbox import (
    SANDBOX_UIDS,
    SandboxBusy,
    SandboxError,
    gpu_access_problem,
    hold_uid,
    probe_isolation,
    run_sandboxed,
)

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox uid and running as nobody need root")
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

# One program, many attacks: each argument `action:arg` prints `action:arg=ok` or `=<the error>`. Its
# lines, and the driver's below, are the programs' own (noqa: E501): wrapping them would change them.
HOSTILE = r"""
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

static std::string errs(bool ok) { return ok ? "ok" : strerror(errno); }
static std::string connect_to(int family, const sockaddr* addr, socklen_t len) {
    int fd = socket(family, SOCK_STREAM, 0);
    return errs(fd >= 0 && connect(fd, addr, len) == 0);
}
static std::string unix_socket(const std::string& path, bool abstract) {
    sockaddr_un a{}; a.sun_family = AF_UNIX;
    memcpy(a.sun_path + abstract, path.data(), path.size());  // abstract names start with a NUL byte
    return connect_to(AF_UNIX, (sockaddr*)&a, offsetof(sockaddr_un, sun_path) + abstract + path.size());
}
static std::string pids() {
    std::string out; DIR* d = opendir("/proc");
    while (dirent* e = readdir(d))
        if (e->d_name[0] >= '1' && e->d_name[0] <= '9') out += std::string(e->d_name) + " ";
    return out;
}
static void sleep_forever() { for (;;) pause(); }
static std::string act(const std::string& what, const std::string& arg) {
    const char* path = arg.c_str();
    char c;
    if (what == "read") { int fd = open(path, O_RDONLY); return errs(fd >= 0 && read(fd, &c, 1) >= 0); }
    if (what == "list") return errs(opendir(path) != nullptr);
    if (what == "write") {
        int fd = open(path, O_WRONLY | O_CREAT, 0666);
        return errs(fd >= 0 && write(fd, "x", 1) == 1);
    }
    if (what == "unix") return unix_socket(arg, false);
    if (what == "abstract") return unix_socket(arg, true);
    if (what == "tcp") {
        sockaddr_in a{}; a.sin_family = AF_INET; a.sin_port = htons(atoi(path));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return connect_to(AF_INET, (sockaddr*)&a, sizeof a);
    }
    if (what == "signal") return errs(kill(atoi(path), 0) == 0);
    if (what == "pids") return pids();
    if (what == "megabytes") {  // the size of the file system at `path`
        struct statvfs f;
        return statvfs(path, &f) ? errs(false) : std::to_string(f.f_blocks * f.f_frsize >> 20);
    }
    if (what == "spew") { for (long i = 0; i < atol(path); i++) putchar('a' + (i * 7 + i / 26) % 26); return "ok"; }
    if (what == "loop") for (volatile long i = 0;; i++) {}
    if (what == "bomb") { while (fork() >= 0) setsid(); sleep_forever(); }  // every process forks until refused
    if (what == "setsid") { if (fork() == 0) { setsid(); sleep_forever(); } sleep_forever(); }
    if (what == "daemon") {  // a grandchild in its own session, orphaned at once
        if (fork() == 0) { setsid(); if (fork() == 0) sleep_forever(); _exit(0); }
        sleep_forever();
    }
    if (what == "double") {  // data/in.bin -> data/out.bin, each byte doubled
        FILE* in = fopen("data/in.bin", "rb"); FILE* out = fopen("data/out.bin", "wb"); int c;
        if (!in || !out) return errs(false);
        while ((c = fgetc(in)) != EOF) fputc(2 * c, out);
        return fclose(out) == 0 ? "ok" : errs(false);
    }
    return "unknown action";
}
int main(int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i]; size_t colon = a.find(':');
        std::string result = act(a.substr(0, colon), colon == std::string::npos ? "" : a.substr(colon + 1));
        if (a.rfind("spew", 0) != 0) printf("%s=%s\n", argv[i], result.c_str());
        fflush(stdout);
    }
}
"""  # noqa: E501

# Runs one sandboxed command as its user (nobody) with the system python: stdlib and sandbox.py only.
DRIVER = r"""
import json, sys
from dataclasses import asdict
from pathlib import Path
from sandbox import SandboxError, probe_isolation, run_sandboxed
if sys.argv[1] == "probe":
    print(json.dumps(asdict(probe_isolation())))
else:
    job = json.loads(sys.argv[1])
    if "stdin" in job["kw"]:
        job["kw"]["stdin"] = job["kw"]["stdin"].encode("latin-1")
    try:
        code, log = run_sandboxed(job["cmd"], Path(job["cwd"]), job["timeout"], untrusted=job["untrusted"], **job["kw"])
        print(json.dumps({"code": code, "log": log}))
    except SandboxError as e:
        print(json.dumps({"sandbox_error": str(e), "kind": type(e).__name__}))
"""  # noqa: E501


@pytest.fixture(scope="session")
def base():
    """A world-traversable folder under /tmp: nobody cannot reach pytest's tmp_path."""
    path = Path(tempfile.mkdtemp(prefix="cuset-sandbox-test-"))
    try:
        path.chmod(0o755)
        for module in ("sandbox.py", "reaper.py"):  # the reaper runs unsandboxed commands (isolate=False)
            (path / module).write_bytes((ROOT / "harness" / module).read_bytes())
        (path / "driver.py").write_text(DRIVER)
        (path / "hostile.cpp").write_text(HOSTILE)
        subprocess.run(["g++", "-O1", "-o", str(path / "hostile"), str(path / "hostile.cpp")], check=True)
        yield path
    finally:
        shutil.rmtree(path)


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


class Sandbox:
    """Runs commands sandboxed in fresh folders as `who`; each folder has a world-readable task file next
    to it."""

    def __init__(self, base: Path, who: str):
        self.base, self.who = base, who
        uid = NOBODY if who == "nobody" else os.getuid()
        self.runs_as = f"uids {SANDBOX_UIDS[0]}-{SANDBOX_UIDS[-1]}, one per job" if uid == 0 else f"uid {uid}"

    def folder(self) -> Path:
        top = Path(tempfile.mkdtemp(dir=self.base))
        top.chmod(0o777)  # writable for anyone: only the sandbox can keep the program from writing here
        (top / "task").mkdir(mode=0o755)
        (top / "task" / "secret.txt").write_text("reference outputs")
        (top / "task" / "secret.txt").chmod(0o644)
        (top / "run" / "data").mkdir(parents=True)
        shutil.copy(self.base / "hostile", top / "run" / "hostile")
        if self.who == "nobody":
            for p in [top / "run", *(top / "run").rglob("*")]:
                os.chown(p, NOBODY, NOBODY)
        return top / "run"

    def run(self, cmd: list[str], timeout: float = 30, cwd: Path | None = None, untrusted: bool = True, **kw):
        cwd = cwd or self.folder()
        if self.who == "self":
            return run_sandboxed(cmd, cwd, timeout, untrusted=untrusted, **kw)
        if "stdin" in kw:  # JSON has no bytes
            kw["stdin"] = kw["stdin"].decode("latin-1")
        job = {"cmd": cmd, "cwd": str(cwd), "timeout": timeout, "untrusted": untrusted, "kw": kw}
        r = as_nobody("/usr/bin/python3", str(self.base / "driver.py"), json.dumps(job))
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        if "sandbox_error" in report:
            kind = SandboxBusy if report["kind"] == "SandboxBusy" else SandboxError
            raise kind(report["sandbox_error"])
        return report["code"], report["log"]

    def attack(self, *actions: str, **kw) -> dict[str, str]:
        code, log = self.run(["./hostile", *actions], **kw)
        assert code == 0, log
        return dict(line.split("=", 1) for line in log.splitlines())


@pytest.fixture(scope="session", params=["self", pytest.param("nobody", marks=root_only)])
def sandbox(request, base) -> Sandbox:
    return Sandbox(base, request.param)


@pytest.fixture(scope="session")
def listeners():
    """A filesystem unix socket under /tmp, an abstract one and a TCP port on 127.0.0.1, all open to
    anyone."""
    path = f"/tmp/cuset-test-{uuid.uuid4().hex[:8]}.sock"
    fs, abstract, tcp = (socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX), socket.socket())
    fs.bind(path)
    os.chmod(path, 0o777)
    name = f"cuset-test-{uuid.uuid4().hex[:8]}"
    abstract.bind("\0" + name)
    tcp.bind(("127.0.0.1", 0))
    for s in (fs, abstract, tcp):
        s.listen()
    yield {"unix": path, "abstract": name, "tcp": str(tcp.getsockname()[1])}
    for s in (fs, abstract, tcp):
        s.close()
    os.unlink(path)


def survivors(token: str) -> list[str]:
    """Live (non-zombie) processes whose command line holds `token`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline, status = (proc / "cmdline").read_bytes(), (proc / "stat").read_text()
        except OSError:
            continue
        if token.encode() in cmdline and status[status.rindex(")") + 2] != "Z":
            found.append(f"{proc.name}: {cmdline!r}")
    return found


# ---------------------------------------------------------------------------------------
# What the program cannot reach
# ---------------------------------------------------------------------------------------


def test_it_cannot_read_the_project_the_task_file_or_home_folders(sandbox):
    cwd = sandbox.folder()
    results = sandbox.attack(
        f"read:{ROOT / 'README.md'}",
        f"read:{ROOT / 'cuset_common' / '__init__.py'}",
        "read:../task/secret.txt",
        f"read:{cwd.parent / 'task' / 'secret.txt'}",
        f"list:{ROOT}",
        "list:/root",
        "list:/home",
        "read:/etc/shadow",
        "read:/etc/passwd",
        "list:/run",
        cwd=cwd,
    )
    assert results == dict.fromkeys(results, "No such file or directory")


def test_it_cannot_see_host_processes(sandbox):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        results = sandbox.attack(
            "pids", f"signal:{sleeper.pid}", f"signal:{os.getpid()}", f"read:/proc/{sleeper.pid}/cmdline"
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    pids = {int(p) for p in results.pop("pids").split()}
    assert len(pids) <= 3 and sleeper.pid not in pids and os.getpid() not in pids, (
        pids
    )  # bwrap's init and the program
    assert all(
        result == "No such process" or result == "No such file or directory" for result in results.values()
    )


def test_nothing_it_writes_outside_its_folder_reaches_the_host(sandbox):
    cwd, token = sandbox.folder(), uuid.uuid4().hex[:8]
    targets = [
        Path(d) / f"cuset-escape-{token}"
        for d in ("/tmp", "/var/tmp", "/dev/shm", "/run", "/run/lock", ROOT, cwd.parent, cwd.parent.parent)
    ]
    sandbox.attack(*(f"write:{t}" for t in targets), "write:../escape-relative", cwd=cwd)
    written = [t for t in [*targets, cwd.parent / "escape-relative"] if t.exists()]
    for t in written:
        t.unlink()
    assert written == []


def test_its_in_memory_file_systems_are_read_only_or_bounded(sandbox):
    results = sandbox.attack("write:/new", "write:/dev/new", "megabytes:/tmp", "megabytes:/dev/shm")
    assert results["write:/new"] == results["write:/dev/new"] == "Read-only file system"
    assert int(results["megabytes:/tmp"]) <= 512 and int(results["megabytes:/dev/shm"]) <= 64


def test_it_cannot_connect_to_host_sockets(sandbox, listeners):
    results = sandbox.attack(
        f"unix:{listeners['unix']}", f"abstract:{listeners['abstract']}", f"tcp:{listeners['tcp']}"
    )
    assert all(result != "ok" for result in results.values()), results


@root_only
def test_it_runs_as_a_sandbox_uid_on_the_host(base):
    cwd = Sandbox(base, "self").folder()
    Sandbox(base, "self").attack("write:mine", cwd=cwd)
    assert (cwd / "mine").stat().st_uid in SANDBOX_UIDS


@root_only
def test_a_hard_linked_shared_file_stays_read_only(base):
    cwd, shared = Sandbox(base, "self").folder(), base / "shared.h"
    shared.write_text("shared header")
    os.link(shared, cwd / "shared.h")
    results = Sandbox(base, "self").attack("read:shared.h", "write:shared.h", cwd=cwd)
    assert results == {"read:shared.h": "ok", "write:shared.h": "Permission denied"}
    assert shared.stat().st_uid == 0 and shared.read_text() == "shared header"


# ---------------------------------------------------------------------------------------
# Timeouts, limits, output
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("attack", ["bomb", "setsid", "daemon"])
def test_nothing_it_started_survives_the_timeout(sandbox, attack):
    token = uuid.uuid4().hex
    code, log = sandbox.run(["./hostile", attack, token], timeout=1, nproc=64)
    assert code is None
    assert survivors(token) == []


def test_a_setsid_child_is_killed_without_isolation_too(sandbox):
    token = uuid.uuid4().hex
    code, _ = sandbox.run(["./hostile", "setsid", token], timeout=1, isolate=False)
    assert code is None
    assert survivors(token) == []


def test_an_honest_program_reads_and_writes_its_data(sandbox):
    cwd = sandbox.folder()
    (cwd / "data" / "in.bin").write_bytes(bytes(range(100)))
    assert sandbox.attack("double", cwd=cwd) == {"double": "ok"}
    assert (cwd / "data" / "out.bin").read_bytes() == bytes(2 * b % 256 for b in range(100))


def test_an_endless_loop_times_out(sandbox):
    assert sandbox.run(["./hostile", "loop"], timeout=1)[0] is None


def spew(n: int) -> str:
    return "".join(chr(ord("a") + (i * 7 + i // 26) % 26) for i in range(n))


@pytest.mark.parametrize(
    "size,keep", [(3_000_000, 1000), (2500, 1000), (1500, 1000), (2000, 1000), (999, 1000)]
)
def test_output_keeps_head_and_tail_and_counts_the_cut_exactly(sandbox, size, keep):
    code, log = sandbox.run(["./hostile", f"spew:{size}"], log_keep=keep)
    text, cut = spew(size), max(0, size - 2 * keep)
    assert code == 0
    assert log == (text[:keep] + f"\n[... {cut} bytes cut ...]\n" + text[-keep:] if cut else text)


def test_a_sandbox_that_cannot_start_raises_and_a_program_cannot_fake_that(sandbox):
    with pytest.raises(SandboxBusy, match="Resource temporarily unavailable"):
        sandbox.run(["true"], nproc=1)  # bwrap cannot fork the sandbox's first process
    fake = "bwrap: Creating new namespace failed: Resource temporarily unavailable"
    assert sandbox.run(["sh", "-c", f"echo '{fake}'; exit 1"]) == (1, fake + "\n")


def test_stdin_is_given_then_closed(sandbox):
    code, log = sandbox.run(["sh", "-c", "cat; echo end"], stdin=b"nonce-42\n")
    assert (code, log) == (0, "nonce-42\nend\n")


# ---------------------------------------------------------------------------------------
# One uid per job (as root), a user's process budget (not root), a sandbox that cannot start
# ---------------------------------------------------------------------------------------

# Holds a uid of the pool given by a Python expression until its stdin closes; prints it first.
HOLDER = """import sys
from harness.sandbox import SANDBOX_UIDS, hold_uid
with hold_uid({pool}) as uid:
    print(uid, flush=True)
    sys.stdin.read()
"""


@contextmanager
def another_process_holding(pool: str):
    """(the process, the uid it holds) for the block; it is killed at the end if still alive."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(pool=pool)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc, int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def live_processes_of(uid: int) -> list[str]:
    """Live (non-zombie) processes that have `uid` among their real, effective, saved and fs uids."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if str(uid) in fields["Uid"].split() and not fields["State"].strip().startswith("Z"):
            found.append(f"{status.parent.name}: {fields['Name'].strip()}")
    return found


@root_only
def test_concurrent_jobs_run_as_different_uids(base):
    # Each job writes its uid, then waits until every job has written one: all of them live at once.
    box = Sandbox(base, "self")
    folders = [box.folder() for _ in range(4)]
    done = {}

    def job(folder: Path):
        done[folder] = box.run(["sh", "-c", "id -u > uid; until [ -e go ]; do sleep 0.05; done"], 60, folder)

    threads = [threading.Thread(target=job, args=(f,)) for f in folders]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not all((f / "uid").exists() for f in folders) and time.monotonic() < deadline:
        time.sleep(0.05)
    for f in folders:
        (f / "go").touch()
    for t in threads:
        t.join()
    uids = [int((f / "uid").read_text()) for f in folders]
    assert [code for code, _ in done.values()] == [0] * len(folders)
    assert len(set(uids)) == len(folders) and all(u in SANDBOX_UIDS for u in uids), uids


@root_only
def test_a_uid_another_process_holds_is_not_taken(base):
    with another_process_holding("SANDBOX_UIDS") as (_, held):
        code, log = Sandbox(base, "self").run(["id", "-u"])
    assert code == 0 and int(log) != held and int(log) in SANDBOX_UIDS


@root_only
def test_a_killed_holder_frees_its_uid():
    top = SANDBOX_UIDS[-1:]  # a pool of one uid, which stage-04 runs beside this test do not reach
    with another_process_holding("SANDBOX_UIDS[-1:]") as (holder, held):
        assert held == top[0]
        with pytest.raises(SandboxBusy, match="no free sandbox uid"), hold_uid(top):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with hold_uid(top) as again:
            assert again == held


@root_only
@pytest.mark.parametrize(
    "cmd,timeout,code",
    [(["./hostile", "bomb"], 1, None), (["sh", "-c", "./hostile daemon & sleep 0.2"], 30, 0)],
    ids=["fork-loop-till-its-timeout", "exits-leaving-a-daemon"],
)
def test_nothing_of_a_jobs_uid_survives_it(base, cmd, timeout, code):
    with hold_uid() as uid:  # held past the job: nothing else can run as this uid before we look
        assert (
            run_sandboxed(cmd, Sandbox(base, "self").folder(), timeout, untrusted=True, nproc=64, uid=uid)[0]
            == code
        )
        assert live_processes_of(uid) == []


@root_only
def test_a_process_of_the_jobs_uid_outside_its_sandbox_is_killed_after_the_job(base):
    with hold_uid() as uid:
        stray = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"]
        )
        assert run_sandboxed(["true"], Sandbox(base, "self").folder(), 30, untrusted=True, uid=uid)[0] == 0
        assert stray.wait(timeout=15) == -signal.SIGKILL
        assert live_processes_of(uid) == []


@root_only
def test_a_users_own_processes_leave_a_job_its_allowance(base):
    # Not root (nobody), with 40 processes already: a job allowed 16 still starts 5 (a limit of 16
    # processes for the user as a whole would refuse the sandbox itself).
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "120"]
    sleepers = [subprocess.Popen(as_nobody) for _ in range(40)]
    try:
        code, log = Sandbox(base, "nobody").run(
            ["sh", "-c", "for i in 1 2 3 4 5; do sleep 0.1 & done; wait; echo ok"], nproc=16
        )
    finally:
        for s in sleepers:
            s.kill()
            s.wait()
    assert (code, log) == (0, "ok\n")


def test_a_sandbox_that_cannot_start_for_want_of_processes_is_a_timeout_of_that_call(base):
    started = time.monotonic()
    code, log = Runner(True, "emulated").untrusted(["true"], Sandbox(base, "self").folder(), 1, nproc=1)
    assert code is None, log
    assert log.startswith("the sandbox could not start within 1 s, for want of a resource: ")
    assert "Resource temporarily unavailable" in log
    assert time.monotonic() - started >= 1  # retried for the call's own timeout first


# ---------------------------------------------------------------------------------------
# The GPU backend's device nodes (stand-ins: /dev/null's numbers under GPU names)
# ---------------------------------------------------------------------------------------


@root_only
def test_the_gpu_nodes_are_bound_on_the_gpu_backend_only_and_open_to_the_sandbox_uid_if_world_rw(base):
    dev = Path(tempfile.mkdtemp(dir=base))
    dev.chmod(0o755)  # the sandbox uid's bwrap must reach the nodes to bind them
    for name, mode in (("nvidiactl", 0o666), ("nvidia0", 0o660)):  # 0660: a driver limited to a group
        os.mknod(dev / name, stat.S_IFCHR | mode, os.stat("/dev/null").st_rdev)
        os.chmod(dev / name, mode)
    write_each = ["sh", "-c", "for n in nvidiactl nvidia0; do echo x > /dev/$n && echo $n=ok; done; true"]
    code, log = run_sandboxed(write_each, Sandbox(base, "self").folder(), 30, untrusted=True, gpu_dev=dev)
    assert code == 0 and "nvidiactl=ok" in log, log
    assert "nvidia0=ok" not in log and "/dev/nvidia0: Permission denied" in log, log  # --clear-groups
    assert gpu_access_problem(dev).startswith(f"{dev}/nvidia0 is crw-rw---- (gid 0): ")  # refused up front
    code, log = run_sandboxed(write_each, Sandbox(base, "self").folder(), 30, untrusted=True)
    assert "=ok" not in log and "/dev/nvidiactl: Read-only file system" in log, log  # absent: not bound


# ---------------------------------------------------------------------------------------
# Compilers in the whitelist, trusted scripts
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "compiler,source",
    [
        (
            ["nvcc", "-O2", "-gencode", "arch=compute_80,code=sm_80"],
            "__global__ void k(float* y) { *y = 1; }\n",
        ),
        (["g++", "-O2", "-x", "c++"], ""),
    ],
)
def test_the_compilers_work_in_the_whitelist(sandbox, compiler, source):
    cwd = sandbox.folder()
    (cwd / "prog.cu").write_text(source + '#include <cstdio>\nint main() { printf("built\\n"); }\n')
    code, log = sandbox.run([*compiler, "prog.cu", "-o", "prog"], timeout=120, cwd=cwd, nproc=512)
    assert code == 0, log
    assert sandbox.run(["./prog"], cwd=cwd) == (0, "built\n")


def test_trusted_scripts_see_our_files_but_no_network_and_no_host_processes(sandbox, listeners):
    # The task's file beside the run folder: hidden from the program (test above), there for gen.py and
    # compare.py. (Not the project's own files: as `nobody` those are readable only if the checkout is.)
    cwd = sandbox.folder()
    task_file = cwd.parent / "task" / "secret.txt"
    results = sandbox.attack(f"read:{task_file}", f"tcp:{listeners['tcp']}", "pids", untrusted=False, cwd=cwd)
    assert results[f"read:{task_file}"] == "ok"
    assert results[f"tcp:{listeners['tcp']}"] != "ok"
    assert len(results["pids"].split()) <= 3


# ---------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------


def test_the_probe_names_what_it_uses(sandbox, base):
    how = (
        probe_isolation().how
        if sandbox.who == "self"
        else json.loads(as_nobody("/usr/bin/python3", str(base / "driver.py"), "probe").stdout)["how"]
    )
    assert how.startswith("bubblewrap") and how.endswith(f"namespaces; {sandbox.runs_as}")


@root_only
def test_the_probe_says_why_when_user_namespaces_are_disabled(base):
    disable = "echo 0 > /proc/sys/user/max_user_namespaces"  # per user namespace: this one and those below
    r = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            f"{disable} && exec /usr/bin/python3 driver.py probe",
        ],
        cwd=base,
        capture_output=True,
        text=True,
    )
    assert json.loads(r.stdout) == {
        "available": False,
        "how": "user namespaces are disabled (/proc/sys/user/"
        "max_user_namespaces = 0): sysctl -w user.max_user_namespaces=10000",
    }


@root_only
def test_the_probe_says_why_without_bwrap(base, tmp_path):
    for tool in ("python3", "true", "setpriv"):
        (tmp_path / tool).symlink_to(shutil.which(tool, path="/usr/bin:/bin"))
    r = subprocess.run(
        ["python3", "driver.py", "probe"],
        cwd=base,
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path)},
    )
    report = json.loads(r.stdout)
    assert not report["available"] and report["how"].startswith("bwrap not found: apt-get install bubblewrap")
