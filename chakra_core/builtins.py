"""Built-in implementations, registered through the same hooks as any plugin."""

from __future__ import annotations

from chakra_core.hookspecs import hookimpl
from chakra_core.replay import ReplayCompute
from chakra_core.system.algorithms import BUILTIN_ALGORITHMS
from chakra_core.system.native import NativeSystem


@hookimpl
def chakra_sim_register_system(registry):
    registry.add(NativeSystem)
    for algorithm in BUILTIN_ALGORITHMS:
        registry.add_algorithm(algorithm)


@hookimpl
def chakra_sim_register_compute(registry):
    registry.add(ReplayCompute)
