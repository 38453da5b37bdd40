"""The worked trace: one sample's quantities token by token, so that a reader can check the method by hand
(docs/method.md "The worked trace").

    python 03_train_cuset.py --trace I [--regions R] [--model M --data D]

reads sample I (0-based, in the data's order) of the regions artifact R and of the stage-01 profile it names,
runs --model on it (before any step: the base model) and prints a row per response token, then the sample's
weights, thresholds and loss under each objective. Nothing is trained or written. The artifacts' values are
printed as stored (p0_it, c_it from the profile; tau_i, r_it, m_i, w_i from the regions); low and seed are
stage 02's rules on them (p0_it < tau_i; low and c_it > 0). Everything the loss reads comes from the functions
stage 03 trains with (its loss_terms and objective_loss, handed in as `terms_of`), under the run's
--mask-source, --rho, --tau-max and --profit-threshold.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from cuset_common.artifacts import tokenizer_fingerprint
from cuset_common.cli import UserError
from cuset_common.data_sources import load_data
from cuset_common.device import pick_device, resolve_precision
from cuset_common.method import sample_threshold
from cuset_common.models import load_causal_lm
from cuset_common.training.run import check_model
from cuset_common.training.samples import (
    aligned_sample,
    collate,
    load_regions,
    padding_tokenizer,
    resolve_max_length,
)

TOKEN_WIDTH = 16  # characters of a token's text shown (escaped as a JSON string)


@dataclass
class Trace:
    """One sample's worked trace: per response token t (arrays [n_i]) and per sample."""

    index: int  # i, the sample
    tokens: list[str]  # each token's text
    p0: np.ndarray  # p0_it, the profile's
    c: np.ndarray  # c_it, the profile's category code
    tau: float  # tau_i, the regions artifact's
    low: np.ndarray  # p0_it < tau_i
    seed: np.ndarray  # low and c_it > 0
    r: np.ndarray  # r_it: region_id >= 0
    p: np.ndarray  # p_it at --model, before any step
    l: np.ndarray  # noqa: E741  l_it = -log q(y_it)
    k: dict[str, np.ndarray]  # k_it of each objective
    f: np.ndarray  # f_it of dft (p_it); every other objective's is 1
    m: float  # m_i, the regions artifact's
    w: float  # w_i, the regions artifact's
    kappa: float  # kappa_i on the mask's probability (p_it, or p0_it with --mask-source profile)
    loss: dict[str, float]  # each objective's loss of the sample alone: N = n_i
    weights: dict[str, float]  # the w_i each objective applies (w_i, or 1)


def print_trace(args, terms_of: Callable) -> int:
    """--trace: print sample args.trace's worked trace (render); 0."""
    print(render(sample_trace(args, terms_of), args))
    return 0


def sample_trace(args, terms_of: Callable) -> Trace:
    """The trace of sample args.trace: its tokens and the artifacts' values, and terms_of(model, batch, args)
    (stage 03's trace_terms: per objective loss_terms' tensors and "loss") at --model."""
    records, data_id = load_data(args)
    tokenizer = padding_tokenizer(args.model)
    regions = load_regions(args, tokenizer_fingerprint(tokenizer), data_id, trace=True)
    i = args.trace
    if i >= len(records):
        raise UserError(f"--trace {i}: {args.data} holds {len(records)} samples, 0 to {len(records) - 1}")
    sample = aligned_sample(tokenizer, records[i], i, resolve_max_length(args, regions), regions)
    n = len(sample["input_ids"]) - sample["start"]
    if n == 0:
        raise UserError(f"--trace {i}: the sample has no response token (its prompt fills --max-length)")
    device = pick_device(args.device)
    model = load_causal_lm(args.model, torch.float32).to(device)
    check_model(model, torch.tensor([sample["input_ids"]]), args.model)
    model.eval()  # the base model as it is: no dropout
    batch = collate([sample], tokenizer.pad_token_id, device)
    bf16 = resolve_precision(args.precision, device) == "bf16"
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
        terms = terms_of(model, batch, args)
    return trace_of(i, sample, regions, terms, batch["valid"], tokenizer, args)


def trace_of(i: int, sample: dict, regions: dict, terms: dict, valid, tokenizer, args) -> Trace:
    """The Trace of sample i from its slice of the artifacts and stage 03's terms (valid: its [1, L-1])."""
    lo, hi = int(regions["offsets"][i]), int(regions["offsets"][i + 1])
    tensors, profile = regions["tensors"], regions["profile"]
    p0, c, tau = profile["p0"][lo:hi], profile["c"][lo:hi], float(tensors["tau"][i])
    low = p0.astype(np.float64) < tau
    on_tokens = lambda x: x[0][valid[0]].detach().float().cpu().numpy()  # noqa: E731  [1, L-1] -> [n_i]
    any_terms = terms["sft"]
    kappa = sample_threshold(any_terms["p_mask"], valid, args.rho, args.tau_max)
    return Trace(
        index=i,
        tokens=[tokenizer.decode([t]) for t in sample["input_ids"][sample["start"] :]],
        p0=p0,
        c=c,
        tau=tau,
        low=low,
        seed=low & (c > 0),
        r=tensors["region_id"][lo:hi] >= 0,
        p=on_tokens(any_terms["p"]),
        l=on_tokens(any_terms["l"]),
        k={name: on_tokens(t["k"]).astype(bool) for name, t in terms.items()},
        f=on_tokens(terms["dft"]["f"]),
        m=float(tensors["m"][i]),
        w=float(tensors["w"][i]),
        kappa=float(kappa[0]),
        loss={name: float(t["loss"]) for name, t in terms.items()},
        weights={name: float(t["w"][0]) for name, t in terms.items()},
    )


def render(tr: Trace, args) -> str:
    """The trace as text: the token table, then the sample's quantities and its loss per objective."""
    names = list(tr.k)
    head = (
        f"sample {tr.index}: {len(tr.tokens)} response tokens | regions {args.regions} | "
        f"model {args.model} | --mask-source {args.mask_source}\n"
        f"k: 1 kept, . dropped, one flag per objective in this order: {' '.join(names)}\n"
        f"f: the factor f_it of dft (p_it); every other objective's is 1\n"
    )
    rows = [
        f"{'t':>5} {'token':<{TOKEN_WIDTH + 2}} {'p0':>7} {'c':>2} {'tau':>7} low seed r {'p':>7} {'l':>8} "
        f"{'k':<{len(names)}} {'f':>7}"
    ]
    for t, text in enumerate(tr.tokens):
        flags = "".join("1" if tr.k[name][t] else "." for name in names)
        shown = json.dumps(text, ensure_ascii=False)[1:-1][:TOKEN_WIDTH]
        rows.append(
            f"{t:>5} {shown:<{TOKEN_WIDTH + 2}} {tr.p0[t]:7.4f} {tr.c[t]:>2} {tr.tau:7.4f} "
            f"{int(tr.low[t]):>3} {int(tr.seed[t]):>4} {int(tr.r[t])} {tr.p[t]:7.4f} {tr.l[t]:8.4f} {flags} "
            f"{tr.f[t]:7.4f}"
        )
    sample = f"n_i {len(tr.tokens)} | m_i {tr.m:.6f} | w_i {tr.w:.6f} | tau_i {tr.tau:.6f} | "
    sample += f"kappa_i {tr.kappa:.6f}"
    losses = [f"{'objective':<13} {'kept':>5} {'w':>9} {'L_i = sum_t w f k l / n_i':>26}"]
    for name in names:
        losses.append(f"{name:<13} {int(tr.k[name].sum()):>5} {tr.weights[name]:9.6f} {tr.loss[name]:26.6f}")
    return "\n".join([head, *rows, "", sample, "", *losses])
