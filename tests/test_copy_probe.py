"""research/copy_probe.py: does a model copy names from its prompt, as a kernel that compiles must?

The probe's numbers are checked against the definitions they claim: name extraction on known
signatures, teacher-forced probabilities against a naive one-prefix-at-a-time loop on the bundled
model, and the random-repeat measurement against an ideal copier (a model that predicts the token
that followed the current token's last earlier occurrence) and the same copier shifted by one.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import load_script

from cuset_common.data import encode_sample, load_sft
from cuset_common.paths import EVAL_SFT_KERNEL_FILE, ROOT, TINY_MODEL

probe = load_script("research/copy_probe.py")


def test_prompt_names_are_the_kernels_and_their_parameters():
    prompt = (
        "Write only the CUDA kernel(s) with exactly these signatures:\n"
        "  __global__ void scale_rows(const float* __restrict__ src, float* dst, int rows, int cols)\n"
        "  __global__ void finish_k(unsigned int *counts,const int n)\n"
        "The host code is fixed: scale_rows is launched once."
    )
    assert probe.prompt_names(prompt) == {
        "scale_rows",
        "src",
        "dst",
        "rows",
        "cols",
        "finish_k",
        "counts",
        "n",
    }
    assert probe.prompt_names("Write a complete CUDA program with a main function.") == set()


def naive_name_probabilities(model, tokenizer, record: dict) -> tuple[list[float], list[float]]:
    """p(gold) of every response token, one forward pass per prefix, split by name / other."""
    enc = encode_sample(tokenizer, record, 2048)
    names = probe.prompt_names(probe.prompt_text(record))
    words = [m for m in re.finditer(r"\w+", enc["response_text"]) if m.group() in names]
    name_p, other_p = [], []
    for k, (a, b) in enumerate(enc["spans"]):
        pos = enc["response_start"] + k
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([enc["input_ids"][:pos]])).logits[0, -1]
        p = torch.softmax(logits.float(), -1)[enc["input_ids"][pos]].item()
        (name_p if any(m.start() < b and m.end() > a for m in words) else other_p).append(p)
    return name_p, other_p


def test_probabilities_match_a_naive_loop_on_the_tiny_model(tmp_path, tiny_tokenizer):
    out = tmp_path / "probe.json"
    assert probe.main(["--limit", "1", "--trials", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    record = load_sft(EVAL_SFT_KERNEL_FILE)[0]
    model = probe.load_causal_lm(str(TINY_MODEL), torch.float32).eval()
    name_p, other_p = naive_name_probabilities(model, tiny_tokenizer, record)
    assert result["name_tokens"] == len(name_p) > 0 and result["other_tokens"] == len(other_p) > 0
    assert result["mean_name_p"] == pytest.approx(sum(name_p) / len(name_p), abs=1e-5)
    assert result["mean_other_p"] == pytest.approx(sum(other_p) / len(other_p), abs=1e-5)
    assert result["signatures"] == 1 and result["signatures_right"] in (0, 1)
    assert 0.0 <= result["random_repeat_accuracy"] <= 1.0


class IdealCopier(torch.nn.Module):
    """Logits that put all mass on the token that followed the last earlier occurrence of the
    current token (shifted by `shift` positions): an induction head with nothing else."""

    def __init__(self, vocab: int, shift: int = 0):
        super().__init__()
        self.vocab, self.shift = vocab, shift

    def forward(self, input_ids):
        ids = input_ids[0].tolist()
        logits = torch.zeros(1, len(ids), self.vocab)
        for t, tok in enumerate(ids):
            earlier = [j for j in range(t) if ids[j] == tok]
            if earlier and earlier[-1] + 1 + self.shift < len(ids):
                logits[0, t, ids[earlier[-1] + 1 + self.shift]] = 1.0
        return type("Out", (), {"logits": logits})


def test_random_repeat_accuracy_is_one_for_an_ideal_copier_and_low_when_it_is_off_by_one(tiny_tokenizer):
    args = probe.parse_args(["--trials", "2", "--span", "12", "--gap", "30"])
    vocab = len(tiny_tokenizer)
    exact = probe.random_repeat_accuracy(IdealCopier(vocab), tiny_tokenizer, args, "cpu")
    shifted = probe.random_repeat_accuracy(IdealCopier(vocab, shift=1), tiny_tokenizer, args, "cpu")
    assert exact == 1.0
    assert shifted < 0.2


def test_the_bundled_base_model_does_not_copy_random_tokens(tmp_path):
    """README's statement about the tiny model: no induction (random-repeat accuracy near chance)."""
    out = tmp_path / "probe.json"
    assert probe.main(["--limit", "1", "--trials", "4", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["random_repeat_accuracy"] < 0.05


@pytest.mark.parametrize(
    "make_data, msg",
    [
        (lambda d: d / "missing.jsonl", "no such file"),
        (lambda d: ROOT / "data" / "sft" / "eval.jsonl", "no record's prompt gives"),
    ],
)
def test_bad_data_exits_2_with_one_line(tmp_path, capsys, make_data, msg):
    out = tmp_path / "probe.json"
    assert (
        probe.run_main(probe.main, ["--data", str(make_data(tmp_path)), "--limit", "2", "--out", str(out)])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: --data") and msg in err and err.count("\n") == 1
    assert not out.exists()
