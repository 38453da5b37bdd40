"""The stage scripts as modules, for the research tools that reuse or measure what a stage computes: the one
place outside tests where a stage file is loaded by path.

The method lives in the stages, where a reader looks for it (stage 03's loss, written out by hand), and the
stages are entry points that nothing imports. The TRL port (research/trl_sft.py) trains with stage 03's loss
itself; the benches (research/bench/) time a stage's own steps beside the machine's limits; the comparison
(research/comparison/) checks a stage-03 call with the stage's parser, whose --objective choices are the
stage's OBJECTIVES, and asks which objectives read stage 02's regions. All take them from here, each stage
loaded once. Everything else the tools need lives in the packages the stages
import (cuset_common/, harness/).
"""

from __future__ import annotations

from functools import cache

from cuset_common.cli import load_script

STAGE_FILES = {
    "01": "01_profile.py",
    "02": "02_label_regions.py",
    "03": "03_train_cuset.py",
    "04": "04_eval_kernels.py",
}


@cache
def stage_module(key: str):
    """Stage `key` ("01".."04") as a module: loaded once, its main never run."""
    return load_script(STAGE_FILES[key])


def stage_file_module(path: str):
    """Another version of a stage, by path (relative to the repository or absolute), as a module: what a
    bench times against the stage of this tree (research/bench/profiling.py, --stage)."""
    return load_script(path)
