"""The formulas two stages share, defined once: the per-sample threshold (stage 02's tau_i, stage 03's
kappa_i) and the output layer applied chunk by chunk to the gold token (stages 01 and 03).

docs/method.md states each formula; the stages call these functions and point there. Both stages take
log p(gold) the same way, gold_log_softmax of float32 logits chunk by chunk: stage 01 without grad (it
needs the whole log-softmax for the entropy too), stage 03 under a checkpoint per chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# Defaults of --rho and --tau-max, the same in stages 02 and 03 (docs/method.md): the threshold stage 02
# labels regions with is the one stage 03 masks with.
RHO = 0.2
TAU_MAX = 0.5
# c_it takes CODES values: 0 (not CUDA-sensitive) and the categories 1-9 (cuset_common/profiler/tagger.py:
# CATEGORIES)
CODES = 10


def sample_threshold(p: torch.Tensor, valid: torch.Tensor, rho: float, tau_max: float) -> torch.Tensor:
    """The per-sample threshold of each row of p [B, L] -> [B], in p's dtype: tau_i on p0 (stage 02),
    kappa_i on p (stage 03); the rule: docs/method.md "Regions", Threshold.

    Linear interpolation (torch.quantile's default, and numpy's) over each row's valid tokens, all rows at
    once and without a device sync: invalid positions are NaN, which nanquantile ignores. A row with no
    valid token (all NaN) gets 0, so that no token of it is low (docs/method.md, the same place).
    """
    q = torch.nanquantile(torch.where(valid, p, torch.nan), rho, dim=1)  # [B], NaN for empty rows
    return torch.nan_to_num(q.clamp(max=tau_max), nan=0.0)


def head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float32 logits [n, V] of hidden states [n, d]: h @ weight.T + bias, what check_head_is_plain
    checks."""
    return F.linear(hidden, weight, bias).float()


def row_chunks(n_rows: int, chunk_rows: int) -> range:
    """Start of each chunk of rows: only a [chunk_rows, V] block of logits exists at a time
    (docs/method.md "Memory")."""
    return range(0, n_rows, chunk_rows)


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    """-sum p log p per row of log-probs [n, V] -> [n], as torch.special.entr sums it, at less cost: entr
    takes a log per logit again (on a CPU it cost more than the log-softmax itself). A -inf logit (p = 0,
    log p = -inf) makes 0 * -inf = nan; only those rows, rare, are summed with entr, whose entr(0) = 0."""
    entropy = -logp.exp().mul_(logp).sum(-1)  # [n]; in place on the new p
    bad = entropy.isnan()
    if bad.any():
        entropy[bad] = torch.special.entr(logp[bad].exp()).sum(-1)
    return entropy


@torch.no_grad()
def gold_logprob_entropy(
    head, hidden: torch.Tensor, gold: torch.Tensor, chunk_rows: int, use_bf16: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage 01: log p(gold), entropy and argmax == gold (bool) per row of hidden [N, d] -> three [N];
    head: h [n, d] -> logits [n, V] (head_logits of the model's output layer).

    The logits are upcast to float32 before log_softmax, so the gold log-prob is exact up to the body's
    precision. The argmax is taken on the same float32 logits (log_softmax shifts a row by one constant:
    same argmax).
    """
    logp_gold, entropy, correct = [], [], []
    for lo in row_chunks(hidden.shape[0], chunk_rows):
        with torch.autocast(device_type=hidden.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = head(hidden[lo : lo + chunk_rows])  # [n, V]
        logits = logits.float()  # [n, V] float32
        correct.append(logits.argmax(-1) == gold[lo : lo + chunk_rows])  # [n] bool
        logp, gold_logp = gold_log_softmax(logits, gold[lo : lo + chunk_rows])  # [n, V], [n]
        logp_gold.append(gold_logp)
        entropy.append(entropy_of(logp))  # [n]
    return torch.cat(logp_gold), torch.cat(entropy), torch.cat(correct)


def gold_log_softmax(logits: torch.Tensor, gold: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p = log_softmax(logits) [n, V] and log p(gold) [n] of float32 logits [n, V], gold ids [n]."""
    logp = torch.log_softmax(logits, dim=-1)  # [n, V]
    return logp, logp.gather(1, gold[:, None])[:, 0]


def _chunk_gold_logp(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor
) -> torch.Tensor:
    return gold_log_softmax(head_logits(hidden, weight, bias), labels)[1]  # one [n, V] chunk at a time


def gold_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Stage 03: log q(labels) from last hidden states [..., d] and the output layer (weight [V, d],
    bias [V]) -> [...], with grad.

    Each chunk of positions is checkpointed: backward recomputes its [chunk, V] logits, so neither
    forward nor backward ever holds logits for the whole batch (docs/method.md "Memory").
    """
    h, y = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)  # [n, d], [n]
    parts = [
        checkpoint(_chunk_gold_logp, h[s : s + chunk], weight, bias, y[s : s + chunk], use_reentrant=False)
        for s in row_chunks(h.shape[0], chunk)
    ]
    return torch.cat(parts).view(labels.shape) if parts else h.new_zeros(labels.shape, dtype=torch.float32)
