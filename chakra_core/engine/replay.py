"""The built-in `replay` compute model: every COMP node takes its traced duration.

This is ASTRA-sim's behaviour with the roofline disabled, and what the
`roofline` plugin falls back to for CPU operations and nodes without
`num_ops`. A node with `duration_micros` 0 takes 1 ns, as in ASTRA-sim; a
`duration_ns` attribute, when present, gives the exact time.
"""

from __future__ import annotations

from chakra_core.et.attrs import NodeView
from chakra_core.contract.layers import ComputeModel, PluginConfig


def replay_time_ns(node: NodeView) -> int:
    """ASTRA-sim's replay duration: duration_micros in ns, at least 1 ns.

    A `duration_ns` attribute (written by chakra-sim's converters when µs would
    lose precision; not part of Chakra's schema) takes precedence.
    """
    exact = node.int("duration_ns", None)
    if exact is not None and exact >= 0:
        return exact
    micros = node.pb.duration_micros
    return micros * 1000 if micros else 1


class ReplayConfig(PluginConfig):
    pass


class ReplayCompute(ComputeModel):
    name = "replay"
    fidelity = "replays each compute node's traced duration_micros (no hardware model)"
    Config = ReplayConfig
    fold_safe = True

    def compute_time_ns(self, rank: int, node: NodeView) -> int | None:
        return None
