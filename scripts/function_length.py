#!/usr/bin/env python3
"""Lists library functions longer than the house limit (120 lines) in the C++ sources.

A function's length counts from the line that names it to the line of its closing brace. Tests,
samples and benchmarks are not library code and are not read. The scanner strips comments,
string, character and raw-string literals and preprocessor lines, then matches braces, so it reads
any layout clang-format produces (wrapped signatures, constructor initializer lists, trailing
return types, brace-initialized members, macros such as PYBIND11_MODULE that open a body).

  scripts/function_length.py [--root DIR] [--limit N] [--all]

Exits 1 when a function outside ALLOWED is over the limit (each printed as
`path:line: Name N lines`), 0 otherwise. --all prints every function over the limit, allowed or
not, and exits 0.
"""

import argparse
import fnmatch
import os
import re
import sys

LIMIT = 120
SOURCE_SUFFIXES = (".cc", ".h", ".cpp", ".hpp")
# Top-level folders that are not library code.
SKIP_DIRS = {"tests", "samples", "bench", ".git", "cmake"}

# Files whose long functions may stay for now; each entry is a glob over the path from the
# repository root. Empty: every library function is held to the limit.
ALLOWED = []

_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_CONTAINER = re.compile(r"^(?:template\s*<.*>\s*)?(?:namespace|class|struct|union|enum)\b|^extern\b",
                        re.S)
_TRAILING_QUALIFIERS = {"const", "override", "final", "noexcept", "mutable", "volatile"}


def strip_source(text):
    """Returns text with comments, literals and preprocessor lines blanked; newlines are kept."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":
            # A preprocessor directive runs to the end of the line, continued by backslashes.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        line_start = c == "\n"
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
            continue
        raw = re.match(r'(?:u8|u|U|L)?R"([^()\\ ]{0,16})\(', text[i:i + 24])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = ")" + raw.group(1) + '"'
            end = text.find(close, i + raw.end())
            end = n if end < 0 else end + len(close)
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
            continue
        if c == "'":
            # A character literal, or a digit separator (1'000), which is left as it is.
            lit = re.match(r"'(?:\\[^\n]+?|[^\\'\n])'", text[i:i + 12])
            if lit and not (i > 0 and text[i - 1].isalnum() and text[i + 1].isdigit()):
                out.append("' '")
                i += lit.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _top_level(header):
    """The header with bracketed groups (), [], <> left in but their insides dropped."""
    depth = 0
    kept = []
    for c in header:
        if c in "([":
            if depth == 0:
                kept.append(c)
            depth += 1
        elif c in ")]":
            depth -= 1
            if depth == 0:
                kept.append(c)
        elif depth == 0:
            kept.append(c)
    return "".join(kept)


def _function_name(header):
    """The name before the first top-level '(' of a function header, or None."""
    op = re.search(r"\boperator\s*(\(\)|[^\s(]+)\s*\(", header)
    if op:
        return "operator" + op.group(1)
    depth = 0
    for k, c in enumerate(header):
        if c in "([":
            if depth == 0 and c == "(":
                before = header[:k].rstrip()
                names = re.findall(r"(?:~?[A-Za-z_][A-Za-z_0-9]*(?:\s*::\s*~?[A-Za-z_][A-Za-z_0-9]*)*"
                                   r"(?:\s*operator\s*\S+)?)\s*(?:<[^()]*>)?\s*$", before)
                return names[0].split("::")[-1].strip() if names and names[0] else None
            depth += 1
        elif c in ")]":
            depth -= 1
    return None


def _classify(header):
    """'container', 'function' or 'other' for the text before a '{' at class or namespace level."""
    h = " ".join(header.split())
    if not h:
        return "other"
    top = _top_level(h)
    if _CONTAINER.match(top) and "(" not in top.split("{")[0]:
        return "container"
    if re.match(r"^(?:template\s*<.*>\s*)?(?:class|struct)\b", h) and "(" not in top:
        return "container"
    if "(" not in top:
        return "other"
    # An assignment at the top level makes this an initializer (a lambda or a braced value).
    if re.search(r"(?<![=!<>+\-*/%&|^])=(?!=)", top.replace("operator=", "")):
        return "other"
    tail = re.sub(r"\s+", " ", top).strip()
    if "->" in tail[tail.rfind(")"):]:
        return "function"
    last = tail.split()[-1] if tail.split() else ""
    if tail.endswith(")") or tail.endswith("}") or last in _TRAILING_QUALIFIERS:
        return "function"
    if last.endswith(")") or last in ("&", "&&"):
        return "function"
    return "other"


def functions(stripped):
    """Yields (name, first_line, last_line) for every function body in stripped source."""
    lines_before = [0]
    for ch in stripped:
        lines_before.append(lines_before[-1] + (ch == "\n"))

    def line_of(pos):
        return lines_before[pos] + 1

    def skip_block(pos):
        depth = 0
        while pos < len(stripped):
            if stripped[pos] == "{":
                depth += 1
            elif stripped[pos] == "}":
                depth -= 1
                if depth == 0:
                    return pos
            pos += 1
        return len(stripped) - 1

    def scan(pos, end):
        header_start = pos
        while pos < end:
            c = stripped[pos]
            if c in ";}":
                header_start = pos + 1
            elif c == "{":
                header = stripped[header_start:pos]
                kind = _classify(header)
                close = skip_block(pos)
                if kind == "container":
                    yield from scan(pos + 1, close)
                    header_start = close + 1
                elif kind == "function":
                    name = _function_name(" ".join(header.split())) or "?"
                    offset = header.find(name) if name != "?" else -1
                    start = header_start + (offset if offset >= 0 else len(header) - len(header.lstrip()))
                    yield name, line_of(start), line_of(close)
                    header_start = close + 1
                # Other braces (initializers, brace-initialized members) belong to the header.
                pos = close
            pos += 1

    yield from scan(0, len(stripped))


def library_files(root):
    for top in sorted(os.listdir(root)):
        path = os.path.join(root, top)
        if not os.path.isdir(path) or top in SKIP_DIRS or top.startswith("build"):
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("build"))
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def long_functions(root, limit):
    for rel in library_files(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            stripped = strip_source(f.read())
        for name, first, last in functions(stripped):
            length = last - first + 1
            if length > limit:
                yield rel, first, name, length


def is_allowed(rel):
    return any(fnmatch.fnmatch(rel, pattern) for pattern in ALLOWED)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), os.pardir))
    parser.add_argument("--limit", type=int, default=LIMIT)
    parser.add_argument("--all", action="store_true", help="list allowed files too; never fail")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    failing = 0
    for rel, line, name, length in long_functions(root, args.limit):
        allowed = is_allowed(rel)
        if allowed and not args.all:
            continue
        note = " (allowed)" if allowed else ""
        print(f"{rel}:{line}: {name} {length} lines{note}")
        failing += 0 if allowed else 1
    if failing and not args.all:
        print(f"function_length: {failing} function(s) over {args.limit} lines; split them into "
              "named pieces", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
