"""CUDA sensitivity: the category c_it of each response token (docs/method.md "CUDA sensitivity"; our
reconstruction), 0 for none or one of CATEGORIES.

A token gets a category when the characters it spans overlap a match of that category's rules; where
several match, the first in PRIORITY wins. Every rule runs on the code view of the response
(cuset_common/profiler/cuda_source.py: prose outside ``` fences, comments and literals blanked), so a CUDA
word in prose or in a comment is never tagged. Two kinds of rule:

  lexemes    LEXEMES, the named CUDA words and operators, anywhere in the code (`__syncthreads`, `<<<`);
  structure  inside the body of each __global__/__device__ function: integer index assignments derived
             from the thread builtins and pointer arithmetic with an index (indexing), bounds checks on an
             index and a kernel's early `return;` (guard), stores through an output pointer (write_back);
             and anywhere, the grid-size arithmetic `(n + b - 1) / b` (launch).

tests/test_tagger.py shows each rule by example.
"""

from __future__ import annotations

import bisect
import re

import numpy as np

from cuset_common.profiler.cuda_source import (
    COMPARISON,
    Brackets,
    code_view,
    device_functions,
    expr_edge,
    expr_ends,
    next_of,
    outside_brackets,
)

CATEGORIES = {  # code -> name, as stored in the profile's meta (stage 02 reads them from there)
    1: "signature",  # function qualifiers: __global__, __device__, __launch_bounds__, __restrict__
    2: "indexing",  # thread builtins, index variables derived from them, pointer arithmetic with an index
    3: "guard",  # bounds checks on an index, a kernel's early `return;`
    4: "shared_memory",  # __shared__
    5: "synchronization",  # __syncthreads, __syncwarp, fences, cudaDeviceSynchronize
    6: "warp_atomic",  # warp shuffles and votes, atomics
    7: "launch",  # <<<grid, block>>>, dim3, grid-size arithmetic
    8: "memory_api",  # cudaMalloc, cudaMemcpy, cudaFree, cudaMemset
    9: "write_back",  # stores through an output pointer
}
# A token that overlaps several categories gets the first of these (assumption): named CUDA
# lexemes (specific) before the structural patterns (broad), so `threadIdx` inside a guard
# `if (threadIdx.x < 32)` is indexing and the rest of the condition is guard.
PRIORITY = (5, 6, 4, 8, 1, 2, 7, 3, 9)


# ---------------------------------------------------------------------------------------
# Lexemes: category -> regex over the code view; \b keeps `threads` or `index_count` untagged
# ---------------------------------------------------------------------------------------

LEXEMES = {
    1: r"\b__(?:global|device|host|launch_bounds|restrict|forceinline|noinline)__\b|\b__restrict\b",
    2: r"\b(?:threadIdx|blockIdx|blockDim|gridDim)\b(?:\s*\.\s*[xyz]\b)?|\bwarpSize\b",  # with its .x
    4: r"\b(?:extern\s+)?__shared__\b",
    5: "|".join(
        [
            r"\b(?:__syncthreads(?:_count|_and|_or)?|__syncwarp|__threadfence(?:_block|_system)?"
            r"|cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize)\b",
            r"\bcg::sync\b",  # cooperative groups: cg::sync(block)
            r"\.\s*sync\s*\(\s*\)",  # and block.sync()
        ]
    ),
    6: "|".join(
        [
            r"\b__shfl(?:_up|_down|_xor)?_sync\b",  # warp shuffles
            r"\b__(?:ballot|any|all|match_any|match_all)_sync\b",  # warp votes
            r"\b__activemask\b",
            r"\batomic(?:Add|Sub|Max|Min|CAS|Exch|And|Or|Xor|Inc|Dec)(?:_block|_system)?\b",
        ]
    ),
    7: "|".join(
        [
            # the whole launch configuration <<<grid, block, smem>>>; it holds no `;` and no other `<<<`
            # (which also keeps a run of `<<<` without `>>>` from reading the rest of the text each)
            r"<<<(?:(?!<<<)[^;])*?>>>",
            r"<<<|>>>",  # and a bracket whose partner is missing (before a `;`)
            r"\bdim3\b",
        ]
    ),
    8: r"\bcuda(?:Malloc|Memcpy|Free|Memset)\w*\b",
}

# ---------------------------------------------------------------------------------------
# Structure: the pieces of C++ the structural rules read, one regex each
# ---------------------------------------------------------------------------------------

BUILTIN = re.compile(r"\b(?:threadIdx|blockIdx|blockDim|gridDim|warpSize)\b")
NAME = r"[A-Za-z_]\w*"  # a C++ identifier

# An integer assignment: `int i = ...;`, `i += stride)` (a for header's step), `a = ..., b = ...;`.
INT_TYPE = (
    r"(?:const\s+)?(?:unsigned\s+|signed\s+)?"
    r"(?:int|long\s+long|long|size_t|int64_t|uint64_t|int32_t|uint32_t|unsigned|auto)"
)
TOP = r"[^;{}(),]*"  # right-hand side text outside parentheses: a `,` there ends the assignment
NO_PAREN = r"[^;{}()]*"  # text inside parentheses, where a `,` separates arguments
PAREN_1 = rf"\({NO_PAREN}\)"  # `(b * c)`
PAREN_2 = rf"\({NO_PAREN}(?:{PAREN_1}{NO_PAREN})*\)"  # `(a + (b * c))`: two levels are enough for index code
ASSIGN_HEAD = re.compile(  # an assignment up to its `=`
    rf"(?:\b(?P<type>{INT_TYPE})\s+)?"  # declared here (`int i =`) or assigned (`i =`)
    rf"(?<![\w.\]>])(?P<name>{NAME})"  # a plain variable: not a member `s.x` or `p->x`
    r"\s*(?P<op>[+\-*/%&|^]|<<|>>)?=(?!=)"  # `=` or a compound `+=`, `<<=`, ...; not `==`
)
ASSIGN = re.compile(
    ASSIGN_HEAD.pattern + rf"(?P<rhs>{TOP}(?:{PAREN_2}{TOP})*)"
    r"[;),]"  # ends at the statement's `;`, the for header's `)` or the `,` before the next name
)
RHS_STOP = re.compile(r"[;{}(),]")  # where TOP ends
PAREN_GROUP = re.compile(PAREN_2)
# A variable declared with a type that is not an integer (`float v`, `bool ok`, `float4* p`): never an index
NON_INT_DECL = re.compile(
    r"\b(?:float|double|half|__half|__nv_bfloat16|bool|char|float[1-4]|double[1-4])\b"
    rf"[\s*&]*(?:const\s+|__restrict__\s+)*({NAME})"
)
# A local pointer declaration, `const float* __restrict__ xr = x + row * cols;`. The data is const when
# `const` stands before the * (c1: `const float*`, c2: `float const*`); after it, the pointer itself is.
PTR_DECL = re.compile(
    r"(?<![\w.>])(?P<c1>const\s+)?(?:unsigned\s+)?"
    r"[A-Za-z_][\w:]*(?:\s*<[^;<>]*>)?"  # the pointee type, maybe qualified or a template: std::array<int, 4>
    r"(?P<c2>\s+const)?\s*"
    r"(?:\*\s*(?:(?:const|__restrict__|__restrict)\b)?\s*)+"  # the stars, each maybe const or __restrict__
    rf"(?P<name>{NAME})\s*=(?!=)(?P<rhs>[^;]*);"
)
STORE_OP = re.compile(r"\s*(?:[+\-*/%&|^]|<<|>>)?=(?!=)")  # after `y[...]` or `*p`: a store, not a read
# Grid-size arithmetic, a ceiling division: `(n + b - 1) / b`, `(rows * cols + b - 1) / b`, `(n + 255) / 256`
CEIL_DIV = re.compile(
    r"\(\s*[\w.]+(?:\s*\*\s*[\w.]+)*"  # the element count: `n` or a product `rows * cols`
    r"\s*\+\s*([\w.]+)\s*(?:-\s*1\s*)?\)"  # + b - 1 (group 1: b), or + 255
    r"\s*/\s*([\w.]+)"  # / b (group 2), or / 256
)
CONDITION = re.compile(r"\b(if|while|for)\s*\(")  # ternary conditions are found from their `?`
LEADING = re.compile(r"\s*(?:return\b)?\s*")  # what may precede a ?: condition in its expression
NUMBER = r"\b(?:0[xX][\da-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)[uUlLfF]*\b"  # 0xff, 32, 1.5e-3f, 16u
# An operand made of literals only (and warpSize, 32 on every GPU so far): what a loop stops at
CONSTANT = re.compile(rf"(?:[\s()+\-*/%<>&|^~]|\bwarpSize\b|{NUMBER})*")


# ---------------------------------------------------------------------------------------
# Structure: the rules, one function body at a time
# ---------------------------------------------------------------------------------------


def index_assignments(body: str, params: str) -> tuple[set[str], list[tuple[int, int]]]:
    """Index variables of a function body and the spans of their assignments.

    An index variable is an integer computed from thread/block builtins, directly or through
    other index variables (idx -> row/col -> offset); a value read at an index (`v = x[i]`)
    or a variable declared float/bool/... is not one.
    """
    not_int = set(NON_INT_DECL.findall(params + "\n" + body))
    names: set[str] = set()
    found = assignments(body)
    for _ in range(4):  # a few rounds of derivation (idx -> row -> offset) reach the fixed point
        known, hits = set(names), []
        for a in found:
            rhs = outside_brackets(a["rhs"])
            uses = (
                BUILTIN.search(rhs)
                or names & set(re.findall(r"\w+", rhs))
                or (a["op"] and a["name"] in names)
            )
            if uses and a["name"] not in not_int and (a["type"] or a["name"] in names or BUILTIN.search(rhs)):
                names.add(a["name"])
                hits.append((a.start(), a.end() - (body[a.end() - 1] in "),")))  # not the `)`/`,` after it
        if names == known:
            break
    return names, hits


def assignments(body: str) -> list[re.Match]:
    """ASSIGN.finditer(body), with each right-hand side read about once.

    The regex, tried at each `x =` (ASSIGN_HEAD), walks its right-hand side from one RHS_STOP to the next,
    over parenthesised groups (PAREN_GROUP), and succeeds at a `;`, `)` or `,`, fails at a `{`, `}`, the
    end or a group it cannot take: the same walk whatever `=` it started from. So rhs_end remembers where
    the walk from each stop it reached ended, and a later walk that reaches that stop ends there at once;
    ASSIGN itself runs only where it matches. (Tried at each `x =` as it is, each would read up to that
    end again: k of them, k times.)"""
    stops, ends, found, pos = [m.start() for m in RHS_STOP.finditer(body)], {}, [], 0
    for head in ASSIGN_HEAD.finditer(body):  # heads that overlap share their `=`, and so their fate
        if head.start() >= pos and rhs_end(body, head.end(), stops, ends) is not None:
            found.append(ASSIGN.match(body, head.start()))
            pos = found[-1].end()
    return found


def rhs_end(body: str, x: int, stops: list[int], ends: dict[int, int | None]) -> int | None:
    """Where ASSIGN's right-hand side from x ends (past its `;`, `)` or `,`), None where it fails; stops:
    the positions of RHS_STOP, ends: what earlier walks found from each stop they reached (filled here)."""
    reached, end = [], None
    while (y := next_of(stops, x, len(body))) < len(body) and y not in ends:
        reached.append(y)
        if body[y] in ";),":
            end = y + 1
            break
        group = PAREN_GROUP.match(body, y) if body[y] == "(" else None  # `{` or `}`: no assignment
        if group is None:
            break
        x = group.end()
    else:
        end = ends.get(y) if y < len(body) else None
    for y in reached:
        ends[y] = end
    return end


def pointers(body: str, params: str) -> tuple[set[str], set[str]]:
    """(all pointers, output pointers) of a function: its pointer parameters and the local pointers it
    declares (`float* yr = y + row * cols;`). Outputs: non-const pointer parameters, and local pointers
    to non-const data derived from an output (`yr` above, then `float* p = yr + 1`), in body order."""
    ptrs, outs = set(), set()
    for p in params.split(","):
        star, ident = p.find("*"), re.findall(NAME, p)
        if star >= 0 and ident:
            ptrs.add(ident[-1])
            if "const" not in p[:star].split():
                outs.add(ident[-1])
    for d in PTR_DECL.finditer(body, 0, body.rfind(";") + 1):  # a declaration ends at its `;`
        ptrs.add(d["name"])
        if not (d["c1"] or d["c2"]) and outs & set(re.findall(r"\w+", d["rhs"])):
            outs.add(d["name"])
    return ptrs, outs


def pointer_offset_spans(body: str, ptrs: set[str], index: re.Pattern) -> list[tuple[int, int]]:
    """Pointer arithmetic with an index (index: the function's index variables and builtins; BUILTIN), in
    full: `x + row * cols` (up to where the operand ends), `y += offset`, and a whole pointer declaration
    whose initializer uses an index.

    An operand's end is expr_edge's (expr_ends: a run of pointer operators in one expression is read
    once), and whether it uses an index is looked up among the index words of the whole body, found
    once: an operand ends at a character that is not part of a word, so its words are the body's."""
    declarations = PTR_DECL.finditer(body, 0, body.rfind(";") + 1)  # each ends at its `;`
    spans = [d.span() for d in declarations if index.search(d["rhs"]) or BUILTIN.search(d["rhs"])]
    if ptrs:
        alt = "|".join(map(re.escape, sorted(ptrs)))
        # not a member `s.x + 1`
        ops = list(re.finditer(rf"(?<!\.)(?<!->)\b(?:{alt})\s*[+-]=?(?![+\-=>])", body))
        words = sorted({m.span() for pattern in (index, BUILTIN) for m in pattern.finditer(body)})
        starts = [a for a, _ in words]
        for p, end in zip(ops, expr_ends(body, [p.end() for p in ops])):
            k = bisect.bisect_left(starts, p.end())  # the first index word in the operand, if any
            if k < len(words) and words[k][1] <= end:
                spans.append((p.start(), end))
    return spans


def conditions(body: str, brackets: Brackets) -> list[tuple[bool, str, int, int]]:
    """(in a loop header, condition text, span start, span end) of each condition: if/while (span: the whole
    `if (...)`), a for-loop's test (span: the test) and a ?: condition, parenthesised or not (span: it).

    An if/while/for whose `(` is never closed (an answer cut off inside it, or broken code) has no
    condition: its text would run to the end of the function, all of it one guard, and k of them would
    cost k times the text."""
    found = []
    for c in CONDITION.finditer(body):
        close = brackets.close(c.end() - 1)
        if close is None:
            continue
        lo, hi = c.end(), close - 1  # condition text: body[lo:hi]
        if c.group(1) != "for":
            found.append((c.group(1) == "while", body[lo:hi], c.start(), hi + 1))
        elif body.count(";", lo, hi) == 2:
            test = body[lo:hi].split(";")[1]
            a = body.index(";", lo) + 1
            found.append((True, test, a, a + len(test)))
    for q in re.finditer(r"\?", body):
        a = LEADING.match(body, expr_edge(body, q.start() - 1, -1)).end()
        found.append((False, body[a : q.start()], a, a + len(body[a : q.start()].rstrip())))
    return found


def is_guard(cond: str, index: re.Pattern, in_loop_header: bool) -> bool:
    """The guard rule (docs/method.md "CUDA sensitivity", category 3; our reconstruction): a guard is a
    bounds check on an index.

    In an if or ?: condition: any comparison involving an index variable or builtin (which threads or
    elements act: `i < n`, `tid == 0`, `lane < 16`). In a loop header (for test, while condition): only a
    comparison bounding an index variable (or threadIdx/blockIdx) by a size, an operand that is not a
    constant (literals, warpSize). So the grid-stride test `i < n` is a guard, and a loop's own termination
    test is not: halving/doubling loops stop at constants (`s > 0`, `offset < 32`, `stride > 0`), counting
    loops run a plain counter, not an index (`k < K`).
    """
    cond = outside_brackets(cond)
    if not in_loop_header:
        return bool(COMPARISON.search(cond) and (index.search(cond) or BUILTIN.search(cond)))
    for part in re.split(r"&&|\|\|", cond):
        sides = COMPARISON.split(part, maxsplit=1)
        if len(sides) == 2 and any(
            index.search(a) and not CONSTANT.fullmatch(b) for a, b in (sides, sides[::-1])
        ):
            return True
    return False


def write_back_spans(body: str, outs: set[str], brackets: Brackets) -> list[tuple[int, int]]:
    """Stores through an output pointer (`y[...] =`, `*y =`, `*(y + i) =`, compound assignments too)."""
    spans = []
    for w in re.finditer(rf"\b({NAME})\s*\[", body):
        if w.group(1) not in outs or (w.start() > 0 and body[w.start() - 1] in ".>"):
            continue
        op = STORE_OP.match(body, brackets.close(w.end() - 1, "[]") or len(body))
        if op:
            spans.append((w.start(), op.end()))
    for d in re.finditer(rf"\*\s*(\(\s*)?({NAME})", body):  # `*p =`, `*(p + i) =`, starting a statement
        if d.group(2) not in outs:
            continue
        op = STORE_OP.match(body, (brackets.close(d.start(1)) or len(body)) if d.group(1) else d.end())
        k = d.start() - 1  # the last character before it that is not blank (-1: none)
        while k >= 0 and body[k].isspace():
            k -= 1
        if op and (k < 0 or body[k] in ";{}:)" or body[max(k - 3, 0) : k + 1] == "else"):
            spans.append((d.start(), op.end()))
    return spans


def function_spans(kind: str, params: str, body: str) -> dict[int, list[tuple[int, int]]]:
    """Spans (offsets into body) of indexing, guard and write-back in one function; kind: global or device.
    An early `return;` and write-back are looked for in kernels (__global__) only (docs/method.md)."""
    idx, assigns = index_assignments(body, params)
    index = re.compile(r"\b(?:" + "|".join(["threadIdx", "blockIdx", *map(re.escape, sorted(idx))]) + r")\b")
    ptrs, outs = pointers(body, params)
    brackets = Brackets(body)
    guards = [(a, b) for loop, cond, a, b in conditions(body, brackets) if is_guard(cond, index, loop)]
    early_returns = [r.span() for r in re.finditer(r"\breturn\s*;", body)] if kind == "global" else []
    return {
        2: assigns + pointer_offset_spans(body, ptrs, index),
        3: guards + early_returns,
        9: write_back_spans(body, outs, brackets) if kind == "global" else [],
    }


def structural_spans(code: str) -> dict[int, list[tuple[int, int]]]:
    """Character spans of the structural categories: index and pointer arithmetic, guards, grid arithmetic,
    write-back."""
    spans: dict[int, list[tuple[int, int]]] = {2: [], 3: [], 7: [], 9: []}
    for m in CEIL_DIV.finditer(code):  # (n + b - 1) / b, or (n + 255) / 256
        b, div = m.group(1), m.group(2)
        if b == div or (b.isdigit() and div.isdigit() and int(b) + 1 == int(div)):
            spans[7].append(m.span())
    for kind, params, lo, hi in device_functions(code):
        for cat, found in function_spans(kind, params, code[lo:hi]).items():
            spans[cat] += [(lo + s, lo + e) for s, e in found]
    return spans


# ---------------------------------------------------------------------------------------
# Tokens: the first category in PRIORITY whose matches a token's span overlaps
# ---------------------------------------------------------------------------------------


def category_masks(text: str) -> dict[int, np.ndarray]:
    """Per category, a bool mask over the characters of `text` (True where a match covers it)."""
    code = code_view(text)
    masks = {c: np.zeros(len(text), dtype=bool) for c in CATEGORIES}
    for cat, pattern in LEXEMES.items():
        for m in re.finditer(pattern, code):
            masks[cat][m.start() : m.end()] = True
    for cat, spans in structural_spans(code).items():
        for s, e in spans:
            masks[cat][s:e] = True
    return masks


def tag_tokens(text: str, spans: list[tuple[int, int]]) -> np.ndarray:
    """c_it, the category code (uint8 [T]) of each token span (start, end) in `text`: the first in PRIORITY
    whose matches the span overlaps, 0 when none does."""
    c = np.zeros(len(spans), dtype=np.uint8)
    if not spans:
        return c
    s = np.array([a for a, _ in spans], dtype=np.int64)  # [T]
    e = np.array([b for _, b in spans], dtype=np.int64)  # [T]
    for cat, mask in sorted(category_masks(text).items(), key=lambda kv: -PRIORITY.index(kv[0])):
        csum = np.concatenate([[0], np.cumsum(mask)])  # [len+1]; chars covered in [s, e) = csum[e] - csum[s]
        c[csum[e] - csum[s] > 0] = cat  # later (higher-priority) categories overwrite
    return c
