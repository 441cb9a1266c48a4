"""chakra-sim: simulate distributed AI/ML training from MLCommons Chakra execution traces.

The public API (documented in docs/api.md): what scripts and plugin authors import.

Running::

    import chakra_core

    config = chakra_core.load("examples/allreduce_8npu.yaml")   # or a mapping, or load_astra(...)
    result = chakra_core.simulate(config)                        # .results: the results document

Writing a plugin: `hookimpl`, the layer interfaces (`ComputeModel`, `MemoryModel`,
`NetworkModel` with its optional fast paths, `SystemLayer`), `PluginConfig`,
`LayerContext` / `RunInputs`, the errors to raise, and `NodeView`, the node a layer is given.
Names are imported on first use, so `import chakra_core` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from chakra_core._version import __version__

if TYPE_CHECKING:
    from chakra_core.comm.collectives import CollectiveCall, collective_name
    from chakra_core.config.spec import RunConfig
    from chakra_core.contract.algorithm import CollectiveAlgorithm, PhaseContext, StepSchedule
    from chakra_core.contract.folding import Folding
    from chakra_core.contract.hookspecs import hookimpl
    from chakra_core.plugins import PluginHost, make_plugin_host
    from chakra_core.contract.inputs import LayerContext, RunInputs, Scheduler, Unfold, ValidationInputs
    from chakra_core.contract.layers import (AstraEquivalent, ComputeModel, LayerModel, MemoryModel, PluginConfig,
                                             SystemLayer)
    from chakra_core.contract.network import (ClosedFormNetwork, ContentionFreeNetwork, Dimension, FlowNetwork,
                                              NetworkModel)
    from chakra_core.et.duration import replay_time_ns
    from chakra_core.errors import (AttributeTypeError, ChakraSimError, DeadlockError, InputFileError, ManifestError,
                                    PluginError, SimulationError, TraceFormatError, TraceGraphError)
    from chakra_core.et.attrs import NodeView
    from chakra_core.et.io import read_trace, write_trace
    from chakra_core.feeder import GraphFeeder, open_feeder
    from chakra_core.run import PreparedRun, RunResult, Validation, load, load_astra, prepare, simulate, validate
    from chakra_core.report.document import LayerResult, RankResult, Results
    from chakra_core.jobs.step import TrainingStep
    from chakra_core.schema import pb
    from chakra_core.system.matching import MatchingSystem
    from chakra_core._atomic import atomic_write_bytes, atomic_write_text
    from chakra_core.input_files import read_input_text
    from chakra_core.cli.output import CliError, out_console, tool_errors
    from chakra_core.cli.output import warn as print_warnings
    from chakra_core.comm.collectives import collective_wait
    from chakra_core.comm.matcher import OpenCollective
    from chakra_core.contract.inputs import GpuLoad, NO_LOAD
    from chakra_core.et.build import int_attr, write_rank_files
    from chakra_core.et.build import metadata as trace_metadata
    from chakra_core.et.build import read_collective as collective_attrs
    from chakra_core.et.dtypes import canonical as canonical_dtype
    from chakra_core.et.dtypes import node_dtype
    from chakra_core.et.io import iter_trace
    from chakra_core.hardware.devices import device_mismatch
    from chakra_core.hardware.profiles import Profile, load_profile, profile_problems, shipped_or_file
    from chakra_core.hardware.values import DTYPES as PEAK_DTYPES
    from chakra_core.hardware.values import Sourced

_EXPORTS = {
    # running
    "load": "chakra_core.run", "load_astra": "chakra_core.run", "prepare": "chakra_core.run",
    "simulate": "chakra_core.run", "validate": "chakra_core.run", "PreparedRun": "chakra_core.run",
    "RunResult": "chakra_core.run", "Validation": "chakra_core.run", "RunConfig": "chakra_core.config.spec",
    "PluginHost": "chakra_core.plugins", "make_plugin_host": "chakra_core.plugins",
    "Results": "chakra_core.report.document", "RankResult": "chakra_core.report.document",
    "LayerResult": "chakra_core.report.document", "TrainingStep": "chakra_core.jobs.step",
    # the plugin contract
    "hookimpl": "chakra_core.contract.hookspecs",
    "LayerModel": "chakra_core.contract.layers", "ComputeModel": "chakra_core.contract.layers",
    "MemoryModel": "chakra_core.contract.layers", "SystemLayer": "chakra_core.contract.layers",
    "PluginConfig": "chakra_core.contract.layers", "AstraEquivalent": "chakra_core.contract.layers",
    "NetworkModel": "chakra_core.contract.network", "Dimension": "chakra_core.contract.network",
    "ContentionFreeNetwork": "chakra_core.contract.network", "ClosedFormNetwork": "chakra_core.contract.network",
    "FlowNetwork": "chakra_core.contract.network",
    "LayerContext": "chakra_core.contract.inputs", "RunInputs": "chakra_core.contract.inputs",
    "Scheduler": "chakra_core.contract.inputs", "Unfold": "chakra_core.contract.inputs",
    "GpuLoad": "chakra_core.contract.inputs",
    "ValidationInputs": "chakra_core.contract.inputs", "Folding": "chakra_core.contract.folding",
    "CollectiveAlgorithm": "chakra_core.contract.algorithm", "StepSchedule": "chakra_core.contract.algorithm",
    "PhaseContext": "chakra_core.contract.algorithm",
    "MatchingSystem": "chakra_core.system.matching",
    "CollectiveCall": "chakra_core.comm.collectives", "collective_name": "chakra_core.comm.collectives",
    "replay_time_ns": "chakra_core.et.duration",
    # traces
    "NodeView": "chakra_core.et.attrs", "read_trace": "chakra_core.et.io", "write_trace": "chakra_core.et.io",
    "GraphFeeder": "chakra_core.feeder", "open_feeder": "chakra_core.feeder", "pb": "chakra_core.schema",
    "OpenCollective": "chakra_core.comm.matcher", "collective_wait": "chakra_core.comm.collectives",
    "NO_LOAD": "chakra_core.contract.inputs",
    # hardware profiles
    "Profile": "chakra_core.hardware.profiles", "load_profile": "chakra_core.hardware.profiles",
    "profile_problems": "chakra_core.hardware.profiles", "shipped_or_file": "chakra_core.hardware.profiles",
    "Sourced": "chakra_core.hardware.values", "PEAK_DTYPES": "chakra_core.hardware.values:DTYPES",
    "device_mismatch": "chakra_core.hardware.devices",
    # building and reading traces in a plugin
    "iter_trace": "chakra_core.et.io", "node_dtype": "chakra_core.et.dtypes",
    "canonical_dtype": "chakra_core.et.dtypes:canonical", "int_attr": "chakra_core.et.build",
    "trace_metadata": "chakra_core.et.build:metadata", "collective_attrs": "chakra_core.et.build:read_collective",
    "write_rank_files": "chakra_core.et.build",
    # a plugin's commands
    "CliError": "chakra_core.cli.output", "tool_errors": "chakra_core.cli.output",
    "out_console": "chakra_core.cli.output", "print_warnings": "chakra_core.cli.output:warn",
    "atomic_write_text": "chakra_core._atomic", "atomic_write_bytes": "chakra_core._atomic",
    "read_input_text": "chakra_core.input_files",
    # errors
    "ChakraSimError": "chakra_core.errors", "ManifestError": "chakra_core.errors",
    "PluginError": "chakra_core.errors", "SimulationError": "chakra_core.errors",
    "DeadlockError": "chakra_core.errors", "TraceFormatError": "chakra_core.errors",
    "TraceGraphError": "chakra_core.errors", "AttributeTypeError": "chakra_core.errors",
    "InputFileError": "chakra_core.errors",
}
"""Public name -> the module that defines it ("module:name" where the public name differs)."""

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chakra_core' has no attribute {name!r}")
    module, _, attribute = module.partition(":")
    value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
