"""Reading CUDA C++ source for the tagger (cuset_common/profiler/tagger.py): a code view with prose, comments
and literals blanked, bracket matching, expression edges, and the __global__/__device__ functions defined in a
text."""

from __future__ import annotations

import bisect
import re
from itertools import accumulate, islice

FUNC_HEAD = re.compile(r"\b__(global|device)__\b")  # a device function's qualifier
NAME_CALL = re.compile(r"\b(\w+)\s*\(")  # the name a definition's parameters follow
NOT_A_NAME = ("__launch_bounds__", "__align__")  # attributes between the qualifier and the name
LITERAL = re.compile(  # what the code view blanks besides prose; one scan finds whichever starts first
    "|".join(
        [
            r"//[^\n]*",  # a line comment
            r"/\*.*?(?:\*/|\Z)",  # a block comment (unclosed: to the end of the text)
            r"\"(?:\\.|[^\"\\\n])*\"?",  # a string literal, escapes included (unclosed: to the line's end)
            r"(?<!\w)'(?:\\.|[^'\\\n]){1,4}'",  # a char literal; after a digit, `'` separates digits: 1'000
        ]
    ),
    re.S,
)
BLANK = re.compile(r"[^\n]")  # blanking keeps newlines, so offsets and line numbers stay valid
# What a forward expr_edge may stop at besides a closing bracket: ; , { } ? : = < > ! & |
STOP_CANDIDATE = re.compile(r"[;,{}?:=<>!&|)\]]")
COMPARISON = re.compile(r"<=|>=|==|!=|(?<![<>\-])[<>](?![<>=])")


def outside_brackets(expr: str) -> str:
    """expr without the contents of [...]: `x[i] > 0` compares a value, not the index i."""
    return re.sub(r"\[[^\[\]]*\]", "[]", re.sub(r"\[[^\[\]]*\]", "[]", expr))


def code_view(text: str) -> str:
    """`text` with prose outside ``` fences, comments and string/char literals replaced by spaces."""
    lines = text.splitlines(keepends=True)
    if "```" in text:  # a markdown answer: only the fenced blocks are code (the fence lines are not)
        in_code = False
        for k, line in enumerate(lines):
            fence = line.lstrip().startswith("```")
            if fence or not in_code:
                lines[k] = BLANK.sub(" ", line)
            in_code ^= fence
    # one left-to-right scan, so a quote inside a comment (or // inside a string) is not misread
    return LITERAL.sub(lambda m: BLANK.sub(" ", m.group()), "".join(lines))


class Brackets:
    """Where each bracket of a text closes, found for all brackets of a kind at once, in one pass with a
    stack: looking up every opener then costs as much as the text. Scanning from each opener instead
    costs, for k openers never closed (an answer cut off, or broken), k times the rest of the text."""

    def __init__(self, text: str):
        self.text, self.closing = text, {}

    def close(self, open_pos: int, pair: str = "()") -> int | None:
        """Index just past the bracket that closes the one at open_pos; None if it is never closed."""
        if pair not in self.closing:
            opened, self.closing[pair] = [], {}
            for m in re.finditer(f"[{re.escape(pair)}]", self.text):
                if m.group() == pair[0]:
                    opened.append(m.start())
                elif opened:  # a closer nothing opened is skipped, as counting depth from an opener skips it
                    self.closing[pair][opened.pop()] = m.end()
        return self.closing[pair].get(open_pos)


def next_of(positions: list[int], pos: int, default: int) -> int:
    """The first of the sorted positions at or after pos (default: none is)."""
    k = bisect.bisect_left(positions, pos)
    return positions[k] if k < len(positions) else default


def is_assignment(code: str, j: int) -> bool:
    """The `=` at code[j] assigns (`=`, `+=`, `<<=`, ...), it is not part of == != <= >=."""
    return (
        code[j] == "="
        and code[j + 1 : j + 2] != "="
        and (code[j - 1 : j] not in ("=", "!", "<", ">") or code[max(j - 2, 0) : j] in ("<<", ">>"))
    )


def expr_edge(code: str, pos: int, step: int) -> int:
    """Edge of the expression through code[pos], at bracket depth 0: step 1 gives the index past its end,
    step -1 the index of its first character. It stops at ; , { } ? a lone :, an assignment or an unmatched
    bracket, and going forward also at a comparison or && || (where an operand ends)."""
    opens, closes = ("([", ")]") if step > 0 else (")]", "([")
    j, depth = pos, 0
    while 0 <= j < len(code):
        c = code[j]
        if c in opens:
            depth += 1
        elif c in closes:
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and ends_here(code, j, step > 0):
            break
        j += step
    return j if step > 0 else j + 1


def ends_here(code: str, j: int, forward: bool) -> bool:
    """An expression at bracket depth 0 ends at code[j] (expr_edge): at ; , { } ? a lone :, an assignment,
    and going forward also at a comparison or && ||."""
    return bool(
        code[j] in ";,{}?"
        or (code[j] == ":" and "::" not in code[max(j - 1, 0) : j + 2])
        or is_assignment(code, j)
        or (forward and (COMPARISON.match(code, j) or code.startswith(("&&", "||"), j)))
    )


def expr_ends(code: str, starts: list[int]) -> list[int]:
    """expr_edge(code, s, 1) of each of the starts, reading the text once for all of them.

    A forward scan from s is at depth 0 exactly where the bracket depth of the text equals its depth at
    s, and stops at the first such place that holds a closing bracket or what expr_edge stops at there:
    so the places where a scan at depth 0 would stop are found once, grouped by the text's depth, and
    each start looks up the first of its group after it (a scan per start would read, for k starts
    inside brackets never closed, k times the rest of the text)."""
    if not starts:
        return []
    depth = list(accumulate(((c in "([") - (c in ")]") for c in code), initial=0))  # [len + 1]
    stops: dict[int, list[int]] = {}  # depth -> ascending places where a scan at depth 0 stops
    for m in STOP_CANDIDATE.finditer(code):
        j = m.start()
        if code[j] in ")]" or ends_here(code, j, True):
            stops.setdefault(depth[j], []).append(j)
    return [next_of(stops.get(depth[s], []), s, len(code)) for s in starts]


def device_functions(code: str) -> list[tuple[str, str, int, int]]:
    """(qualifier 'global'/'device', parameter text, body start, body end) of each defined function.

    A body whose `{` is never closed (an answer cut off, or broken) ends where the next definition starts,
    or at the end of the text: C++ defines no function inside another. A head is looked at up to the next
    `;`, `{` or `}` only (it holds none before its parameters), so that many heads in a row do not each
    read the rest of the text."""
    brackets, funcs = Brackets(code), []
    ends = [m.start() for m in re.finditer(r"[;{}]", code)]  # where a declaration's head ends
    stops = [m.start() for m in re.finditer(r"[;{]", code)]  # where what follows the parameters ends
    calls = list(NAME_CALL.finditer(code))  # a word and `(`: each head's name is the first after it
    call_starts = [c.start() for c in calls]
    for m in FUNC_HEAD.finditer(code):
        end = next_of(ends, m.end(), len(code))  # no `;{}` before `(`: else a __device__ variable
        after = islice(calls, bisect.bisect_left(call_starts, m.end()), None)
        name = next((n for n in after if n.end() > end or n[1] not in NOT_A_NAME), None)
        if name is None or name.end() > end:
            continue
        p_open = name.end() - 1
        p_close = brackets.close(p_open) or len(code)
        nxt = next_of(stops, p_close, len(code))  # past `const` and attributes: `{` opens the body
        if nxt < len(code) and code[nxt] == "{":  # a definition, not a declaration
            funcs.append(
                (m.group(1), code[p_open + 1 : p_close - 1], nxt, brackets.close(nxt, "{}"), m.start())
            )
    starts = [head for *_, head in funcs]
    return [(kind, params, lo, hi or next_of(starts, lo, len(code))) for kind, params, lo, hi, _ in funcs]
