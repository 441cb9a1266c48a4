"""results.json and results.csv, written atomically."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from chakra_core._atomic import atomic_write_text

CSV_COLUMNS = ("rank", "finish_ns", "compute_ns", "cpu_ns", "exposed_comm_ns", "comm_ns",
               "memory_ns", "idle_ns", "bytes_sent")


def results_json(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2, sort_keys=False) + "\n"


def results_csv(results: dict[str, Any]) -> str:
    """One row per rank: the scalar columns, then bytes per collective type."""
    types = sorted({t for row in results["ranks"] for t in row.get("comm_bytes_by_type", {})})
    extra = sorted({k for row in results["ranks"] for k, v in row.items()
                    if k not in CSV_COLUMNS and isinstance(v, (int, float)) and not isinstance(v, bool)})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(list(CSV_COLUMNS) + extra + [f"bytes_{t}" for t in types])
    for row in results["ranks"]:
        by_type = row.get("comm_bytes_by_type", {})
        writer.writerow([row.get(c, "") for c in CSV_COLUMNS] + [row.get(k, "") for k in extra]
                        + [by_type.get(t, 0) for t in types])
    return buffer.getvalue()


def write_results(results: dict[str, Any], out_dir: Path, formats: list[str]) -> list[Path]:
    """Write the requested formats into out_dir (created if needed); return the paths."""
    written = []
    if "json" in formats:
        path = out_dir / "results.json"
        atomic_write_text(path, results_json(results))
        written.append(path)
    if "csv" in formats:
        path = out_dir / "results.csv"
        atomic_write_text(path, results_csv(results))
        written.append(path)
    return written
