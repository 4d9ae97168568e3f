"""The import layers of docs/architecture.md, checked over the source (imports inside functions included).

Every ``quadforge`` module is read with ``ast`` (nothing is imported), each of its imports of another
``quadforge`` module is an edge, and:

- an edge may only point to the same layer or a lower one (``LAYERS``, lowest first);
- the three siblings of the second layer (envs, data, models) do not import each other;
- there is no import cycle between modules;
- an import inside a function (lazy) of another quadforge package is allowed only where laziness is the
  point: the CLI layer (fast ``--help``), or an entry of ``LAZY`` with its reason.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> installed package (pyproject.toml [tool.setuptools.package-dir])
FOLDERS = {"quadforge": "quadforge", "envs": "quadforge.envs", "models": "quadforge.models", "experts": "quadforge.experts",
           "collection": "quadforge.collection", "training": "quadforge.training", "data": "quadforge.data",
           "tools": "quadforge.tools"}

# Lowest first. A module belongs to the layer of its longest matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("quadforge", "quadforge.seeding", "quadforge.overrides", "quadforge.layout",
                     "quadforge.cli_flags", "quadforge.output_paths", "quadforge.checkpoint_sniff",
                     "quadforge.progress")),
    ("envs", ("quadforge.envs",)),
    ("data", ("quadforge.data",)),
    ("models", ("quadforge.models",)),
    ("policies", ("quadforge.experts",)),
    ("collection", ("quadforge.collection",)),
    ("evaluation", ("quadforge.collection.evaluate", "quadforge.collection.evaluate_cmd",
                    "quadforge.collection.evaluate_task", "quadforge.collection.evaluate_expert",
                    "quadforge.collection.tracking_eval", "quadforge.collection.metrics",
                    "quadforge.collection.reports", "quadforge.collection.video")),
    ("training", ("quadforge.training",)),
    ("cli", ("quadforge.tools", "quadforge.data.cli", "quadforge.training.cli")),
]
RANK = {"foundations": 0, "envs": 1, "data": 1, "models": 1, "policies": 2, "collection": 3, "evaluation": 4,
        "training": 5, "cli": 6}

# (importing module, imported module) -> why the import stays inside a function.
LAZY: dict[tuple[str, str], str] = {
    ("quadforge.collection.collect_cmd", "quadforge.collection.distributed"): "Ray loads only with --workers",
}


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def imports(mods: dict[str, Path]) -> list[tuple[str, str, bool, int]]:
    """(importer, imported module, inside a function, line) for every quadforge import."""
    edges = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        lazy_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(pkg + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            found = set()
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and t.startswith("quadforge"):
                    found.add(t)
            for t in found:
                edges.append((name, t, id(node) in lazy_nodes, node.lineno))
    return edges


def layer_of(module: str) -> str:
    best, layer = -1, None
    for name, prefixes in LAYERS:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                if p == "quadforge" and module != "quadforge":
                    continue  # the bare package prefix names only the package itself
                best, layer = len(p), name
    assert layer is not None, f"{module} belongs to no layer; add it to LAYERS in {__file__}"
    return layer


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_imports_point_down_the_layers():
    mods = modules()
    bad = []
    for a, b, _, line in imports(mods):
        la, lb = layer_of(a), layer_of(b)
        if RANK[lb] > RANK[la] or (RANK[lb] == RANK[la] and la != lb):
            bad.append(f"{mods[a].relative_to(ROOT)}:{line}: {a} ({la}) imports {b} ({lb})")
    assert not bad, "imports that point up (or sideways) the layers of docs/architecture.md:\n" + "\n".join(bad)


def test_no_import_cycles():
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for a, b, _, _ in imports(mods):
        graph[a].add(b)
    # Tarjan's strongly connected components
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not sccs, f"import cycles: {sccs}"


def test_imports_inside_functions_only_where_laziness_is_the_point():
    mods = modules()
    bad = []
    for a, b, lazy, line in imports(mods):
        if not lazy or layer_of(a) == "cli" or (a, b) in LAZY:
            continue
        if a.split(".")[:2] == b.split(".")[:2] and a.split(".")[1] != "training":
            continue  # inside one package: the package's own business
        bad.append(f"{mods[a].relative_to(ROOT)}:{line}: {a} imports {b} inside a function")
    assert not bad, ("imports of another package inside functions (move them to the top, or add the pair to "
                     "LAZY with the reason laziness is needed):\n" + "\n".join(bad))
