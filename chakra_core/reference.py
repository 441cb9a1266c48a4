"""Render the manifest reference (docs/manifest.md) from the pydantic models.

    python -m chakra_core.reference --write docs/manifest.md

The tables between the GENERATED markers of docs/manifest.md come from here:
the core sections (workload, output, job) and the Config of every installed plugin.
tests/test_docs.py fails when the file is out of date.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

from chakra_core._atomic import atomic_write_text
from chakra_core.contract.layers import LAYERS
from chakra_core.config.manifest import OutputSection, ResourcesSection, WorkloadSection
from chakra_core.jobs.spec import JobSpec
from chakra_core.plugins import PluginHost, make_plugin_host

BEGIN, END = "<!-- BEGIN GENERATED: python -m chakra_core.reference -->", "<!-- END GENERATED -->"


def _type_name(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " \\| ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    if "anyOf" in schema:
        return " \\| ".join(_type_name(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_type_name(schema.get('items', {}))}"
    if kind == "object":
        return "mapping"
    if "$ref" in schema:
        return "section"
    names = {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "null": "null"}
    return names.get(str(kind), str(kind or "any"))


def _bounds(schema: dict[str, Any]) -> str:
    parts = []
    for key, sign in (("exclusiveMinimum", ">"), ("minimum", "≥"), ("maximum", "≤")):
        if key in schema:
            parts.append(f"{sign} {schema[key]}")
    for option in schema.get("anyOf", []):
        extra = _bounds(option)
        if extra:
            parts.append(extra)
    return ", ".join(parts)


def model_table(model: type[BaseModel], skip: tuple[str, ...] = ()) -> list[str]:
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, prop in schema.get("properties", {}).items():
        if key in skip:
            continue
        kind = _type_name(prop)
        bounds = _bounds(prop)
        if bounds:
            kind += f" ({bounds})"
        default = "required" if key in required else f"`{json.dumps(prop.get('default'))}`"
        if key not in required and "default" not in prop:
            default = "see meaning"
        description = prop.get("description", "").replace("|", "\\|")
        rows.append(f"| `{key}` | {kind} | {default} | {description} |")
    return rows


def _section_tables(name: str, model: type[BaseModel]) -> list[str]:
    """A section's table, then one per nested section (job, job.model, job.parallel, ...)."""
    lines = [f"### `{name}`", "", *model_table(model), ""]
    for key, field in model.model_fields.items():
        for section in (field.annotation, *get_args(field.annotation)):   # a section, or one a union allows
            if isinstance(section, type) and issubclass(section, BaseModel):
                lines += _section_tables(f"{name}.{field.alias or key}", section)
    return lines


def render(host: PluginHost) -> str:
    lines = [BEGIN, "", "### `workload`", "", *model_table(WorkloadSection, skip=("resources",)), "",
             "### `workload.resources`", "", *model_table(ResourcesSection), "",
             "### `output`", "", *model_table(OutputSection), "", *_section_tables("job", JobSpec)]
    for layer in LAYERS:
        lines += [f"### `{layer}` plugins", ""]
        for impl in host.implementations(layer):
            lines += [f"#### `plugin: {impl.name}` ({impl.plugin.distribution})", "", impl.fidelity + ".", ""]
            fields = impl.cls.Config.model_fields
            if fields:
                lines += model_table(impl.cls.Config)
            else:
                lines.append("No settings.")
            lines.append("")
            for key, field in fields.items():   # a nested section: its own table
                section = field.annotation
                if isinstance(section, type) and issubclass(section, BaseModel):
                    lines += [f"`{field.alias or key}`:", "", *model_table(section), ""]
    lines.append(END)
    return "\n".join(lines)


def update(path: Path, host: PluginHost) -> str:
    """The file's text with its generated part replaced."""
    text = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{path}: GENERATED markers not found")
    return pattern.sub(lambda _: render(host), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="update the generated part of this markdown file")
    args = parser.parse_args(argv)
    host = make_plugin_host()
    if args.write:
        atomic_write_text(args.write, update(args.write, host))
    else:
        print(render(host))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
