"""`chakra-sim analyze`: what a job's traces ask of the machine, found without simulating.

    from chakra_core.tools.analyze import ComputeTiming, analyze_traces
    report = analyze_traces("traces/gpt", ComputeTiming("roofline", 100, 1600))

Modules: `scan` (one trace file in one streaming pass: node counts, compute time and critical
path, communication), `job` (every rank: the report, communicator groups, collective size
imbalance), `report` (the report as types: `JobAnalysis`), `tables` (the report as terminal tables), `output` (analysis.json and the plots),
`cli` (the `analyze` command, which also compares two runs). docs/analysis.md is the user guide.
"""

from chakra_core.tools.analyze.cli import analyze
from chakra_core.tools.analyze.job import (COMM_KINDS, DEFAULT_THRESHOLD, analyze_traces, imbalance,
                                           natural_key)
from chakra_core.tools.analyze.report import JobAnalysis
from chakra_core.tools.analyze.output import (ANALYSIS_JSON, COMPARISON_JSON, analysis_files, report_json,
                                              write_outputs)
from chakra_core.tools.analyze.scan import (Collective, ComputeTiming, TraceScan, node_type_key, scan_trace,
                                            size_bucket)
from chakra_core.tools.analyze.tables import (MAX_FLAGGED_ROWS, MAX_RANK_ROWS, comm_table, group_table,
                                              node_table, print_report, size_table, summary_table)

__all__ = [
    "ANALYSIS_JSON", "COMM_KINDS", "COMPARISON_JSON", "Collective", "ComputeTiming", "DEFAULT_THRESHOLD", "JobAnalysis",
    "MAX_FLAGGED_ROWS", "MAX_RANK_ROWS", "TraceScan", "analysis_files", "analyze", "analyze_traces",
    "comm_table", "group_table", "imbalance", "natural_key", "node_table", "node_type_key", "print_report",
    "report_json", "scan_trace", "size_bucket", "size_table", "summary_table", "write_outputs",
]
