"""Every command the documentation shows runs as written.

Fenced blocks tagged `sh` are examples: each page's blocks run in order, in a
fresh folder holding a copy of the repository's `examples/`, `tests/data/`,
`benchmarks/data/` and the nccl plugin's published logs (the files the examples
use), and every command must exit 0. Blocks tagged
`text` are synopses (placeholders such as `PREFIX`, `[--flag]`, `a|b`); any
other block that shows a command is an error, so an example cannot hide from
this test. Lines that run other programs are handled so:

- `python -m pytest`: not run (it is this suite); nor is the install command
  (`... pip install -r requirements-dev.txt ...`), which .ci/run runs on a
  fresh machine;
- `python benchmarks/<script>.py ...`: the script must start (`--help`) and
  accept every option the docs give it; running the benchmarks takes minutes
  and `../shared`, so they are run by hand (docs/benchmarks.md);
- other programs (`dot`, `pip`): not run here; docs/writing-a-plugin.md,
  whose `pip install` needs a package built on the page, is run whole by
  tests/test_plugin_guide.py.

Inline spans such as `chakra-sim convert pytorch` must name a real command
and only options it has. Links in the docs must stay inside the repository.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from chakra_core.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", *sorted(ROOT.glob("plugins/*/README.md"))]
RUN_ELSEWHERE = {"writing-a-plugin.md": "tests/test_plugin_guide.py runs the whole page"}
COMMAND = re.compile(r"^\s*(\$ )?(chakra-sim|python3?|pip|dot)\b")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(page.read_text())]


def commands(body: str) -> list[list[str]]:
    """The block's commands: continuation lines joined, `$ ` prompts and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"^\s*\$ ", "", line).strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line, comments=True))
    return out


def _sh_pages() -> list[Path]:
    return [page for page in PAGES if page.name not in RUN_ELSEWHERE
            and any(lang == "sh" for lang, _ in blocks(page))]


def test_every_block_that_shows_a_command_is_an_example_or_a_synopsis():
    for page in PAGES:
        for lang, body in blocks(page):
            if not any(COMMAND.match(line) for line in body.splitlines()):
                continue
            assert lang in ("sh", "text"), f"{_name(page)}: tag this block sh (runs) or text (synopsis):\n{body}"
            if lang == "text":
                assert re.search(r"\[|\||\.\.\.|\b[A-Z][A-Z_]{2,}\b", body), \
                    f"{_name(page)}: a `text` block without placeholders is an example: tag it sh\n{body}"


def _benchmark_accepts(argv: list[str], cwd: Path) -> None:
    script = ROOT / argv[1]
    assert script.is_file(), f"no script {argv[1]}"
    shown = subprocess.run([sys.executable, str(script), "--help"], cwd=cwd, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    for token in argv[2:]:
        if token.startswith("--"):
            assert token.split("=")[0] in shown.stdout, f"{argv[1]} has no option {token}"


@pytest.mark.parametrize("page", _sh_pages(), ids=_name)
def test_the_pages_examples_run_as_written(page, tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "tests" / "data", tmp_path / "tests" / "data")
    shutil.copytree(ROOT / "benchmarks" / "data", tmp_path / "benchmarks" / "data")
    nccl_logs = Path("plugins") / "system_nccl" / "tests" / "data"
    shutil.copytree(ROOT / nccl_logs, tmp_path / nccl_logs)
    for lang, body in blocks(page):
        if lang != "sh":
            continue
        for argv in commands(body):
            program = argv[0]
            if "requirements-dev.txt" in argv:
                continue
            if program == "chakra-sim":
                done = subprocess.run([sys.executable, "-m", "chakra_core.cli", *argv[1:]], cwd=tmp_path,
                                      capture_output=True, text=True)
                assert done.returncode == 0, f"{_name(page)}: {shlex.join(argv)}\n{done.stdout}\n{done.stderr}"
            elif program.startswith("python") and argv[1:3] == ["-m", "pytest"]:
                continue
            elif program.startswith("python") and argv[1].startswith("benchmarks/"):
                _benchmark_accepts(argv, tmp_path)
            else:
                assert program in ("dot", "pip"), f"{_name(page)}: unexpected program {program}"


def _resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    command: click.Command = main
    ctx = click.Context(main)
    while words and isinstance(command, click.Group):
        sub = command.get_command(ctx, words[0])
        if sub is None:
            break
        command, words = sub, words[1:]
    return command, words


def test_inline_commands_name_real_commands_and_options():
    for page in PAGES:
        text = BLOCK.sub("", page.read_text())
        for span in re.findall(r"`chakra-sim ([^`]*)`", text):
            words = span.replace("...", "").split()
            command, rest = _resolve(words)
            assert command is not main or not words, f"{_name(page)}: `chakra-sim {span}`: no such command"
            options = {opt for param in command.params for opt in getattr(param, "opts", [])}
            options.add("--help")
            for word in rest:
                if word.startswith("-"):
                    assert word.split("=")[0] in options, f"{_name(page)}: `chakra-sim {span}`: no option {word}"


def test_links_stay_inside_the_repository():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.is_relative_to(ROOT), f"{_name(page)}: link {target} leaves the repository"
            assert resolved.exists(), f"{_name(page)}: link {target} is broken"


def _yaml_blocks() -> list[tuple[str, str]]:
    return [(_name(page), body) for page in PAGES for lang, body in blocks(page) if lang in ("yaml", "yml")]


@pytest.mark.parametrize("where, body", _yaml_blocks(), ids=lambda v: v if v.endswith(".md") else "")
def test_every_yaml_block_parses_and_a_sweep_file_is_valid(where, body):
    """A `yaml` block claims to be a file a user can copy (a manifest, sweep file or profile):
    it must parse, and a sweep file (top-level `base:`) must pass the sweep's own checks
    against the examples it names."""
    import yaml

    from chakra_core.sweep.spec import build_sweep

    try:
        data = yaml.safe_load(body)
    except yaml.YAMLError as exc:
        pytest.fail(f"{where}: a yaml block is not valid YAML: {exc}\n{body}")
    assert isinstance(data, dict), f"{where}: a yaml block should be a mapping of keys:\n{body}"
    if "base" in data:
        build_sweep(data, ROOT / "examples", where)
