"""A seccomp filter that forbids new user namespaces, for bubblewrap older than 0.8.0 (harness/sandbox.py).

Why: a program that makes a user namespace of its own holds every capability inside it, and with them
reaches kernel code (mounting file systems, netfilter, ...) that an unprivileged process never would:
most of the kernel's recent local privilege escalations start there. bubblewrap 0.8.0 forbids it with
--disable-userns; older releases (Ubuntu 22.04 ships 0.6.1, RHEL 9 0.4.1) have no such option, but every
one of them loads a classic-BPF seccomp program from a file descriptor (--seccomp FD) just before it
starts the command. This module writes that program, by hand: a few instructions need no libseccomp.

The rules, for each system call of the sandboxed command:

  * unshare and clone whose flags include CLONE_NEWUSER fail with EPERM;
  * clone3 fails with ENOSYS: its flags lie in a struct in the caller's memory, which a seccomp filter
    cannot read, so it cannot tell a thread from a new user namespace. "Not implemented" makes glibc
    fall back to clone, whose flags it can read (Flatpak and Docker do the same);
  * every other call is allowed.

The numbers of those calls depend on the ABI that made the call, which the filter reads first
(seccomp_data.arch). It knows the 64-bit ABIs of x86_64 and aarch64; a call through any other ABI (a
32-bit one: int 0x80 on x86_64, 32-bit ARM on aarch64) or through x32 (the x86_64 ABI with bit 30 set
in the call's number) kills the process: each has numbers of its own, and no program built here uses
one, so refusing them all is simpler than knowing them all.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass

# Classic BPF, as <linux/filter.h> and <linux/bpf_common.h> spell the instructions used here.
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: load the 32-bit word at an offset of seccomp_data
JEQ, JGE, JSET = 0x15, 0x35, 0x45  # BPF_JMP | BPF_JEQ / BPF_JGE / BPF_JSET, compared with a constant
RET = 0x06  # BPF_RET | BPF_K: return a constant

# What the filter returns (<linux/seccomp.h>).
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000  # | the errno the call then fails with
RET_KILL_PROCESS = 0x80000000  # kernels older than 4.14 read it as "kill the thread"

# Offsets in struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
NR, ARCH, ARG0_LOW = 0, 4, 16  # ARG0_LOW: the first argument's low word on a little-endian ABI

CLONE_NEWUSER = 0x10000000  # <linux/sched.h>; it lies in the flags' low word
X32_SYSCALL_BIT = 0x40000000  # <asm/unistd.h> on x86_64


@dataclass(frozen=True)
class Abi:
    """A system-call ABI the filter knows: its audit architecture (<linux/audit.h>) and the numbers of
    the three calls that can make a user namespace. Both ABIs here are little-endian and take clone's
    flags as its first argument."""

    arch: int
    unshare: int
    clone: int
    clone3: int
    x32_bit: bool = False  # calls with X32_SYSCALL_BIT set use the x32 ABI under this arch's name


ABIS = (
    Abi(arch=0xC000003E, unshare=272, clone=56, clone3=435, x32_bit=True),  # x86_64
    Abi(arch=0xC00000B7, unshare=97, clone=220, clone3=435),  # aarch64
)

# Where the rules of an ABI jump to: the instructions after its checks, in this order (_ENDING).
ALLOW, FLAGS, EPERM, ENOSYS, KILL = 0, 1, 4, 5, 6


def _instruction(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    """One struct sock_filter: __u16 code, __u8 jt, __u8 jf, __u32 k, in the machine's byte order. A
    jump goes jt (true) or jf (false) instructions past the next one."""
    return struct.pack("=HBBI", code, jt, jf, k)


# The end of every ABI's rules: the outcomes its checks jump to (ALLOW ... KILL index into it).
_ENDING = [
    _instruction(RET, RET_ALLOW),  # ALLOW: none of the three calls
    _instruction(LD_W_ABS, ARG0_LOW),  # FLAGS: unshare's or clone's flags
    _instruction(JSET, CLONE_NEWUSER, jt=EPERM - 3),  # a new user namespace: to EPERM, else on
    _instruction(RET, RET_ALLOW),
    _instruction(RET, RET_ERRNO | errno.EPERM),  # EPERM
    _instruction(RET, RET_ERRNO | errno.ENOSYS),  # ENOSYS
    _instruction(RET, RET_KILL_PROCESS),  # KILL
]


def abi_rules(abi: Abi) -> list[bytes]:
    """The instructions for a call made through `abi`: load its number, jump to the outcome it gets."""
    checks = [(JGE, X32_SYSCALL_BIT, KILL)] if abi.x32_bit else []
    checks += [(JEQ, abi.clone3, ENOSYS), (JEQ, abi.unshare, FLAGS), (JEQ, abi.clone, FLAGS)]
    # check i sits at i, the ending starts at len(checks); the last check falls through to ALLOW
    jumps = [
        _instruction(code, k, jt=len(checks) + target - (i + 1)) for i, (code, k, target) in enumerate(checks)
    ]
    return [_instruction(LD_W_ABS, NR), *jumps, *_ENDING]


def program(abis: tuple[Abi, ...] = ABIS) -> bytes:
    """The filter as bwrap's --seccomp reads it: the instructions back to back.

    Layout: load the arch; one jump per ABI to its rules; kill (an ABI not listed); then the rules of
    each ABI in turn."""
    rules = [abi_rules(abi) for abi in abis]
    start = 1 + len(abis) + 1  # where the first ABI's rules begin
    dispatch = []
    for i, abi in enumerate(abis):
        # the jump for ABI i sits at 1 + i; its rules begin after those of the ABIs before it
        dispatch.append(_instruction(JEQ, abi.arch, jt=start + sum(map(len, rules[:i])) - (2 + i)))
    head = [_instruction(LD_W_ABS, ARCH), *dispatch, _instruction(RET, RET_KILL_PROCESS)]
    return b"".join(head + [instruction for block in rules for instruction in block])
