"""Model FLOPs utilisation (MFU): the FLOPs a training step's arithmetic needs, over what the processes'
devices could do in that time at their peak for the precision in use. It says how far a run is from the
hardware, the figure nanoGPT and nanochat print beside tokens per second.

Model FLOPs of one training sequence of T tokens, R of them response tokens (docs/performance.md, "MFU"):

    T (6 N_body + 12 L H Q T) + 6 N_head R

N_body: the weights of the model's linear layers except the output layer; N_head: the output layer's
(V x d). A weight costs 2 FLOPs per token forward and 4 backward (PaLM, Chowdhery et al., appendix B). The
output layer is counted at the response positions alone, because that is where stage 03 applies it
(03_train_cuset.py: GoldLogProbs): the work done, not the work of an implementation that scores every
position. 12 L H Q T per token: attention's two products (scores and the weighted sum of values), over the
whole sequence as PaLM counts them (a causal kernel may skip half), with L layers, H query heads of Q
dimensions. The weights are counted from the model's own linear layers, so grouped-query attention, gated
MLPs and tied output layers count as they are; the embedding is a lookup, no product. Activations that
--grad-checkpointing recomputes are work the model's FLOPs do not count: MFU stays MFU.

Peaks: dense (no structured sparsity) tensor-core TFLOP/s per GPU for bf16 with fp32 accumulation, and the
fp32 rate of the CUDA cores (the fp32 path here does not use TF32), from NVIDIA's datasheets (H200 SXM/NVL,
H100 SXM/PCIe/NVL, A100 SXM, L40S, L4, A10, RTX A6000) and architecture whitepapers (Ada: RTX 4090; Ampere
GA102: RTX 3090). A device the table does not name, or a CPU, has no peak unless --peak-tflops gives one
(research/bench/ measures a CPU's GEMM rate): MFU is then left out.
"""

from __future__ import annotations

import re

import torch

TERA = 1e12
# (a substring of torch.cuda.get_device_name(), the most specific first) -> (bf16, fp32) peak TFLOP/s
PEAK_TFLOPS = (
    ("H200 NVL", (835.5, 60.0)),
    ("H200", (989.4, 66.9)),  # SXM
    ("H100 NVL", (835.0, 60.0)),
    ("H100 PCIe", (756.0, 51.2)),
    ("H100", (989.4, 66.9)),  # SXM5, and the H100 the name does not qualify
    ("A100", (312.0, 19.5)),
    ("L40S", (362.05, 91.6)),
    ("L4", (121.0, 30.3)),
    ("A10", (125.0, 31.2)),
    ("RTX 4090", (165.2, 82.6)),
    ("RTX 3090", (71.0, 35.6)),
    ("RTX A6000", (154.8, 38.7)),
)


def table_peak(device_name: str | None, precision: str) -> float | None:
    """The table's peak FLOP/s of a GPU named `device_name` for `precision` ("bf16" or "fp32"), or None."""
    for name, (bf16, fp32) in PEAK_TFLOPS:  # a whole word: "A10" is not the A10G, "L4" not the L40
        if device_name and re.search(rf"\b{re.escape(name)}(?![\w])", device_name):
            return (bf16 if precision == "bf16" else fp32) * TERA
    return None


def device_peak(device: str, precision: str, peak_tflops: float | None = None) -> float | None:
    """The peak FLOP/s of one process's device: --peak-tflops where given, else the table's for a GPU."""
    if peak_tflops is not None:
        return peak_tflops * TERA
    if not device.startswith("cuda"):
        return None
    return table_peak(torch.cuda.get_device_name(torch.device(device)), precision)


def weight_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(N_body, N_head): the weights of the linear layers but the output layer, and the output layer's."""
    head = model.get_output_embeddings().weight
    seen, body = {id(head)}, 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            body += module.weight.numel()
    return body, head.numel()


def attention_shape(config) -> tuple[int, int, int]:
    """(L layers, H query heads, Q dimensions per head) from a transformers config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, heads, head_dim


class ModelFlops:
    """The model FLOPs of a micro-batch, as the module's docstring counts them."""

    def __init__(self, model: torch.nn.Module):
        self.n_body, self.n_head = weight_counts(model)
        layers, heads, head_dim = attention_shape(model.config)
        self.attention = 12 * layers * heads * head_dim  # x T^2 per sequence

    def __call__(self, lengths: list[tuple[int, int]]) -> int:
        """lengths: (T, R) of each sequence, its tokens and its response tokens (the positions scored)."""
        return sum(T * (6 * self.n_body + self.attention * T) + 6 * self.n_head * R for T, R in lengths)


def mfu(flops: float, seconds: float, peak: float | None, processes: int) -> float | None:
    """The share of the processes' peak that `flops` in `seconds` used, or None without a peak."""
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / (peak * processes)
