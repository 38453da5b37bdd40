"""Reading CUDA C++ source for the tagger (profiler/tagger.py): a code view with prose, comments and
literals blanked, bracket matching, expression edges, and the __global__/__device__ functions defined in a
text."""

from __future__ import annotations

import re

FUNC_HEAD = re.compile(r"\b__(global|device)__\b")  # a device function's qualifier
BEFORE_BODY = re.compile(r"[^;{]*")  # between its `)` and `{`: `const`, attributes
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


def match_paren(code: str, open_pos: int, pair: str = "()") -> int:
    """Index just past the bracket that closes the one at open_pos (len(code) if unclosed)."""
    depth = 0
    for j in range(open_pos, len(code)):
        depth += (code[j] == pair[0]) - (code[j] == pair[1])
        if depth == 0:
            return j + 1
    return len(code)


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
        elif depth == 0 and (
            c in ";,{}?"
            or (c == ":" and "::" not in code[max(j - 1, 0) : j + 2])
            or is_assignment(code, j)
            or (step > 0 and (COMPARISON.match(code, j) or code.startswith(("&&", "||"), j)))
        ):
            break
        j += step
    return j if step > 0 else j + 1


def device_functions(code: str) -> list[tuple[str, str, int, int]]:
    """(qualifier 'global'/'device', parameter text, body start, body end) of each defined function."""
    funcs = []
    for m in FUNC_HEAD.finditer(code):
        for name in re.finditer(r"\b(\w+)\s*\(", code[m.end() :]):
            if name.group(1) not in ("__launch_bounds__", "__align__"):
                break
        else:
            continue
        p_open = m.end() + name.end() - 1
        if re.search(r"[;{}]", code[m.end() : p_open]):  # a __device__ variable, not a function
            continue
        p_close = match_paren(code, p_open)
        nxt = BEFORE_BODY.match(code, p_close).end()  # skip `const`, trailing attributes
        if nxt < len(code) and code[nxt] == "{":  # a definition, not a declaration
            funcs.append((m.group(1), code[p_open + 1 : p_close - 1], nxt, match_paren(code, nxt, "{}")))
    return funcs
