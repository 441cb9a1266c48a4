"""The plugin contract: hookspecs, typed registries, the layer interfaces and what layers receive.

Everything a plugin author needs is re-exported here and from `chakra_core` itself:

- `hookimpl` and the hookspecs (`chakra_core.contract.hookspecs`, the reference);
- the layer interfaces `ComputeModel`, `MemoryModel`, `NetworkModel` (with the optional
  fast paths `ContentionFreeNetwork` and `ClosedFormNetwork`) and `SystemLayer`, their
  `PluginConfig` base and `AstraEquivalent`;
- what a layer receives: `LayerContext`, `RunInputs`, `Scheduler`, `Folding`;
- the registries the hooks fill, and the collective algorithm interface;
- the sections of a hardware profile a plugin owns (`ProfileSectionRegistry`, `ProfileSectionModel`).

The plugin host (`chakra_core.plugins`) discovers plugins and answers lookups.
"""

from chakra_core.contract.algorithm import CollectiveAlgorithm, PhaseContext, PhaseIO, PhaseMember, StepSchedule
from chakra_core.contract.folding import Folding
from chakra_core.contract.time_folding import FoldView
from chakra_core.contract.hookspecs import hookimpl, hookspec
from chakra_core.contract.inputs import (LayerContext, RestartRequest, RunInputs, Scheduler, Unfold,
                                         ValidationInputs)
from chakra_core.contract.layers import (LAYERS, AstraEquivalent, ComputeModel, LayerModel, MemoryModel,
                                         PluginConfig, SystemLayer)
from chakra_core.contract.network import ClosedFormNetwork, ContentionFreeNetwork, Dimension, NetworkModel
from chakra_core.contract.profile_sections import ProfileSection, ProfileSectionModel, ProfileSections
from chakra_core.contract.registry import (CommandRegistry, ComputeRegistry, LayerRegistry, MemoryRegistry,
                                           NetworkRegistry, ProfileSectionRegistry, Registries, SystemRegistry)

__all__ = [
    "LAYERS", "AstraEquivalent", "ClosedFormNetwork", "CollectiveAlgorithm", "CommandRegistry", "ComputeModel",
    "ComputeRegistry", "ContentionFreeNetwork", "Dimension", "Folding", "FoldView", "LayerContext", "LayerModel",
    "LayerRegistry", "MemoryModel", "MemoryRegistry", "NetworkModel", "NetworkRegistry", "PhaseContext",
    "PhaseIO", "PhaseMember", "PluginConfig", "ProfileSection", "ProfileSectionModel", "ProfileSectionRegistry",
    "ProfileSections", "Registries", "RestartRequest", "RunInputs", "Scheduler",
    "StepSchedule", "SystemLayer", "SystemRegistry", "Unfold", "ValidationInputs", "hookimpl", "hookspec",
]
