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

from chakra_core._version import __version__ as __version__

if TYPE_CHECKING:
    # `name as name`: an explicit re-export, so that mypy --strict (no implicit re-export) sees the
    # public names plugins import; at run time __getattr__ below imports them on first use.
    from chakra_core.comm.collectives import (
        CollectiveCall as CollectiveCall, collective_name as collective_name, collective_wait as collective_wait,
        even_pieces as even_pieces,
    )
    from chakra_core.config.spec import RunConfig as RunConfig
    from chakra_core.contract.algorithm import (
        CollectiveAlgorithm as CollectiveAlgorithm, PhaseContext as PhaseContext, StepSchedule as StepSchedule,
    )
    from chakra_core.contract.folding import Folding as Folding
    from chakra_core.contract.time_folding import FoldView as FoldView
    from chakra_core.contract.hookspecs import hookimpl as hookimpl
    from chakra_core.json_types import JsonObject as JsonObject, JsonValue as JsonValue
    from chakra_core.plugins import PluginHost as PluginHost, make_plugin_host as make_plugin_host
    from chakra_core.contract.inputs import (
        LayerContext as LayerContext, RunInputs as RunInputs, Scheduler as Scheduler, Unfold as Unfold,
        ValidationInputs as ValidationInputs, GpuLoad as GpuLoad, NO_LOAD as NO_LOAD,
    )
    from chakra_core.contract.layers import (
        AstraEquivalent as AstraEquivalent, ComputeModel as ComputeModel, LayerModel as LayerModel,
        MemoryModel as MemoryModel, PluginConfig as PluginConfig, SystemLayer as SystemLayer,
    )
    from chakra_core.contract.network import (
        ClosedFormNetwork as ClosedFormNetwork, ContentionFreeNetwork as ContentionFreeNetwork, Dimension as Dimension,
        FlowNetwork as FlowNetwork, NetworkModel as NetworkModel,
    )
    from chakra_core.et.duration import replay_time_ns as replay_time_ns
    from chakra_core.errors import (
        AttributeTypeError as AttributeTypeError, ChakraSimError as ChakraSimError, DeadlockError as DeadlockError,
        InputFileError as InputFileError, ManifestError as ManifestError, PluginError as PluginError,
        SimulationError as SimulationError, TraceFormatError as TraceFormatError, TraceGraphError as TraceGraphError,
    )
    from chakra_core.et.attrs import NodeView as NodeView
    from chakra_core.et.attr_cache import AttributeCache as AttributeCache
    from chakra_core.et.io import read_trace as read_trace, write_trace as write_trace, iter_trace as iter_trace
    from chakra_core.feeder import GraphFeeder as GraphFeeder, open_feeder as open_feeder
    from chakra_core.run import (
        PreparedRun as PreparedRun, RunResult as RunResult, Validation as Validation, load as load,
        load_astra as load_astra, prepare as prepare, simulate as simulate, validate as validate,
    )
    from chakra_core.report.document import LayerResult as LayerResult, RankResult as RankResult, Results as Results
    from chakra_core.jobs.step import TrainingStep as TrainingStep
    from chakra_core.schema import pb as pb
    from chakra_core.system.matching import MatchingSystem as MatchingSystem
    from chakra_core._atomic import atomic_write_bytes as atomic_write_bytes, atomic_write_text as atomic_write_text
    from chakra_core.input_files import read_input_text as read_input_text
    from chakra_core.cli.output import CliError as CliError, out_console as out_console, tool_errors as tool_errors
    from chakra_core.comm.matcher import OpenCollective as OpenCollective
    from chakra_core.et.build import int_attr as int_attr, write_rank_files as write_rank_files
    from chakra_core.et.dtypes import node_dtype as node_dtype
    from chakra_core.hardware.devices import device_mismatch as device_mismatch
    from chakra_core.hardware.profiles import (
        Profile as Profile, load_profile as load_profile, profile_problems as profile_problems,
        shipped_or_file as shipped_or_file,
    )
    from chakra_core.hardware.values import Sourced as Sourced
    # A renamed import (`from m import a as b`) is no re-export to mypy: these names are assigned.
    from chakra_core.cli import output as _output
    from chakra_core.et import build as _build, dtypes as _dtypes
    from chakra_core.hardware import values as _values
    print_warnings = _output.warn
    trace_metadata = _build.metadata
    collective_attrs = _build.read_collective
    canonical_dtype = _dtypes.canonical
    PEAK_DTYPES = _values.DTYPES

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
    "JsonObject": "chakra_core.json_types", "JsonValue": "chakra_core.json_types",
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
    "FoldView": "chakra_core.contract.time_folding",
    "CollectiveAlgorithm": "chakra_core.contract.algorithm", "StepSchedule": "chakra_core.contract.algorithm",
    "PhaseContext": "chakra_core.contract.algorithm",
    "MatchingSystem": "chakra_core.system.matching",
    "CollectiveCall": "chakra_core.comm.collectives", "collective_name": "chakra_core.comm.collectives",
    "replay_time_ns": "chakra_core.et.duration",
    # traces
    "NodeView": "chakra_core.et.attrs", "AttributeCache": "chakra_core.et.attr_cache",
    "read_trace": "chakra_core.et.io", "write_trace": "chakra_core.et.io",
    "GraphFeeder": "chakra_core.feeder", "open_feeder": "chakra_core.feeder", "pb": "chakra_core.schema",
    "OpenCollective": "chakra_core.comm.matcher", "collective_wait": "chakra_core.comm.collectives",
    "even_pieces": "chakra_core.comm.collectives",
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
