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
from google.protobuf.message import Message

from chakra_core._atomic import AtomicFiles, atomic_output
from chakra_core.errors import ChakraSimError
from chakra_core.et.io import iter_trace
from chakra_core.json_types import JsonObject


def message_dict(message: Message) -> JsonObject:
    return MessageToDict(message, preserving_proto_field_name=True)


def jsonize_file(et_path: str | os.PathLike[str], json_path: str | os.PathLike[str],
                 indent: int | None = 1, files: AtomicFiles | None = None) -> int:
    """Write `et_path` as JSON to `json_path`; return the number of nodes written. With `files`,
    the JSON is staged there, to replace its target when the set is committed."""
    metadata, nodes = iter_trace(et_path)
    count = 0
    output = atomic_output if files is None else files.open
    with output(json_path, "w", encoding="utf-8") as out:
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


TRACE_SUFFIXES = (".et", ".et.gz")
"""Rank files are `<prefix>.<rank>.et`, or `.et.gz` when gzip-compressed (readers detect gzip by its
magic bytes, whatever the name)."""


def trace_files(prefix: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(rank, path) of every `<prefix>.<rank>.et` or `<prefix>.<rank>.et.gz` file, sorted by rank
    (a rank with both files appears twice: see `duplicate_ranks`)."""
    prefix = Path(prefix)
    folder = prefix.parent if str(prefix.parent) else Path(".")
    stem = prefix.name + "."
    found = []
    if folder.is_dir():
        for entry in folder.iterdir():
            name = entry.name
            if not name.startswith(stem):
                continue
            for suffix in TRACE_SUFFIXES:
                if name.endswith(suffix):
                    middle = name[len(stem):-len(suffix)]
                    if middle.isdigit():
                        found.append((int(middle), entry))
    return sorted(found)


def duplicate_ranks(found: list[tuple[int, Path]]) -> dict[int, list[Path]]:
    """Ranks with more than one trace file (`x.0.et` and `x.0.et.gz`) in a `trace_files` result."""
    paths: dict[int, list[Path]] = {}
    for rank, path in found:
        paths.setdefault(rank, []).append(path)
    return {rank: files for rank, files in paths.items() if len(files) > 1}


def check_one_file_per_rank(found: list[tuple[int, Path]]) -> None:
    """ChakraSimError naming the first rank of a `trace_files` result that has two files."""
    duplicates = duplicate_ranks(found)
    if duplicates:
        rank = min(duplicates)
        raise ChakraSimError(f"rank {rank} has two trace files ({', '.join(map(str, duplicates[rank]))}); "
                             "keep one")


def rank_files(prefix: str | os.PathLike[str]) -> list[Path]:
    """The trace file of every rank 0..N-1 of `prefix`; ChakraSimError when there is none, when a
    rank has two files, or when a rank is missing."""
    found = trace_files(prefix)
    if not found:
        raise ChakraSimError(f"no trace files {prefix}.<rank>.et (or .et.gz) found")
    check_one_file_per_rank(found)
    ranks = [rank for rank, _ in found]
    missing = sorted(set(range(ranks[-1] + 1)) - set(ranks))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise ChakraSimError(f"missing trace file(s) for rank(s) {shown} ({prefix}.<rank>.et)")
    return [path for _, path in found]


def json_name(et_path: Path) -> str:
    """`x.0.et` / `x.0.et.gz` -> `x.0.json`."""
    name = et_path.name
    for suffix in (".et.gz", ".et"):
        if name.endswith(suffix):
            return name[:-len(suffix)] + ".json"
    return name + ".json"
