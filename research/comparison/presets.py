"""The presets: each is the options it gives, written as on the command line, and a note that --help and
comparison.md quote. An option typed on the command line overrides the preset's (apply_preset)."""

from __future__ import annotations

import argparse

from cuset_common.paths import SFT_KERNEL_FILE, SFT_KERNEL_ORIGINALS_FILE, SMOLLM2_MODEL, TINY_MODEL

# What a preset gives when it names no value of its own.
DEFAULTS = {
    "model": str(TINY_MODEL),
    "data": SFT_KERNEL_FILE,
    "eval_base": False,
    "modes": "kernel,standalone",
    "seeds_for": "",
    "profile_args": "",
    "regions_args": "",
    "standalone_args": "",
}
PRESETS = {
    "full": {
        "note": """all six objectives x 3 seeds; stage 03 --batch-size 64 --micro-batch-size 4
--lr 1e-5 --epochs 3; stage 04 levels 1-3 of the 40 eval tasks, 5 samples at temperature 0.8 (pass@1 and
pass@5), backend auto. For a real model on a GPU: docs/comparison.md estimates its time.""",
        "objectives": "sft,dft,profit,cuset,cuset-mask,cuset-weight",
        "seeds": 3,
        "train_args": "--batch-size 64 --micro-batch-size 4 --lr 1e-5 --epochs 3",
        "eval_args": "--levels 1,2,3 --num-samples 5 --temperature 0.8",
    },
    "cpu-quick": {
        "note": """\
the bundled tiny model on 2 CPU cores: sft, profit and cuset x 2 seeds (6 runs); stage 03
--max-steps 100 (800 of the 1,020 training samples, batches of 8); stage 04 level 1 of the 40 eval tasks
under the emulate backend in both modes, standalone answers cut at 512 new tokens (its references are
longer: on the tiny model standalone mode only exercises the path). Most of its time is stage 03
(docs/comparison.md has the measured times).""",
        "objectives": "sft,profit,cuset",
        "seeds": 2,
        "train_args": "--max-steps 100",
        "eval_args": "--levels 1 --backend emulate",
        "standalone_args": "--max-new-tokens 512",
    },
    # lr 1e-4 for one epoch (12 steps of 8): already enough for sft on SmolLM2-135M to write kernels that
    # compile and a few that pass (docs/comparison.md, "The real model on a CPU").
    "cpu-real": {
        "note": """\
SmolLM2-135M-Instruct (data/build_smollm2.py) on 2 CPU cores: the base model, then sft, profit, cuset
on snapped regions and cuset on unsnapped ones (cuset.no-snap: snapped regions cover about half of this
model's response tokens) x 2 seeds; stage 03 on the 102 kernel-mode train records without renamed copies,
1 epoch (12 steps of 8) at lr 1e-4; stage 04 in kernel mode only, levels 1-3 of the 40 eval tasks (120
prompts, greedy) under the emulate backend. Runs go seed by seed: split them across processes and
sessions with --runs and keep what finished with --save-record (docs/comparison.md has the measured
times).""",
        "model": str(SMOLLM2_MODEL),
        "data": SFT_KERNEL_ORIGINALS_FILE,
        "modes": "kernel",
        "eval_base": True,
        "objectives": "sft,profit,cuset,cuset.no-snap",
        "seeds": 2,
        "train_args": "--lr 1e-4 --epochs 1",
        "eval_args": "--levels 1,2,3 --backend emulate",
    },
    # Every objective x 3 seeds, greedy and sampled verdicts: a design sized to resolve a few points of
    # pass@1 (docs/comparison.md, "The powered design"). Training as cpu-real's: the pilot (docs/notebook.md)
    # found no longer training that passes more prompts.
    "cpu-power": {
        "note": """\
SmolLM2-135M-Instruct (data/build_smollm2.py): the base model, then sft, dft, profit, cuset and its two
ablations (cuset-mask, cuset-weight) x 3 seeds, sft and cuset x 5 (the power calculation); stage 03 on
the 102 kernel-mode train records, 1 epoch (12 steps of 8) at lr 1e-4 (the pilot in docs/notebook.md:
longer training lowers held-out NLL but passes no more prompts); stage 04 in kernel mode, levels 1-3 of
the 40 eval tasks (120 prompts) under the emulate backend, replies cut at 512 new tokens, twice: `kernel`
greedy (one reply per prompt) and `kernel-sampled`, 4 replies per prompt at temperature 0.2, top-p 0.95,
sampling seed 0 (unbiased pass@1 and pass@4; docs/comparison.md says why 0.2). Paired intervals resample
seeds and prompts. Split it across processes and sessions with --runs and keep what finished with
--save-record; `profit.t01` (--objectives) is the diagnostic of profit's threshold, one seed
(docs/comparison.md has the measured times).""",
        "model": str(SMOLLM2_MODEL),
        "data": SFT_KERNEL_ORIGINALS_FILE,
        "eval_base": True,
        "objectives": "sft,dft,profit,cuset,cuset-mask,cuset-weight",
        "seeds": 3,
        # The power calculation asks for more seeds of the pair the question is about: with 3 the interval
        # of cuset - sft in pass@1 stood at the design's bar, and 5 narrow it (docs/comparison.md, "The
        # powered design", gives the figures; the record, docs/records/cpu-power/comparison.md, measures
        # them). profit.t01, the diagnostic of profit's threshold, is one run when --objectives names it.
        "seeds_for": "sft=5,cuset=5,profit.t01=1",
        "train_args": "--lr 1e-4 --epochs 1",
        "evaluation": [
            "kernel=--num-samples 1 --temperature 0",
            "kernel-sampled=--num-samples 4 --temperature 0.2 --top-p 0.95 --seed 0",
        ],
        "eval_args": "--levels 1,2,3 --backend emulate --max-new-tokens 512",
    },
}
DEFAULT_PRESET = "full"
PRESET_HELP = "\n".join(
    f"{name}{' (default)' if name == DEFAULT_PRESET else ''}: {preset['note']}"
    for name, preset in PRESETS.items()
)


def apply_preset(args: argparse.Namespace) -> None:
    """Give every option left out on the command line (None) the value of --preset. Its evaluations
    (--evaluation, or --modes) count only when neither is typed, and its --seeds-for only when --seeds is
    not (a typed seed count is every objective's)."""
    options = DEFAULTS | {k: v for k, v in PRESETS[args.preset].items() if k != "note"}
    if args.evaluation is not None or args.modes is not None:
        options = {k: v for k, v in options.items() if k not in ("evaluation", "modes")}
    elif "evaluation" in options:  # a preset names its evaluations, or only their modes
        del options["modes"]
    if args.seeds is not None:
        options.pop("seeds_for", None)
    for option, value in options.items():
        if getattr(args, option) is None:
            setattr(args, option, value)
