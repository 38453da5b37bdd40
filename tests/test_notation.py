"""The method is written down once: README's one-screen summary and docs/method.md state the defaults the
scripts' parsers have, and each formula (the per-sample threshold, the sample weight, the loss) is computed
in one function of the code and written out once in docs/method.md (its "Notation" section). Nothing is
run but the parsers and a search of the text.
"""

from __future__ import annotations

import functools
import re
import subprocess

import pytest
from conftest import load_script

from cuset_common.paths import ROOT

README = ROOT / "README.md"
METHOD = ROOT / "docs" / "method.md"

# How the documents write a default: "rho 0.2", "rho = 0.2" or "--rho 0.2"; ProFit's threshold inside its
# mask, "p >= 0.1" or "p_it >= 0.1".
SYMBOLS = {
    "rho": r"rho",
    "tau_max": r"tau_max",
    "gap": r"gap",
    "alpha": r"alpha",
    "w_max": r"w_max",
    "profit_threshold": r"p(?:_it)? >=",
}
NUMBER = r"(\d+(?:\.\d+)?)"

# Each formula as code or a docstring would write it, and the one file that computes it.
FORMULAS_IN_CODE = {
    "threshold": (r"quantile\w*\(.*\brho\b|quantile_rho|min\(\s*tau_max", "cuset_common/method.py"),
    "sample weight": (r"\b1(?:\.0)? \+ alpha\b", "02_label_regions.py"),
    "loss": (r"k_it l_it|w_i sum_t|\.sum\(\) / N\b", "03_train_cuset.py"),
}
# Each formula as docs/method.md writes it out.
FORMULAS_IN_DOCS = {
    "threshold": r"min\(tau_max, quantile_rho\(",
    "sample weight": r"clip\(1 \+ alpha",
    "loss": r"sum_i w_i sum_t",
}


@functools.cache
def code_defaults() -> dict[str, float]:
    """The method knobs' defaults, from the parsers of stages 02 (regions, weights) and 03 (ProFit)."""
    stage02 = load_script("02_label_regions.py").parse_args([])
    stage03 = load_script("03_train_cuset.py").parse_args([])
    return {
        **{name: getattr(stage02, name) for name in ("rho", "tau_max", "gap", "alpha", "w_max")},
        "profit_threshold": stage03.profit_threshold,
    }


def readme_summary() -> str:
    """README's section "The method on one screen", up to the next section."""
    return re.search(r"^## The method on one screen\n(.*?)^## ", README.read_text(), re.S | re.M).group(1)


def stated_values(text: str, name: str) -> list[float]:
    """Every value the text gives the knob `name`, as its symbol or as its command-line flag."""
    flag = "--" + name.replace("_", "-")
    pattern = rf"(?:\b{SYMBOLS[name]}(?: =)?|{flag}) {NUMBER}"
    return [float(value) for value in re.findall(pattern, text)]


def code_lines() -> list[tuple[str, str]]:
    """(path, line) of every line of the repository's Python outside tests/ (the tests restate formulas
    on purpose: naive loops to check the code against)."""
    paths = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [
        (path, line)
        for path in paths
        if not path.startswith("tests/")
        for line in (ROOT / path).read_text().splitlines()
    ]


@pytest.mark.parametrize("document", ["README summary", "docs/method.md"])
@pytest.mark.parametrize("name", list(SYMBOLS))
def test_documents_state_the_codes_defaults(document, name):
    text = readme_summary() if document == "README summary" else METHOD.read_text()
    stated = stated_values(text, name)
    assert stated, f"{document} does not state the default of {name}"
    assert set(stated) == {code_defaults()[name]}, f"{document}: {name} {stated}, the code's default differs"


@pytest.mark.parametrize("formula", list(FORMULAS_IN_CODE))
def test_each_formula_is_computed_in_one_place_of_the_code(formula):
    pattern, home = FORMULAS_IN_CODE[formula]
    found = [(path, line.strip()) for path, line in code_lines() if re.search(pattern, line)]
    assert [path for path, _ in found] == [home], f"the {formula} formula written out in: {found}"


@pytest.mark.parametrize("formula", list(FORMULAS_IN_DOCS))
def test_docs_method_writes_each_formula_out_once(formula):
    assert len(re.findall(FORMULAS_IN_DOCS[formula], METHOD.read_text())) == 1


def test_the_category_codes_are_counted_once():
    """c_it's values, 0 and one code per category: CODES (cuset_common/method.py) is what stage 02 and the
    observation count over, so it must cover every category the tagger assigns."""
    from cuset_common.method import CODES
    from cuset_common.profiler.tagger import CATEGORIES

    assert sorted(CATEGORIES) == list(range(1, CODES))
