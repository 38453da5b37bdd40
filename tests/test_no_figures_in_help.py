"""No script's --help reports a measurement: how long something took, how big it came out or how fast it
ran, on some machine, on some day. Those figures date and depend on the machine; they live in docs/
(notebook.md, performance.md, comparison.md) with their dates, and --help keeps the reason and a pointer.

The rule, as checked here. A --help may state settings exactly: a default, a timeout, a budget the code
enforces ("--run-timeout ... (default 30.0)", "a doubling wait from 1 s", "at most 8 minutes"). What it
may not carry:
  - a rate after a number (tok/s, tokens/s, GFLOP/s, programs per minute, ...): a rate is only ever
    measured, never set;
  - a duration or a size after a hedge ("about 11 minutes", "~2 min", "in under 10 minutes", "roughly
    5 GB"): a setting is exact, an approximate figure is a measurement;
  - a duration or a size tied to hardware ("12 minutes on 2 idle cores", "a few minutes on 2 CPU cores");
  - a speed-up ("1.8x faster", "2.3x slower"); "4x what its task's reference took" is a limit, not one;
  - a date ("2026-12-03", "Dec 2026"); a citation's bare year ("Olsson et al., 2022") dates no figure.
An exact, unhedged figure such as "538 MB" passes: the test cannot tell it from a setting, a reader can.
"""

from __future__ import annotations

import re
import sys

import pytest
from conftest import load_script, missing_package

from cuset_common.paths import ROOT

# Every script a user runs: the files with a __main__ block in the folders that hold commands.
SCRIPTS = sorted(
    str(path.relative_to(ROOT))
    for folder in (ROOT, *(ROOT / name for name in ("data", "research", "research/bench")))
    for path in folder.glob("*.py")
    if 'if __name__ == "__main__"' in path.read_text()
)
NUMBER = r"\d[\d,]*(?:\.\d+)?\s*[kKMG]?"
DURATION_OR_SIZE = r"(?:ms|s|sec|seconds?|min|minutes?|h|hours?|[KMGT]i?B)\b"
RATE = r"(?:\w*/s\b|\w+ per (?:second|minute|hour)\b)"  # tok/s, GFLOP/s, programs per minute
AMOUNT = rf"(?:{NUMBER}|a few|several)"
HEDGE = r"(?:about|around|roughly|nearly|almost|under|over|~)"
HARDWARE = r"(?:one|two|\d+)\s+(?:idle\s+|busy\s+|CPU\s+)?(?:cores?|CPUs?|vCPUs?|threads?|GPUs?)\b"
MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
PATTERNS = {
    "a rate": rf"{NUMBER}\s*{RATE}",
    "a hedged duration or size": rf"{HEDGE}\s*{NUMBER}\s*{DURATION_OR_SIZE}",
    "a figure on some hardware": rf"{AMOUNT}\s*{DURATION_OR_SIZE}[^.;:()]{{0,40}}?\bon\s+{HARDWARE}",
    "a speed-up": r"\d(?:\.\d+)?\s*x\s+(?:faster|slower)\b",
    "a date": rf"\b(?:19|20)\d\d-[01]\d\b|\b{MONTH} (?:19|20)\d\d\b",
}


def figures(text: str) -> list[str]:
    """Each measurement-like phrase in `text`, named by the rule it breaks."""
    flat = " ".join(text.split())  # a figure may wrap across lines
    return [f"{rule}: {m.group(0)!r}" for rule, regex in PATTERNS.items() for m in re.finditer(regex, flat)]


def help_text(script: str, capsys, monkeypatch) -> str:
    """What `python <script> --help` prints, read in this process (the scripts share one torch import)."""
    # the script's folder, where `python <script>` finds data/taskgen; last, so that research/trl_sft.py
    # does not stand in for the trl library it imports
    monkeypatch.setattr(sys, "path", [*sys.path, str((ROOT / script).parent)])
    module = load_script(script)
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_:
        module.main()  # its own main, so that a stage's --help carries the docstring main passes its parser
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    # the text checked is the whole --help: the script's docstring (its description) included
    assert " ".join(module.__doc__.split("\n\n")[0].split()) in " ".join(text.split())
    return text


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_carries_no_measurement(script, capsys, monkeypatch):
    if package := missing_package(script):
        pytest.skip(f"{script} needs {package}, which is not installed (tests/requirements.txt)")
    assert not figures(help_text(script, capsys, monkeypatch))


@pytest.mark.parametrize(
    "text",
    [
        "A full build takes about 11 minutes on one core",
        "quick check (~2 min)",
        "in under 10 minutes on 2 cores",
        "took 5 s on one thread",
        "full: a few minutes on 2 CPU cores",
        "measured: 2 threads 6.7k tok/s alone",
        "~1.8x faster on CPUs with AVX512-BF16",
        "about 1 MB a run",
        "(idle machine, 2026-12-03)",
    ],
)
def test_the_rule_catches_the_figures_that_left_help(text):
    assert figures(text)


@pytest.mark.parametrize(
    "text",
    [
        "--timeout 10 (seconds)",
        "seconds per program run, at least (default 30.0): a candidate may also take 4x what its task's "
        "reference took here",
        "Retry-After or a doubling wait from 1 s (default 4)",
        "one GPU, with the bundled tiny model, in at most 8 minutes",
        "two processes with one torch thread each share 2 cores",
        "(~1.2k tokens each)",
        "induction heads (Olsson et al., 2022: attend to the token after an earlier occurrence)",
        "torch CPU threads (default: 1)",
        "tokens per record (default: 2048)",
    ],
)
def test_the_rule_lets_settings_and_facts_pass(text):
    assert not figures(text)
