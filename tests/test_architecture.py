"""The house keeps its shape (docs/architecture.md): imports flow one way, the core names no plugin,
modules stay small, the public API is what docs/api.md says, and the bundled plugins live by the
same rules (public API only, no plugin importing another, small modules)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import networkx as nx

import chakra_core

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "chakra_core"
GENERATED = {"chakra_core.schema.et_def_pb2"}
MAX_LINES = 420
"""~400 lines: a module longer than that holds more than one concept (docs/architecture.md)."""
LONG_BUT_ONE_CONCEPT = {
    "chakra_core.feeder.streaming": "the streaming feeder: its index, cache and gzip handling are one mechanism",
}
"""Modules allowed over MAX_LINES, each with the reason it is still one concept."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(CORE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _runtime_imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Modules `path` imports when it runs (anywhere in it, functions included), not those imported
    only for type checking."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                # `from package import submodule` needs the submodule; a name needs the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        if name in GENERATED:
            continue
        graph.add_node(name)
        for target in _runtime_imports(path, name, modules):
            if target in modules and target != name and target not in GENERATED:
                graph.add_edge(name, target)
    return graph


def test_no_import_cycle_between_modules():
    cycles = list(nx.simple_cycles(_graph()))
    assert cycles == [], f"import cycles: {cycles[:5]}"


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def test_no_import_cycle_between_packages():
    """chakra_core.<package> -> chakra_core.<other>: the packages form a DAG (the top-level
    chakra_core/__init__.py, which only names the public API lazily, is left out)."""
    packages = nx.DiGraph()
    for a, b in _graph().edges:
        pa, pb = _package(a), _package(b)
        if pa != pb and "chakra_core" not in (pa, pb):
            packages.add_edge(pa, pb)
    cycles = list(nx.simple_cycles(packages))
    assert cycles == [], f"package cycles: {cycles[:5]}"


def test_the_engine_does_not_know_the_report_and_the_contract_knows_no_implementation():
    edges = {(_package(a), _package(b)) for a, b in _graph().edges}
    assert ("chakra_core.engine", "chakra_core.report") not in edges
    for below in ("chakra_core.engine", "chakra_core.system", "chakra_core.config", "chakra_core.run",
                  "chakra_core.cli", "chakra_core.report"):
        assert ("chakra_core.contract", below) not in edges, f"the contract imports {below}"
        assert ("chakra_core.comm", below) not in edges, f"comm imports {below}"


def test_the_core_never_imports_or_names_a_bundled_plugin():
    bundled = sorted(p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists())
    names = {"roofline", "achievable", "hbm", "analytical", "congestion", "nccl", "ns3"}
    modules = _modules()
    for name, path in modules.items():
        text = path.read_text()
        assert "chakra_sim_" not in "".join(_runtime_imports(path, name, modules)), f"{name} imports a plugin"
        for plugin in names:
            # as a plugin selection in code: plugin: <name> / "plugin": "<name>" / == "<name>"
            assert not re.search(rf"""["']plugin["']\s*:\s*["']{plugin}["']""", text), f"{name} selects {plugin}"
            assert not re.search(rf"""(==|=)\s*["']{plugin}["']\s*$""", text, re.M), f"{name} names {plugin}"
    assert bundled == ["compute_achievable", "compute_roofline", "memory_hbm", "network_analytical", "network_congestion",
                       "network_ns3", "system_nccl"]


def test_modules_hold_one_concept():
    too_long = {name: len(path.read_text().splitlines()) for name, path in _modules().items()
                if name not in GENERATED and name not in LONG_BUT_ONE_CONCEPT
                and len(path.read_text().splitlines()) > MAX_LINES}
    assert too_long == {}, f"split these modules (or say why each is one concept): {too_long}"


def test_the_public_api_is_documented_and_importable():
    page = (ROOT / "docs" / "api.md").read_text()
    for name in chakra_core.__all__:
        if name == "__version__":
            continue
        assert getattr(chakra_core, name) is not None
        assert re.search(rf"`{re.escape(name)}[`(]", page), f"chakra_core.{name} is not in docs/api.md"
    documented = set(re.findall(r"^\| `(\w+)[`(]", page, re.M))
    assert documented <= set(chakra_core.__all__), f"docs/api.md lists {documented - set(chakra_core.__all__)}"


def test_the_type_checker_sees_the_public_api_and_only_it():
    """chakra_core/__init__.py's `if TYPE_CHECKING:` block names, as explicit re-exports (`from m import a
    as a`, or `b = m.a` where the public name differs), exactly the names __getattr__ resolves, each from
    the module it resolves it from: what `mypy --strict` lets a plugin import is the public API."""
    init = CORE / "__init__.py"
    block = next(n for n in ast.parse(init.read_text()).body
                 if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))
    private_modules: dict[str, str] = {}
    seen: dict[str, str] = {}
    for node in block.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.asname and alias.asname.startswith("_"):
                    private_modules[alias.asname] = f"{node.module}.{alias.name}"
                else:
                    assert alias.asname == alias.name, f"{alias.name} as {alias.asname}: not a re-export to mypy"
                    seen[alias.name] = node.module or ""
        else:
            assert isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute), ast.unparse(node)
            assert isinstance(node.value.value, ast.Name), ast.unparse(node)
            (target,) = node.targets
            assert isinstance(target, ast.Name), ast.unparse(node)
            seen[target.id] = f"{private_modules[node.value.value.id]}:{node.value.attr}"
    assert seen == chakra_core._EXPORTS

PLUGIN_API = ("chakra_core.contract", "chakra_core.topology")
"""What a plugin may import from besides `chakra_core` itself: the contract's registries and the
networks any network layer may build (both public, docs/api.md)."""


def _plugin_modules() -> dict[str, Path]:
    """Every bundled plugin's own modules (not its tests), by dotted name."""
    return {f"{path.parent.name}.{path.stem}": path for path in sorted((ROOT / "plugins").glob("*/chakra_sim_*/*.py"))}


def _imported(path: Path) -> set[str]:
    """Modules a file imports (anywhere, type-checking imports included: they bind it too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_plugins_import_the_core_only_through_its_public_api():
    """A plugin's own code imports `chakra_core` (docs/api.md), the contract's registries and
    `chakra_core.topology`, never the modules behind them, which may move."""
    for name, path in _plugin_modules().items():
        inner = sorted(module for module in _imported(path) if module.startswith("chakra_core.")
                       and not module.startswith(PLUGIN_API))
        assert not inner, f"{path.relative_to(ROOT)} imports {inner}: import the names from chakra_core"


def test_plugins_do_not_import_each_other():
    packages = {path.parent.name: path.parent.parent.name for path in _plugin_modules().values()}
    for name, path in _plugin_modules().items():
        own = packages[path.parent.name]
        for module in _imported(path):
            other = packages.get(module.split(".")[0])
            assert other is None or other == own, f"{path.relative_to(ROOT)} imports plugin {other}"


def test_plugin_modules_hold_one_concept():
    too_long = {name: len(path.read_text().splitlines()) for name, path in _plugin_modules().items()
                if len(path.read_text().splitlines()) > MAX_LINES}
    assert too_long == {}, f"split these plugin modules: {too_long}"


def test_every_module_imports():
    for name in _modules():
        if name.endswith("__main__") or name == "chakra_core.pytest_plugin":
            continue
        importlib.import_module(name)
