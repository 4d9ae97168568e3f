"""The import layers of docs/architecture.md, checked over the source (imports inside functions included).

A module's layer is where it lives: its top folder (``FOLDER_LAYERS``, the order of the layers diagram in
docs/architecture.md, lowest first), except a package's command-line front-end - a ``cli.py`` in any
folder - which is the CLI layer. No module is listed by name. Every ``quadforge`` module is read with
``ast`` (nothing is imported), each of its imports of another ``quadforge`` module is an edge, and:

- an edge may only point to the same layer or a lower one;
- the three siblings of the second layer (envs, data, models) do not import each other;
- there is no import cycle between modules;
- an import inside a function (lazy) of another quadforge package is allowed only where laziness is the
  point: the CLI layer (fast ``--help``), or an entry of ``LAZY`` with its reason;
- a string naming a module (``"quadforge.x.y"`` or ``"quadforge.x.y:Attr"``: the registries' tables, e.g.
  ``COMMANDS``, ``BENCHMARKS``, ``TASK_MODULES``, ``POLICY_KIND_MODULES``, the model registry's classes,
  the trainer table) is an import made later, and must point down like any other (it is not an import
  cycle: a registry naming a module that registers itself into the registry is the point).
"""
from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> installed package, as pyproject.toml installs them
FOLDERS = {package_dir: package for package, package_dir in
           tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].items()}

# Top folder -> (layer, rank), lowest first; folders of one rank are siblings that do not import each other.
FOLDER_LAYERS: dict[str, tuple[str, int]] = {
    "quadforge": ("foundations", 0),
    "envs": ("envs", 1), "data": ("data", 1), "models": ("models", 1),
    "experts": ("policies", 2),
    "collection": ("collection", 3),
    "evaluation": ("evaluation", 4),
    "training": ("training", 5),
    "tools": ("cli", 6),
}
RANK = {layer: rank for layer, rank in FOLDER_LAYERS.values()} | {"cli": 6}
FRONT_END = re.compile(r"\.cli$")   # a package's command-line front-end, wherever it lives
MODULE_STRING = re.compile(r"^quadforge(\.\w+)+(:\w+)?$")

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
    """The layer of a module, from where it lives: its file's name, then its top folder."""
    if FRONT_END.search(module):
        return "cli"
    for folder, package in FOLDERS.items():
        if package != "quadforge" and (module == package or module.startswith(package + ".")):
            return FOLDER_LAYERS[folder][0]
    return FOLDER_LAYERS["quadforge"][0]


def string_imports(mods: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(module, named module, line) for every string constant that names a quadforge module (a registry
    table entry imported on use)."""
    edges = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.match(node.value):
                target = node.value.split(":")[0]
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                assert target, f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r} names no module"
                if target != name:
                    edges.append((name, target, node.lineno))
    return edges


def test_every_folder_has_a_layer():
    assert set(FOLDERS) == set(FOLDER_LAYERS), "a top folder without a layer: add it to FOLDER_LAYERS"
    assert layer_of("quadforge.layout") == "foundations" and layer_of("quadforge.evaluation.metrics") == "evaluation"
    assert layer_of("quadforge.training.cli") == layer_of("quadforge.tools.demo") == "cli"
    assert layer_of("quadforge.collection.collect_cmd") == "collection"


def test_the_layers_diagram_puts_each_folder_in_its_layer():
    """docs/architecture.md's diagram: layer N (N = rank + 1) names each of its top folders as ``folder/``
    (a path into a folder, e.g. ``data/cli.py``, names a file, not the folder's layer)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    diagram = doc[doc.index("## Layers"):doc.index("## Where each")]
    placed: dict[str, int] = {}
    number = None
    for line in diagram.splitlines():
        start = re.match(r"^ (\d) ", line)
        number = int(start.group(1)) if start else number
        for folder in re.findall(r"(?<![\w/])(\w+)/(?![\w*{])", line):
            if folder in FOLDER_LAYERS and number is not None:
                placed.setdefault(folder, number)
    assert placed == {f: rank + 1 for f, (_, rank) in FOLDER_LAYERS.items()}, diagram


def test_string_tables_point_down_the_layers():
    mods = modules()
    edges = string_imports(mods)
    named = {b for _, b, _ in edges}
    for table_entry in ("quadforge.tools.bench.vla", "quadforge.training.imitation", "quadforge.models.rt1",
                        "quadforge.experts.vla", "quadforge.training.cli"):   # the tables are seen
        assert table_entry in named, table_entry
    bad = []
    for a, b, line in edges:
        la, lb = layer_of(a), layer_of(b)
        if RANK[lb] > RANK[la] or (RANK[lb] == RANK[la] and la != lb):
            bad.append(f"{mods[a].relative_to(ROOT)}:{line}: {a} ({la}) names {b} ({lb})")
    assert not bad, "string tables naming modules up (or sideways) the layers:\n" + "\n".join(bad)


def test_a_string_table_pointing_up_is_caught(tmp_path):
    low = tmp_path / "low.py"
    low.write_text('TABLE = {"x": "quadforge.training.vla:train", "doc": "not quadforge.training.vla here"}\n')
    mods = {"quadforge.envs.low": low, "quadforge.training.vla": ROOT / "training" / "vla.py"}
    assert string_imports(mods) == [("quadforge.envs.low", "quadforge.training.vla", 1)]


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


def test_the_repository_as_built_names_every_module():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    built = doc[doc.index("## The repository as built"):]
    built = built[:built.index("```", built.index("```") + 3)]
    missing = [str(path.relative_to(ROOT)) for name, path in modules().items()
               if path.name != "__init__.py" and not re.search(rf"(?<![\w]){re.escape(path.stem)}\b", built)]
    assert not missing, "modules missing from docs/architecture.md's 'The repository as built': " + ", ".join(missing)


def test_the_dataset_commands_start_without_torch():
    """`quadforge dataset info | validate | compact | export-hdf5 | export-lerobot` read the store through numpy,
    zarr and JSON; the term catalogue they need (quadforge.terms) is plain Python and quadforge.seeding imports
    torch only to seed it, so they start in well under a second instead of importing torch first (about 1.7 s
    and 180 MB)."""
    import subprocess
    import sys
    code = ("import sys, quadforge.data.cli, quadforge.data.store, quadforge.data.compaction, "
            "quadforge.data.validate, quadforge.data.export, quadforge.data.export_lerobot; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
