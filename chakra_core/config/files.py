"""Reading configuration files (manifests, sweep files, ASTRA-sim's JSON and YAML) into mappings.

Every problem is a `ManifestError` naming the file (and line, for a syntax error).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from chakra_core.errors import ManifestError


def _line_of(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f" (line {mark.line + 1}, column {mark.column + 1})"
    lineno = getattr(exc, "lineno", None)
    return f" (line {lineno})" if lineno else ""


def read_config_file(path: Path) -> dict[str, Any]:
    """A JSON or YAML mapping from `path`, or a ManifestError naming the file and the problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError([(str(path), "file not found")]) from None
    except OSError as exc:
        raise ManifestError([(str(path), f"cannot read: {exc.strerror}")]) from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc).splitlines()[0]
        raise ManifestError([(str(path), f"not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                                         f"{reason}{_line_of(exc)}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ManifestError([(str(path), f"expected a mapping of keys, found {type(data).__name__}")])
    return data
