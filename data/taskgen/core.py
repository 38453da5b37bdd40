"""Task specification and the renderers that turn one spec into a CUDABench-format task.

A family module (elementwise.py, reductions.py, ...) describes each operation as an `OpSpec`:
the CUDA kernels, how the host launches them, how numpy makes the inputs and the reference
outputs, and the prompts. `render_task` turns a spec into one JSONL record with the fields of
CUDABench (`bench.cu`, `gen.py`, `compare.py`, `level{1,2,3}_prompt`, ...) plus ours
(`split`, `category`, `op`, `kernel_mode`).

Rules for the CUDA a family writes (they keep the kernel-mode harness sound):
- `kernels` holds `__device__` helpers and `__global__` kernels only; no `#define` (use
  `constexpr`), no `#include` (the renderer includes cuda_runtime.h, cstdio, cstdint,
  cfloat, cmath). The same text is the reference program's kernels, the reference inside
  the harness (wrapped in `namespace cuset_ref`), and the kernel-mode SFT answer.
- `launch` is host C++ that launches the kernels. It may use: the kernel names written as
  `{k}name` (the renderer puts `cuset_ref::` there for the harness's reference run), device
  pointers `d_<buffer>` for every input, output and scratch buffer, the host constants of
  `constants`, and `CUDA_CHECK(...)`. It must not use names defined in `kernels` other than
  the kernels, because a candidate's kernels define their own helpers and constants.
- Every launch must fully define the outputs from the inputs alone (memset what it
  accumulates into), because the harness runs it many times for timing.
"""

from __future__ import annotations

import json
import textwrap
import zlib
from dataclasses import dataclass, field

# numpy dtype name -> C type. Kept small on purpose: these are all our tasks use.
C_TYPES = {
    "float32": "float",
    "float64": "double",
    "int32": "int",
    "uint32": "unsigned int",
    "int64": "long long",
    "uint8": "unsigned char",
}

# Where a candidate's kernels go in the kernel-mode harness. Stage 04 replaces this line.
CANDIDATE_MARKER = "// @CUSET_CANDIDATE_KERNELS@"

# Timing protocol of the harness (docs/evaluation.md, "Timing"). Stage 04 runs a kernel-mode program a
# second time, with TIMING_ARGUMENT, to time it; harness/timing.py reads the line it prints.
TIMING_ARGUMENT = "--time"
TIMING_REPEATS = 25  # interleaved repetitions, each timing both sides
TIMING_MIN_MS = 1.0  # the least time the launches of one side's repetition take together
TIMING_MAX_LAUNCHES = 256  # launches per side and repetition at most, each timed on its own (a flush each)
CHECK_FOLDER = "check"  # where stage 04 puts the inputs of the launch after the timed ones

SPLITS = ("train", "eval", "pretrain")


@dataclass(frozen=True)
class Buffer:
    """One array read from or written to `data/<name>.bin` (raw, little-endian, row-major)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def ctype(self) -> str:
        return C_TYPES[self.dtype]

    def shape_str(self) -> str:
        # CUDABench writes shapes as Python tuple literals: "(1048576,)", "(128, 128, 4)".
        return repr(tuple(self.shape))


@dataclass
class OpSpec:
    """Everything needed to render one task. See the module docstring for the CUDA rules."""

    op: str  # operation key; splits are disjoint by op
    name: str  # task_name, e.g. "ReLU_Activation"
    category: str
    split: str  # train | eval | pretrain
    description: str  # one sentence: what is computed
    level1: str  # guided prompt: the math plus implementation guidance
    level2: str  # algorithmic prompt: the math only
    inputs: list[Buffer]
    outputs: list[Buffer]
    constants: str  # host C++ constants used by `launch`, e.g. "const int n = 1048576;"
    kernels: str  # __device__ helpers + __global__ kernels
    signatures: list[str]  # exact __global__ signatures a kernel-mode answer must define
    launch: str  # host C++ launching `{k}kernel<<<...>>>(d_...)`
    launch_note: str  # the launch configuration in words, for the kernel-mode prompt
    gen: str  # numpy body: defines every input array and `<output>_ref` arrays; `rng` given
    atol: float = 1e-5
    rtol: float = 1e-5
    variant: str = ""  # size tag for the id when an op has several sizes
    scratch: list[Buffer] = field(default_factory=list)  # zeroed device temporaries
    copy: str = ""  # renamed SFT copy of a train task (taskgen/variants.py): id `<task id>~<copy>`

    @property
    def task_id(self) -> str:
        base = f"{self.op}_{self.variant}" if self.variant else self.op
        return f"{base}~{self.copy}" if self.copy else base


def dedent(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def _indent(text: str, spaces: int) -> str:
    return textwrap.indent(dedent(text), " " * spaces)


def _seed(task_id: str) -> int:
    # Stable across Python runs (hash() is salted); the same id always gets the same data.
    return zlib.crc32(task_id.encode()) % (2**31)


# ---------------------------------------------------------------------------------------
# Small helpers the family modules share.
# ---------------------------------------------------------------------------------------


def int_constants(**dims: int) -> str:
    """Host constants for the launch, one `const int NAME = value;` per size."""
    return "\n".join(f"const int {name} = {value};" for name, value in dims.items())


def kernel_signatures(kernels: str) -> list[str]:
    """The `__global__` lines of `kernels` (each signature written on one line)."""
    return [line.removesuffix(" {") for line in dedent(kernels).splitlines() if line.startswith("__global__")]


def matrix_io(rows: int, cols: int) -> tuple[list[Buffer], list[Buffer], str]:
    """Input x and output y of shape (rows, cols), and their host constants."""
    return (
        [Buffer("x", "float32", (rows, cols))],
        [Buffer("y", "float32", (rows, cols))],
        f"const int rows = {rows};\nconst int cols = {cols};",
    )


def grid_stride_launch(
    fn: str, args: str, what: str = "n", blocks: int = 1024, block: int = 256
) -> tuple[str, str]:
    """(launch, launch_note) of a grid-stride kernel on a fixed grid smaller than the work."""
    return (
        f"{{k}}{fn}<<<{blocks}, {block}>>>({args});",
        f"{fn} is launched once with {blocks} blocks of {block} threads (a fixed grid smaller than "
        f"{what} / {block}), so each thread must loop over outputs with a grid stride.",
    )


# ---------------------------------------------------------------------------------------
# bench.cu and the kernel-mode harness share the host boilerplate below.
# ---------------------------------------------------------------------------------------

HEADER = """\
#include <cuda_runtime.h>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CUDA_CHECK(call)                                                          \\
    do {                                                                          \\
        cudaError_t err_ = (call);                                                \\
        if (err_ != cudaSuccess) {                                                \\
            fprintf(stderr, "CUDA error: %s at %s:%d\\n", cudaGetErrorString(err_), \\
                    __FILE__, __LINE__);                                          \\
            exit(1);                                                              \\
        }                                                                         \\
    } while (0)
"""

FILE_IO = """\
static void read_file(const char* path, void* data, size_t bytes) {
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\\n", path); exit(1); }
    size_t got = fread(data, 1, bytes, f);
    fclose(f);
    if (got != bytes) { fprintf(stderr, "%s: expected %zu bytes, got %zu\\n", path, bytes, got); exit(1); }
}

static void write_file(const char* path, const void* data, size_t bytes) {
    FILE* f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "cannot write %s\\n", path); exit(1); }
    size_t put = fwrite(data, 1, bytes, f);
    fclose(f);
    if (put != bytes) { fprintf(stderr, "%s: short write\\n", path); exit(1); }
}
"""

# New words in TIMER's text (comments too) can change the renamed SFT copies: data/taskgen/variants.py
# draws no fresh name that is a word of the rendered task. Check with python data/build_sft.py --check.
TIMER = f"""\
// ---- Timing (docs/evaluation.md, "Timing"): only in the run stage 04 starts with {TIMING_ARGUMENT} ----
// The evaluator writes a fresh random nonce on stdin for that run; main reads it before any
// kernel runs and the timing line carries it. A timing line printed by anything else (a
// candidate's static constructor, a kernel's printf) lacks it, and a nonce taken from stdin
// before main leaves main's own line without it: either way stage 04 discards the timing.
// From a terminal (stdin a tty) nothing is read, so the program can still be run by hand.
#include <cstring>
#include <string>
#include <unistd.h>

static void read_timing_nonce(char* nonce, int size) {{
    if (isatty(fileno(stdin)) || !fgets(nonce, size, stdin)) nonce[0] = '\\0';
    nonce[strcspn(nonce, "\\r\\n")] = '\\0';
}}

// CUDA events around each launch, and each launch from a cold L2 cache. Before it, untimed, the side's
// outputs are overwritten with 0xFF bytes (a launch that computes nothing leaves them so) and a device
// buffer twice the size of the L2 cache (as the device reports it) is written, which evicts what the
// launch before, of either side, brought into it (as Triton's do_bench and KernelBench time).
class KernelTimer {{
  public:
    KernelTimer() {{
        int device = 0;
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        flush_bytes_ = 2 * size_t(prop.l2CacheSize);
        CUDA_CHECK(cudaMalloc(&flush_buffer_, flush_bytes_));
        for (int i = 0; i < {TIMING_MAX_LAUNCHES}; ++i) {{
            CUDA_CHECK(cudaEventCreate(&start_[i]));
            CUDA_CHECK(cudaEventCreate(&stop_[i]));
        }}
    }}
    ~KernelTimer() {{
        for (int i = 0; i < {TIMING_MAX_LAUNCHES}; ++i) {{
            cudaEventDestroy(start_[i]);
            cudaEventDestroy(stop_[i]);
        }}
        cudaFree(flush_buffer_);
    }}

    // What comes before every timed launch, untimed: the outputs poisoned, then the L2 cache flushed.
    template <typename Poison>
    void prepare(Poison& poison) {{
        poison();
        CUDA_CHECK(cudaMemsetAsync(flush_buffer_, 0, flush_bytes_));
    }}

    // Milliseconds per launch of `run`: the mean of `launches` launches, each prepared and then timed
    // by a pair of events of its own.
    template <typename Run, typename Poison>
    float ms_per_launch(Run& run, Poison& poison, int launches) {{
        for (int i = 0; i < launches; ++i) {{
            prepare(poison);
            CUDA_CHECK(cudaEventRecord(start_[i]));
            run();
            CUDA_CHECK(cudaEventRecord(stop_[i]));
        }}
        CUDA_CHECK(cudaEventSynchronize(stop_[launches - 1]));
        CUDA_CHECK(cudaGetLastError());
        float sum = 0.0f;
        for (int i = 0; i < launches; ++i) {{
            float ms = 0.0f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, start_[i], stop_[i]));
            sum += ms;
        }}
        return sum / launches;
    }}

    // The launches per repetition whose times span at least {TIMING_MIN_MS:g} ms together, doubled from one until
    // they do. The launch before, untimed, loads the kernels' module (CUDA loads it lazily).
    template <typename Run, typename Poison>
    int calibrate(Run& run, Poison& poison) {{
        run();
        int launches = 1;
        while (launches < {TIMING_MAX_LAUNCHES} && launches * ms_per_launch(run, poison, launches) < {TIMING_MIN_MS!r})
            launches *= 2;
        return launches;
    }}

  private:
    void* flush_buffer_ = nullptr;
    size_t flush_bytes_ = 0;
    cudaEvent_t start_[{TIMING_MAX_LAUNCHES}], stop_[{TIMING_MAX_LAUNCHES}];
}};

static void append_ms(std::string& list, float ms) {{
    char number[32];
    snprintf(number, sizeof number, list.empty() ? "%.6g" : ",%.6g", ms);
    list += number;
}}

// Times the candidate against the reference in {TIMING_REPEATS} interleaved repetitions, the candidate
// ahead of the reference in even ones and after it in odd ones, so that neither the order nor a
// drift of the clocks over the run favours a side; before each side's batch of launches the inputs are
// put back as read (restore), whatever the other side's wrote over them. Prints one line: per repetition,
// each side's milliseconds per launch, and the launches per repetition; stage 04 computes the statistics
// (harness/timing.py). Then the candidate runs once more, prepared as each timed launch was, on the
// inputs stage 04 put under {CHECK_FOLDER}/ (another set of inputs where it has one): main writes what it
// computed, and stage 04 judges that as it judged the plain run. A kernel whose later launches do less
// than the one before (it skips them, or returns what it kept in __device__ memory) fails there.
template <typename Candidate, typename Reference, typename Restore, typename Poison, typename LoadCheck>
static void time_kernels(const char* nonce, Candidate& candidate, Reference& reference, Restore& restore,
                         Poison& poison, LoadCheck& load_check_inputs) {{
    KernelTimer timer;
    restore();
    const int candidate_launches = timer.calibrate(candidate, poison);
    restore();
    const int reference_launches = timer.calibrate(reference, poison);
    std::string candidate_ms, reference_ms;
    auto time_candidate = [&] {{
        restore();
        append_ms(candidate_ms, timer.ms_per_launch(candidate, poison, candidate_launches));
    }};
    auto time_reference = [&] {{
        restore();
        append_ms(reference_ms, timer.ms_per_launch(reference, poison, reference_launches));
    }};
    for (int i = 0; i < {TIMING_REPEATS}; ++i) {{
        if (i % 2 == 0) {{
            time_candidate();
            time_reference();
        }} else {{
            time_reference();
            time_candidate();
        }}
    }}
    printf("CUSET_TIMING nonce=%s candidate_ms=%s reference_ms=%s launches=%d,%d\\n", nonce,
           candidate_ms.c_str(), reference_ms.c_str(), candidate_launches, reference_launches);
    fflush(stdout);
    load_check_inputs();
    restore();
    timer.prepare(poison);
    candidate();
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
}}
"""


def _host_setup(spec: OpSpec) -> str:
    """Read inputs, allocate and fill device buffers, allocate zeroed outputs and scratch."""
    lines = []
    for b in spec.inputs:
        lines += [
            f"std::vector<{b.ctype}> h_{b.name}({b.count});",
            f'read_file("data/{b.name}.bin", h_{b.name}.data(), {b.count} * sizeof({b.ctype}));',
            f"{b.ctype}* d_{b.name} = nullptr;",
            f"CUDA_CHECK(cudaMalloc(&d_{b.name}, {b.count} * sizeof({b.ctype})));",
            f"CUDA_CHECK(cudaMemcpy(d_{b.name}, h_{b.name}.data(), {b.count} * sizeof({b.ctype}), cudaMemcpyHostToDevice));",
        ]
    for b in spec.outputs + spec.scratch:
        lines += [
            f"{b.ctype}* d_{b.name} = nullptr;",
            f"CUDA_CHECK(cudaMalloc(&d_{b.name}, {b.count} * sizeof({b.ctype})));",
            f"CUDA_CHECK(cudaMemset(d_{b.name}, 0, {b.count} * sizeof({b.ctype})));",
        ]
    return "\n".join(lines)


def _host_write_outputs(spec: OpSpec) -> str:
    lines = []
    for b in spec.outputs:
        lines += [
            f"std::vector<{b.ctype}> h_{b.name}({b.count});",
            f"CUDA_CHECK(cudaMemcpy(h_{b.name}.data(), d_{b.name}, {b.count} * sizeof({b.ctype}), cudaMemcpyDeviceToHost));",
            f'write_file("data/{b.name}.bin", h_{b.name}.data(), {b.count} * sizeof({b.ctype}));',
        ]
    return "\n".join(lines)


def _timing_steps(spec: OpSpec) -> str:
    """The harness's steps around each timed launch (TIMER: time_kernels): put the inputs back as read,
    overwrite the outputs with 0xFF bytes, and read the inputs of the launch after the timed ones from
    CHECK_FOLDER/ where stage 04 put them there."""
    restore = [
        f"CUDA_CHECK(cudaMemcpy(d_{b.name}, h_{b.name}.data(), {b.count} * sizeof({b.ctype}), cudaMemcpyHostToDevice));"
        for b in spec.inputs
    ]
    poison = [
        f"CUDA_CHECK(cudaMemsetAsync(d_{b.name}, 0xFF, {b.count} * sizeof({b.ctype})));" for b in spec.outputs
    ]
    check = [
        f'if (access("{CHECK_FOLDER}/{b.name}.bin", R_OK) == 0)\n'
        f'    read_file("{CHECK_FOLDER}/{b.name}.bin", h_{b.name}.data(), {b.count} * sizeof({b.ctype}));'
        for b in spec.inputs
    ]
    return "\n".join(
        f"auto {name} = [&]() {{\n" + _indent("\n".join(lines), 4) + "\n};"
        for name, lines in (
            ("restore_inputs", restore),
            ("poison_outputs", poison),
            ("load_check_inputs", check),
        )
    )


def _host_free(spec: OpSpec) -> str:
    return "\n".join(f"CUDA_CHECK(cudaFree(d_{b.name}));" for b in spec.inputs + spec.outputs + spec.scratch)


def _launch(spec: OpSpec, prefix: str) -> str:
    return dedent(spec.launch).replace("{k}", prefix)


def _io_comment(spec: OpSpec) -> str:
    ins = ", ".join(f"data/{b.name}.bin ({b.dtype} {b.shape_str()})" for b in spec.inputs)
    outs = ", ".join(f"data/{b.name}.bin ({b.dtype} {b.shape_str()})" for b in spec.outputs)
    return f"// Reads {ins}.\n// Writes {outs}."


def render_bench_cu(spec: OpSpec) -> str:
    """The reference standalone program: reads inputs, runs the kernels once, writes outputs."""
    body = "\n\n".join(
        [
            _host_setup(spec),
            _launch(spec, ""),
            "CUDA_CHECK(cudaGetLastError());\nCUDA_CHECK(cudaDeviceSynchronize());",
            _host_write_outputs(spec),
            _host_free(spec),
            "return 0;",
        ]
    )
    return "\n".join(
        [
            f"// {spec.name}: {spec.description}",
            _io_comment(spec),
            HEADER,
            dedent(spec.kernels),
            "",
            FILE_IO,
            "int main() {",
            _indent(spec.constants, 4),
            "",
            _indent(body, 4),
            "}",
            "",
        ]
    )


def render_harness(spec: OpSpec) -> str:
    """Kernel-mode host program: the candidate's kernels replace CANDIDATE_MARKER.

    Run plainly, it runs the candidate once and writes its outputs (stage 04 judges those). Run with
    TIMING_ARGUMENT, it times the candidate against the reference kernels, prints one `CUSET_TIMING`
    line (TIMER), then writes the outputs of one more launch of the candidate, on the inputs under
    CHECK_FOLDER/ (stage 04 judges those too: _timing_steps).
    """
    run_candidate = _indent(_launch(spec, ""), 4)
    run_reference = _indent(_launch(spec, "cuset_ref::"), 4)
    run_once = "run_candidate();\nCUDA_CHECK(cudaGetLastError());\nCUDA_CHECK(cudaDeviceSynchronize());"
    timed = "time_kernels(nonce, run_candidate, run_reference, restore_inputs, poison_outputs, load_check_inputs);"
    body = "\n\n".join(
        [
            "char nonce[80];\nread_timing_nonce(nonce, sizeof nonce);",
            _host_setup(spec),
            "auto run_candidate = [&]() {\n" + run_candidate + "\n};",
            "auto run_reference = [&]() {\n" + run_reference + "\n};",
            _timing_steps(spec),
            f'if (argc > 1 && strcmp(argv[1], "{TIMING_ARGUMENT}") == 0) {{\n'
            f"    {timed}\n"
            "} else {\n" + _indent(run_once, 4) + "\n}",
            _host_write_outputs(spec),
            _host_free(spec),
            "return 0;",
        ]
    )
    return "\n".join(
        [
            f"// Kernel-mode harness for {spec.name}: {spec.description}",
            _io_comment(spec),
            HEADER,
            "// Reference kernels, namespaced so that a candidate may reuse their names.",
            "namespace cuset_ref {",
            dedent(spec.kernels),
            "}  // namespace cuset_ref",
            "",
            "// ---- candidate kernels (inserted by the evaluator) ----",
            CANDIDATE_MARKER,
            "// ---- end of candidate kernels ----",
            "",
            FILE_IO,
            TIMER,
            "int main(int argc, char** argv) {",
            _indent(spec.constants, 4),
            "",
            _indent(body, 4),
            "}",
            "",
        ]
    )


# ---------------------------------------------------------------------------------------
# gen.py and compare.py: standalone numpy scripts run as subprocesses in the task folder.
# ---------------------------------------------------------------------------------------


def render_gen_py(spec: OpSpec) -> str:
    writes = [
        f'np.ascontiguousarray({b.name}, dtype=np.{b.dtype}).tofile("data/{b.name}.bin")' for b in spec.inputs
    ]
    writes += [
        f'np.ascontiguousarray({b.name}_ref, dtype=np.{b.dtype}).tofile("data/{b.name}_ref.bin")'
        for b in spec.outputs
    ]
    checks = [f"assert np.shape({b.name}) == {tuple(b.shape)!r}, np.shape({b.name})" for b in spec.inputs] + [
        f"assert np.shape({b.name}_ref) == {tuple(b.shape)!r}, np.shape({b.name}_ref)" for b in spec.outputs
    ]
    return "\n".join(
        [
            f'"""Inputs and reference outputs for task {spec.task_id} ({spec.name}). numpy only, fixed seed."""',
            "import os",
            "",
            "import numpy as np",
            "",
            f"rng = np.random.default_rng({_seed(spec.task_id)})",
            "",
            dedent(spec.gen),
            "",
            *checks,
            'os.makedirs("data", exist_ok=True)',
            *writes,
            "",
        ]
    )


COMPARE_TEMPLATE = '''\
"""Check the outputs of task {task_id} ({name}) against the reference. Prints T or F."""
import os
import sys

import numpy as np

INPUTS = {inputs!r}
OUTPUTS = {outputs!r}
ATOL = {atol!r}
RTOL = {rtol!r}


def load(path, dtype, count):
    if not os.path.exists(path):
        return None, f"missing {{path}}"
    arr = np.fromfile(path, dtype=dtype)
    if arr.size != count:
        return None, f"{{path}}: {{arr.size}} elements, expected {{count}}"
    return arr, None


def problem(name, dtype, count):
    out, err = load(f"data/{{name}}.bin", dtype, count)
    if err:
        return err
    ref, err = load(f"data/{{name}}_ref.bin", dtype, count)
    if err:
        return err
    is_float = np.issubdtype(out.dtype, np.floating)
    if is_float and not np.all(np.isfinite(out)):
        return f"{{name}}: NaN or Inf in output"
    if not np.any(out):
        return f"{{name}}: output is all zeros"
    for in_name, in_dtype, in_count in INPUTS:
        if in_dtype == dtype and in_count == count:
            inp, _ = load(f"data/{{in_name}}.bin", in_dtype, in_count)
            if inp is not None and np.array_equal(inp, out):
                return f"{{name}}: output equals input {{in_name}}"
    if is_float:
        ok = np.allclose(out, ref, atol=ATOL, rtol=RTOL)
    else:
        ok = np.array_equal(out, ref)
    if not ok:
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        worst = int(np.argmax(diff))
        return f"{{name}}: mismatch, max abs diff {{diff[worst]:.3g}} at {{worst}} (got {{out[worst]}}, want {{ref[worst]}})"
    return None


def main():
    for name, dtype, count in OUTPUTS:
        err = problem(name, dtype, count)
        if err:
            print(err, file=sys.stderr)
            print("F")
            return
    print("T")


if __name__ == "__main__":
    main()
'''


def render_compare_py(spec: OpSpec) -> str:
    return COMPARE_TEMPLATE.format(
        task_id=spec.task_id,
        name=spec.name,
        inputs=[(b.name, b.dtype, b.count) for b in spec.inputs],
        outputs=[(b.name, b.dtype, b.count) for b in spec.outputs],
        atol=spec.atol,
        rtol=spec.rtol,
    )


# ---------------------------------------------------------------------------------------
# The record.
# ---------------------------------------------------------------------------------------


def level3_prompt(spec: OpSpec) -> str:
    return f"Implement the {spec.name} operation on the GPU in CUDA."


def render_task(spec: OpSpec) -> dict:
    """One CUDABench-format record plus our fields. Key order is fixed for byte-stable output."""
    if spec.split not in SPLITS:
        raise ValueError(f"{spec.task_id}: split {spec.split!r} not in {SPLITS}")
    return {
        "id": spec.task_id,
        "task_name": spec.name,
        "task_description": spec.description,
        "inputs": [{"name": b.name, "dtype": b.dtype, "shape": b.shape_str()} for b in spec.inputs],
        "outputs": [{"name": b.name, "dtype": b.dtype, "shape": b.shape_str()} for b in spec.outputs],
        "bench.cu": render_bench_cu(spec),
        "gen.py": render_gen_py(spec),
        "compare.py": render_compare_py(spec),
        "level1_prompt": dedent(spec.level1),
        "level2_prompt": dedent(spec.level2),
        "level3_prompt": level3_prompt(spec),
        "split": spec.split,
        "category": spec.category,
        "op": spec.op,
        "kernel_mode": {
            "harness.cu": render_harness(spec),
            "marker": CANDIDATE_MARKER,
            "signatures": list(spec.signatures),
            "launch": dedent(spec.launch_note),
            "reference_kernels": dedent(spec.kernels) + "\n",
        },
    }


def to_jsonl_line(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False) + "\n"
