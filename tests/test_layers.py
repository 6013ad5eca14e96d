"""The import graph of fxengine and fxworker: no cycles, and every import points down.

The graph is built from the source with `ast`, not by importing anything. Every
`import x` and `from x import y` counts wherever it stands: at module level, inside a
function or method (a deferred import is still a dependency, it only hides a cycle), and
under `if TYPE_CHECKING:` (a type-only reference to a higher module makes the lower one
read top-down all the same). Relative imports are resolved against the importing
module's package; `from pkg import name` is an edge to `pkg.name` when that is a module
of the project, else to `pkg` itself. The implicit import of a parent package that
Python runs before any submodule (`fxworker/__init__.py` before `fxworker.errors`) is not
an edge: a package's `__init__` is its public face and sits where LAYERS puts it.

LAYERS, bottom first, is the one place the layer order is written. An entry names a
module or a subpackage; a module belongs to the longest entry that is it or one of its
parents (the entries "fxengine" and "fxworker" stand for the `__init__` alone, so a new
module must be given its place). A module may import a module of its own layer or of any
layer below, never one above; the cycle check holds within a layer too. fxengine is below
fxworker and never imports it. ALLOWED_UPWARD lists the exceptions still standing, each
with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fxengine", "fxworker")

LAYERS: list[list[str]] = [
    # ------------------------------------------------------------------ fxengine
    ["fxengine.codes", "fxengine.errors", "fxengine._build", "fxengine.usage", "fxengine.ids"],
    ["fxengine.limits", "fxengine.lines", "fxengine.persistence"],
    ["fxengine.events", "fxengine.tools", "fxengine.providers", "fxengine.journal", "fxengine.tracing"],
    ["fxengine.messages", "fxengine.output"],
    ["fxengine.models", "fxengine.mcp", "fxengine.skills"],
    ["fxengine.conversation"],
    ["fxengine.core"],
    ["fxengine.turn"],
    ["fxengine.opening", "fxengine.steering", "fxengine.streaming", "fxengine.tool_calls", "fxengine.approvals"],
    ["fxengine.loop"],
    ["fxengine.engine"],
    ["fxengine"],
    ["fxengine.testing"],
    # ------------------------------------------------------------------ fxworker
    ["fxworker.errors", "fxworker.settings", "fxworker.keys", "fxworker.ids", "fxworker.metrics", "fxworker.urls",
     "fxworker.refresh_lock", "fxworker.info", "fxworker.tracing"],
    ["fxworker.runtime"],
    ["fxworker.scripts", "fxworker.broker"],
    ["fxworker.store._transport"],
    ["fxworker.store"],
    ["fxworker.protocol", "fxworker.leases", "fxworker.background", "fxworker.watch", "fxworker.registry", "fxworker.celery_app",
     "fxworker.liveness",
     "fxworker.deadline", "fxworker.waiting", "fxworker.typed"],
    ["fxworker.wakers"],
    ["fxworker.timeline"],
    ["fxworker.export"],
    ["fxworker.delegation"],
    ["fxworker.turns"],
    ["fxworker.work"],
    ["fxworker.runner"],
    ["fxworker.delivery"],
    ["fxworker.sweeper"],
    ["fxworker.embedded"],
    ["fxworker.tasks"],
    ["fxworker.agent"],
    ["fxworker"],
    ["fxworker.web"],
    ["fxworker.demo"],
    ["fxworker.cli"],
    ["fxworker.__main__"],
]

# Known upward imports still to be removed: (importer, imported) -> why it stands. An
# upward import not listed fails the test, and so does an entry whose import is gone.
# A listed import is also left out of the cycle check.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def project_modules() -> dict[str, Path]:
    """Every module of the project packages: dotted name -> source file."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imports(module: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported project module, line) for every import statement of `module`."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _resolve(alias.name, None, node.lineno, modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield from _resolve(base, alias.name, node.lineno, modules)


def _resolve(base: str, name: str | None, line: int, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    if name is not None and name != "*" and f"{base}.{name}" in modules:
        yield f"{base}.{name}", line
        return
    # `import a.b.c` names a.b.c; keep the longest prefix that is a project module.
    parts = base.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            yield candidate, line
            return
        parts.pop()


def import_graph() -> dict[str, dict[str, int]]:
    """importer -> {imported: first line}, project modules only, self-imports dropped."""
    modules = project_modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for imported, line in _imports(module, path, modules):
            if imported != module:
                edges.setdefault(imported, line)
    return graph


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, entry) of the longest LAYERS entry that is `module` or a parent of it.

    A top package's entry ("fxworker") stands for its `__init__` only, so a new module
    of the package has to be given its place.
    """
    best: tuple[int, str] | None = None
    for index, layer in enumerate(LAYERS):
        for entry in layer:
            covers = module == entry or (entry not in PACKAGES and module.startswith(entry + "."))
            if covers and (best is None or len(entry) > len(best[1])):
                best = (index, entry)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected component of the graph."""
    return [_one_cycle(graph, set(component)) for component in strongly_connected(graph)]


def _one_cycle(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest cycle through the first (sorted) module of a strongly connected component."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph.get(node, {})):
            if target not in component:
                continue
            if target == start:
                return paths[node] + [start]
            if target not in paths:
                paths[target] = paths[node] + [target]
                queue.append(target)
    raise AssertionError(f"no cycle through {start}")  # unreachable for an SCC


def upward_imports(graph: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of a module of a higher layer."""
    found = []
    for importer, edges in sorted(graph.items()):
        low_index, _ = layer_of(importer)
        for imported, line in sorted(edges.items()):
            high_index, _ = layer_of(imported)
            if high_index > low_index:
                found.append((importer, imported, line))
    return found


def _where(module: str, line: int) -> str:
    return f"{project_modules()[module].relative_to(ROOT)}:{line}"


def test_every_module_has_a_layer_and_each_entry_names_a_module() -> None:
    modules = project_modules()
    for module in modules:
        layer_of(module)
    entries = [entry for layer in LAYERS for entry in layer]
    assert len(entries) == len(set(entries)), "an entry is listed twice in LAYERS"
    assert [e for e in entries if e not in modules] == [], "LAYERS names modules that do not exist"


def test_no_import_cycles() -> None:
    graph = import_graph()
    for importer, imported in ALLOWED_UPWARD:
        graph.get(importer, {}).pop(imported, None)
    cycles = find_cycles(graph)
    described = [
        " -> ".join(cycle)
        + "\n      " + ", ".join(_where(a, graph[a][b]) for a, b in zip(cycle, cycle[1:]))
        + f"\n      (one circle of {len(members)} modules: {', '.join(members)})"
        for cycle, members in zip(cycles, strongly_connected(graph))
    ]
    assert cycles == [], "import cycles:\n  " + "\n  ".join(described)


def test_imports_point_down_the_layers() -> None:
    graph = import_graph()
    found = upward_imports(graph)
    new = [
        f"{_where(a, line)}: {a} (layer {layer_of(a)[0]}) imports {b} (layer {layer_of(b)[0]})"
        for a, b, line in found
        if (a, b) not in ALLOWED_UPWARD
    ]
    assert new == [], "imports from a lower layer to a higher one:\n  " + "\n  ".join(new)
    stale = sorted(set(ALLOWED_UPWARD) - {(a, b) for a, b, _ in found})
    assert stale == [], f"ALLOWED_UPWARD lists imports that no longer exist: {stale}"


def test_the_checks_catch_what_they_are_for() -> None:
    """The graph checks themselves: a cycle and an upward edge are found."""
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b": 1}, "b": {}}) == []
    upward = upward_imports({"fxengine.errors": {"fxworker.errors": 1}, "fxworker.errors": {"fxengine.errors": 1}})
    assert upward == [("fxengine.errors", "fxworker.errors", 1)]


def drawing() -> dict[str, list[str]]:
    """The layer drawing of docs/architecture.md, package → its entries top-down, as
    LAYERS names them ("fxworker.store._transport" for `store/_transport`, "fxworker" for
    `__init__`)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layers, bottom-up", 1)[1].split("```", 2)[1]
    rows: dict[str, list[str]] = {}
    package = ""
    for row in block.splitlines():
        head = row.strip().split(" ", 1)[0]
        if head in PACKAGES:
            package = head
            rows[package] = []
            continue
        left = row[3:33].strip()
        for name in filter(None, (part.strip().rstrip("/") for part in left.split(","))):
            dotted = name.replace("/", ".")
            rows[package].append(package if dotted == "__init__" else f"{package}.{dotted}")
    return rows


def test_the_drawing_lists_every_layer_in_order() -> None:
    """docs/architecture.md's drawing names every LAYERS entry once, top-down in the order
    of LAYERS (entries of one layer in any order)."""
    drawn = drawing()
    for package in PACKAGES:
        entries = [entry for layer in LAYERS for entry in layer if entry.split(".")[0] == package]
        assert sorted(drawn[package]) == sorted(entries), (
            f"{package}: drawn but not in LAYERS {sorted(set(drawn[package]) - set(entries))}, "
            f"in LAYERS but not drawn {sorted(set(entries) - set(drawn[package]))}")
        layer = {entry: n for n, names in enumerate(LAYERS) for entry in names}
        heights = [layer[name] for name in drawn[package]]
        assert heights == sorted(heights, reverse=True), f"{package}: drawn out of LAYERS order: {drawn[package]}"
