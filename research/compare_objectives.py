"""The paper's comparison in one command: every objective x seed through the four stages, then one table.

`python research/compare_objectives.py --help` says what it runs, resumes and reports; the code is the package
research/comparison/, one idea a module (its __init__.py lists them).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's packages live at the repo root
from cuset_common.cli import run_main
from research.comparison.command import main

if __name__ == "__main__":
    sys.exit(run_main(main))
