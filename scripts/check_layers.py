#!/usr/bin/env python3
"""The crate's layering, checked: `.ci/run` fails when it breaks.

Two rules, on code outside tests (`#[cfg(test)]` modules are left out):

1. `src/lib.rs` opens with a map of the top-level modules, by layer: each
   module uses only modules listed before it (its `crate::` paths), and every
   module is on the map.
2. No import circle anywhere below: at every level of the module tree, the
   sibling modules' uses of one another (`super::x`, `crate::a::x`, brace
   lists included) form no cycle.

A path is resolved as Rust resolves it (`crate::`, `super::` from the file's
own module, `self::`), to the module it names; items a parent module defines
itself are not siblings. Prints each violation and exits 1; prints a one-line
summary and exits 0 otherwise.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def strip_code(text: str) -> str:
    """The source with comments, string and char literals blanked out, so
    braces and paths in them are not read as code."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif m := re.match(r'b?r(#*)"', text[i:]):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"' or (c == "b" and text.startswith('b"', i)):
            i += 2 if c == "b" else 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and (m := re.match(r"'(\\[^']{1,10}|[^\\'])'", text[i:])):
            i += m.end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_modules(code: str) -> str:
    """`#[cfg(test)] mod x { ... }` and `#[cfg(test)] mod x;` removed."""
    while m := re.search(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*([{;])", code):
        if m.group(1) == ";":
            code = code[: m.start()] + code[m.end() :]
            continue
        depth, j = 1, m.end()
        while depth and j < len(code):
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        code = code[: m.start()] + code[j:]
    return code


def module_of(path: Path, src: Path = SRC) -> tuple[str, ...]:
    rel = path.relative_to(src).with_suffix("")
    parts = rel.parts
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def expand(prefix: str, rest: str) -> list[str]:
    """`a::{b, c::d}` → [`a::b`, `a::c::d`] (first segments are enough)."""
    if not rest.startswith("{"):
        return [prefix + rest]
    depth, j, items, start = 0, 0, [], 1
    for j, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                items.append(rest[start:j])
                break
        elif ch == "," and depth == 1:
            items.append(rest[start:j])
            start = j + 1
    paths = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        inner = re.match(r"(\w+)(::)?(.*)", item, re.S)
        if not inner:
            continue
        if inner.group(2) and inner.group(3).startswith("{"):
            paths += expand(prefix + inner.group(1) + "::", inner.group(3))
        else:
            paths.append(prefix + inner.group(1))
    return paths


PATH_RE = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::(?:super|self))*)::(\{|\w+(?:::\w+)*(?:::\{)?)")


def references(code: str) -> list[str]:
    refs = []
    for m in PATH_RE.finditer(code):
        head, rest = m.group(1), m.group(2)
        if rest.endswith("{"):
            brace = code[m.end() - 1 :]
            base = rest[:-1] if rest != "{" else ""
            refs += expand(head + "::" + base, brace)
        else:
            refs.append(head + "::" + rest)
    return refs


def resolve(module: tuple[str, ...], ref: str) -> tuple[str, ...] | None:
    parts = ref.split("::")
    if parts[0] == "crate":
        at: list[str] = []
        parts = parts[1:]
    else:
        at = list(module)
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                if not at:
                    return None
                at.pop()
            parts = parts[1:]
    return tuple(at + parts)


def check(src: Path) -> tuple[list[str], int, int]:
    """The violations under `src`, the map's length and the module count."""
    modules: set[tuple[str, ...]] = set()
    files = sorted(src.rglob("*.rs"))
    for f in files:
        modules.add(module_of(f, src))
    # Modules declared inline (`mod x { ... }` outside tests) are not files:
    # their uses count for the file that holds them.

    def longest_module(path: tuple[str, ...]) -> tuple[str, ...]:
        for k in range(len(path), 0, -1):
            if path[:k] in modules:
                return path[:k]
        return ()

    edges: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for f in files:
        me = module_of(f, src)
        code = drop_test_modules(strip_code(f.read_text()))
        for ref in references(code):
            target = resolve(me, ref)
            if target is None:
                continue
            target = longest_module(target)
            if target and target != me:
                edges.setdefault(me, set()).add(target)

    failures = []

    # Rule 1: the map's order.
    lib = (src / "lib.rs").read_text()
    doc = "\n".join(l[3:].strip() for l in lib.splitlines() if l.startswith("//!"))
    order = re.findall(r"^- \[?`(\w+)`\]?", doc, re.M)
    declared = re.findall(r"^pub mod (\w+);", lib, re.M)
    for name in declared:
        if name not in order:
            failures.append(f"src/lib.rs: module `{name}` is not on the module map")
    for name in order:
        if name not in declared:
            failures.append(f"src/lib.rs: the module map lists `{name}`, which is not a module")
    rank = {name: i for i, name in enumerate(order)}
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = source[0], target[0]
            if a != b and a in rank and b in rank and rank[b] > rank[a]:
                failures.append(
                    f"{'::'.join(source)} uses {'::'.join(target)}: `{b}` is listed after `{a}` on the module map"
                )

    # Rule 2: no circle among siblings, at every level.
    sibling: dict[tuple[str, ...], dict[str, set[str]]] = {}
    for source, targets in edges.items():
        for target in targets:
            k = 0
            while k < min(len(source), len(target)) and source[k] == target[k]:
                k += 1
            if k < len(source) and k < len(target):
                sibling.setdefault(source[:k], {}).setdefault(source[k], set()).add(target[k])
    for parent, graph in sorted(sibling.items()):
        for cycle in cycles(graph):
            where = "::".join(parent) or "crate"
            failures.append(f"import circle in {where}: {' -> '.join(cycle + [cycle[0]])}")

    return failures, len(order), len(modules)


def self_test() -> None:
    """The check on a small crate made to break each rule once: it must
    find exactly those breaks, and nothing in a test module, a comment or
    a string."""
    import tempfile

    crate = {
        "lib.rs": "//! - [`base`] — first.\n//! - [`top`] — second.\n"
        "pub mod base;\npub mod top;\npub mod unmapped;\n",
        "base/mod.rs": "mod a;\nmod b;\nfn f() { crate::top::g(); }\n"
        '// crate::top::in_a_comment\nconst S: &str = "crate::top::in_a_string {";\n',
        "base/a.rs": "use super::{b::{B}, A2};\n",
        "base/b.rs": "use super::super::base::a::A;\n"
        "#[cfg(test)]\nmod tests {\n    use crate::top::T;\n}\n",
        "top.rs": "use crate::base::b::B;\n",
        "unmapped.rs": "",
    }
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp)
        for name, text in crate.items():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_text(text)
        failures, _, _ = check(src)
    want = [
        "src/lib.rs: module `unmapped` is not on the module map",
        "base uses top: `top` is listed after `base` on the module map",
        "import circle in crate: base -> top -> base",
        "import circle in base: a -> b -> a",
    ]
    assert sorted(failures) == sorted(want), failures


def main() -> int:
    self_test()
    failures, mapped, modules = check(SRC)
    for failure in failures:
        print(failure)
    if failures:
        return 1
    print(f"layers: {mapped} top-level modules in map order, {modules} modules, no import circle")
    return 0


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    nodes = set(graph) | {w for ws in graph.values() for w in ws}
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


if __name__ == "__main__":
    sys.exit(main())
