"""Plumbing shared by the bench scripts: the machine label and its limits (GEMM FLOP/s, memory
bandwidth), thread count, interleaved timing, peak extra memory measured in a forked child per variant,
and the table printer.

Memory method. On a CPU, torch's allocator is invisible to tracemalloc, so we read the kernel's
numbers. Once the model and data are loaded, the process forks one child per variant. The child
(1) computes on one thread: OpenMP's pool does not survive a fork (per-thread buffers are small
next to activations and logits); (2) takes every block of 128 KiB or more from mmap, so that it
neither reuses memory the parent freed (still counted in VmRSS) nor keeps what it frees;
(3) runs warm_up(), a small forward pass, so that pages of code and weights it has not touched
yet (a forked child maps file-backed pages as it touches them) are not charged to the variant;
(4) records its resident set (VmRSS), resets its peak (writing 5 to /proc/self/clear_refs sets
VmHWM to VmRSS, Linux >= 4.0), runs the variant once and reads the peak (VmHWM). Peak extra
memory = VmHWM - VmRSS before the run: what the variant adds on top of the loaded model, data
(and, in training, optimizer state). On a GPU: torch.cuda.max_memory_allocated() -
memory_allocated() before the run, in process (the caching allocator's counters see every tensor).
"""

from __future__ import annotations

import ctypes
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from cuset_common.models import load_causal_lm
from cuset_common.paths import TINY_MODEL

MIB, GIB = 2**20, 2**30
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def cpus_available() -> int:
    """The CPUs this process may run on (not the machine's count: a container may get fewer)."""
    return len(os.sched_getaffinity(0))


def add_run_args(ap) -> None:
    """--repeats, --threads and --device, the same in every bench."""
    ap.add_argument(
        "--repeats", type=int, default=2, help="rounds of timing (default %(default)s; --quick: 1)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: the CPUs available; --quick: 1, fastest on a shared CI machine)",
    )
    ap.add_argument("--device", type=str, default="cpu", help="cpu, cuda, cuda:1, ...")


def resolve_run_args(args) -> None:
    """--quick means one round on one thread; otherwise threads default to cpus_available()."""
    if args.quick:
        args.repeats = 1
    if args.threads is None:
        args.threads = 1 if args.quick else cpus_available()


def machine(device: str, threads: int) -> str:
    """One line naming what the figures were measured on."""
    if device.startswith("cuda"):
        where = f"{torch.cuda.get_device_name(device)}"
    else:
        names = [
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ]
        where = f"{names[0] if names else platform.processor()}, {cpus_available()} CPUs available"
    return (
        f"{where}; torch {torch.__version__} with {threads} threads (torch.set_num_threads); "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )


def machine_limits(threads: int, device: str = "cpu") -> dict[str, float]:
    """This machine's limits on `threads` torch threads, measured now: the best of 5 runs of a square matrix
    product in fp32 and in bf16 (FLOP/s: 2 n^3 per product; 2048 on a CPU, 8192 on a GPU, where the
    products are larger than any a decode step makes, so these are ceilings), and the rate at which a sum
    reads a float32 tensor far larger than any cache (bytes/s). bf16 on a CPU without native bf16 is
    emulated: its figure then shows the emulation's speed. Torch's thread count is put back."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 8192 if device.startswith("cuda") else 2048
        limits = {
            f"gemm_{name}": 2 * n**3 / best_seconds(lambda a=a: a @ a, device)
            for name, a in (
                ("fp32", torch.randn(n, n, device=device)),
                ("bf16", torch.randn(n, n, device=device, dtype=torch.bfloat16)),
            )
        }
        big = torch.ones(GIB // 4 // 2, device=device)  # 512 MiB of float32
        return limits | {"memory_read": big.numel() * 4 / best_seconds(big.sum, device)}
    finally:
        torch.set_num_threads(previous)


def limits_line(limits: dict[str, float], threads: int, native_bf16: bool) -> str:
    """machine_limits as one line of a bench's output."""
    return (
        f"limits on {threads} thread(s): GEMM fp32 {limits['gemm_fp32'] / 1e9:,.1f} GFLOP/s, bf16 "
        f"{limits['gemm_bf16'] / 1e9:,.1f} GFLOP/s (native bf16: {'yes' if native_bf16 else 'no'}); memory "
        f"read {limits['memory_read'] / 1e9:,.1f} GB/s"
    )


def best_seconds(run: Callable[[], object], device: str, repeats: int = 5) -> float:
    """The fastest of `repeats` wall-clock runs of `run` after one untimed (the machine's best: a ceiling)."""
    run()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def wide_model(vocab: int):
    """The bundled tiny model's body with a random output layer of `vocab` rows (seeded; tied, so the input
    embedding grows with it): the shape of a real model's head on a body that runs in seconds on a CPU."""
    model = load_causal_lm(str(TINY_MODEL), torch.float32)
    torch.manual_seed(0)
    model.resize_token_embeddings(vocab, mean_resizing=False)
    torch.nn.init.normal_(model.get_output_embeddings().weight, std=model.config.initializer_range)
    return model


@torch.no_grad()
def warm_up(model, device: str) -> None:
    """One forward pass on 16 tokens and a log-softmax: what every variant does first, on a scale too small to
    matter, so that one-time set-up (lazy initialisation, pages of code and weights) is charged to none."""
    model(input_ids=torch.arange(16, device=device)[None]).logits.float().log_softmax(-1)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def clock(device: str) -> tuple[Callable[[], float], str]:
    """(timer, unit). On a CPU the process's CPU time: on a shared machine wall time mostly measures how
    long the scheduler made us wait (it swung the same code by 2x between runs here), CPU time what the
    work cost. On a GPU wall time, synchronized."""
    return (time.process_time, "CPU s") if device == "cpu" else (time.perf_counter, "s")


def interleaved_times(
    variants: dict[str, Callable[[], object]], repeats: int, device: str
) -> dict[str, list[float]]:
    """Seconds (clock(device)) per run of each variant, `repeats` rounds; the order flips every round so
    that a slow spell of the machine (or warm caches) does not always favour the same variant."""
    timer, _ = clock(device)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(repeats):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            synchronize(device)
            t0 = timer()
            variants[name]()
            synchronize(device)
            times[name].append(timer() - t0)
    return times


def median_ratio(times: dict[str, list[float]], name: str, anchor: str) -> float:
    """Speed of `name` relative to `anchor` (> 1: faster), the median over rounds of the ratio within
    one round: both ran back to back, so the machine's load largely cancels."""
    return statistics.median(a / b for a, b in zip(times[anchor], times[name]))


def _proc_status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _peak_rss_delta(run: Callable[[], object]) -> int:
    base = _proc_status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    run()
    return _proc_status_bytes("VmHWM") - base


def peak_extra_memory(run: Callable[[], object], device: str, warm_up: Callable[[], object]) -> int:
    """Bytes `run` needs beyond what is already loaded, measured as the module docstring says (on a CPU in
    a forked child that calls warm_up() first)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report through the pipe, exit without running the parent's cleanup
        code = 1
        try:
            torch.set_num_threads(1)  # OpenMP's thread pool does not survive fork: more threads hang here
            # blocks >= 128 KiB from mmap: no reuse of the parent's freed memory, nothing kept once freed
            ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024)
            warm_up()
            os.write(write_end, str(_peak_rss_delta(run)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        reported = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not reported:
        raise RuntimeError(f"the memory measurement's child process failed (wait status {status})")
    return int(reported)


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    """A markdown table (pastes into docs/performance.md as it is)."""
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" if k == 0 else "---:" for k in range(len(headers))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
