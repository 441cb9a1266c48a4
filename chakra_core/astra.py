"""ASTRA-sim configuration files, read as they are.

- network YAML: `topology`, `npus_count`, `bandwidth` (GB/s, GB = 2^30), `latency` (ns) lists;
- system JSON: `scheduling-policy`, `endpoint-delay`, `preferred-dataset-splits`, ...,
  plus `roofline-enabled`, `peak-perf` (TFLOP/s = 10^12) and `local-mem-bw` (GB/s = 10^9),
  which the manifest loader also hands to the compute and memory layers;
- remote-memory JSON: `memory-type`, `remote-mem-latency`, `remote-mem-bw`, ...;
- communicator-group JSON: `{"<group id>": [ranks...]}`.

Files are parsed into plain dicts; the plugin's pydantic Config validates
them. Keys a plugin does not implement produce one warning each instead of
being silently dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from chakra_core.errors import ManifestError

ROOFLINE_KEYS = ("roofline-enabled", "peak-perf")
"""System JSON keys that select and configure ASTRA-sim's roofline compute model."""
SYSTEM_FILE_LINKED_KEYS = frozenset(ROOFLINE_KEYS + ("local-mem-bw",))
"""System JSON keys other layers may read (see manifest._SystemFileLinks)."""


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


def read_comm_groups(path: Path) -> dict[str, list[int]]:
    """ASTRA-sim communicator-group JSON: {"<id>": [ranks]}."""
    data = read_config_file(path)
    groups: dict[str, list[int]] = {}
    problems = []
    for key, ranks in data.items():
        if not isinstance(ranks, list) or not all(isinstance(r, int) and r >= 0 for r in ranks):
            problems.append((f"{path}: {key}", "must be a list of non-negative rank numbers"))
            continue
        groups[str(key)] = ranks
    if problems:
        raise ManifestError(problems)
    return groups


def field_keys(config_cls) -> set[str]:
    """Every key a pydantic Config accepts (field names and aliases)."""
    keys = set()
    for name, info in config_cls.model_fields.items():
        keys.add(name)
        if info.alias:
            keys.add(info.alias)
    return keys


def split_known(data: dict[str, Any], config_cls, source: str, layer: str, plugin: str,
                consumed_elsewhere: frozenset[str] = frozenset()) -> tuple[dict[str, Any], list[str]]:
    """Keep the keys `config_cls` implements; return (kept, warnings for the rest)."""
    known = field_keys(config_cls)
    kept, warnings = {}, []
    for key, value in data.items():
        if key in known:
            kept[key] = value
        elif key not in consumed_elsewhere:
            warnings.append(f"{source}: key '{key}' is not implemented by {layer} plugin "
                            f"'{plugin}'; ignored")
    return kept, warnings
