"""Task families for data/build_tasks.py. Each module has `specs() -> list[OpSpec]`."""

from taskgen import (
    atomics,
    binary,
    elementwise,
    gather,
    layout,
    matmul,
    normalization,
    pooling,
    reductions,
    scan,
    stencil,
)

# Order fixes the order of lines in tasks.jsonl.
FAMILIES = [
    elementwise,
    binary,
    reductions,
    normalization,
    scan,
    matmul,
    layout,
    stencil,
    pooling,
    atomics,
    gather,
]
