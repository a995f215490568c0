"""The packages' layers, read from the source: every import, lazy ones inside functions
included, goes to the package itself, to the ground package (``speculant``) or to a package
below it, and never names another package's private (underscore) name.

Layers, lowest first: ``speculant`` (types, formats, configuration, the wire); the services
``builder``, ``draft_service`` and ``verifier_service``; ``gateway`` (its embedded mode runs the
two services in process); ``distill``; ``bench``; ``launcher``. The root command line
(``speculant/cli.py``) registers every package's commands: the one module of the ground package
allowed to import upward.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

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
ROOT_CLI = Path("speculant/cli.py")


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
            if path.relative_to(ROOT) == ROOT_CLI:
                continue
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
    module.write_text("def f():\n    from gateway.up import _child_setup\n    import bench.cli\n")
    assert imports(module) == [(2, "gateway.up", ["_child_setup"]), (3, "bench.cli", [])]
