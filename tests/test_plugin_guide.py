"""docs/writing-a-plugin.md stays true: every code block of the guide runs as written.

Blocks are taken in order. A block right after a line ending in "`<path>`:" is a file to write;
`sh` blocks are commands, run from the folder holding the files (pip installs into a private
folder instead of the environment); other Python blocks run as scripts; TOML and YAML blocks
must parse.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10: TOML blocks are written but not parsed
    tomllib = None

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "writing-a-plugin.md"
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
FILE_LABEL = re.compile(r"`([\w.-]+(?:/[\w.-]+)*\.\w+)`:\s*$")


def guide_blocks(text: str) -> list[tuple[str, str | None, str]]:
    """(language, file path or None, code) of each fenced block, in order."""
    blocks, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, language = opening.groups()
        previous = next((line for line in reversed(lines[:index]) if line.strip()), "")
        label = FILE_LABEL.search(previous)
        body = []
        index += 1
        while not FENCE.match(lines[index]):
            body.append(lines[index][len(indent):])
            index += 1
        blocks.append((language, label.group(1) if label else None, "\n".join(body) + "\n"))
        index += 1
    return blocks


def _command(line: str, site: Path) -> list[str]:
    words = shlex.split(line, comments=True)
    if words[:2] == ["pip", "install"]:
        return [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                "--target", str(site), *words[2:]]
    if words[0] == "chakra-sim":
        return [sys.executable, "-m", "chakra_core.cli", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise AssertionError(f"the guide runs a command this test does not know: {line}")


def test_every_block_of_the_plugin_guide_runs(tmp_path):
    site = tmp_path / "site"
    env = {"PYTHONPATH": str(site), "PATH": "", "HOME": str(tmp_path)}
    outputs: dict[str, str] = {}
    blocks = guide_blocks(GUIDE.read_text())
    assert [path for _, path, _ in blocks if path] == [
        "acme-fixed-network/pyproject.toml", "acme-fixed-network/acme_fixed/__init__.py",
        "acme-fixed-network/tests/test_fixed.py", "manifest.yaml"]
    for language, path, code in blocks:
        if path is not None:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(code)
        elif language == "sh":
            for line in filter(str.strip, code.splitlines()):
                done = subprocess.run(_command(line, site), cwd=tmp_path, env=env, capture_output=True,
                                      text=True)
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                outputs[line.split("#")[0].strip()] = done.stdout
        elif language == "python":
            done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                                  text=True)
            assert done.returncode == 0, f"{code}\n{done.stderr}"
        elif language == "toml":
            if tomllib is not None:
                tomllib.loads(code)
        elif language == "yaml":
            yaml.safe_load(code)
        else:
            raise AssertionError(f"a ```{language} block: give it a language this test checks")

    listing = outputs["chakra-sim plugins --layer network"]
    assert "fixed" in listing and "acme-fixed-network" in listing and "2.1.0" in listing
    assert "3 passed" in outputs["python -m pytest -q acme-fixed-network/tests"]
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert results["finish_ns"] == 6000
    assert results["layers"]["network"]["plugin"] == "fixed"
    assert results["plugins"] == {"acme_fixed": {"messages": 0}}
