"""The report: comparison.md (the tables, what each column means, the commands), comparison.json (every
number) and comparison.png (held-out NLL per CUDA-sensitivity category). A run whose training diverged is
named as such: its objective's cells are over the seeds that trained, and read "diverged" where none did."""

from __future__ import annotations

import functools
import json
import math
import shlex
from pathlib import Path

from cuset_common.figures import pyplot, save_figure
from cuset_common.files import json_safe, write_text_atomic
from research.comparison.bootstrap import POWER_Z
from research.comparison.metrics import TOKEN_GROUPS
from research.comparison.objectives import VARIANTS
from research.comparison.plan import most_seeds, seeds_text
from research.comparison.presets import PRESETS
from research.comparison.stages import typed

COLUMNS = {
    "all": "every response token of the held-out data",
    "sensitive": "CUDA-sensitive tokens (stage 01's tagger, any category)",
    "base_hard": "tokens the base model found hard: base confidence below the sample's threshold tau_i "
    "(stage 02 on the base model's held-out profile, as stored)",
    "base_region": "tokens inside the base model's low-confidence CUDA-sensitive regions "
    "(stage 02 on the held-out data)",
    "nll": "mean negative log-likelihood of the gold token, nats per token (confidences below float32's "
    "smallest normal count as that: at most 87.3)",
    "acc": "token accuracy: share of tokens whose argmax is the gold token",
    "compile_rate / pass@1 / pass@k": "stage 04's summary.json (overall) of that evaluation "
    "(<evaluation>.<metric>: its folder eval-<evaluation>)",
}


DIVERGED = "diverged"  # the cell of an objective all of whose seeds diverged: no model, no number


def category_columns(table: dict) -> list[str]:
    """The `cat.<name>.nll` metrics that have tokens in the held-out data (the base model's row has every
    metric, and so has every objective's that trained)."""
    row = table["base"]
    return [k for k in row if k.startswith("cat.") and k.endswith(".nll") and not math.isnan(row[k]["mean"])]


def table_cell(table: dict, o: str, c: str) -> str:
    """An objective's cell of metric c: cell() over its seeds that trained, DIVERGED where none did."""
    return cell(table[o][c]) if table[o] else DIVERGED


def row_name(res: dict, o: str) -> str:
    """An objective's row label, with how many of its seeds diverged, if any (their runs have no numbers)."""
    runs = [v for v in res["per_run"].values() if v["objective"] == o]
    lost = sum(bool(v.get("diverged")) for v in runs)
    if not lost:
        return o
    return f"{o} ({'every seed' if lost == len(runs) else f'{lost} of {len(runs)} seeds'} diverged)"


def cell(s: dict) -> str:
    """A table cell: mean ± standard deviation over seeds (the mean alone for one seed)."""
    if math.isnan(s["mean"]):
        return "n/a"
    return f"{s['mean']:.3f}" + ("" if math.isnan(s["std"]) else f" ± {s['std']:.3f}")


def number(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3f}"


def md_table(
    cols: list[str], rows: list[str], fmt, label=lambda c: c, name=lambda o: o, empty: str = "only sft"
) -> list[str]:
    """A markdown table: one row per objective, name(objective) first, fmt(objective, column) per cell,
    label(column) heads; `empty`: why there is none."""
    if not cols or not rows:
        return [f"(none: {empty})"]
    return [
        "| objective | " + " | ".join(map(label, cols)) + " |",
        "|---" * (len(cols) + 1) + "|",
        *[f"| {name(o)} | " + " | ".join(fmt(o, c) for c in cols) + " |" for o in rows],
    ]


def kernel_section(args, res: dict) -> list[str]:
    """Kernel verdicts per evaluation: compile rate, pass@1 and (several replies per prompt) pass@k."""
    # k: replies per prompt of each evaluation; none where no run was evaluated (every training diverged)
    t, ks = res["table"], {name: "/".join(map(str, k)) or "no" for name, k in res["k"].items()}
    cols = [
        f"{name}.{m}"
        for name in args.evaluations
        for m in ("compile_rate", "pass@1", "pass@k")
        if m != "pass@k" or res["k"][name] not in ([1], [])
    ]  # one reply per prompt: pass@k is pass@1 (none: every run diverged)

    def label(c: str) -> str:  # pass@k: k = the evaluation's --num-samples
        name, _, metric = c.partition(".")
        return f"{name}.pass@{ks[name]}" if metric == "pass@k" else c

    described = [
        f"`{name}` ({shlex.join(own) + '; ' if own else ''}{ks[name]} repl"
        f"{'y' if ks[name] == '1' else 'ies'} per prompt)"
        for name, own in args.evaluations.items()
    ]
    return [
        "## Kernel verdicts (stage 04, eval split)",
        "",
        f"Evaluations, with their stage-04 arguments after --eval-args: {', '.join(described)}. pass@1 "
        "is the unbiased c/n of each prompt (c of its n replies pass), averaged over prompts; pass@k is "
        "stage 04's unbiased pass@k.",
        "",
        *md_table(
            cols,
            (["base"] if args.eval_base else []) + args.objectives,
            lambda o, c: table_cell(t, o, c),
            label,
            lambda o: row_name(res, o),
        ),
        "",
    ]


def paired_section(args, res: dict) -> list[str]:
    """The paired differences to sft (what the bootstrap resampled) and the power statement."""
    paired = res["paired"]
    cols = list(paired[next(iter(paired))]) if paired else []

    def diff(o: str, c: str) -> str:
        p = paired[o][c]
        return (
            "n/a" if math.isnan(p["diff"]) else f"{p['diff']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"
        )

    def resolves(o: str, c: str) -> str:
        p = paired[o][c]
        return "n/a" if math.isnan(p["resolves"]) else f"{number(p['resolves'])} (SE {number(p['se'])})"

    drawn = "seeds and units" if most_seeds(args) > 1 else "units; one seed, so no seed draw"
    passes = [c for c in cols if c.endswith(".pass@1")]
    return [
        f"## Paired differences to sft (95% bootstrap interval; resampled: {drawn})",
        "",
        "Units: held-out samples for the token metrics (a sample's value: its mean over its tokens of "
        "that kind), prompts (task x level) for pass@1 (a prompt's value: c/n, its share of passing "
        f"replies). Each objective is a matrix [seeds, units]. In each of {args.bootstrap} resamples "
        "(numpy seed 0) the units are drawn with replacement, one draw for the objective and sft "
        "(paired by unit), and the objective's seeds and sft's seeds are drawn with replacement, each "
        "apart (seed k of an objective is a training apart from seed k of sft); the statistic is the "
        "objective's mean over its drawn seeds and units minus sft's. Cells: the difference on every "
        "seed and unit [2.5th, 97.5th percentile of the resamples]."
        + (
            " With one seed per objective the seed draw is a no-op: the intervals hold the units' "
            "variance, not the seed-to-seed one."
            if most_seeds(args) == 1
            else ""
        )
        + (" `base` is one run: only sft's seeds are drawn against it." if args.eval_base else ""),
        "",
        *md_table(cols, list(paired), diff, empty=no_pairs(res)),
        *without_pairs(args, res),
        "",
        "## Power: the smallest difference this design resolves",
        "",
        f"{POWER_Z:.2f} x SE (z_0.975 + z_0.8, SE the standard deviation of the resamples above): the "
        "true difference a two-sided test at the 5% level detects with 80% power (normal "
        "approximation, the variance as measured here).",
        "",
        *[
            f"- {o}: resolves differences of "
            + ", ".join(
                f"{number(paired[o][c]['resolves'])} in pass@1 ({c.partition('.')[0]})" for c in passes
            )
            for o in paired
            if passes
        ],
        *([""] if passes and paired else []),
        "Every metric's resolvable difference, the SE it comes from in parentheses:",
        "",
        *md_table(cols, list(paired), resolves, empty=no_pairs(res)),
        "",
    ]


def no_pairs(res: dict) -> str:
    """Why the paired tables are empty: every seed of sft diverged, or the comparison has only sft."""
    return f"every seed of sft {DIVERGED}" if not res["table"]["sft"] else "only sft"


def without_pairs(args, res: dict) -> list[str]:
    """A line naming the objectives left out of the paired differences: every one of their seeds diverged."""
    gone = [o for o in args.objectives if o != "sft" and not res["table"][o]]
    return ["", f"Not paired ({DIVERGED} on every seed, no model): {', '.join(gone)}."] if gone else []


def diverged_section(res: dict) -> list[str]:
    """The runs whose training diverged (stage 03 stopped: a loss, gradient or weight not finite), each
    with stage 03's line; they have no model, so no numbers in the tables."""
    if not res["diverged"]:
        return []
    return [
        "## Runs that diverged",
        "",
        "Stage 03 stopped these trainings (a loss, gradient or weight that is not finite) and wrote no "
        "model: they have no numbers above, and an objective's cells are over its other seeds "
        f'("{DIVERGED}" where it has none). A rerun with other --train-args trains them again.',
        "",
        *[f"- {name}: {message}" for name, message in res["diverged"].items()],
        "",
    ]


def header(args, res: dict) -> list[str]:
    """The title, the data and backend, the preset's note and the regions stage 03 read."""
    counts = res["token_counts"]
    variants = sorted({label.partition(".")[2] for label in args.objectives} - {""})
    return [
        f"# Comparison: {', '.join(args.objectives)} x {seeds_text(args)} (preset {args.preset})",
        "",
        f"Base model `{typed(args.model)}`; training data `{typed(args.data)}`; held-out data "
        f"`{typed(args.eval_data)}` "
        f"({res['held_out_samples']} samples, {counts['all']} response tokens, "
        f"{counts['sensitive']} CUDA-sensitive, {counts['base_hard']} "
        f"base-hard, {counts['base_region']} in base regions). Stage 04 backend: "
        f"**{', '.join(res['backends']) or 'none'}**"
        + (" (CPU emulation: functional verdicts only)" if "emulated" in res["backends"] else "")
        + ".",
        "",
        f"Preset {args.preset} (options on the command line override it; the "
        "commands below are what ran): " + " ".join(PRESETS[args.preset]["note"].split()),
        "",
        "Cells: mean ± standard deviation over seeds; `base` is the untrained base model"
        + (" (one run)." if args.eval_base else " (token metrics only)."),
        "",
        "Regions stage 03 read, share of the training data's response tokens inside them: "
        + ", ".join(f"`{k}` {100 * v:.1f}%" for k, v in res["region_coverage"].items())
        + " (cuset's token mask is its regions)."
        + "".join(
            f" `.{v}`: stage {VARIANTS[v]['stage']} with {shlex.join(VARIANTS[v]['args'])}." for v in variants
        ),
        "",
    ]


def markdown(args, res: dict, figure_note: str) -> str:
    """comparison.md: every table, what each column means, the stage times and the commands."""
    t, objs = res["table"], ["base", *args.objectives]
    token_cols = [f"{g}.{m}" for g in TOKEN_GROUPS for m in ("nll", "acc")]
    name = functools.partial(row_name, res)
    lines = [
        *header(args, res),
        *diverged_section(res),
        "## Held-out token metrics (stage 01 on the held-out data)",
        "",
        *md_table(token_cols, objs, lambda o, c: table_cell(t, o, c), name=name),
        "",
        *kernel_section(args, res),
        *paired_section(args, res),
        "## Held-out NLL per CUDA-sensitivity category",
        "",
        *md_table(
            [c[4:-4] for c in category_columns(t)],
            objs,
            lambda o, c: table_cell(t, o, f"cat.{c}.nll"),
            name=name,
        ),
        "",
        figure_note,
        "",
        "## Columns",
        "",
        *[f"- `{k}`: {v}" for k, v in COLUMNS.items()],
        "- `.nll`/`.acc` of a group: over all its tokens of all held-out samples (token-weighted)",
        "",
        "## Stage times (seconds, the last execution of each step)",
        "",
        *[
            f"- {name}: "
            + ", ".join(f"{k} {v:g}" for k, v in steps.items())
            + f"; total {sum(steps.values()):g}"
            for name, steps in res["timings"].items()
        ],
        "",
        "## Commands",
        "",
        "A step continued after an interruption ran with its "
        "stage's --resume (or --force) "
        "added; `<run>/log.txt` holds every invocation and its output.",
        "",
        "```bash",
        res["command"],
        *res["commands"],
        "```",
        "",
    ]
    return "\n".join(lines)


def figure(path: Path, res: dict, args) -> bool:
    """comparison.png; False when matplotlib is not installed (cuset_common/figures.py)."""
    if (plt := pyplot()) is None:
        return False
    objs, t = ["base", *args.objectives], res["table"]
    cats = category_columns(t)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 + 1.1 * len(objs)), 4))
    width = 0.8 / max(len(cats), 1)
    for j, c in enumerate(cats):
        ax.bar(
            [i - 0.4 + (j + 0.5) * width for i in range(len(objs))],
            [t[o][c]["mean"] if t[o] else math.nan for o in objs],  # a diverged objective: no bar
            width,
            yerr=[0 if not t[o] or math.isnan(t[o][c]["std"]) else t[o][c]["std"] for o in objs],
            label=c[4:-4],
        )
    ax.set_xticks(range(len(objs)), objs)
    ax.set_ylabel("held-out NLL, nats per token (mean ± std over seeds)", fontsize=8)
    ax.set_title("Held-out NLL per CUDA-sensitivity category", fontsize=10)
    ax.legend(fontsize=7, ncol=3)
    save_figure(fig, path)
    return True


def write_report(args, res: dict) -> None:
    """comparison.json, comparison.png (or none: a figure from an earlier call would show other numbers)
    and comparison.md into --out; the table is printed too."""
    for v in res["per_run"].values():  # per-unit arrays as lists; nan as null
        v["units"] = {
            k: dict(sorted(a.items())) if isinstance(a, dict) else a.tolist()
            for k, a in v.get("units", {}).items()
        }
    write_text_atomic(
        args.out / "comparison.json", json.dumps(json_safe(res), indent=1, allow_nan=False) + "\n"
    )
    made = figure(args.out / "comparison.png", res, args)
    note = (
        "![held-out NLL per category](comparison.png)"
        if made
        else "(No figure: matplotlib is not installed; pip install matplotlib, then "
        "rerun this command to add it.)"
    )
    text = markdown(args, res, note)
    write_text_atomic(args.out / "comparison.md", text)
    print(text)
    if not made:
        (args.out / "comparison.png").unlink(missing_ok=True)
    print(
        f"[compare] wrote {args.out / 'comparison.png'}"
        if made
        else "[compare] no figure: matplotlib is not installed (pip install matplotlib for comparison.png)"
    )
    print(f"[compare] wrote {args.out / 'comparison.md'} and comparison.json")
