"""Docs stay true: the manifest reference matches the code, every hook is documented and tested."""

from __future__ import annotations

import inspect
from pathlib import Path

from chakra_core.contract import hookspecs
from chakra_core.reference import update
from chakra_core.plugins import make_plugin_host

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HOOKS = [name for name, fn in vars(hookspecs).items()
         if name.startswith("chakra_sim_") and inspect.isfunction(fn)]


def test_manifest_reference_is_generated_from_the_models():
    path = DOCS / "manifest.md"
    assert update(path, make_plugin_host()) == path.read_text(), (
        "docs/manifest.md is out of date: run python -m chakra_core.reference --write docs/manifest.md")


def test_every_hook_is_documented_with_its_exact_signature():
    guide = (DOCS / "writing-a-plugin.md").read_text()
    assert HOOKS, "no hookspecs found"
    for name in HOOKS:
        params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        assert f"{name}({params})" in guide, f"{name}({params}) is not in docs/writing-a-plugin.md"


def test_every_hook_has_a_test():
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_docs.py")
    sources += "\n".join(p.read_text() for p in (ROOT / "plugins").glob("*/tests/test_*.py"))
    for name in HOOKS:
        assert f"def {name}(" in sources, f"no test implements {name}"


def test_readme_commands_exist():
    readme = (ROOT / "README.md").read_text()
    assert "chakra-sim run examples/allreduce_8npu.yaml" in readme
    assert (ROOT / "examples" / "allreduce_8npu.yaml").exists()
    assert "python -m pytest" in (ROOT / ".ci" / "run").read_text()
