"""The dependency graph stays readable: no import cycles between our modules (counting the package
``__init__`` each import runs), and our own modules imported at the top of a module, where a reader
sees them, except on the paths that must stay light."""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pulsartx", "datasource", "commit_protocol")
# Spark's data-source discovery imports these in every session: pyspark only, the rest on use.
LIGHT = {"datasource/source.py", "datasource/schema.py"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            if pkg != "pulsartx":  # installed inside pulsartx's namespace (setup.py)
                name = f"pulsartx.{name}"
            out[name.removesuffix(".__init__")] = p
    return out


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")
            if MODULES[module].name != "__init__.py":
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
    else:
        names = [a.name for a in node.names]
    out = set()
    for n in names:  # importing a.b.c runs a and a.b first
        parts = n.split(".")
        out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in MODULES}
    return {t for t in out if t != module and not module.startswith(t + ".")}


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """Runtime imports at module level (``if TYPE_CHECKING`` excluded), and the function-local ones."""
    graph: dict[str, set[str]] = defaultdict(set)
    local = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and "TYPE_CHECKING" in ast.unparse(b.test)
                       for n in ast.walk(b)}
        top = {id(n) for n in tree.body}
        for n in ast.walk(tree):
            if not isinstance(n, ast.Import | ast.ImportFrom) or id(n) in typing_only:
                continue
            targets = _targets(module, n)
            if not targets:
                continue
            if id(n) in top:
                graph[module] |= targets
            elif str(path.relative_to(ROOT)) not in LIGHT:
                local.append(f"{path.relative_to(ROOT)}:{n.lineno}: {ast.unparse(n)}")
    return graph, local


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    graph, _ = _graph()
    assert _cycles(graph) == []


def test_our_modules_are_imported_at_the_top() -> None:
    _, local = _graph()
    assert local == []


def test_lower_layers_never_import_upper_ones() -> None:
    """Storage, the log, the coordinator, the buffer and subscriptions know nothing of the client,
    the admin, the CLI or Spark; the admin knows nothing of the client that owns it."""
    graph, _ = _graph()
    below = ("pulsartx.storage", "pulsartx.log", "pulsartx.coordinator", "pulsartx.buffer", "pulsartx.subscription",
             "pulsartx.observe")
    above = ("pulsartx.client", "pulsartx.admin", "pulsartx.cli", "pulsartx.datasource",
             "pulsartx.commit_protocol")
    wrong = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                   if m.startswith(below) and t.startswith(above))
    wrong += sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                    if m.startswith("pulsartx.admin") and t.startswith(("pulsartx.client", "pulsartx.cli")))
    assert wrong == []


def test_the_checks_can_fail() -> None:
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _targets("pulsartx.client.client", ast.parse("from pulsartx.admin import topics").body[0]) == {
        "pulsartx.admin", "pulsartx.admin.topics"}
