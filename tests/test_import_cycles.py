"""No package of flightlog, nor the benchmark harness, imports itself in a circle: every
import counts, those under ``if TYPE_CHECKING:`` and inside functions too, so the modules
can be read (and changed) from the bottom up.  And each package imports only the
packages docs/architecture.md's table lets it."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Each package's directory: flightlog.protocol, flightlog.sdk, flightlog.cli,
#: flightlog.integrations, flightlog.daemon; and the repository's own top-level bench.
PACKAGES = [
    *sorted(path for path in ROOT.glob("*/src/flightlog/*") if (path / "__init__.py").exists()),
    ROOT / "bench",
]


def modules_of(package: Path) -> dict[str, Path]:
    """Every module under ``package`` (a directory named flightlog/NAME, or a top-level
    package such as bench), by dotted name."""
    top = package.parent.parent if package.parent.name == "flightlog" else package.parent
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(top).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The modules of ``known`` that the module ``name`` at ``path`` imports anywhere."""
    known = set(known)
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                if node.module:
                    base += node.module.split(".")
                source = ".".join(base)
            else:
                source = node.module or ""
            for alias in node.names:
                # `from package import module` needs the module, not the package's names.
                module = f"{source}.{alias.name}"
                targets.add(module if module in known else source)
    return {target for target in targets if target in known and target != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph(packages: Iterable[Path]) -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for package in packages:
        modules.update(modules_of(package))
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


@cache
def repository_graph() -> dict[str, set[str]]:
    """The import graph of :data:`PACKAGES`, parsed once for all the tests (callers
    must not change it)."""
    return import_graph(PACKAGES)


def test_the_packages_are_found() -> None:
    names = {package.name for package in PACKAGES}
    assert {"protocol", "sdk", "cli", "integrations", "daemon", "bench"} <= names


@pytest.mark.parametrize("package", [pytest.param(path, id=path.name) for path in PACKAGES])
def test_no_import_cycle(package: Path) -> None:
    mine = modules_of(package)
    assert len(mine) > 1, package
    found = [cycle for cycle in cycles(repository_graph()) if set(cycle) & set(mine)]
    assert found == [], "modules that import each other in a circle"


#: The flightlog packages (and modules) each package may import beside its own:
#: docs/architecture.md, "The packages".
MAY_IMPORT = {
    "protocol": set(),
    "sdk": {"flightlog.protocol"},
    "cli": {"flightlog.protocol", "flightlog.sdk"},
    "integrations": {"flightlog.protocol", "flightlog.sdk"},
    # The sdk's file keeping, which `flightlog compress` and `vacuum` run too.
    "daemon": {"flightlog.protocol", "flightlog.sdk.storage"},
}


@pytest.mark.parametrize("name", sorted(MAY_IMPORT))
def test_each_package_imports_only_what_it_may(name: str) -> None:
    flightlog = {f"flightlog.{package.name}" for package in PACKAGES if package.name != "bench"}
    modules = repository_graph()
    allowed = MAY_IMPORT[name] | {f"flightlog.{name}"}
    wrong = set()
    for module, targets in modules.items():
        if module != f"flightlog.{name}" and not module.startswith(f"flightlog.{name}."):
            continue
        for target in targets:
            package = ".".join(target.split(".")[:2])
            if package in flightlog and not any(
                target == rule or target.startswith(rule + ".") for rule in allowed
            ):
                wrong.add((module, target))
    assert sorted(wrong) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "src" / "flightlog" / "demo"
    package.mkdir(parents=True)
    for name, text in files.items():
        (package / name).write_text(text)
    return package


def test_a_cycle_under_type_checking_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "_a.py": "from ._b import B\n",
            "_b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import A\n"
            ),
            "_c.py": "from ._a import A\n",
        },
    )
    assert cycles(import_graph([package])) == [["flightlog.demo._a", "flightlog.demo._b"]]


def test_a_cycle_through_the_package_and_a_function_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "from . import _a\n",
            "_a.py": "def later():\n    from flightlog.demo import _b\n",
            "_b.py": "import flightlog.demo\n",
        },
    )
    assert cycles(import_graph([package])) == [
        ["flightlog.demo", "flightlog.demo._a", "flightlog.demo._b"]
    ]


def test_one_way_imports_are_no_cycle(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "from ._a import A\n",
            "_a.py": "from ._b import B\nfrom . import _c\n",
            "_b.py": "from ._c import C\n",
            "_c.py": "import os\n",
        },
    )
    graph = import_graph([package])
    assert graph["flightlog.demo._a"] == {"flightlog.demo._b", "flightlog.demo._c"}
    assert cycles(graph) == []


def test_a_cycle_in_a_top_level_package_is_found(tmp_path: Path) -> None:
    # As bench._systems and bench._syslog once were: one imports the other inside a method.
    package = tmp_path / "harness"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_systems.py").write_text("def agent():\n    from ._syslog import Agent\n")
    (package / "_syslog.py").write_text("from ._systems import System\n")
    (package / "_report.py").write_text("from harness._systems import agent\n")
    graph = import_graph([package])
    assert graph["harness._report"] == {"harness._systems"}
    assert cycles(graph) == [["harness._syslog", "harness._systems"]]
