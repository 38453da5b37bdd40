"""Model FLOPs (cuset_common/training/mfu.py) against a count by hand from the models' configs: the tiny
model's and SmolLM2-135M's, a Llama each (q, k, v and o projections, a gated MLP of three matrices, no
biases), and the peak table's lookup of GPU names."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cuset_common.models import load_causal_lm
from cuset_common.paths import TINY_MODEL
from cuset_common.training.mfu import ModelFlops, table_peak

# SmolLM2-135M's config (its config.json on the hub): 30 layers, d 576, 9 query heads and 3 key/value
# heads of 64, MLP 1536, vocabulary 49152, the output layer tied to the embedding; 134,515,008 parameters.
SMOLLM2 = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    tie_word_embeddings=True,
)
SMOLLM2_PARAMETERS = 134_515_008


def by_hand(config: dict, T: int, R: int) -> int:
    """T (6 N_body + 12 L H Q T) + 6 V d R, N_body counted matrix by matrix from the config."""
    d, L, H = config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]
    KV, mlp_width, V = config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]
    Q = config.get("head_dim") or d // H
    attention = d * H * Q + 2 * d * KV * Q + H * Q * d  # q; k and v; o
    mlp = 3 * d * mlp_width  # gate, up, down
    n_body = L * (attention + mlp)
    return T * (6 * n_body + 12 * L * H * Q * T) + 6 * V * d * R


LENGTHS = [(1, 1), (289, 120), (2048, 0), (4096, 4000)]


def test_the_tiny_models_flops_are_its_configs():
    config = json.loads((TINY_MODEL / "config.json").read_text())
    flops = ModelFlops(load_causal_lm(str(TINY_MODEL), torch.float32))
    for T, R in LENGTHS:
        assert flops([(T, R)]) == by_hand(config, T, R), (T, R)
    assert flops(LENGTHS) == sum(by_hand(config, T, R) for T, R in LENGTHS)  # a batch: the sum


def test_smollm2s_flops_are_its_configs():
    with torch.device("meta"):  # shapes only: no weights are made
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2))
    assert sum(p.numel() for p in model.parameters()) == SMOLLM2_PARAMETERS  # the config is SmolLM2's
    flops = ModelFlops(model)
    assert flops.n_head == SMOLLM2["vocab_size"] * SMOLLM2["hidden_size"]  # tied: counted once, as the head
    for T, R in LENGTHS:
        assert flops([(T, R)]) == by_hand(SMOLLM2, T, R), (T, R)


@pytest.mark.parametrize(
    "name, bf16, fp32",
    [
        ("NVIDIA H200", 989.4, 66.9),
        ("NVIDIA H100 80GB HBM3", 989.4, 66.9),
        ("NVIDIA H100 PCIe", 756.0, 51.2),
        ("NVIDIA A100-SXM4-80GB", 312.0, 19.5),
        ("NVIDIA L40S", 362.05, 91.6),
        ("NVIDIA L4", 121.0, 30.3),
        ("NVIDIA GeForce RTX 4090", 165.2, 82.6),
        ("NVIDIA A10G", None, None),  # not the A10: no peak rather than a wrong one
        ("NVIDIA L40", None, None),  # not the L4
        ("Tesla T4", None, None),
    ],
)
def test_the_peak_table_names_whole_gpus(name, bf16, fp32):
    tera = lambda x: None if x is None else pytest.approx(x * 1e12)  # noqa: E731
    assert table_peak(name, "bf16") == tera(bf16) and table_peak(name, "fp32") == tera(fp32)
