"""The layer contract (ARCHITECTURE.md; DESIGN.md section 15): the package is split by pipeline stage,
and a module imports only from its own layer or from lower ones, never a private name of another module,
and no chain of imports, at the top of a file or inside a function, comes back to where it started.

The check reads every ``import`` and ``from ... import`` statement of ``crsrepro/`` with :mod:`ast`,
wherever it sits, so an import hidden inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "crsrepro"

LAYERS = [  # lowest first; a module may import from its own layer and the layers before it
    "crsrepro.core",
    "crsrepro.profiles",
    "crsrepro.data",
    "crsrepro.encoders",
    "crsrepro.extract",
    "crsrepro.fit",
    "crsrepro.run",
    "crsrepro.score",
    "crsrepro.analyse",
    "crsrepro.present",
    "crsrepro.tools",
    "crsrepro.cli",
    "crsrepro.__main__",
    "crsrepro",  # the facade: crsrepro/__init__.py exports the first names a user reaches for
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every crsrepro import in ``path``."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "crsrepro"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "crsrepro":
                found += [(target, a.name, node.lineno) for a in node.names]
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(target: str, name: str | None) -> str:
    """The module an import statement depends on: ``from pkg import submodule`` names the submodule."""
    if name is not None and f"{target}.{name}" in MODULES:
        return f"{target}.{name}"
    return target


def layer(module: str) -> int:
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return i
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS or move it")


def graph() -> dict[str, dict[str, list[int]]]:
    edges: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for module, path in MODULES.items():
        for target, name, line in imports(path):
            dep = resolve(target, name)
            if dep != module:
                edges[module][dep].append(line)
    return edges


def test_every_module_belongs_to_a_layer():
    for module in MODULES:
        layer(module)


def test_no_module_imports_from_a_higher_layer():
    upward = [f"{m}:{lines[0]} imports {dep}" for m, deps in graph().items() for dep, lines in deps.items()
              if dep in MODULES or dep == "crsrepro" if layer(dep) > layer(m)]
    assert not upward, "imports from a higher layer:\n" + "\n".join(sorted(upward))


def test_no_private_name_is_imported_across_modules():
    private = []
    for module, path in MODULES.items():
        for target, name, line in imports(path):
            names = [name] if name else target.split(".")
            for n in names + target.split("."):
                if n.startswith("_") and not n.startswith("__"):
                    private.append(f"{module}:{line} imports {target}.{name or ''}")
                    break
    assert not private, "private names imported across modules:\n" + "\n".join(sorted(set(private)))


def test_there_is_no_import_cycle():
    edges = {m: set(deps) & set(MODULES) for m, deps in graph().items()}
    # Tarjan's strongly connected components; a package's __init__ importing its own submodule is an edge too
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
                cycles.append(sorted(component))

    for v in MODULES:
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("source, ok", [
    ("from crsrepro.run.grid import run_grid\n", False),      # core importing run: upward
    ("from crsrepro.core.io import content_key\n", True),
    ("def f():\n    from crsrepro.present import report\n", False),  # hidden in a function: still upward
])
def test_the_check_sees_upward_imports_at_any_depth(tmp_path, source, ok):
    path = PACKAGE / "core" / "io.py"
    deps = [resolve(t, n) for t, n, _ in _imports_of_source(source, path)]
    assert all(layer(d) <= layer("crsrepro.core.io") for d in deps) is ok


def _imports_of_source(source: str, path: Path):
    tree = ast.parse(source)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.module, a.name, node.lineno) for a in node.names]
    return out
