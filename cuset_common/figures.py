"""The pictures a run draws (stage 03's curves, the comparison's bars): matplotlib is an optional package,
imported here only, with its file-only backend; a figure is written atomically."""

from __future__ import annotations

import os
from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (files, no window), or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig, path: Path) -> None:
    """`fig` as a PNG at `path`, swapped in whole (a reader never sees half a file); the figure is closed."""
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    pyplot().close(fig)
