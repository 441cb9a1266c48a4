"""ET -> JSON, so users can look inside a trace with their usual tools.

The output follows protobuf's canonical JSON mapping with the .proto field
names (`data_deps`, `duration_micros`, ...); note that 64-bit integers are
JSON strings in that mapping. One JSON file per rank; nodes are streamed, so a
large trace does not need to fit in memory twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from google.protobuf.json_format import MessageToDict

from chakra_core._atomic import atomic_output
from chakra_core.et.io import iter_trace


def message_dict(message) -> dict:
    return MessageToDict(message, preserving_proto_field_name=True)


def jsonize_file(et_path: str | os.PathLike, json_path: str | os.PathLike, indent: int | None = 1) -> int:
    """Write `et_path` as JSON to `json_path`; return the number of nodes written."""
    metadata, nodes = iter_trace(et_path)
    count = 0
    with atomic_output(json_path, "w", encoding="utf-8") as out:
        out.write('{"global_metadata": ')
        json.dump(message_dict(metadata), out, indent=indent)
        out.write(', "nodes": [')
        for _, node in nodes:
            if count:
                out.write(",")
            out.write("\n")
            json.dump(message_dict(node), out, indent=indent)
            count += 1
        out.write("\n]}\n")
    return count


def trace_files(prefix: str | os.PathLike) -> list[tuple[int, Path]]:
    """(rank, path) of every `<prefix>.<rank>.et` file, sorted by rank."""
    prefix = Path(prefix)
    folder = prefix.parent if str(prefix.parent) else Path(".")
    stem = prefix.name + "."
    found = []
    if folder.is_dir():
        for entry in folder.iterdir():
            name = entry.name
            if name.startswith(stem) and name.endswith(".et"):
                middle = name[len(stem):-3]
                if middle.isdigit():
                    found.append((int(middle), entry))
    return sorted(found)
