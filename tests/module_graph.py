#!/usr/bin/env python3
"""The compiler crate's import graph: which module uses which, its circles, and the arrows that
run back up the layers.

    python3 tests/module_graph.py            # counts, then each circle and back-arrow
    python3 tests/module_graph.py --dot      # the graph for Graphviz

It reads the source, not the compiler's name resolution: every `crate::a::b` path (in `use`
items, grouped `use crate::{a, b::c}` included, and in expressions) and every `super::` path
counts as an arrow from the file's unit to the unit the path names. A *unit* is a top-level
module of `compiler/src`, except that `ir`, `codegen` and `schedule` count by their children
(`ir::expr`, `codegen::cranelift`, ...), since their layering is the point. Test-only code
(files named `tests*.rs`, `*_tests.rs` or `test_util.rs`, and `#[cfg(test)] mod tests { ... }`
blocks) is left out: tests may reach anywhere.

LAYERS lists the units from the bottom up; an arrow from a unit to one in a higher layer runs
back up. `tests/python/test_layers.py` keeps both counts at zero.
"""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compiler", "src")
if "--root" in sys.argv:  # another checkout's compiler/src (to compare before and after)
    ROOT = sys.argv[sys.argv.index("--root") + 1]

# Bottom to top. A unit may use units of its own layer or below. Units not named here are
# reported (so the list cannot silently go stale).
LAYERS: list[list[str]] = [
    # errors; the build's phase timer (a clock and stderr, used by every phase)
    ["error", "build_times"],
    ["target"],
    # the IR as data: its types refer to each other (an Expr's deferred drop holds Exprs, a
    # Stmt::Call holds an Intrin whose model is a Stmt), which is harmless
    ["ir", "ir::expr", "ir::stmt", "ir::intrin", "ir::callback", "ir::limits",
     "ir::deferred_drop", "ir::float_serde", "ir::printer", "ir::uses"],
    ["arith"],
    # the IR's verifiers decide some facts up to simplification
    ["ir::verify"],
    ["te"],
    # programs derived from te programs (a backward, its saved-activations form): no schedule
    ["vjp"],
    ["residuals"],
    ["schedule::loops"],
    ["schedule", "schedule::definitions"],
    ["lower"],
    ["codegen", "codegen::cpu_lib"],
    ["codegen::interp", "codegen::cranelift", "codegen::cuda"],
    # the default schedules: built from the schedule primitives, applied by the pipeline
    ["schedule::cpu_default", "schedule::gpu_default"],
    # the compiled artefact, calling it, the pipeline that makes it, what is derived from it
    ["artifact"],
    ["call"],
    # the in-process build cache: keys read the program, values are artefacts
    ["build_cache"],
    ["build"],
    ["backward"],
    # the kernel library: definitions and per-target strategies, on top of everything
    ["kernels"],
]
SPLIT = {"codegen", "schedule", "ir"}


def _strip(src: str) -> str:
    """Source without comments, strings and `#[cfg(test)] mod ... { }` blocks."""
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r'"(?:\\.|[^"\\])*"', '""', src)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", src):
        if m.start() < i:
            continue
        out.append(src[i:m.start()])
        depth, j = 1, m.end()
        while j < len(src) and depth:
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
        i = j
    out.append(src[i:])
    return "".join(out)


def _module_of(path: str) -> list[str]:
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return rel


def _is_module(segs: list[str]) -> bool:
    base = os.path.join(ROOT, *segs)
    return os.path.isfile(base + ".rs") or os.path.isfile(os.path.join(base, "mod.rs"))


def _unit(segs: list[str]) -> str | None:
    """The unit a path names: its top-level module (or, under SPLIT, the child module);
    items named directly in a module (`codegen::Backend`) belong to that module."""
    if not segs or not _is_module(segs[:1]):
        return None
    if segs[0] in SPLIT and len(segs) > 1 and _is_module(segs[:2]):
        return f"{segs[0]}::{segs[1]}"
    return segs[0]


def _group_paths(text: str, start: int) -> tuple[list[list[str]], int]:
    """The paths of a `{ ... }` group starting at text[start] == '{' (first segments only
    matter beyond two levels), and the index after the group."""
    paths, depth, j, cur = [], 0, start, ""
    while j < len(text):
        c = text[j]
        if c == "{":
            depth += 1
            if depth > 1:
                # a nested group: `a::{b, c}` -> the prefix `a` is enough for the unit.
                paths.append([s for s in cur.strip().split("::") if s])
                cur = ""
                sub_depth = 1
                j += 1
                while j < len(text) and sub_depth:
                    sub_depth += {"{": 1, "}": -1}.get(text[j], 0)
                    j += 1
                depth -= 1
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                paths.append([s for s in cur.strip().split("::") if s])
                return [p for p in paths if p], j + 1
        elif c == "," and depth == 1:
            paths.append([s for s in cur.strip().split("::") if s])
            cur = ""
        elif depth >= 1:
            cur += c
        j += 1
    return [p for p in paths if p], j


PATH = re.compile(r"\b(crate|super(?:::super)*)::(\{|[A-Za-z_][A-Za-z_0-9]*(?:::[A-Za-z_][A-Za-z_0-9]*)*)")


def edges() -> dict[tuple[str, str], set[str]]:
    """(from unit, to unit) -> the files where the arrow is written."""
    out: dict[tuple[str, str], set[str]] = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if (not f.endswith(".rs") or f.startswith("tests") or f.endswith("_tests.rs")
                    or f == "test_util.rs"):
                continue
            path = os.path.join(dirpath, f)
            mod = _module_of(path)
            src = _strip(open(path, encoding="utf-8").read())
            here = _unit(mod)
            for m in PATH.finditer(src):
                head, rest = m.group(1), m.group(2)
                if head == "crate":
                    base: list[str] = []
                else:
                    ups = head.count("super")
                    # `super` of a mod.rs file is the parent of its directory's module.
                    base = mod[: len(mod) - ups]
                if rest == "{":
                    targets = [base + p for p in _group_paths(src, m.end() - 1)[0]]
                else:
                    targets = [base + rest.split("::")]
                for t in targets:
                    if t and t[0] == "self":
                        continue
                    u = _unit([s for s in t if s != "self"])
                    if u is None or here is None or u == here:
                        continue
                    out.setdefault((here, u), set()).add(os.path.relpath(path, ROOT))
    return out


# Where the modules of the older layout (before the arithmetic, the run-time library, the
# default schedules and the call got rooms of their own) sit, so that `--root` on an older
# checkout counts its circles and back-arrows by the same layers.
OLD_NAMES = {
    "ir::checked": "arith", "ir::verify_callbacks": "ir::verify", "ir::verify_gpu": "ir::verify",
    "ir::verify_parallel": "ir::verify", "codegen::callback": "codegen::cpu_lib",
    "codegen::erff16": "codegen::cpu_lib", "codegen::erff4": "codegen::cpu_lib",
    "codegen::exp32": "codegen::cpu_lib", "codegen::expf4": "codegen::cpu_lib",
    "codegen::host": "codegen::cpu_lib", "codegen::math": "codegen::cpu_lib",
    "codegen::microkernel": "codegen::cpu_lib", "call_plan": "call", "output_shapes": "call",
    "module_file": "artifact",
}


def layer_of() -> dict[str, int]:
    here = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    return here | {old: here[new] for old, new in OLD_NAMES.items() if old not in here}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Elementary circles (Johnson's idea, small graph: a DFS from each node over larger
    nodes only, so each circle is found once, from its smallest node)."""
    nodes = sorted(graph)
    found: list[list[str]] = []

    def dfs(start: str, v: str, path: list[str], seen: set[str]) -> None:
        for w in sorted(graph.get(v, ())):
            if w == start:
                found.append(path[:])
            elif w > start and w not in seen:
                seen.add(w)
                path.append(w)
                dfs(start, w, path, seen)
                path.pop()
                seen.discard(w)

    for s in nodes:
        dfs(s, s, [s], {s})
    return found


def report() -> tuple[list[list[str]], list[tuple[str, str]], list[str]]:
    e = edges()
    graph: dict[str, set[str]] = {}
    for a, b in e:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    lay = layer_of()
    unknown = sorted(u for u in graph if u not in lay)
    back = sorted((a, b) for a, b in e if a in lay and b in lay and lay[b] > lay[a])
    return cycles(graph), back, unknown


def main() -> int:
    e = edges()
    if "--dot" in sys.argv:
        print("digraph compiler {")
        for a, b in sorted(e):
            print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    circ, back, unknown = report()
    print(f"units: {len({u for ab in e for u in ab})}, arrows: {len(e)}")
    print(f"circles: {len(circ)}")
    for c in circ:
        print("  " + " -> ".join(c + [c[0]]))
    print(f"arrows back up the layers: {len(back)}")
    for a, b in back:
        print(f"  {a} -> {b}   ({', '.join(sorted(e[(a, b)]))})")
    if unknown:
        print(f"units missing from LAYERS: {', '.join(unknown)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
