"""The numbers of the table: token metrics from stage 01's profiles of the held-out data (aligned token by
token with the base model's), kernel verdicts from stage 04's summaries, per run and as mean and standard
deviation over seeds per objective. A run whose training diverged has no model and so no numbers: it is
recorded as diverged, and an objective's figures are over its seeds that trained."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from cuset_common.artifacts import read_artifact
from cuset_common.cli import UserError
from cuset_common.files import read_jsonl
from harness.outcomes import APART
from research.comparison.bootstrap import paired
from research.comparison.objectives import region_variants, regions_dir
from research.comparison.steps import read_json, summary_problem, training_diverged

PROFILE = {"p0": np.float32, "argmax_correct": np.uint8, "c": np.uint8, "token_ids": np.int32}
TOKEN_GROUPS = ("all", "sensitive", "base_hard", "base_region")
UNIT_METRICS = (
    "all.nll",
    "sensitive.nll",
    "base_hard.nll",
    "all.acc",
)  # token metrics with a paired bootstrap


def read_profile(path: Path, base: tuple[dict, dict] | None = None) -> tuple[dict, dict]:
    """A stage-01 profile; with `base`, refused unless it lines up with the base model's token by token."""
    t, meta = read_artifact(
        path, "01_profile", f"research/compare_objectives.py (stage 01 into {path})", token_tensors=PROFILE
    )
    if base is not None:
        bt, bmeta = base
        for what, get in (
            ("tokenizer", lambda m: m.get("tokenizer_fingerprint")),
            ("data", lambda m: (m.get("data") or {}).get("sha256")),
        ):
            if get(meta) != get(bmeta):
                raise UserError(
                    f"{path}: made with another {what} (meta.json) than the base model's "
                    "held-out profile; token metrics align the two token by token: profile "
                    f"both with the same tokenizer and --eval-data"
                )
        if not (
            np.array_equal(t["sample_offsets"], bt["sample_offsets"])
            and np.array_equal(t["token_ids"], bt["token_ids"])
        ):
            raise UserError(
                f"{path}: its tokens differ from the base model's held-out profile (same "
                "tokenizer and data but another --max-length?); rerun both with the same "
                "settings"
            )
    return t, meta


def per_sample(values: np.ndarray, mask: np.ndarray, sample_of: np.ndarray, n: int) -> np.ndarray:
    """Mean of values over each sample's masked tokens; nan for a sample without one. [S]"""
    count = np.bincount(sample_of, weights=mask, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(sample_of, weights=values * mask, minlength=n) / count


def token_metrics(
    prof: dict, groups: dict[str, np.ndarray], sample_of: np.ndarray, n: int
) -> tuple[dict, dict]:
    """({group.nll, group.acc: mean over the group's tokens}, {UNIT_METRICS: per-sample means [S]})."""
    nll = -np.log(np.maximum(prof["p0"].astype(np.float64), np.finfo(np.float32).tiny))  # [T]
    acc = prof["argmax_correct"].astype(np.float64)  # [T]
    metrics, units = {}, {}
    for g, mask in groups.items():
        for name, v in (("nll", nll), ("acc", acc)):
            metrics[f"{g}.{name}"] = float(v[mask].mean()) if mask.any() else math.nan
            if f"{g}.{name}" in UNIT_METRICS:
                units[f"{g}.{name}"] = per_sample(v, mask, sample_of, n)
    return metrics, units


def kernel_metrics(folder: Path, name: str) -> tuple[dict, dict, str, int]:
    """One evaluation's overall compile rate, pass@1 and pass@k (stage 04's summary.json), its per-prompt
    pass@1 (unit: task x level; the prompt's share of passing samples c/n, unbiased), backend, k."""
    anew = (
        f"not as stage 04 wrote it; restore it, or remove {folder} and run without --report-only to "
        f"evaluate anew"
    )
    summary_path, results_path = folder / "summary.json", folder / "results.jsonl"
    summary = read_json(summary_path)
    if problem := summary_problem(summary):
        raise UserError(f"{summary_path}: {problem}, {anew}")
    k, over = summary["num_samples"], summary["overall"]
    metrics = {
        f"{name}.compile_rate": over["compile_rate"],
        f"{name}.pass@1": over["pass@1"],
        f"{name}.pass@k": over.get(f"pass@{k}", over["pass@1"]),
    }
    judged: dict[str, list[bool]] = {}
    for lineno, r in read_jsonl(results_path):
        if (
            type(r.get("task_id")) not in (str, int)
            or type(r.get("level")) is not int
            or type(r.get("outcome")) is not str
        ):
            raise UserError(
                f"{results_path}:{lineno}: a row needs task_id, level (an integer) and outcome "
                f"(a string), {anew}"
            )
        if r["outcome"] not in APART:
            judged.setdefault(f"{r['task_id']}/L{r['level']}", []).append(r["outcome"] == "pass")
    units = {f"{name}.pass@1": {key: float(np.mean(v)) for key, v in judged.items()}}
    return metrics, units, summary["backend"], k


def token_groups(base_dir: Path, profile: dict, meta: dict, sample_of: np.ndarray) -> dict[str, np.ndarray]:
    """The held-out tokens each token metric is taken over, as masks [T]: all, CUDA-sensitive, hard for
    the base model (p0 below its sample's tau_i), inside the base model's regions, each category."""
    regions, _ = read_artifact(
        base_dir / "regions-heldout",
        "02_label_regions",
        "research/compare_objectives.py",
        token_tensors={"region_id": np.int32},
        sample_tensors={"tau": np.float32},
    )
    groups = {
        "all": np.ones(len(sample_of), bool),
        "sensitive": profile["c"] > 0,
        "base_hard": profile["p0"] < regions["tau"][sample_of],
        "base_region": regions["region_id"] >= 0,
    }
    names = {int(c): v for c, v in meta["categories"].items()}
    return groups | {f"cat.{name}": profile["c"] == code for code, name in names.items()}


def seed_table(per_run: dict, objectives: list[str]) -> dict:
    """{objective: {metric: {mean, n, std}}} over each objective's seeds that trained (std nan for one
    seed); {} for an objective all of whose seeds diverged."""
    table = {}
    for o in objectives:
        rows = [v["metrics"] for v in per_run.values() if v["objective"] == o and not v.get("diverged")]
        if not rows:
            table[o] = {}
            continue
        table[o] = {
            k: {
                "mean": float(np.mean([x[k] for x in rows])),
                "n": len(rows),
                "std": float(np.std([x[k] for x in rows], ddof=1)) if len(rows) > 1 else math.nan,
            }
            for k in rows[0]
        }
    return table


def aggregate(args, runs: list[dict]) -> dict:
    """Every number of the comparison: per run (metrics and per-unit values), per objective (the seed
    table), the paired differences to sft, and what the report says of the data and the backends."""
    base_dir = args.out / "base"
    base = read_profile(base_dir / "profile-heldout")
    bt, bmeta = base
    n = len(bt["sample_offsets"]) - 1
    sample_of = np.repeat(np.arange(n), np.diff(bt["sample_offsets"]))  # [T]
    groups = token_groups(base_dir, bt, bmeta, sample_of)
    per_run, backends, ks = {}, set(), {name: set() for name in args.evaluations}
    base_run = {"name": "base", "objective": "base", "seed": 0, "dir": base_dir}
    for r in [base_run, *runs]:
        if message := training_diverged(r.get("steps", []), fresh=not args.report_only):
            per_run[r["name"]] = {"objective": r["objective"], "seed": r["seed"], "diverged": message}
            per_run[r["name"]] |= {"metrics": {}, "units": {}}
            continue
        profile = bt if r is base_run else read_profile(r["dir"] / "profile-heldout", base)[0]
        metrics, units = token_metrics(profile, groups, sample_of, n)
        for name in args.evaluations if r is not base_run or args.eval_base else ():
            km, ku, backend, k = kernel_metrics(r["dir"] / f"eval-{name}", name)
            metrics, units, backends = metrics | km, units | ku, backends | {backend}
            ks[name].add(k)
        per_run[r["name"]] = {
            "objective": r["objective"],
            "seed": r["seed"],
            "metrics": metrics,
            "units": units,
        }
    return {
        "per_run": per_run,
        "table": seed_table(per_run, ["base", *args.objectives]),
        "paired": paired(args, per_run),
        "diverged": {name: v["diverged"] for name, v in per_run.items() if v.get("diverged")},
        "backends": sorted(backends),
        "k": {name: sorted(k) for name, k in ks.items()},
        "evaluations": args.evaluations,
        "token_counts": {g: int(m.sum()) for g, m in groups.items()},
        "held_out_samples": n,
        "region_coverage": region_coverage(args),
    }


def region_coverage(args) -> dict[str, float]:
    """Share of the training data's response tokens inside regions, per regions variant stage 03 read."""
    out = {}
    for variant in [""] + region_variants(args):
        folder = regions_dir(args.out / "base", variant)
        t, _ = read_artifact(
            folder,
            "02_label_regions",
            "research/compare_objectives.py",
            token_tensors={"region_id": np.int32},
        )
        out[folder.name] = float((t["region_id"] >= 0).mean())
    return out
