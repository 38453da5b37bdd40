"""Binary and broadcast elementwise ops: out = f(a, b) on float32 vectors and matrices.

Vector ops combine two (or three) arrays of at least 1M elements element by element; they are
memory-bound, so the kernels stay simple and rotate through three idiomatic styles: a guarded
one-thread-per-element kernel, a grid-stride loop over a fixed grid, and a float4-vectorized
kernel whose first threads also finish the n % 4 leftover elements. The broadcast ops combine a
2048 x 1000 matrix with a vector along its rows or columns: one stages its vector in a shared-
memory tile, the other gives each matrix row to one block.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskgen.core import C_TYPES, Buffer, OpSpec, dedent

SIZES = {"1048576": 1 << 20, "1500007": 1_500_007}  # a power of two and a size that no block (or 4) divides
BLOCK = 256
GRID_STRIDE_BLOCKS = 1024  # grid-stride kernels launch a fixed grid and loop
ROWS, COLS = 2048, 1000  # broadcast ops: COLS is not a multiple of the 32-wide tile or the 256-thread block

NORMAL = "rng.standard_normal(n) * 2.0"


@dataclass(frozen=True)
class Input:
    name: str
    dtype: str
    draw: str  # numpy expression drawing the array with `rng` and `n`


@dataclass(frozen=True)
class VectorOp:
    """out[i] = f(inputs[i]) for 1-D inputs of n elements."""

    op: str
    name: str
    split: str
    formula: str  # the math, for prompts: "out[i] = a[i] + b[i]"
    summary: str  # one sentence with `{n}`, the task description
    inputs: tuple[Input, ...]
    cuda: str  # CUDA expression; `{a}` stands for the value of input `a` at the element
    numpy: str  # numpy expression of the inputs (float inputs as float64 arrays)
    guidance: str  # implementation hint for the level-1 prompt
    style: str = "guarded"  # guarded | grid_stride | vec4
    sizes: tuple[str, ...] = ("1048576",)
    params: tuple[tuple[str, str, str], ...] = ()  # scalar kernel arguments: (C type, name, host value)
    atol: float = 1e-5
    rtol: float = 1e-5


def _pair(first: str = NORMAL, second: str = NORMAL) -> tuple[Input, ...]:
    return (Input("a", "float32", first), Input("b", "float32", second))


VECTOR_OPS = [
    # --- train ----------------------------------------------------------------------------
    VectorOp(
        "vector_add",
        "Vector_Add",
        "train",
        "out[i] = a[i] + b[i]",
        "Add two float32 vectors of {n} elements elementwise.",
        _pair(),
        "{a} + {b}",
        "a + b",
        "add the two loaded values",
        sizes=("1048576", "1500007"),
    ),
    VectorOp(
        "vector_mul",
        "Vector_Multiply",
        "train",
        "out[i] = a[i] * b[i]",
        "Multiply two float32 vectors of {n} elements elementwise (Hadamard product).",
        _pair(),
        "{a} * {b}",
        "a * b",
        "multiply the two loaded values",
        style="grid_stride",
    ),
    VectorOp(
        "vector_max",
        "Elementwise_Maximum",
        "train",
        "out[i] = max(a[i], b[i])",
        "Take the elementwise maximum of two float32 vectors of {n} elements.",
        _pair(),
        "fmaxf({a}, {b})",
        "np.maximum(a, b)",
        "use fmaxf",
        style="grid_stride",
    ),
    VectorOp(
        "squared_diff",
        "Squared_Difference",
        "train",
        "out[i] = (a[i] - b[i])^2",
        "Compute the elementwise squared difference (a - b)^2 of two float32 vectors of {n} elements.",
        _pair(),
        "({a} - {b}) * ({a} - {b})",
        "(a - b) ** 2",
        "square the difference with one multiply",
        style="vec4",
        sizes=("1048576", "1500007"),
    ),
    VectorOp(
        "saxpy",
        "SAXPY",
        "train",
        "out[i] = alpha * x[i] + y[i] with alpha = 2.5",
        "Compute out = alpha * x + y (SAXPY, alpha = 2.5) for float32 vectors of {n} elements.",
        (Input("x", "float32", NORMAL), Input("y", "float32", NORMAL)),
        "fmaf(alpha, {x}, {y})",
        "2.5 * x + y",
        "one fused multiply-add fmaf(alpha, x, y), with alpha passed to the kernel as a float argument",
        params=(("float", "alpha", "2.5f"),),
    ),
    VectorOp(
        "masked_where",
        "Masked_Select_Where",
        "train",
        "out[i] = mask[i] != 0 ? a[i] : b[i]",
        "Select elementwise from two float32 vectors of {n} elements with a uint8 mask "
        "(a where the mask is nonzero, else b).",
        (Input("mask", "uint8", "rng.random(n) < 0.5"), *_pair()),
        "{mask} ? {a} : {b}",
        "np.where(mask != 0, a, b)",
        "a conditional select on the mask byte",
        style="grid_stride",
    ),
    # --- eval (held-out operations) ---------------------------------------------------------
    VectorOp(
        "vector_div",
        "Vector_Divide",
        "eval",
        "out[i] = a[i] / b[i], |b[i]| in [0.5, 4]",
        "Divide two float32 vectors of {n} elements elementwise.",
        _pair(second="rng.uniform(0.5, 4.0, n) * rng.choice([-1.0, 1.0], n)"),
        "{a} / {b}",
        "a / b",
        "use an IEEE division a / b (|b| >= 0.5, so no zero divisors)",
    ),
    VectorOp(
        "vector_hypot",
        "Elementwise_Hypotenuse",
        "eval",
        "out[i] = sqrt(a[i]^2 + b[i]^2)",
        "Compute the elementwise hypotenuse sqrt(a^2 + b^2) of two float32 vectors of {n} elements.",
        _pair(),
        "hypotf({a}, {b})",
        "np.hypot(a, b)",
        "use hypotf, which avoids overflow",
        style="vec4",
    ),
    VectorOp(
        "vector_lerp",
        "Linear_Interpolation",
        "eval",
        "out[i] = a[i] + w[i] * (b[i] - a[i]), w[i] in [0, 1]",
        "Linearly interpolate between two float32 vectors of {n} elements with per-element weights w.",
        (*_pair(), Input("w", "float32", "rng.uniform(0.0, 1.0, n)")),
        "fmaf({w}, {b} - {a}, {a})",
        "a + w * (b - a)",
        "one fmaf(w, b - a, a)",
        style="grid_stride",
    ),
    # --- pretrain ---------------------------------------------------------------------------
    VectorOp(
        "vector_sub",
        "Vector_Subtract",
        "pretrain",
        "out[i] = a[i] - b[i]",
        "Subtract two float32 vectors of {n} elements elementwise.",
        _pair(),
        "{a} - {b}",
        "a - b",
        "subtract the two loaded values",
        style="grid_stride",
    ),
    VectorOp(
        "vector_min",
        "Elementwise_Minimum",
        "pretrain",
        "out[i] = min(a[i], b[i])",
        "Take the elementwise minimum of two float32 vectors of {n} elements.",
        _pair(),
        "fminf({a}, {b})",
        "np.minimum(a, b)",
        "use fminf",
        style="vec4",
    ),
    VectorOp(
        "abs_diff",
        "Absolute_Difference",
        "pretrain",
        "out[i] = |a[i] - b[i]|",
        "Compute the elementwise absolute difference |a - b| of two float32 vectors of {n} elements.",
        _pair(),
        "fabsf({a} - {b})",
        "np.abs(a - b)",
        "use fabsf on the difference",
    ),
]


def _c_args(v: VectorOp) -> str:
    ins = [f"const {C_TYPES[i.dtype]}* __restrict__ {i.name}" for i in v.inputs]
    return ", ".join(ins + ["float* __restrict__ out"] + [f"{ct} {nm}" for ct, nm, _ in v.params] + ["int n"])


def _vector_kernel(v: VectorOp) -> tuple[str, str]:
    """(kernels, signature) for one vector op in its style."""
    signature = f"__global__ void {v.op}_kernel({_c_args(v)})"
    at_i = v.cuda.format(**{i.name: f"{i.name}[i]" for i in v.inputs})
    if v.style == "guarded":
        return dedent(f"""
            // One thread per element; the guard covers the last, partly filled block.
            {signature} {{
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) out[i] = {at_i};
            }}
            """), signature
    if v.style == "grid_stride":
        return dedent(f"""
            // Grid-stride loop: a fixed grid covers any n, each thread strides by the grid size.
            {signature} {{
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
                    out[i] = {at_i};
            }}
            """), signature
    assert v.style == "vec4" and not v.params and all(i.dtype == "float32" for i in v.inputs), v.op
    names = [i.name for i in v.inputs]
    helper = f"{v.op}_op"
    scalar_args = ", ".join(f"float {nm}" for nm in names)
    body = v.cuda.format(**{nm: nm for nm in names})
    loads = "\n".join(f"        float4 {nm}4 = reinterpret_cast<const float4*>({nm})[i];" for nm in names)
    lanes = "\n".join(f"        r.{c} = {helper}({', '.join(f'{nm}4.{c}' for nm in names)});" for c in "xyzw")
    tail = ", ".join(f"{nm}[t]" for nm in names)
    # Built line by line: the loads and lanes above already carry the body's indentation.
    return "\n".join(
        [
            f"__device__ __forceinline__ float {helper}({scalar_args}) {{ return {body}; }}",
            "",
            "// float4-vectorized: thread i handles elements 4i..4i+3 with 16-byte loads and stores",
            "// (cudaMalloc pointers are 256-byte aligned); the first n % 4 threads of the grid also",
            "// handle the leftover scalar elements at the end.",
            f"{signature} {{",
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;",
            "    int n4 = n / 4;",
            "    if (i < n4) {",
            loads,
            "        float4 r;",
            lanes,
            "        reinterpret_cast<float4*>(out)[i] = r;",
            "    }",
            "    int t = 4 * n4 + i;",
            f"    if (t < n) out[t] = {helper}({tail});",
            "}",
        ]
    ), signature


def _vector_launch(v: VectorOp) -> tuple[str, str]:
    fn = f"{v.op}_kernel"
    args = ", ".join([f"d_{i.name}" for i in v.inputs] + ["d_out"] + [nm for _, nm, _ in v.params] + ["n"])
    if v.style == "guarded":
        return (
            f"{{k}}{fn}<<<(n + {BLOCK - 1}) / {BLOCK}, {BLOCK}>>>({args});",
            f"{fn} is launched once with (n + {BLOCK - 1}) / {BLOCK} blocks of {BLOCK} threads, one thread per "
            f"element; the last block is only partly used.",
        )
    if v.style == "grid_stride":
        return (
            f"{{k}}{fn}<<<{GRID_STRIDE_BLOCKS}, {BLOCK}>>>({args});",
            f"{fn} is launched once with {GRID_STRIDE_BLOCKS} blocks of {BLOCK} threads (a fixed grid that is "
            f"smaller than n / {BLOCK}), so each thread must loop over elements with a grid stride.",
        )
    return (
        f"{{k}}{fn}<<<((n + 3) / 4 + {BLOCK - 1}) / {BLOCK}, {BLOCK}>>>({args});",
        f"{fn} is launched once with ((n + 3) / 4 + {BLOCK - 1}) / {BLOCK} blocks of {BLOCK} threads: one "
        f"thread per group of 4 consecutive elements (ceil(n / 4) threads are needed), so the kernel must "
        f"also handle the n % 4 elements past the last full group of 4.",
    )


STYLE_WORDS = {
    "guarded": "one thread per element with a bounds check i < n",
    "grid_stride": "a grid-stride loop over a fixed grid",
    "vec4": "float4 vectorized loads and stores (4 elements per thread) plus scalar handling of the n % 4 "
    "leftover elements",
}


def _vector_gen(v: VectorOp, n: int) -> str:
    draws = [f"{i.name} = ({i.draw}).astype(np.{i.dtype})" for i in v.inputs]
    names = ", ".join(i.name for i in v.inputs)
    wide = ", ".join(f"{i.name}.astype(np.float64)" if i.dtype == "float32" else i.name for i in v.inputs)
    return "\n".join(
        [
            f"n = {n}",
            *draws,
            "",
            "",
            f"def reference({names}):",
            f"    return {v.numpy}",
            "",
            "",
            f"out_ref = reference({wide}).astype(np.float32)  # float64 math, stored as float32",
        ]
    )


def _vector_spec(v: VectorOp, n: int, size_tag: str) -> OpSpec:
    kernels, signature = _vector_kernel(v)
    launch, note = _vector_launch(v)
    arrays = ", ".join(f"{i.name} ({i.dtype})" for i in v.inputs)
    return OpSpec(
        op=v.op,
        name=v.name,
        category="binary",
        split=v.split,
        variant=size_tag if len(v.sizes) > 1 else "",
        description=v.summary.format(n=n),
        level1=f"Write a CUDA kernel that computes {v.formula} for n = {n} elements; inputs {arrays}, output "
        f"out (float32). Use {STYLE_WORDS[v.style]}; {v.guidance}. Launch with {BLOCK} threads per block.",
        level2=f"Compute {v.formula} for i = 0 .. {n - 1}; inputs {arrays}, output out (float32).",
        inputs=[Buffer(i.name, i.dtype, (n,)) for i in v.inputs],
        outputs=[Buffer("out", "float32", (n,))],
        constants="\n".join(
            [f"const int n = {n};"] + [f"const {ct} {nm} = {val};" for ct, nm, val in v.params]
        ),
        kernels=kernels,
        signatures=[signature],
        launch=launch,
        launch_note=note,
        gen=_vector_gen(v, n),
        atol=v.atol,
        rtol=v.rtol,
    )


# ---------------------------------------------------------------------------------------
# Broadcast ops on a ROWS x COLS row-major matrix.
# ---------------------------------------------------------------------------------------

BIAS_SIG = (
    "__global__ void row_bias_add_kernel(const float* __restrict__ x, const float* __restrict__ bias, "
    "float* __restrict__ out, int rows, int cols)"
)


def row_bias_add() -> OpSpec:
    kernels = dedent(f"""
        constexpr int BIAS_TILE_COLS = 32;  // blockDim.x: one warp spans 32 consecutive columns (coalesced)
        constexpr int BIAS_TILE_ROWS = 32;  // rows per block; the blockDim.y = 8 thread rows step through them

        // Each block stages its 32 bias values in shared memory once and reuses them for 32 rows.
        {BIAS_SIG} {{
            __shared__ float bias_tile[BIAS_TILE_COLS];
            int c = blockIdx.x * BIAS_TILE_COLS + threadIdx.x;
            if (threadIdx.y == 0) bias_tile[threadIdx.x] = (c < cols) ? bias[c] : 0.0f;  // pad past the last column
            __syncthreads();
            if (c >= cols) return;  // after the block's only barrier
            int row_end = min(rows, (int)(blockIdx.y + 1) * BIAS_TILE_ROWS);
            for (int r = blockIdx.y * BIAS_TILE_ROWS + threadIdx.y; r < row_end; r += blockDim.y) {{
                size_t idx = (size_t)r * cols + c;
                out[idx] = x[idx] + bias_tile[threadIdx.x];
            }}
        }}
        """)
    return OpSpec(
        op="row_bias_add",
        name="Row_Broadcast_Bias_Add",
        category="binary",
        split="train",
        description=f"Add a bias vector of {COLS} floats to every row of a {ROWS} x {COLS} float32 matrix.",
        level1=f"Write a CUDA kernel that computes out[r][c] = x[r][c] + bias[c] for a row-major float32 matrix x "
        f"of {ROWS} rows and {COLS} columns and a bias vector of {COLS} floats. Use 2-D thread blocks of "
        f"32 x 8 threads, threadIdx.x along the columns so that accesses are coalesced; each block covers "
        f"32 columns and 32 rows, loads its 32 bias values into shared memory once (padding past the last "
        f"column), calls __syncthreads, then loops over its rows. Guard both the row and the column "
        f"bound: {COLS} is not a multiple of 32.",
        level2=f"Broadcast-add a bias vector along the rows of a matrix: out[r][c] = x[r][c] + bias[c], with x of "
        f"shape ({ROWS}, {COLS}) row-major float32 and bias of {COLS} floats.",
        inputs=[Buffer("x", "float32", (ROWS, COLS)), Buffer("bias", "float32", (COLS,))],
        outputs=[Buffer("out", "float32", (ROWS, COLS))],
        constants=f"const int rows = {ROWS};\nconst int cols = {COLS};",
        kernels=kernels,
        signatures=[BIAS_SIG],
        launch="""
            dim3 block(32, 8);
            dim3 grid((cols + 31) / 32, (rows + 31) / 32);
            {k}row_bias_add_kernel<<<grid, block>>>(d_x, d_bias, d_out, rows, cols);
            """,
        launch_note="row_bias_add_kernel is launched once with 2-D blocks of 32 x 8 threads (blockDim.x = 32 along "
        "the columns, blockDim.y = 8) and a 2-D grid of ((cols + 31) / 32, (rows + 31) / 32) blocks: "
        "block (bx, by) owns columns 32*bx .. 32*bx+31 and rows 32*by .. 32*by+31, so each thread "
        "handles 4 rows of one column.",
        gen=f"rows, cols = {ROWS}, {COLS}\n"
        "x = (rng.standard_normal((rows, cols)) * 2.0).astype(np.float32)\n"
        "bias = rng.uniform(-1.0, 1.0, cols).astype(np.float32)\n\n\n"
        "def reference(x, bias):\n    return x + bias[None, :]\n\n\n"
        "out_ref = reference(x.astype(np.float64), bias.astype(np.float64)).astype(np.float32)",
    )


SCALE_SIG = (
    "__global__ void col_broadcast_scale_kernel(const float* __restrict__ x, const float* __restrict__ scale, "
    "float* __restrict__ out, int rows, int cols)"
)


def col_broadcast_scale() -> OpSpec:
    kernels = dedent(f"""
        // One block per matrix row: the row's scale factor is read once, the threads stride over the columns.
        {SCALE_SIG} {{
            int r = blockIdx.x;
            if (r >= rows) return;
            float s = scale[r];
            const float* x_row = x + (size_t)r * cols;
            float* out_row = out + (size_t)r * cols;
            for (int c = threadIdx.x; c < cols; c += blockDim.x)
                out_row[c] = x_row[c] * s;
        }}
        """)
    return OpSpec(
        op="col_broadcast_scale",
        name="Column_Broadcast_Scale",
        category="binary",
        split="eval",
        description=f"Scale each row of a {ROWS} x {COLS} float32 matrix by its own factor from a column vector "
        f"of {ROWS} floats.",
        level1=f"Write a CUDA kernel that computes out[r][c] = x[r][c] * scale[r] for a row-major float32 matrix x "
        f"of {ROWS} rows and {COLS} columns and a scale vector of {ROWS} floats (a column vector broadcast "
        f"across the columns). Give each row to one block of {BLOCK} threads: read scale[r] once into a "
        f"register, then let the threads stride over the {COLS} columns (not a multiple of {BLOCK}).",
        level2=f"Broadcast-multiply a column vector across a matrix: out[r][c] = x[r][c] * scale[r], with x of "
        f"shape ({ROWS}, {COLS}) row-major float32 and scale of {ROWS} floats.",
        inputs=[Buffer("x", "float32", (ROWS, COLS)), Buffer("scale", "float32", (ROWS,))],
        outputs=[Buffer("out", "float32", (ROWS, COLS))],
        constants=f"const int rows = {ROWS};\nconst int cols = {COLS};",
        kernels=kernels,
        signatures=[SCALE_SIG],
        launch=f"{{k}}col_broadcast_scale_kernel<<<rows, {BLOCK}>>>(d_x, d_scale, d_out, rows, cols);",
        launch_note=f"col_broadcast_scale_kernel is launched once with one block per row (rows = {ROWS} blocks) of "
        f"{BLOCK} threads; the threads of a block must loop over the {COLS} columns of their row.",
        gen=f"rows, cols = {ROWS}, {COLS}\n"
        "x = (rng.standard_normal((rows, cols)) * 2.0).astype(np.float32)\n"
        "scale = rng.uniform(-2.0, 2.0, rows).astype(np.float32)\n\n\n"
        "def reference(x, scale):\n    return x * scale[:, None]\n\n\n"
        "out_ref = reference(x.astype(np.float64), scale.astype(np.float64)).astype(np.float32)",
    )


def specs() -> list[OpSpec]:
    vector = [_vector_spec(v, SIZES[size], size) for v in VECTOR_OPS for size in v.sizes]
    return vector + [row_bias_add(), col_broadcast_scale()]


def at_size(spec: OpSpec, n: int) -> OpSpec | None:
    """A vector op over n elements (its kernels take n as an argument), or None if `spec` is no vector op.
    For the renamed SFT copies of taskgen/variants.py; the id keeps the size tag of the task it copies."""
    v = next((v for v in VECTOR_OPS if v.op == spec.op), None)
    return None if v is None else _vector_spec(v, n, spec.variant)
