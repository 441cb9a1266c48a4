"""Built-in implementations, registered through the same hooks as any plugin: the `native`
system layer with its collective algorithms, and the `replay` compute model.

`replay` gives every COMP node its traced duration (chakra_core.et.duration.replay_time_ns):
ASTRA-sim's behaviour with the roofline disabled, and what the `roofline` plugin falls back
to for CPU operations and nodes without `num_ops`.
"""

from __future__ import annotations

from chakra_core.contract.hookspecs import hookimpl
from chakra_core.contract.layers import ComputeModel, PluginConfig
from chakra_core.contract.registry import ComputeRegistry, SystemRegistry
from chakra_core.et.attrs import NodeView
from chakra_core.system.native.algorithms import BUILTIN_ALGORITHMS
from chakra_core.system.native.layer import NativeSystem


class ReplayConfig(PluginConfig):
    """`replay` takes no settings."""


class ReplayCompute(ComputeModel):
    """Every compute node takes its traced duration (the engine replays a None answer)."""

    name = "replay"
    fidelity = "replays each compute node's traced duration_micros (no hardware model)"
    Config = ReplayConfig
    fold_safe = True
    time_fold_safe = True     # a pure function of the node

    def compute_time_ns(self, rank: int, node: NodeView) -> int | None:
        return None


@hookimpl
def chakra_sim_register_system(registry: SystemRegistry) -> None:
    registry.add(NativeSystem)
    for algorithm in BUILTIN_ALGORITHMS:
        registry.add_algorithm(algorithm)


@hookimpl
def chakra_sim_register_compute(registry: ComputeRegistry) -> None:
    registry.add(ReplayCompute)
