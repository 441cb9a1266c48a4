"""Built-in implementations, registered through the same hooks as any plugin: the `native`
system layer with its collective algorithms, and the `replay` compute model."""

from __future__ import annotations

from chakra_core.contract.hookspecs import hookimpl
from chakra_core.contract.registry import ComputeRegistry, SystemRegistry
from chakra_core.engine.replay import ReplayCompute
from chakra_core.system.native.algorithms import BUILTIN_ALGORITHMS
from chakra_core.system.native.layer import NativeSystem


@hookimpl
def chakra_sim_register_system(registry: SystemRegistry) -> None:
    registry.add(NativeSystem)
    for algorithm in BUILTIN_ALGORITHMS:
        registry.add_algorithm(algorithm)


@hookimpl
def chakra_sim_register_compute(registry: ComputeRegistry) -> None:
    registry.add(ReplayCompute)
