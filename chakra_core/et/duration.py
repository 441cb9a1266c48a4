"""A node's traced duration, as ASTRA-sim replays it (the built-in `replay` compute model)."""

from __future__ import annotations

from chakra_core.et.attrs import NodeView


def replay_time_ns(node: NodeView) -> int:
    """ASTRA-sim's replay duration: duration_micros in ns, at least 1 ns (a node with
    `duration_micros` 0 takes 1 ns, as in ASTRA-sim, so a chain of zero-length nodes still
    advances the clock).

    A `duration_ns` attribute (written by chakra-sim's converters when µs would
    lose precision; not part of Chakra's schema) takes precedence.
    """
    exact = node.int("duration_ns", None)
    if exact is not None and exact >= 0:
        return exact
    micros = node.pb.duration_micros
    return micros * 1000 if micros else 1
