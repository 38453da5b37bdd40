"""Stage 02's report.md (the finding as Markdown) and regions.html (samples drawn token by token).

Both read the finding (cuset_common/labeling/observation.py) and the labels (cuset_common/labeling/labels.py);
the page draws the samples of most region mass, each token shaded by its confidence p0_it, each region
outlined.
"""

from __future__ import annotations

import argparse
import html

import numpy as np

from cuset_common.artifacts import path_text
from cuset_common.labeling.labels import RegionLabels

CATEGORY_COLORS = {  # HTML colour of each category code
    1: "#7c3aed",
    2: "#2563eb",
    3: "#d97706",
    4: "#0d9488",
    5: "#db2777",
    6: "#65a30d",
    7: "#0891b2",
    8: "#64748b",
    9: "#b91c1c",
}


def pct(x: float) -> str:
    """A share as a percentage with one decimal; n/a for NaN (a figure that could not be computed)."""
    return "n/a" if x != x else f"{100 * x:.1f}%"  # x != x: NaN


def num(x: float, digits: int = 3) -> str:
    """A number with `digits` decimals; n/a for NaN."""
    return "n/a" if x != x else f"{x:.{digits}f}"


def p_and_holm(raw: float, adjusted: float) -> str:
    """A raw p-value and, in parentheses, its Holm-adjusted one."""
    return f"{num(raw, 4)} ({num(adjusted, 4)})"


# ---------------------------------------------------------------------------------------
# report.md: the finding as Markdown (also printed)
# ---------------------------------------------------------------------------------------


def render_report(f: dict, args: argparse.Namespace, n_samples: int) -> str:
    """The finding as Markdown (report.md, and stdout)."""
    head = [
        "# CuSeT stage 02: regions and the finding",
        "",
        f"Profile `{path_text(args.profile)}`: {n_samples} samples, {f['tokens']} response tokens. "
        f"Low confidence: p0 < tau_i = min({args.tau_max}, quantile_{args.rho}(p0 of sample i)); high "
        f"confidence: the rest. Gap {args.gap}, line snapping {'on' if args.snap_lines else 'off'}.",
        "",
        f"**What this data supports.** {f['conclusion']}",
        "",
    ]
    sections = (confidence_section(f, args), clustering_section(f, args), regions_section(f, args, n_samples))
    return "\n".join(head + [line for section in sections for line in section])


def confidence_section(f: dict, args: argparse.Namespace) -> list[str]:
    """Level 1: the low-confidence share of sensitive tokens against that of the other tokens."""
    ls = f["low_share"]
    return [
        "## Level 1: how confidently are CUDA-sensitive tokens predicted?",
        "",
        f"- sensitive tokens: {f['sensitive_tokens']} ({pct(f['sensitive_tokens'] / f['tokens'])} of "
        f"response tokens); low-confidence: **{pct(ls['sensitive'])}** of them, "
        f"{pct(ls['other'])} of other tokens",
        f"- about rho = {args.rho} of each sample is low-confidence by construction, so only the "
        f"difference is evidence: {num(100 * ls['observed'], 1)} points; with the tags rotated within "
        f"samples (null b's draws) {num(100 * ls['null_mean'], 1)} points, two-sided p = "
        f"{num(ls['p'], 4)}",
        f"- p0 >= {args.tau_max}: {pct(f['above_tau_max_sensitive'])} of sensitive tokens, "
        f"{pct(f['above_tau_max_other'])} of other tokens; mean entropy "
        f"{num(f['mean_entropy_sensitive'])} vs {num(f['mean_entropy_other'])} nats",
        "",
    ]


def clustering_section(f: dict, args: argparse.Namespace) -> list[str]:
    """Level 2: the run statistic against the three nulls, then per category (with a note when too few
    draws leave Holm no chance)."""
    out = [
        "## Level 2: do low-confidence sensitive tokens cluster into regions?",
        "",
        f"Statistic: the share of low-confidence tokens in multi-token runs (another low token within "
        f"{args.gap + 1} positions), against three nulls ({f['permutations']} draws each, seed "
        f"{f['seed']}; one-sided p of observed >= null).",
        "",
        "| null | tokens | moves | a rejection shows | observed | null mean (sd) | p |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    out += [
        f"| ({k}) | {n['tokens']} | {n['moves']} | {n['rejection_shows']} | {pct(n['observed'])} | "
        f"{pct(n['null_mean'])} ({pct(n['null_sd'])}) | {num(n['p'], 4)} |"
        for k, n in f["nulls"].items()
    ]
    out += [
        "",
        "Per category: low-confidence tokens (share), share in runs, null means, p raw (Holm-adjusted over "
        "the categories).",
        "",
        "| category | tokens | mean p0 | low-conf | in runs | null a | p a | null b | p b | regions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| {c['code']} {name} | {c['tokens']} | {num(c['mean_p'])} | {c['low_conf_tokens']} "
        f"({pct(c['low_conf_share'])}) | {pct(c['clustered_share'])} | {pct(c['null_a_mean'])} | "
        f"{p_and_holm(c['p_a'], c['p_a_holm'])} | {pct(c['null_b_mean'])} | "
        f"{p_and_holm(c['p_b'], c['p_b_holm'])} | {c['regions']} |"
        for name, c in f["per_category"].items()
    ]
    tested = sum(c["p_b"] == c["p_b"] for c in f["per_category"].values())  # categories with a p (not NaN)
    smallest = tested / (f["permutations"] + 1)  # the smallest Holm-adjusted p the draws allow
    if tested and smallest >= f["level"]:
        out += [
            "",
            f"With {f['permutations']} draws the smallest Holm-adjusted p over {tested} categories is "
            f"{num(smallest, 4)}: none can pass {f['level']}; use --permutations "
            f">= {int(tested / f['level'] + 1e-9)}.",
        ]
    return out


def regions_section(f: dict, args: argparse.Namespace, n_samples: int) -> list[str]:
    """The regions (count, length, categories) and the sample weights (spread, and what the norm costs)."""
    r, w = f["regions"], f["weights"]
    lt, ll = r["length_tokens"], r["length_lines"]
    cats = ", ".join(
        f"{n} {c['regions']} ({pct(c['regions'] / r['count'])})"
        for n, c in f["per_category"].items()
        if c["regions"]
    )
    why = (
        "token-mean 1 keeps the cuset loss on the sft scale (one learning rate serves both); the price: "
        "samples with little or no region mass end below 1, down-weighted against sft by up to "
        f"{num(1 / w['min'], 2)}x (--weight-norm none keeps w in [1, {args.w_max}])"
        if w["norm"] == "token-mean"
        else f"not normalised: the cuset loss is about {num(w['token_weighted_mean'], 2)}x the sft scale at "
        f"the same learning rate (--weight-norm token-mean rescales it to 1)"
    )
    return [
        "",
        "## Regions",
        "",
        f"- {r['count']} regions in {r['samples_with_regions']} of {n_samples} samples, covering "
        f"{r['tokens']} tokens ({pct(r['tokens'] / f['tokens'])})",
        f"- length: mean {num(lt['mean'], 1)} tokens (median {num(lt['median'], 1)}, max "
        f"{num(lt['max'], 0)}), mean {num(ll['mean'], 2)} lines (max {num(ll['max'], 0)})",
        f"- categories: {cats or 'none'}",
        "",
        "## Sample weights",
        "",
        f"- w = clip(1 + {args.alpha} * m / mean(m), 1, {args.w_max}), normalisation {w['norm']}: "
        f"token-weighted mean {num(w['token_weighted_mean'], 4)}; mean region mass m "
        f"{num(w['mean_mass'], 4)}",
        f"- min {num(w['min'])}, p10 {num(w['p10'])}, median {num(w['median'])}, p90 {num(w['p90'])}, "
        f"max {num(w['max'])}; of {w['samples']} samples {w['samples_above_1']} end above 1, "
        f"{w['samples_below_1']} ({pct(w['samples_below_1'] / max(w['samples'], 1))}) below 1",
        f"- {why}",
        "",
    ]


# ---------------------------------------------------------------------------------------
# regions.html: self-contained (inline CSS, no scripts, no external assets)
# ---------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1280px;color:#1f2937;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:15px;margin:0}
.legend,.sample{border:1px solid #e5e7eb;border-radius:8px;padding:12px 16px;margin:14px 0;background:#fff}
.legend p{margin:4px 0}.chip{display:inline-block;margin:2px 10px 2px 0;white-space:nowrap}
.sw{display:inline-block;min-width:3.4em;text-align:center;font-size:12px;border:1px solid #e5e7eb;\
margin-right:-1px}
.meta{color:#6b7280;font-size:12.5px;margin:2px 0 10px}
.code{font:12.5px/1.55 ui-monospace,Menlo,Consolas,monospace;background:#fafafa;border-radius:6px;\
padding:8px 0}
.ln{display:flex;white-space:pre-wrap;overflow-wrap:anywhere}
.no{flex:0 0 3.2em;text-align:right;padding-right:10px;color:#9ca3af;user-select:none}
.src{flex:1;padding-right:11.5em}
.box{position:relative;margin:5px 6px 5px 0;border-radius:4px;box-shadow:0 0 0 2px var(--c);
     background:color-mix(in srgb,var(--c) 6%,transparent)}
.lbl{position:absolute;right:5px;top:2px;white-space:nowrap;font:600 10.5px/15px system-ui,sans-serif;\
color:#fff;
     padding:0 6px;border-radius:3px;background:var(--c)}
.s{border-bottom:2px solid var(--c)}.lo{font-weight:700}
.trunc{color:#9ca3af;font-style:italic;padding-left:3.9em}
"""


def shade(p: float) -> str:
    """Background of a token: red on a log scale, from none at p0 = 1 to full at p0 <= 1e-4.

    Log, not linear: a weak model puts most tokens below 0.1 and a strong one most above 0.9,
    and the page must tell 0.2 from 0.01 in both cases.
    """
    x = min(1.0, -np.log10(max(p, 1e-12)) / 4.0)
    return f"rgba(239,68,68,{0.85 * x:.3f})"


def display_lines(text: str, char_start: np.ndarray, char_end: np.ndarray) -> list[list[tuple[str, int]]]:
    """The response text up to its last token, as lines of (piece, token index or -1) pieces.

    A token spanning a newline is split into one piece per line; a token that is only a
    newline is drawn as a space at the end of its line (so its shade shows); text that no
    token covers is drawn unshaded (-1).
    """
    lines, pos = [[]], 0
    for t in range(len(char_start)):
        a, b = max(int(char_start[t]), pos), int(char_end[t])
        for piece, tok in ((text[pos:a], -1), (text[a:b], t)):
            parts = piece.split("\n")
            if tok >= 0 and not "".join(parts):
                lines[-1].append((" ", tok))
            for k, part in enumerate(parts):
                if k:
                    lines.append([])
                if part:
                    lines[-1].append((part, tok))
        pos = max(pos, b)
    return lines if len(char_start) else []


def region_boxes(los: list[int], his: list[int]) -> list[tuple[int, int, list[int]]]:
    """Group regions (line ranges lo..hi, in order) into boxes (lo, hi, members): overlapping ranges share
    one."""
    boxes: list[tuple[int, int, list[int]]] = []
    for r, (lo, hi) in enumerate(zip(los, his)):
        if boxes and lo <= boxes[-1][1]:
            boxes[-1] = (boxes[-1][0], max(hi, boxes[-1][1]), boxes[-1][2] + [r])
        else:
            boxes.append((lo, hi, [r]))
    return boxes


def render_line(
    k: int, pieces: list[tuple[str, int]], first: int, labels: RegionLabels, names: dict[int, str]
) -> str:
    """Source line k of a sample whose first token is `first`: each token piece shaded by p0, underlined when
    sensitive, bold when low, with a tooltip."""
    spans = []
    for text, t in pieces:
        if t < 0:
            spans.append(html.escape(text))
            continue
        g = first + t  # flat token index
        c, p0, rid = int(labels.c[g]), float(labels.p0[g]), int(labels.region_id[g])
        tip = f"p={p0:.4f}" + (f" · {names[c]}" if c else "") + (f" · R{rid}" if rid >= 0 else "")
        style = f"background:{shade(p0)}" + (f";--c:{CATEGORY_COLORS[c]}" if c else "")
        cls = " ".join(name for name, on in (("s", c), ("lo", labels.low[g])) if on)
        spans.append(
            f'<span{f" class={cls!r}" if cls else ""} style="{style}" title="{html.escape(tip)}">'
            f"{html.escape(text)}</span>"
        )
    return f'<div class="ln"><span class="no">{k + 1}</span><span class="src">{"".join(spans)}</span></div>'


def render_box(
    lines: list, lo: int, hi: int, regions: list[int], first: int, labels: RegionLabels, names: dict[int, str]
) -> str:
    """Lines lo..hi inside one outlined box, labelled with its regions' ids grouped by category (first-seen
    order) and coloured by the first region's category."""
    cats = [int(labels.region_category[r]) for r in regions]
    by_cat = {c: [f"R{r}" for r, cr in zip(regions, cats) if cr == c] for c in cats}
    label = " · ".join(f"{' '.join(ids)} {names[c]}" for c, ids in by_cat.items())
    inner = "".join(render_line(k, lines[k], first, labels, names) for k in range(lo, hi + 1))
    return (
        f'<div class="box" style="--c:{CATEGORY_COLORS[cats[0]]}"><span class="lbl">'
        f"{html.escape(label)}</span>" + inner + "</div>"
    )


def render_sample(i: int, sample: dict, labels: RegionLabels, names: dict[int, str]) -> str:
    """One sample: a header, then its lines; the lines of each region inside an outlined, labelled box."""
    a, b = int(labels.sample_offsets[i]), int(labels.sample_offsets[i + 1])
    lines = display_lines(sample["response_text"], labels.char_start[a:b], labels.char_end[a:b])
    starts, ends, line_index = labels.region_start, labels.region_end, labels.line_index
    rs = np.flatnonzero((starts >= a) & (starts < b))  # this sample's regions
    boxes = region_boxes([int(line_index[starts[r]]) for r in rs], [int(line_index[ends[r] - 1]) for r in rs])
    out, n = [], 0
    for lo, hi, members in boxes + [(len(lines), len(lines), [])]:
        out += [render_line(k, lines[k], a, labels, names) for k in range(n, min(lo, len(lines)))]
        if members:
            out.append(render_box(lines, lo, hi, [int(rs[m]) for m in members], a, labels, names))
        n = hi + 1
    head = (
        f"<h2>#{i} · {html.escape(str(sample.get('id')))}</h2><div class='meta'>{b - a} response tokens · "
        f"τ = {labels.tau[i]:.3g} · {len(rs)} regions · mass {labels.m[i]:.4f} · "
        f"weight {labels.w[i]:.3f}</div>"
    )
    tail = "<div class='trunc'>… truncated at max_length</div>" if sample.get("truncated") else ""
    return f"<section class='sample'>{head}<div class='code'>{''.join(out)}{tail}</div></section>"


def render_html(
    labels: RegionLabels, samples: list[dict], f: dict, args: argparse.Namespace, names: dict[int, str]
) -> str:
    """regions.html: a legend, then the --html-samples samples of highest region mass, highest first."""
    shown = np.argsort(-labels.m, kind="stable")[: args.html_samples].tolist()
    sections = [render_sample(i, samples[i], labels, names) for i in shown]
    swatches = "".join(
        f"<span class='sw' style='background:{shade(q)}'>{q:g}</span>"
        for q in (1e-4, 1e-3, 0.01, 0.1, 0.5, 1)
    )
    chips = "".join(
        f'<span class="chip"><span class="s" style="--c:{CATEGORY_COLORS[c]}">{c} '
        f"{html.escape(n)}</span></span>"
        for c, n in names.items()
    )
    snap = "snapped to whole lines" if args.snap_lines else "not snapped to lines"
    legend = (
        f"<div class='legend'><p><b>Confidence</b> p0 of the gold token (log scale): {swatches} "
        "<span class='lo'>bold</span>: below the sample's τ. Hover a token for p0, category, "
        "region.</p><p><b>CUDA-sensitive</b> tokens are underlined in their category colour: "
        f"{chips}</p><p><b>Regions</b>, outlined and labelled with id and category "
        "(<span class='lbl' style='--c:#2563eb;position:static'>R3 indexing</span>): runs of "
        f"low-confidence tokens (p0 &lt; τ = min({args.tau_max}, quantile {args.rho} of the sample)) "
        f"around sensitive ones, bridging up to {args.gap} confident tokens, {snap}.</p>"
        f"<p>Finding: {html.escape(f['conclusion'])}</p></div>"
    )
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>CuSeT regions</title>"
        f"<style>{CSS}</style></head><body><h1>CuSeT stage 02: low-confidence CUDA-sensitive "
        f"regions</h1><div class='meta'>profile {html.escape(path_text(args.profile))} · samples shown: "
        f"{len(sections)}, highest region mass first</div>{legend}{''.join(sections)}</body></html>\n"
    )
