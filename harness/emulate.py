"""Source translation for the CPU emulation backend of stage 04 (docs/evaluation.md, "CPU emulation").

A CUDA program that nvcc accepted becomes a C++17 program for the host compiler with the
emulator's runtime header (harness/emu/cuda_runtime.h) first on the include path. Most of
CUDA maps onto that header directly (keywords are macros, intrinsics are functions); only
what C++ cannot spell is rewritten here:

    k<<<grid, block, smem, stream>>>(a, b)
        ->  cuset_emu::launch(cuset_emu::Config(grid, block, smem, stream),
                              [&](auto&&... p) { k(p...); }, a, b)
    __shared__ float t[16][17];               ->  auto& t = cuset_emu::shared_var<float[16][17]>([]{});
    extern __shared__ float s[];
        ->  auto s = reinterpret_cast<float (*)>(cuset_emu::dynamic_smem());

Comments and string literals are masked before searching, so `<<<` in them is left alone.
Features the emulator does not model (library calls, half precision, inline PTX, tensor
cores, 3D and layered textures and surfaces, most of cooperative groups) are refused with a
reason: stage 04 records them as `unsupported`, never as a verdict.

    python harness/emulate.py prog.cu > prog_emu.cpp     # look at a translation
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

EMU_INCLUDE = Path(__file__).resolve().parent / "emu"
GXX_FLAGS = ["-std=c++17", "-O2", "-pthread", "-w"]
# AddressSanitizer build (--emulate-checks): out-of-bounds device accesses abort with a report,
# what compute-sanitizer's memcheck does on a GPU.
GXX_CHECK_FLAGS = [
    "-std=c++17",
    "-O1",
    "-g",
    "-pthread",
    "-w",
    "-fsanitize=address",
    "-fno-omit-frame-pointer",
]

# (pattern on comment- and string-masked source, reason). Headers first: a program that
# includes one of these needs a library the emulator does not have.
UNSUPPORTED = [
    (
        r"#\s*include\s*[<\"](cublas|cublasLt|curand|cufft|cusparse|cusolver|cudnn|nccl|nvrtc|npp)\w*\.h",
        "CUDA library {0}",
    ),
    (r"#\s*include\s*[<\"](thrust|cub|cuda)/", "C++ library {0}"),
    (r"#\s*include\s*[<\"](cuda_fp16|cuda_bf16|cuda_fp8)\.h", "half precision ({0}.h)"),
    (r"#\s*include\s*[<\"](mma)\.h", "tensor cores ({0}.h)"),
    (r"\b(asm|__asm__)\s*(volatile\s*|__volatile__\s*)?\(", "inline PTX ({0})"),
    # `half` alone is a common variable name; as a type it needs one of the headers above
    (r"\b(__half2?|__nv_bfloat162?)\b", "half precision ({0})"),
    (r"\b(wmma|nvcuda)::", "tensor cores ({0})"),
    # texture objects over 1D and 2D arrays and memory run (harness/emu/textures.h); these do not
    (
        r"\b(tex3D|tex\w*Layered|texCubemap\w*|tex2DGather|tex\w+Lod|tex\w+Grad|surf\w+|cudaSurfaceObject_t|"
        r"cudaMalloc3DArray|cudaMallocMipmappedArray)\b",
        "textures beyond 1D and 2D texture objects ({0})",
    ),
    (
        r"\b(grid_group|this_grid|tiled_partition|thread_block_tile|coalesced_threads|coalesced_group|"
        r"labeled_partition|memcpy_async|cudaLaunchCooperativeKernel)\b",
        "cooperative groups beyond the thread block ({0})",
    ),
    (r"\b(__cluster_dims__|cluster_group|this_cluster|cudaLaunchKernelEx)\b", "thread block clusters ({0})"),
    (
        r"\b(cu(?:Init|DeviceGet|CtxCreate|ModuleLoad\w*|LaunchKernel|MemAlloc\w*))\b",
        "the CUDA driver API ({0})",
    ),
    (r"\b(cudaGraph\w*|cudaStreamBeginCapture)\b", "CUDA graphs ({0})"),
]


class Unsupported(Exception):
    """The program uses something the emulator does not model; the message says what."""


def mask(src: str, strings: bool = True) -> str:
    """Same length as src, with comments and (strings=True) the insides of string and character
    literals blanked (newlines kept), so that searches see only code."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        two = src[i : i + 2]
        if two == "//":
            end = src.find("\n", i)
            start, stop = i, (n if end < 0 else end)
            nxt = stop
        elif two == "/*":
            end = src.find("*/", i + 2)
            start, stop = i, (n if end < 0 else end + 2)
            nxt = stop
        elif src[i] in "\"'" and not (src[i] == "'" and i and (src[i - 1].isalnum() or src[i - 1] == "_")):
            # a quote after an identifier character is a digit separator (1'000), not a literal
            j = i + 1
            while j < n and src[j] != src[i] and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            start, stop = i + 1, (min(j, n) if strings else i + 1)  # the quotes themselves stay
            nxt = min(j, n) + 1
        else:
            i += 1
            continue
        for k in range(start, stop):
            if out[k] != "\n":
                out[k] = " "
        i = nxt
    return "".join(out)


OPENERS, CLOSERS = "([{<", ")]}>"


def _match_forward(m: str, i: int) -> int:
    """Index just past the bracket group that opens at m[i] (parentheses, brackets, braces)."""
    depth = 0
    for j in range(i, len(m)):
        if m[j] in "([{":
            depth += 1
        elif m[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
    raise Unsupported(f"unbalanced brackets after line {_line(m, i)}")


def _match_backward(m: str, j: int) -> int:
    """Index of the opener of the group that closes at m[j] (any bracket kind, angle brackets too)."""
    depth = 0
    for k in range(j, -1, -1):
        if m[k] in CLOSERS and not (m[k] == ">" and k and m[k - 1] == "-"):
            depth += 1
        elif m[k] in OPENERS:
            depth -= 1
            if depth == 0:
                return k
    raise Unsupported(f"unbalanced brackets before line {_line(m, j)}")


def _kernel_start(m: str, i: int) -> int:
    """Start of the kernel expression that ends just before index i (`ns::k<T, 4>`, `table[j]`, `fp`)."""
    j = i
    while True:
        while j and m[j - 1].isspace():
            j -= 1
        if j and m[j - 1] in ">]":
            j = _match_backward(m, j - 1)
            continue
        if j and (m[j - 1].isalnum() or m[j - 1] == "_"):
            while j and (m[j - 1].isalnum() or m[j - 1] == "_"):
                j -= 1
            k = j
            while k and m[k - 1].isspace():
                k -= 1
            if m[k - 2 : k] in ("::", "->"):
                j = k - 2
                continue
            if m[k - 1 : k] == ".":
                j = k - 1
                continue
            return j
        if m[j - 2 : j] == "::":  # a leading `::`
            return j - 2
        return j


def _line(m: str, i: int) -> int:
    return m.count("\n", 0, i) + 1


def launch_edits(src: str, m: str) -> list[tuple[int, int, str]]:
    edits = []
    for hit in re.finditer(r"<<<", m):
        at = hit.start()
        start = _kernel_start(m, at)
        name = src[start:at].strip()
        if not name:
            raise Unsupported(f"line {_line(m, at)}: cannot find the kernel of this launch")
        close = m.find(">>>", at + 3)
        if close < 0:
            raise Unsupported(f"line {_line(m, at)}: launch without `>>>`")
        config = src[at + 3 : close]
        k = close + 3
        while k < len(m) and m[k].isspace():
            k += 1
        if k >= len(m) or m[k] != "(":
            raise Unsupported(f"line {_line(m, at)}: launch without an argument list")
        end = _match_forward(m, k)
        args = src[k + 1 : end - 1]
        text = (
            f"::cuset_emu::launch(::cuset_emu::Config({config}), "
            f"[&](auto&&... cuset_a) {{ {name}(cuset_a...); }}" + (f", {args})" if args.strip() else ")")
        )
        edits.append((start, end, text))
    return edits


DECLARATOR = re.compile(r"^(?P<type>.*?)\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]*\]\s*)*)$", re.S)
PARENS = r"\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"  # up to three levels deep: __align__(sizeof(T))
ATTRIBUTES = re.compile(rf"\b(?:__align__|alignas|__attribute__)\s*{PARENS}|\b(?:extern|static|__shared__)\b")


def _split_top_level(text: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += ch in "([{<"
        depth -= ch in ")]}>"
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _brace_depth(m: str, i: int) -> int:
    return m.count("{", 0, i) - m.count("}", 0, i)


def shared_edits(src: str, m: str) -> list[tuple[int, int, str]]:
    """Each `[extern] __shared__ T name[...]...;` declaration becomes per-block storage."""
    edits, done_until = [], -1
    for hit in re.finditer(r"\b__shared__\b", m):
        if hit.start() < done_until:
            continue
        # the declaration starts after the previous `;`, `{`, `}`, `:` or line of preprocessor
        start = max(m.rfind(c, 0, hit.start()) for c in ";{}\n:") + 1
        while start < hit.start() and m[start].isspace():
            start += 1
        end = m.find(";", hit.end())
        if end < 0:
            raise Unsupported(f"line {_line(m, hit.start())}: __shared__ declaration without `;`")
        decl = src[start:end]
        extern = re.search(r"\bextern\b", m[start:end]) is not None
        body = ATTRIBUTES.sub(" ", decl).strip()
        declarators = _split_top_level(body)
        first = DECLARATOR.match(declarators[0].strip())
        if first is None or "=" in body or "(" in first.group("type"):
            raise Unsupported(
                f"line {_line(m, hit.start())}: cannot read the __shared__ declaration {decl.strip()!r}"
            )
        base = first.group("type").strip()
        at_file_scope = _brace_depth(m, start) == 0
        out = []
        for d in declarators:
            parts = DECLARATOR.match(d.strip()) if d is not declarators[0] else first
            if parts is None:
                raise Unsupported(
                    f"line {_line(m, hit.start())}: cannot read the __shared__ declarator {d.strip()!r}"
                )
            name, dims = parts.group("name"), re.sub(r"\s+", "", parts.group("dims"))
            ctype = base + (parts.group("type").strip() if d is not declarators[0] else "")
            out.append(_shared_storage(ctype, name, dims, extern, at_file_scope))
        edits.append((start, end + 1, " ".join(out)))
        done_until = end
    return edits


def _shared_storage(ctype: str, name: str, dims: str, extern: bool, at_file_scope: bool) -> str:
    if extern:
        rest = dims[2:] if dims.startswith("[]") else dims
        value = f"reinterpret_cast<{ctype} (*){rest}>(::cuset_emu::dynamic_smem())"
        return f"\n#define {name} ({value})\n" if at_file_scope else f"auto {name} = {value};"
    if at_file_scope:  # one key type per variable, so that every use finds the same storage
        return (
            f"struct cuset_shared_{name};\n#define {name} "
            f"(::cuset_emu::shared_var<{ctype}{dims}>((cuset_shared_{name}*)nullptr))\n"
        )
    return f"auto& {name} = ::cuset_emu::shared_var<{ctype}{dims}>([] {{}});"


def unsupported_reason(src: str) -> str | None:
    code, includes = mask(src), mask(src, strings=False)  # `#include "x.h"` names are string literals
    for pattern, reason in UNSUPPORTED:
        hit = re.search(pattern, includes if pattern.startswith("#") else code)
        if hit:
            return f"line {_line(code, hit.start())}: " + reason.format(hit.group(1))
    return None


def translate(src: str) -> str:
    """The C++ program for the emulator; raises Unsupported with a reason."""
    reason = unsupported_reason(src)
    if reason:
        raise Unsupported(reason)
    m = mask(src)
    edits = sorted(launch_edits(src, m) + shared_edits(src, m))
    out, pos = [], 0
    for start, end, text in edits:
        if start < pos:
            raise Unsupported(f"line {_line(m, start)}: overlapping constructs the translator cannot rewrite")
        out += [src[pos:start], text, _lost_newlines(src[start:end], text)]
        pos = end
    out.append(src[pos:])
    # nvcc includes cuda_runtime.h implicitly; first in line, it can also come precompiled
    return '#include <cuda_runtime.h>\n#line 1 "prog.cu"\n' + "".join(out)


def _lost_newlines(old: str, new: str) -> str:
    """Newlines to add after a rewrite so that line numbers (compiler and sanitizer messages)
    still match prog.cu; none inside a macro body, where a bare newline would end the macro."""
    if "\\\n" in old:
        return ""
    return "\n" * max(0, old.count("\n") - new.count("\n"))


def gxx_command(source: str, exe: str, include: str, checks: bool) -> list[str]:
    """Host compiler command for a translated program; `include` holds a copy of harness/emu."""
    return ["g++", *(GXX_CHECK_FLAGS if checks else GXX_FLAGS), "-I", include, "-x", "c++", source, "-o", exe]


def pch_command(include: str, checks: bool) -> list[str]:
    """Precompiles the runtime header in `include` (a copy of harness/emu) for gxx_command with the
    same flags: about a third of each build's time."""
    header = f"{include}/cuda_runtime.h"
    return [
        "g++",
        *(GXX_CHECK_FLAGS if checks else GXX_FLAGS),
        "-x",
        "c++-header",
        header,
        "-o",
        header + ".gch",
    ]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python harness/emulate.py prog.cu > prog_emu.cpp")
    try:
        sys.stdout.write(translate(Path(sys.argv[1]).read_text()))
    except Unsupported as e:
        sys.exit(f"unsupported: {e}")
