"""Renamed copies of a train OpSpec: SFT data that can only be answered by reading the prompt.

Why: a tiny model fine-tuned on the 102 train answers memorises them. Asked for a held-out
kernel it writes a *training* kernel's name and body, which nvcc rejects ("identifier ... is
undefined"). A variant is the same operation with every name the answer must use drawn afresh:
kernel names, `__device__` helper names, `constexpr` constants and the kernels' parameter names
(with the buffers and host constants they stand for). The prompt states the new names (the
signatures, the launch note, the level-1/2 text), so the only way to write them is to copy them.

Sizes: where a family can build an op at any size (`at_size(spec, n)` in elementwise.py, binary.py
and reductions.py: kernels that take n as an argument), a copy is first rebuilt at a size drawn
from COPY_SIZES, so that the sizes in its prompt and gen.py are read, not remembered too.

How: identifier-level substitution over the spec's text fields, one mapping per variant.
- Code fields (kernels, signatures, launch, constants, gen.py's body) rename every whole-word
  occurrence that is not a member access (`threadIdx.x` keeps its `.x`) and not a Python string
  prefix (`f"..."`), plus the derived host names `d_<buffer>` and `<buffer>_ref`.
- Prose fields (level1, level2, launch note, description) rename the same words, except the two
  uses of a one-letter name that are English there: the article "a"/"A" and the "x" of "32 x 8".
- New names come from neutral word pools, never a word that already occurs in the task (so no
  capture) nor a held-out op's name, and are checked afterwards: each new name occurs where its
  role says it must, and no old name is left in the code.
The result is an ordinary OpSpec with its own id (`<task id>~v<j>`): rendered by render_task, its
reference kernels compile in its own harness (tests/test_sft_variants.py compiles a sample).
"""

from __future__ import annotations

import dataclasses
import random
import re

from cuset_common.tasks import signature_parts
from taskgen import FAMILIES
from taskgen.core import OpSpec, render_task

# Element counts for resizable copies: powers of two and sizes that no block divides, 64k to 3M.
COPY_SIZES = (
    65_536,
    262_144,
    500_000,
    786_433,
    1_000_003,
    1_048_576,
    1_500_007,
    2_000_000,
    2_097_152,
    3_000_017,
)

# Word pools. Neutral on purpose: no op name (a held-out op's name must never enter training
# data), no C/C++ keyword or CUDA builtin. A drawn name that is already a word of the task (say
# `len` where gen.py calls len()) is drawn again, and one draw in five gets a digit, so that a
# task with many names of one role still finds fresh ones.
KERNEL_VERBS = (
    "apply",
    "compute",
    "run",
    "process",
    "transform",
    "update",
    "eval",
    "fused",
    "stage",
    "launch",
    "work",
    "step",
    "pass",
    "calc",
    "exec",
    "solve",
    "emit",
    "build",
    "make",
    "handle",
)
KERNEL_NOUNS = (
    "values",
    "items",
    "elems",
    "buffer",
    "tensor",
    "grid",
    "field",
    "batch",
    "vec",
    "mat",
    "chunk",
    "part",
    "span",
    "job",
    "task",
    "block",
    "entries",
    "cells",
    "samples",
    "points",
)
HELPER_VERBS = ("combine", "fold", "merge", "accum", "gather_up", "collect", "pool", "join", "tally", "blend")
HELPER_NOUNS = (
    "lanes",
    "warp_vals",
    "group",
    "team",
    "threads",
    "vals",
    "partial",
    "pair",
    "local",
    "row_vals",
)
CONST_WORDS = (
    "THREADS",
    "NT",
    "TB",
    "WIDTH_T",
    "SPAN_N",
    "GROUP_N",
    "CHUNK_N",
    "STEP_N",
    "LANES_N",
    "PER_BLOCK",
    "T_SIZE",
    "EDGE",
    "SIDE",
    "DEPTH_N",
    "UNROLL",
    "BLK",
    "WORK",
    "SEG",
    "PAD_N",
    "CAP",
)
INPUT_NAMES = (
    "src",
    "inp",
    "in_vals",
    "source",
    "xs",
    "input",
    "data_in",
    "vin",
    "p",
    "q",
    "lhs",
    "rhs",
    "arr",
    "vals",
    "mat_in",
    "tab",
    "u_in",
    "in0",
    "in1",
    "in2",
    "first",
    "second",
    "left",
    "right",
)
OUTPUT_NAMES = (
    "dst",
    "res",
    "result",
    "outp",
    "out_vals",
    "dest",
    "ys",
    "target",
    "vout",
    "out0",
    "out1",
    "sink",
    "store",
    "answer",
    "o",
)
SCRATCH_NAMES = (
    "tmp",
    "scratch",
    "work_buf",
    "aux",
    "staging",
    "spill",
    "temp_vals",
    "mid",
    "carry_buf",
    "parts",
)
INT_NAMES = (
    "len",
    "count_n",
    "num",
    "total",
    "sz",
    "nelem",
    "n_items",
    "extent",
    "dim_a",
    "dim_b",
    "dim_c",
    "dim_d",
    "span_len",
    "limit",
    "nn",
    "m_dim",
    "k_dim",
    "h_dim",
    "w_dim",
    "size_n",
)
FLOAT_NAMES = ("coef", "factor", "scale_f", "thr", "param", "kval", "mult", "level", "gain", "bias_f")

# Prose words that look like a one-letter identifier but are English (checked per occurrence).
ARTICLE_NAMES = frozenset({"a", "A"})
TIMES_NAMES = frozenset({"x", "X"})

_IDENT = r"[A-Za-z_]\w*"


@dataclasses.dataclass(frozen=True)
class Roles:
    """The renameable identifiers of one spec, by role (each list in order of first appearance)."""

    kernels: list[str]
    helpers: list[str]
    constants: list[str]
    params: dict[str, str]  # name -> "input" | "output" | "scratch" | "int" | "float"


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


def _unique(names) -> list[str]:
    return list(dict.fromkeys(names))


def find_roles(spec: OpSpec) -> Roles:
    """Kernel, helper, constant and parameter names of `spec`, read from its kernels and signatures."""
    kernels, params = [], {}
    buffers = {
        b.name: role
        for role, bs in (("input", spec.inputs), ("output", spec.outputs), ("scratch", spec.scratch))
        for b in bs
    }
    for sig in spec.signatures:
        kernel, types, names = signature_parts(sig)
        kernels.append(kernel)
        for ctype, name in zip(types, names):
            if name in buffers:
                params.setdefault(name, buffers[name])
            elif "*" in ctype:  # a pointer named apart from the buffer the launch passes
                params.setdefault(name, "input" if ctype.startswith("const ") else "output")
            else:
                params.setdefault(name, "float" if re.search(r"\b(float|double)\b", ctype) else "int")
    code = spec.kernels
    helpers = re.findall(
        rf"^\s*__device__[\w\s]*?\b(?:void|bool|int|float|unsigned|double)\s+({_IDENT})\s*\(",
        code,
        flags=re.M,
    )
    constants = re.findall(rf"^\s*constexpr\s+[\w\s]+?\s({_IDENT})\s*=", code, flags=re.M)
    return Roles(
        kernels=_unique(kernels), helpers=_unique(helpers), constants=_unique(constants), params=params
    )


def _kernel_name(rng: random.Random) -> str:
    verb, noun = rng.choice(KERNEL_VERBS), rng.choice(KERNEL_NOUNS)
    style = rng.randrange(5)
    if style == 0:
        return f"{verb}_{noun}_kernel"
    if style == 1:
        return f"{noun}_{verb}"
    if style == 2:
        return f"{verb}{noun.capitalize()}Kernel"
    if style == 3:
        return f"k_{verb}_{noun}"
    return f"{verb}_{noun}{rng.randrange(1, 10)}"


def _helper_name(rng: random.Random) -> str:
    verb, noun = rng.choice(HELPER_VERBS), rng.choice(HELPER_NOUNS)
    return (
        f"{verb}_{noun}" if rng.random() < 0.7 else f"{verb}{noun.replace('_', ' ').title().replace(' ', '')}"
    )


def _from_pool(pool: tuple[str, ...]):
    def draw(rng: random.Random) -> str:
        name = rng.choice(pool)
        return name if rng.random() < 0.8 else f"{name}{rng.randrange(2, 10)}"

    return draw


DRAW = {
    "kernel": _kernel_name,
    "helper": _helper_name,
    "constant": _from_pool(CONST_WORDS),
    "input": _from_pool(INPUT_NAMES),
    "output": _from_pool(OUTPUT_NAMES),
    "scratch": _from_pool(SCRATCH_NAMES),
    "int": _from_pool(INT_NAMES),
    "float": _from_pool(FLOAT_NAMES),
}


def draw_mapping(spec: OpSpec, roles: Roles, rng: random.Random, forbidden: set[str]) -> dict[str, str]:
    """old name -> fresh name for every renameable identifier of `spec`.

    A fresh name is no word of the rendered task (so it captures nothing, not even the host
    harness's locals), not another new name, and contains no word of `forbidden` (held-out ops).
    """
    taken = set().union(*(_words(v) for v in _text_fields(render_task(spec))))
    mapping: dict[str, str] = {}
    wanted = (
        [(k, "kernel") for k in roles.kernels]
        + [(h, "helper") for h in roles.helpers]
        + [(c, "constant") for c in roles.constants]
        + list(roles.params.items())
    )
    for old, role in wanted:
        for _ in range(1000):
            new = DRAW[role](rng)
            if new not in taken and not any(f"_{op}_" in f"_{new.lower()}_" for op in forbidden):
                break
        else:
            raise ValueError(f"{spec.task_id}: no fresh {role} name for {old!r} in 1000 draws")
        mapping[old] = new
        taken.add(new)
    return mapping


def _text_fields(record: dict) -> list[str]:
    fields = [v for v in record.values() if isinstance(v, str)]
    km = record.get("kernel_mode") or {}
    return fields + [v for v in km.values() if isinstance(v, str)] + list(km.get("signatures", []))


def _derived(mapping: dict[str, str], buffers: set[str]) -> dict[str, str]:
    """Host-side names built from a buffer's name: the device pointer d_<b> and gen.py's <b>_ref."""
    out = dict(mapping)
    for old, new in mapping.items():
        if old in buffers:
            out[f"d_{old}"] = f"d_{new}"
            out[f"{old}_ref"] = f"{new}_ref"
    return out


def _pattern(names) -> re.Pattern:
    # Longest first so that alternation never stops at a prefix; whole words only; a member access
    # (`.x`, `->x`) or a Python string prefix (`f"`) is not the identifier.
    alt = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![.\w])(?<!->)({alt})(?![\w\"'])")


def rename_code(text: str, mapping: dict[str, str]) -> str:
    return _pattern(mapping).sub(lambda m: mapping[m.group(1)], text) if mapping else text


def _is_english(text: str, m: re.Match) -> bool:
    """True where a one-letter name is the English article or the multiplication sign of prose."""
    name, before, after = m.group(1), text[: m.start()].rstrip(), text[m.end() :]
    if name in ARTICLE_NAMES:
        nxt = re.match(r" ([A-Za-z][\w-]*)", after)
        return bool(nxt) and nxt.group(1) not in ("and", "or", "is", "are", "has")
    if name in TIMES_NAMES:
        return (
            bool(before) and (before[-1].isdigit() or before[-1] == ")") and bool(re.match(r" [\d(]", after))
        )
    return False


def rename_prose(text: str, mapping: dict[str, str]) -> str:
    if not mapping:
        return text
    return _pattern(mapping).sub(lambda m: m.group(0) if _is_english(text, m) else mapping[m.group(1)], text)


def apply_mapping(spec: OpSpec, mapping: dict[str, str], copy: str) -> OpSpec:
    """`spec` with every old name replaced, under the id `<task id>~<copy>`."""
    full = _derived(mapping, {b.name for b in spec.inputs + spec.outputs + spec.scratch})

    def buffers(bs):
        return [dataclasses.replace(b, name=mapping.get(b.name, b.name)) for b in bs]

    return dataclasses.replace(
        spec,
        copy=copy,
        description=rename_prose(spec.description, full),
        level1=rename_prose(spec.level1, full),
        level2=rename_prose(spec.level2, full),
        launch_note=rename_prose(spec.launch_note, full),
        inputs=buffers(spec.inputs),
        outputs=buffers(spec.outputs),
        scratch=buffers(spec.scratch),
        constants=rename_code(spec.constants, full),
        kernels=rename_code(spec.kernels, full),
        signatures=[rename_code(s, full) for s in spec.signatures],
        launch=rename_code(spec.launch, full),
        gen=rename_code(spec.gen, full),
    )


def check_variant(old: OpSpec, new: OpSpec, roles: Roles, mapping: dict[str, str]) -> None:
    """Each new name occurs where its role says; no old name is left in the code. ValueError if not."""
    problems = []
    sigs, kernels, launch = "\n".join(new.signatures), new.kernels, new.launch
    for k in roles.kernels:
        for where, text in (
            ("signatures", sigs),
            ("kernels", kernels),
            ("launch", launch),
            ("launch note", new.launch_note),
        ):
            if mapping[k] not in _words(text):
                problems.append(f"kernel {mapping[k]} (was {k}) missing from the {where}")
    for name in roles.helpers + roles.constants:
        if mapping[name] not in _words(kernels):
            problems.append(f"{mapping[name]} (was {name}) missing from the kernels")
    for p in roles.params:
        if mapping[p] not in _words(sigs) or mapping[p] not in _words(kernels):
            problems.append(f"parameter {mapping[p]} (was {p}) missing from the signatures or kernels")
    leftover = _pattern(mapping)
    for where, text in (
        ("kernels", kernels),
        ("signatures", sigs),
        ("launch", launch),
        ("constants", new.constants),
        ("gen", new.gen),
    ):
        found = sorted({m.group(1) for m in leftover.finditer(text)})
        if found:
            problems.append(f"old names {found} left in the {where}")
    if problems:
        raise ValueError(f"variant {new.task_id} of {old.task_id}: " + "; ".join(problems))


def resized(spec: OpSpec, rng: random.Random) -> OpSpec:
    """`spec` at a size from COPY_SIZES where its family can build it at any size; else `spec` itself."""
    n = rng.choice(COPY_SIZES)
    for family in FAMILIES:
        at_size = getattr(family, "at_size", None)
        built = at_size(spec, n) if at_size else None
        if built is not None:
            if (built.op, built.split, built.task_id) != (spec.op, spec.split, spec.task_id):
                raise ValueError(
                    f"{spec.task_id}: {family.__name__}.at_size built {built.task_id} ({built.split})"
                )
            return built
    return spec


def variant(spec: OpSpec, j: int, forbidden: set[str]) -> OpSpec:
    """Variant number j (1, 2, ...) of a train spec; deterministic in (task id, j)."""
    if spec.split != "train":
        raise ValueError(f"{spec.task_id}: only train tasks get variants (split {spec.split!r})")
    rng = random.Random(f"{spec.task_id}~v{j}")  # str seeds are hashed with sha512: stable across runs
    base = resized(spec, rng)
    roles = find_roles(base)
    mapping = draw_mapping(base, roles, rng, forbidden)
    new = apply_mapping(base, mapping, f"v{j}")
    check_variant(base, new, roles, mapping)
    return new


def held_out_words(specs: list[OpSpec]) -> set[str]:
    """Lower-case names of the ops outside train: no new name may hold one between `_` boundaries."""
    return {s.op.lower() for s in specs if s.split != "train"}
