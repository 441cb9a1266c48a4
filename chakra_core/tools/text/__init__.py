"""ASTRA-sim 1.0 text workloads to Chakra traces (`chakra-sim convert text`).

Modules: `parse` (the workload file format and its parser), `program` (ASTRA-sim 1.0's workload
loop for one NPU as a dependency graph, and the NPU groups of the hybrid policies), `convert`
(every NPU's trace written, with what the conversion changed), `cli` (the command).
"""

from chakra_core.tools.text.cli import convert_text
from chakra_core.tools.text.convert import ConversionReport, convert_text_workload
from chakra_core.tools.text.parse import (COLUMNS, COMM_TYPES, DLRMS, LAYER_POLICIES, PHASE_NAMES, PHASES,
                                          POLICIES, TRANSFORMERS, LayerSpec, TextWorkload, TextWorkloadError,
                                          parse_text_workload)
from chakra_core.tools.text.program import GroupLayout, default_first_dim

__all__ = [
    "COLUMNS", "COMM_TYPES", "ConversionReport", "DLRMS", "GroupLayout", "LAYER_POLICIES", "LayerSpec",
    "PHASES", "PHASE_NAMES", "POLICIES", "TRANSFORMERS", "TextWorkload", "TextWorkloadError", "convert_text",
    "convert_text_workload", "default_first_dim", "parse_text_workload",
]
