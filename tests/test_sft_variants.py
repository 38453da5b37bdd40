"""Renamed copies of train tasks in the kernel-mode SFT data (data/taskgen/variants.py), practice at
copying names from the prompt, which a kernel must do to compile.

A copy is only useful if it is a correct task of its own (its reference kernels compile in its
own renamed harness, its gen.py writes the renamed files) whose names agree across prompt,
signatures and answer, and it must never carry a held-out op into training data, renamed or not.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuset_common.files import read_jsonl
from cuset_common.paths import NVCC_FLAGS, ROOT, SFT_KERNEL_FILE, TASKS_FILE
from cuset_common.tasks import build_prompt, fence, load_tasks

sys.path.insert(0, str(ROOT / "data"))  # the taskgen package lives in data/
from taskgen import FAMILIES  # noqa: E402
from taskgen.core import render_task  # noqa: E402
from taskgen.variants import COPY_SIZES, find_roles, held_out_words, variant  # noqa: E402

# Compile-only for one fixed architecture: what stage 04 would reject, nvcc rejects here too, and
# no GPU is needed. One copy per family keeps the test near 30 s on 2 cores.
ARCH = ["-arch=sm_80", "-c"]
JOBS = 2
ALL_SPECS = [s for family in FAMILIES for s in family.specs()]
FORBIDDEN = held_out_words(ALL_SPECS)


def names_to_rename(spec) -> int:
    r = find_roles(spec)
    return len(r.kernels) + len(r.helpers) + len(r.constants) + len(r.params)


def sample_specs() -> list:
    """Per family the train spec with the most names to rename (kernels, helpers, constants, parameters)."""
    out = []
    for family in FAMILIES:
        train = [s for s in family.specs() if s.split == "train"]
        if train:
            out.append(max(train, key=names_to_rename))
    return out


SAMPLE = sample_specs()


@pytest.fixture(scope="module")
def kernel_records() -> list[dict]:
    return [r for _, r in read_jsonl(SFT_KERNEL_FILE)]


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


def code_words(text: str) -> set[str]:
    """Identifiers of C++ code as a compiler sees them: comments and member accesses (`.x`) left out."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    return set(re.findall(r"(?<![.\w])[A-Za-z_]\w*", text))


def nvcc_compile(source: str, workdir: Path) -> subprocess.CompletedProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prog.cu").write_text(source)
    return subprocess.run(
        ["nvcc", *NVCC_FLAGS, *ARCH, "prog.cu", "-o", "prog.o"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
    )


def with_kernels(task: dict, kernels: str) -> str:
    km = task["kernel_mode"]
    return km["harness.cu"].replace(km["marker"], kernels)


def test_sample_covers_every_family():
    assert len(SAMPLE) == len(FAMILIES)


@pytest.mark.parametrize("spec", SAMPLE, ids=lambda s: s.task_id)
def test_copy_names_agree_in_prompt_signatures_and_answer(spec):
    roles = find_roles(spec)
    copy = variant(spec, 1, FORBIDDEN)
    task = render_task(copy)
    answer, prompt = task["kernel_mode"]["reference_kernels"], build_prompt(task, 1, "kernel")
    new_roles = find_roles(copy)
    old_names = set(roles.kernels + roles.helpers + roles.constants) | set(roles.params)
    # Every signature the prompt asks for is in the answer, word for word.
    flat_answer = " ".join(answer.split())
    for sig in task["kernel_mode"]["signatures"]:
        assert f"  {sig}" in prompt
        assert " ".join(sig.split()) in flat_answer
    # Kernel names are in the launch note the prompt gives and in the harness's launch.
    for k in new_roles.kernels:
        assert k in words(task["kernel_mode"]["launch"]) and k in words(task["kernel_mode"]["harness.cu"])
    # Every name was replaced: none of the old kernel, helper, constant or parameter names is left in the
    # answer's code, and the new names share nothing with the old ones.
    assert not (old_names & code_words(answer)), old_names & code_words(answer)
    new_names = set(new_roles.kernels + new_roles.helpers + new_roles.constants) | set(new_roles.params)
    assert len(new_names) == len(old_names) and not (new_names & old_names)
    # The buffers the prompt lists are the renamed ones, and the harness reads and writes their files.
    for b in task["inputs"] + task["outputs"]:
        assert f"- {b['name']}: " in prompt and f'"data/{b["name"]}.bin"' in task["kernel_mode"]["harness.cu"]


def test_copies_compile_in_their_own_harness_and_not_in_the_original(tmp_path):
    """The copy's reference kernels compile in the copy's harness; the original kernels do not (the
    harness really calls the new names); gen.py writes the renamed input and reference files."""

    def check(spec) -> str | None:
        j = 1 + SAMPLE.index(spec) % 3  # different copies across families
        task = render_task(variant(spec, j, FORBIDDEN))
        original = render_task(spec)
        d = tmp_path / task["id"].replace("~", "-")
        good = nvcc_compile(with_kernels(task, task["kernel_mode"]["reference_kernels"]), d / "copy")
        if good.returncode:
            return f"{task['id']}: reference does not compile in its own harness:\n{good.stderr[-1500:]}"
        if spec is SAMPLE[0]:  # one negative case is enough to show that the harness follows the renaming
            bad = nvcc_compile(with_kernels(task, original["kernel_mode"]["reference_kernels"]), d / "orig")
            if bad.returncode == 0:
                return f"{task['id']}: the original kernels compile in the renamed harness"
        gen = d / "gen"
        gen.mkdir()
        (gen / "gen.py").write_text(task["gen.py"])
        r = subprocess.run([sys.executable, "gen.py"], cwd=gen, capture_output=True, text=True, timeout=300)
        if r.returncode:
            return f"{task['id']}: gen.py failed: {r.stderr[-800:]}"
        want = {f"{b['name']}.bin" for b in task["inputs"]} | {
            f"{b['name']}_ref.bin" for b in task["outputs"]
        }
        got = {p.name for p in (gen / "data").iterdir()}
        return None if got == want else f"{task['id']}: gen.py wrote {sorted(got)}, expected {sorted(want)}"

    with ThreadPoolExecutor(JOBS) as pool:
        failures = [f for f in pool.map(check, SAMPLE) if f]
    assert not failures, "\n".join(failures)


def test_resized_copy_states_its_size_everywhere(tmp_path):
    """A copy rebuilt at another size (elementwise, binary, 1-D sums) says so in its prompt, host constants,
    buffers and gen.py, and its reference still compiles in its harness."""
    spec = next(s for s in ALL_SPECS if s.op == "sigmoid")
    n0 = spec.inputs[0].shape[0]
    copy = next(c for c in (variant(spec, j, FORBIDDEN) for j in range(1, 20)) if c.inputs[0].shape[0] < n0)
    n = copy.inputs[0].shape[0]
    assert n in COPY_SIZES and copy.outputs[0].shape == (n,)
    task = render_task(copy)
    assert f"= {n} elements" in task["level1_prompt"] and f" = {n};" in copy.constants
    assert str(n0) not in task["gen.py"] + task["level1_prompt"] + task["kernel_mode"]["harness.cu"]
    r = nvcc_compile(with_kernels(task, task["kernel_mode"]["reference_kernels"]), tmp_path / "build")
    assert r.returncode == 0, r.stderr[-1500:]
    (tmp_path / "gen.py").write_text(task["gen.py"])
    subprocess.run([sys.executable, "gen.py"], cwd=tmp_path, check=True, timeout=300)
    assert (tmp_path / "data" / f"{copy.inputs[0].name}.bin").stat().st_size == 4 * n


def test_every_copy_in_the_sft_data_is_of_a_train_task(kernel_records):
    tasks = load_tasks(TASKS_FILE)
    train_ids = {t["id"] for t in tasks if t["split"] == "train"}
    copies = [r for r in kernel_records if "variant_of" in r]
    assert copies, "the bundled kernel-mode SFT data holds no renamed copies"
    for r in copies:
        assert r["variant_of"] in train_ids, r["id"]
        assert r["task_id"].split("~")[0] == r["variant_of"], r["id"]
    by_source: dict[str, set[int]] = {}
    for r in copies:
        by_source.setdefault(r["variant_of"], set()).add(r["level"])
    assert set(by_source) == train_ids  # every train task has copies, at every level (the bundled K >= 3)
    assert all(len(levels) == 3 for levels in by_source.values())


def skeleton(kernels: str) -> str:
    """The kernels' code with the names a copy renames replaced by their order of first use: two answers
    that differ only by renaming have the same skeleton."""
    flat = " ".join(re.sub(r"//[^\n]*", " ", kernels).split())
    names = re.findall(r"__global__ void (\w+)\(([^)]*)\)", flat)
    defined = [k for k, _ in names] + [re.findall(r"\w+", p)[-1] for _, ps in names for p in ps.split(",")]
    defined += re.findall(r"__device__[\w\s]*?\b(?:void|bool|int|float|unsigned|double)\s+(\w+)\s*\(", flat)
    defined += re.findall(r"constexpr\s+[\w\s]+?\s(\w+)\s*=", flat)
    order = {n: f"ID{i}" for i, n in enumerate(dict.fromkeys(defined))}
    return re.sub(r"(?<![.\w])[A-Za-z_]\w*", lambda m: order.get(m.group(0), m.group(0)), flat)


def test_no_held_out_op_leaks_into_training_data(kernel_records):
    tasks = load_tasks(TASKS_FILE)
    held_out = [t for t in tasks if t["split"] != "train"]
    train_names = {t["task_name"] for t in tasks if t["split"] == "train"}
    held_out_kernels = {
        m
        for t in held_out
        for s in t["kernel_mode"]["signatures"]
        for m in re.findall(r"__global__ void (\w+)", s)
    }
    answers = {
        skeleton(r["messages"][2]["content"].removeprefix("```cpp\n").removesuffix("\n```"))
        for r in kernel_records
    }
    for r in kernel_records:
        user, answer = r["messages"][1]["content"], r["messages"][2]["content"]
        assert user.splitlines()[0].removeprefix("Task: ") in train_names, r["id"]
        assert not (held_out_kernels & (words(user) | words(answer))), (
            r["id"],
            held_out_kernels & words(answer),
        )
        assert not any(f"_{op}_" in f"_{w.lower()}_" for w in code_words(answer) for op in FORBIDDEN), r["id"]
    # No held-out op's kernels, under any renaming, are a training answer.
    for t in held_out:
        assert skeleton(t["kernel_mode"]["reference_kernels"]) not in answers, t["id"]


def test_skeleton_sees_through_renaming():
    # The leak check above is only as good as skeleton(): a renamed copy must match its original.
    spec = SAMPLE[2]
    assert skeleton(render_task(variant(spec, 1, FORBIDDEN))["kernel_mode"]["reference_kernels"]) == skeleton(
        render_task(spec)["kernel_mode"]["reference_kernels"]
    )


def test_variant_refuses_a_held_out_spec():
    spec = next(s for s in ALL_SPECS if s.split == "eval")
    with pytest.raises(ValueError, match="only train tasks"):
        variant(spec, 1, FORBIDDEN)


def test_copy_records_use_the_shared_prompt_builder(kernel_records):
    # The committed file equals the builder's output (test_tasks checks --check); here one copy
    # is rebuilt by hand to show what a record is made of.
    r = next(r for r in kernel_records if "variant_of" in r)
    spec = next(s for s in ALL_SPECS if s.task_id == r["variant_of"])
    task = render_task(variant(spec, int(r["task_id"].rsplit("~v", 1)[1]), FORBIDDEN))
    assert r["messages"][1]["content"] == build_prompt(task, r["level"], "kernel")
    assert r["messages"][2]["content"] == fence(task["kernel_mode"]["reference_kernels"])
    assert json.loads(json.dumps(r)) == r
