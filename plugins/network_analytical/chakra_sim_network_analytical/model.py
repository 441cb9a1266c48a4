"""ASTRA-sim's congestion-unaware analytical network, as a chakra-sim network layer."""

from __future__ import annotations

from typing import Annotated, Any, Callable, Literal

from pydantic import Field, PositiveFloat, StrictInt, model_validator

from chakra_core import AstraEquivalent, Dimension, JsonObject, LayerContext, NetworkModel, PluginConfig

GIB = 1 << 30
HOPS_SWITCH = 2   # NPU -> switch -> NPU

Latency = Annotated[float, Field(ge=0, le=1e12)]
"""ns; at most 1,000 s, far above any link: larger values are typos (or unit mix-ups)."""
Npus = Annotated[StrictInt, Field(gt=0)]
"""A count of NPUs: a whole number (YAML's `true` is not 1)."""


class AnalyticalNetworkConfig(PluginConfig):
    """The keys of an ASTRA-sim network YAML file (one list entry per dimension)."""

    topology: list[Literal["Ring", "FullyConnected", "Switch"]] = Field(
        ..., min_length=1, description="building block of each dimension")
    npus_count: list[Npus] = Field(..., min_length=1, description="NPUs per dimension")
    bandwidth: list[PositiveFloat] = Field(
        ..., min_length=1, description="GB/s per dimension, GB = 2^30 bytes (ASTRA-sim convention)")
    latency: list[Latency] = Field(..., min_length=1, description="ns per hop, per dimension")

    @model_validator(mode="after")
    def _same_lengths(self) -> "AnalyticalNetworkConfig":
        lengths = {"topology": len(self.topology), "npus_count": len(self.npus_count),
                   "bandwidth": len(self.bandwidth), "latency": len(self.latency)}
        if len(set(lengths.values())) != 1:
            raise ValueError("topology, npus_count, bandwidth and latency need one entry per "
                             f"dimension; got lengths {lengths}")
        return self


def hops(topology: str, npus: int, src: int, dst: int) -> int:
    """Hops between two coordinates of one dimension (ASTRA-sim's counts)."""
    if topology == "Ring":
        clockwise = (dst - src) % npus
        return min(clockwise, npus - clockwise)   # ASTRA-sim rings are bidirectional
    if topology == "FullyConnected":
        return 1
    return HOPS_SWITCH


class AnalyticalNetwork(NetworkModel):
    name = "analytical"
    fidelity = ("congestion-unaware: hops x latency + size / bandwidth per message, "
                "multi-dimensional Ring/FullyConnected/Switch (ASTRA-sim analytical)")
    Config = AnalyticalNetworkConfig
    contention_free = True
    fold_safe = True    # a message's delay depends on its endpoints and size only
    time_fold_safe = True   # ... and it keeps nothing between messages
    astra_sim = AstraEquivalent("congestion-unaware")   # --astra-network without --network

    def __init__(self, config: AnalyticalNetworkConfig, context: LayerContext) -> None:
        super().__init__(config, context)
        self.dims = tuple(Dimension(t, n, b, lat) for t, n, b, lat in
                          zip(config.topology, config.npus_count, config.bandwidth, config.latency))
        self.npus_count = 1
        for dim in self.dims:
            self.npus_count *= dim.npus
        # bytes per ns; computed like ASTRA-sim (bw * 2^30 / 1e9) for identical rounding
        self._bw_bpns = [dim.bandwidth_gbps * GIB / 1_000_000_000 for dim in self.dims]
        self._strides: list[int] = []
        stride = 1
        for dim in self.dims:
            self._strides.append(stride)
            stride *= dim.npus
        self._scheduler = context.scheduler
        self._cache: dict[tuple[int, int, int], int] = {}

    def message_delay(self, src: int, dst: int, size: int) -> int:
        key = (src, dst, size)
        delay = self._cache.get(key)
        if delay is None:
            delay = self._cache[key] = self._delay(src, dst, size)
        return delay

    def _delay(self, src: int, dst: int, size: int) -> int:
        if src == dst:
            return 0
        for index, dim in enumerate(self.dims):
            stride = self._strides[index]
            a, b = (src // stride) % dim.npus, (dst // stride) % dim.npus
            if a != b:
                link = hops(dim.topology, dim.npus, a, b) * dim.latency_ns
                return int(link + size / self._bw_bpns[index])
        raise ValueError(f"NPU {src} or {dst} is outside the network of {self.npus_count} NPUs")

    def send(self, src: int, dst: int, size: int, on_arrival: Callable[[Any], None], arg: Any = None) -> None:
        self._scheduler.schedule(self.message_delay(src, dst, size), on_arrival, arg)

    def summary(self) -> JsonObject:
        return {"dimensions": [
            {"topology": d.topology, "npus": d.npus, "bandwidth_gbps": d.bandwidth_gbps,
             "latency_ns": d.latency_ns} for d in self.dims]}
