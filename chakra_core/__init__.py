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
    from chakra_core.errors import (AttributeTypeError, ChakraSimError, DeadlockError, ManifestError, PluginError,
                                    SimulationError, TraceFormatError, TraceGraphError)
    from chakra_core.et.attrs import NodeView
    from chakra_core.et.io import read_trace, write_trace
    from chakra_core.feeder import GraphFeeder, open_feeder
    from chakra_core.run import PreparedRun, RunResult, Validation, load, load_astra, prepare, simulate, validate
    from chakra_core.schema import pb
    from chakra_core.system.matching import MatchingSystem

_EXPORTS = {
    # running
    "load": "chakra_core.run", "load_astra": "chakra_core.run", "prepare": "chakra_core.run",
    "simulate": "chakra_core.run", "validate": "chakra_core.run", "PreparedRun": "chakra_core.run",
    "RunResult": "chakra_core.run", "Validation": "chakra_core.run", "RunConfig": "chakra_core.config.spec",
    "PluginHost": "chakra_core.plugins", "make_plugin_host": "chakra_core.plugins",
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
    # errors
    "ChakraSimError": "chakra_core.errors", "ManifestError": "chakra_core.errors",
    "PluginError": "chakra_core.errors", "SimulationError": "chakra_core.errors",
    "DeadlockError": "chakra_core.errors", "TraceFormatError": "chakra_core.errors",
    "TraceGraphError": "chakra_core.errors", "AttributeTypeError": "chakra_core.errors",
}
"""Public name -> the module that defines it."""

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chakra_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
