"""Elementwise math and activation functions: one thread (or one grid-stride step) per element.

Both categories share one template: y[i] = f(x[i]) on a float32 vector of at least 1M elements
(memory-bound, so that kernel timing means something). Kernels alternate between the two
idiomatic styles, a guarded one-thread-per-element kernel and a grid-stride loop, so that
the training data shows both.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskgen.core import Buffer, OpSpec

SIZES = {"1048576": 1 << 20, "1500007": 1_500_007}  # a power of two and a size that no block divides
BLOCK = 256
GRID_STRIDE_BLOCKS = 1024  # grid-stride kernels launch a fixed grid and loop


@dataclass(frozen=True)
class Unary:
    op: str
    name: str
    category: str
    split: str
    formula: str  # the math, for prompts
    cuda: str  # expression of `v` (float) in CUDA
    numpy: str  # expression of `x` (float64 array) in numpy
    inputs: str  # numpy expression drawing `x` with `rng` and `n`
    guidance: str  # implementation hint for the level-1 prompt
    sizes: tuple[str, ...] = ("1048576",)
    grid_stride: bool = False
    atol: float = 1e-5
    rtol: float = 1e-5


NORMAL = "rng.standard_normal(n) * 2.0"
POSITIVE = "rng.uniform(0.05, 8.0, n)"

UNARY_OPS = [
    # --- elementwise math -----------------------------------------------------------------
    Unary(
        "square",
        "Square",
        "elementwise",
        "train",
        "y = x * x",
        "v * v",
        "x * x",
        NORMAL,
        "multiply the value by itself",
        sizes=("1048576", "1500007"),
    ),
    Unary(
        "abs",
        "Absolute_Value",
        "elementwise",
        "train",
        "y = |x|",
        "fabsf(v)",
        "np.abs(x)",
        NORMAL,
        "use fabsf",
    ),
    Unary(
        "sqrt",
        "Square_Root",
        "elementwise",
        "train",
        "y = sqrt(x), x > 0",
        "sqrtf(v)",
        "np.sqrt(x)",
        POSITIVE,
        "use sqrtf",
        grid_stride=True,
    ),
    Unary(
        "exp",
        "Exponential",
        "elementwise",
        "train",
        "y = exp(x)",
        "expf(v)",
        "np.exp(x)",
        "rng.uniform(-6.0, 6.0, n)",
        "use expf",
        sizes=("1048576", "1500007"),
        grid_stride=True,
        rtol=1e-5,
    ),
    Unary(
        "log",
        "Natural_Log",
        "elementwise",
        "train",
        "y = ln(x), x > 0",
        "logf(v)",
        "np.log(x)",
        POSITIVE,
        "use logf",
    ),
    Unary(
        "scale_shift",
        "Scale_And_Shift",
        "elementwise",
        "train",
        "y = 2.5 * x - 0.75",
        "fmaf(2.5f, v, -0.75f)",
        "2.5 * x - 0.75",
        NORMAL,
        "one fused multiply-add (fmaf)",
        grid_stride=True,
    ),
    Unary(
        "reciprocal",
        "Reciprocal",
        "elementwise",
        "eval",
        "y = 1 / x, x in [0.25, 4]",
        "1.0f / v",
        "1.0 / x",
        "rng.uniform(0.25, 4.0, n)",
        "compute 1.0f / x",
    ),
    Unary(
        "cube_poly",
        "Cubic_Polynomial",
        "elementwise",
        "eval",
        "y = 0.5 x^3 - 1.5 x^2 + 2 x - 1",
        "fmaf(fmaf(fmaf(0.5f, v, -1.5f), v, 2.0f), v, -1.0f)",
        "((0.5 * x - 1.5) * x + 2.0) * x - 1.0",
        "rng.uniform(-3.0, 3.0, n)",
        "evaluate with Horner's rule (nested fmaf)",
        grid_stride=True,
        atol=1e-4,
    ),
    Unary(
        "sin",
        "Sine",
        "elementwise",
        "eval",
        "y = sin(x)",
        "sinf(v)",
        "np.sin(x)",
        "rng.uniform(-3.14159, 3.14159, n)",
        "use sinf",
    ),
    Unary(
        "cos",
        "Cosine",
        "elementwise",
        "pretrain",
        "y = cos(x)",
        "cosf(v)",
        "np.cos(x)",
        "rng.uniform(-3.14159, 3.14159, n)",
        "use cosf",
        grid_stride=True,
    ),
    Unary(
        "clamp",
        "Clamp",
        "elementwise",
        "pretrain",
        "y = min(max(x, -1), 1)",
        "fminf(fmaxf(v, -1.0f), 1.0f)",
        "np.clip(x, -1.0, 1.0)",
        NORMAL,
        "use fminf and fmaxf",
    ),
    # --- activations ----------------------------------------------------------------------
    Unary(
        "relu",
        "ReLU_Activation",
        "activation",
        "train",
        "y = max(x, 0)",
        "fmaxf(v, 0.0f)",
        "np.maximum(x, 0.0)",
        NORMAL,
        "use fmaxf(x, 0.0f)",
        sizes=("1048576", "1500007"),
    ),
    Unary(
        "sigmoid",
        "Sigmoid_Activation",
        "activation",
        "train",
        "y = 1 / (1 + exp(-x))",
        "1.0f / (1.0f + expf(-v))",
        "1.0 / (1.0 + np.exp(-x))",
        NORMAL,
        "use expf",
        grid_stride=True,
    ),
    Unary(
        "tanh",
        "Tanh_Activation",
        "activation",
        "train",
        "y = tanh(x)",
        "tanhf(v)",
        "np.tanh(x)",
        NORMAL,
        "use tanhf",
    ),
    Unary(
        "silu",
        "SiLU_Activation",
        "activation",
        "train",
        "y = x / (1 + exp(-x))",
        "v / (1.0f + expf(-v))",
        "x / (1.0 + np.exp(-x))",
        NORMAL,
        "use expf",
        sizes=("1048576", "1500007"),
        grid_stride=True,
    ),
    Unary(
        "leaky_relu",
        "LeakyReLU_Activation",
        "activation",
        "train",
        "y = x if x > 0 else 0.01 * x",
        "v > 0.0f ? v : 0.01f * v",
        "np.where(x > 0, x, 0.01 * x)",
        NORMAL,
        "a select on the sign",
    ),
    Unary(
        "softplus",
        "Softplus_Activation",
        "activation",
        "train",
        "y = ln(1 + exp(x))",
        "log1pf(expf(v))",
        "np.log1p(np.exp(x))",
        NORMAL,
        "use log1pf(expf(x))",
        grid_stride=True,
    ),
    Unary(
        "gelu_tanh",
        "GELU_Tanh_Activation",
        "activation",
        "eval",
        "y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))",
        "0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)))",
        "0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))",
        NORMAL,
        "use tanhf with the constant sqrt(2/pi) = 0.7978845608",
        atol=1e-5,
    ),
    Unary(
        "elu",
        "ELU_Activation",
        "activation",
        "eval",
        "y = x if x > 0 else exp(x) - 1",
        "v > 0.0f ? v : expm1f(v)",
        "np.where(x > 0, x, np.expm1(x))",
        NORMAL,
        "use expm1f on the negative side",
        grid_stride=True,
    ),
    Unary(
        "hardswish",
        "HardSwish_Activation",
        "activation",
        "eval",
        "y = x * min(max(x + 3, 0), 6) / 6",
        "v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) / 6.0f",
        "x * np.clip(x + 3.0, 0.0, 6.0) / 6.0",
        NORMAL,
        "clamp x + 3 to [0, 6] with fminf/fmaxf",
    ),
    Unary(
        "mish",
        "Mish_Activation",
        "activation",
        "eval",
        "y = x * tanh(ln(1 + exp(x)))",
        "v * tanhf(log1pf(expf(v)))",
        "x * np.tanh(np.log1p(np.exp(x)))",
        NORMAL,
        "compose tanhf, log1pf and expf",
        grid_stride=True,
    ),
    Unary(
        "hardsigmoid",
        "HardSigmoid_Activation",
        "activation",
        "pretrain",
        "y = min(max(x / 6 + 0.5, 0), 1)",
        "fminf(fmaxf(v / 6.0f + 0.5f, 0.0f), 1.0f)",
        "np.clip(x / 6.0 + 0.5, 0.0, 1.0)",
        NORMAL,
        "clamp with fminf/fmaxf",
    ),
    Unary(
        "selu",
        "SELU_Activation",
        "activation",
        "pretrain",
        "y = 1.0507 * (x if x > 0 else 1.67326 * (exp(x) - 1))",
        "1.0507009873554805f * (v > 0.0f ? v : 1.6732632423543772f * expm1f(v))",
        "1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x))",
        NORMAL,
        "use expm1f; scale 1.0507009873554805, alpha 1.6732632423543772",
        grid_stride=True,
    ),
]


def _kernel(u: Unary) -> str:
    fn = f"{u.op}_kernel"
    if u.grid_stride:
        return f"""
        // Grid-stride loop: a fixed grid covers any n, each thread strides by the grid size.
        __global__ void {fn}(const float* __restrict__ x, float* __restrict__ y, int n) {{
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {{
                float v = x[i];
                y[i] = {u.cuda};
            }}
        }}
        """
    return f"""
    // One thread per element; the guard covers the last, partly filled block.
    __global__ void {fn}(const float* __restrict__ x, float* __restrict__ y, int n) {{
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) {{
            float v = x[i];
            y[i] = {u.cuda};
        }}
    }}
    """


def _launch(u: Unary) -> tuple[str, str]:
    fn = f"{u.op}_kernel"
    if u.grid_stride:
        return (
            f"{{k}}{fn}<<<{GRID_STRIDE_BLOCKS}, {BLOCK}>>>(d_x, d_y, n);",
            f"{fn} is launched once with {GRID_STRIDE_BLOCKS} blocks of {BLOCK} threads (a fixed grid that is "
            f"smaller than n / {BLOCK}), so each thread must loop over elements with a grid stride.",
        )
    return (
        f"{{k}}{fn}<<<(n + {BLOCK - 1}) / {BLOCK}, {BLOCK}>>>(d_x, d_y, n);",
        f"{fn} is launched once with (n + {BLOCK - 1}) / {BLOCK} blocks of {BLOCK} threads, one thread per "
        f"element; the last block is only partly used.",
    )


def _spec(u: Unary, n: int, size_tag: str) -> OpSpec:
    launch, note = _launch(u)
    style = (
        "a grid-stride loop over a fixed grid"
        if u.grid_stride
        else "one thread per element with a bounds check i < n"
    )
    return OpSpec(
        op=u.op,
        name=u.name,
        category=u.category,
        split=u.split,
        variant=size_tag if len(u.sizes) > 1 else "",
        description=f"Apply {u.formula.split(',')[0]} elementwise to a float32 vector of {n} elements.",
        level1=f"Write a CUDA kernel that computes {u.formula} for each element of a float32 vector x of "
        f"n = {n} elements and stores it in y. Use {style}; {u.guidance}. Launch with {BLOCK} threads "
        f"per block.",
        level2=f"Compute {u.formula} elementwise for a vector of {n} float32 values.",
        inputs=[Buffer("x", "float32", (n,))],
        outputs=[Buffer("y", "float32", (n,))],
        constants=f"const int n = {n};",
        kernels=_kernel(u),
        signatures=[
            f"__global__ void {u.op}_kernel(const float* __restrict__ x, float* __restrict__ y, int n)"
        ],
        launch=launch,
        launch_note=note,
        gen=f"n = {n}\nx = ({u.inputs}).astype(np.float32)\n\n\ndef reference(x):\n    return {u.numpy}\n\n\n"
        "y_ref = reference(x.astype(np.float64)).astype(np.float32)  # float64 math, stored as float32",
        atol=u.atol,
        rtol=u.rtol,
    )


def specs() -> list[OpSpec]:
    return [_spec(u, SIZES[size], size) for u in UNARY_OPS for size in u.sizes]


def at_size(spec: OpSpec, n: int) -> OpSpec | None:
    """`spec` over n elements (its kernels take n as an argument), or None if it is no op of this family.
    For the renamed SFT copies of taskgen/variants.py; the id keeps the size tag of the task it copies."""
    u = next((u for u in UNARY_OPS if u.op == spec.op), None)
    return None if u is None else _spec(u, n, spec.variant)
