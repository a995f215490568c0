"""The packages' layers, read from the source: every import, lazy ones inside functions
included, goes to the package itself, to the ground package (``speculant``) or to a package
below it, never names another package's private (underscore) name, and no modules import each
other in a circle.

Layers, lowest first: ``speculant`` (types, formats, configuration, the wire); the services
``builder``, ``draft_service`` and ``verifier_service``; ``gateway`` (its embedded mode runs the
two services in process); ``distill``; ``bench``; ``launcher`` (the root command line,
``launcher/cli.py``, which registers every package's commands, and the demo). No exception:
the ground package imports nothing above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.assets import ROOT

SERVICES = {"speculant", "builder", "draft_service", "verifier_service"}
MAY_IMPORT = {
    "speculant": {"speculant"},
    "builder": {"speculant", "builder"},
    "draft_service": {"speculant", "draft_service"},
    "verifier_service": {"speculant", "verifier_service"},
    "gateway": SERVICES | {"gateway"},
    "distill": SERVICES | {"gateway", "distill"},
    "bench": SERVICES | {"gateway", "distill", "bench"},
    "launcher": SERVICES | {"gateway", "distill", "bench", "launcher"},
}


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) of every absolute import in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return found


def sources(package: str) -> list[Path]:
    """The package's hand-written modules (not the generated protobuf code)."""
    folder = ROOT / package
    return [p for p in sorted(folder.rglob("*.py")) if "v1" not in p.relative_to(folder).parts]


def test_every_package_imports_only_its_own_layer_and_those_below() -> None:
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for path in sources(package):
            for line, module, _ in imports(path):
                top = module.split(".")[0]
                if top in MAY_IMPORT and top not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_no_package_imports_another_packages_private_names() -> None:
    wrong = []
    for package in MAY_IMPORT:
        for path in sources(package):
            for line, module, names in imports(path):
                top = module.split(".")[0]
                private = [n for n in names if n.startswith("_") and n != "__version__"]
                parts = module.split(".")
                private_module = any(p.startswith("_") and p != "__init__" for p in parts)
                if top in MAY_IMPORT and top != package and (private or private_module):
                    wrong.append(f"{path.relative_to(ROOT)}:{line} {module} {private}")
    assert not wrong, "\n".join(wrong)


def test_the_checks_see_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from gateway.launch.up import _child_setup\n    import bench.cli\n"
    )
    assert imports(module) == [(2, "gateway.launch.up", ["_child_setup"]), (3, "bench.cli", [])]


def module_name(path: Path) -> str:
    """The dotted module name of a source file (a package's __init__: the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports, lazy imports included. ``from pkg import x``
    imports the module pkg.x where there is one (else pkg); the parent packages a submodule
    import loads on the way are not counted (every submodule has them)."""
    files = {module_name(p): p for package in MAY_IMPORT for p in sources(package)}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        for _, module, names in imports(path):
            submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in files]
            targets = submodules or ([module] if module in files else [])
            graph[name].update(t for t in targets if t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_modules_import_each_other_in_a_circle() -> None:
    found = circles(import_graph())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_check_finds_a_circle_through_a_lazy_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
