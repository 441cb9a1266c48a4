"""The analysis as files: the report as JSON (analysis.json) and its plots, written together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from chakra_core._atomic import AtomicFiles
from chakra_core.tools.analyze.report import JobAnalysis

ANALYSIS_JSON = "analysis.json"
COMPARISON_JSON = "comparison.json"


def report_json(report: Mapping[str, object]) -> str:
    """A report's JSON document (analysis.json, comparison.json) as the files hold it."""
    return json.dumps(report, indent=1) + "\n"


def write_outputs(out_dir: Path, files: dict[str, str | bytes]) -> list[Path]:
    """Write the files into `out_dir` together (all renamed at the end); return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with AtomicFiles() as staged:
        for name, contents in files.items():
            if isinstance(contents, bytes):
                staged.write_bytes(out_dir / name, contents)
            else:
                staged.write_text(out_dir / name, contents)
        written = staged.commit()
    return written


def analysis_files(report: JobAnalysis) -> dict[str, str | bytes]:
    """analysis.json and the plots of `report`."""
    from chakra_core.report import analysis_plots as plots

    return {
        ANALYSIS_JSON: report_json(report.to_json()),
        plots.MESSAGE_SIZES_PNG: plots.message_sizes_png(report),
        plots.IMBALANCE_PNG: plots.imbalance_png(report),
        plots.COMPUTE_VS_COMM_PNG: plots.compute_vs_comm_png(report),
    }
