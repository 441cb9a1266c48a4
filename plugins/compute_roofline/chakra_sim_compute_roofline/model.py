"""The roofline model: time = num_ops / min(peak, bandwidth x operational intensity)."""

from __future__ import annotations

from pydantic import Field, PositiveFloat

from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView
from chakra_core.layers import ComputeModel, LayerContext, PluginConfig


_NONE, _MEMORY, _COMPUTE = range(3)


class RooflineConfig(PluginConfig):
    peak_tflops: PositiveFloat = Field(..., description="peak compute in TFLOP/s (10^12 FLOP/s)")
    memory_bandwidth_gbps: PositiveFloat | None = Field(
        None, description="memory bandwidth in GB/s (10^9 B/s); default: the memory layer's")


class RooflineCompute(ComputeModel):
    name = "roofline"
    fidelity = ("roofline: num_ops / min(peak, bandwidth x num_ops/tensor_size); CPU ops and "
                "nodes without num_ops replay their traced duration")
    Config = RooflineConfig
    fold_safe = True

    def __init__(self, config: RooflineConfig, context: LayerContext):
        super().__init__(config, context)
        self.peak = config.peak_tflops * 1e12            # FLOP/s, as ASTRA-sim scales peak-perf
        self.memory = context.memory
        if config.memory_bandwidth_gbps is None and self.memory is None:
            raise SimulationError(
                "compute plugin 'roofline' needs a memory bandwidth: set compute.memory_bandwidth_gbps "
                "or select a memory layer (memory: {plugin: hbm, ...})")
        self._fixed_bw = None if config.memory_bandwidth_gbps is None else config.memory_bandwidth_gbps * 1e9
        self.memory_bound = 0
        self.compute_bound = 0
        # folded runs: how many ranks each simulated rank stands for (counts are per rank)
        self._weights = context.extras.get("rank_weights") or {}

    def bandwidth_bps(self, rank: int) -> float:
        """Bytes per second for `rank`: the configured value, else the memory layer's."""
        if self._fixed_bw is not None:
            return self._fixed_bw
        return self.memory.bandwidth_gbps(rank) * 1e9

    def compute_time_ns(self, rank: int, node: NodeView) -> int | None:
        if self._fixed_bw is None:
            duration, bound = self._time(node, self.bandwidth_bps(rank))
        else:   # the answer depends on the node alone: compute it once per node body
            memo = node.memo
            cached = memo.get(self)
            if cached is None:
                cached = memo[self] = self._time(node, self._fixed_bw)
            duration, bound = cached
        weight = self._weights.get(rank, 1) if self._weights else 1
        if bound == _MEMORY:
            self.memory_bound += weight
        elif bound == _COMPUTE:
            self.compute_bound += weight
        return duration

    def _time(self, node: NodeView, bandwidth: float) -> tuple[int | None, int]:
        """(duration in ns or None to replay, which roof bounds it)."""
        if node.is_cpu_op or not node.has("num_ops"):
            return None, _NONE
        num_ops = float(node.int("num_ops"))
        tensor_size = float(node.int("tensor_size", 0))
        if tensor_size == 0:
            return 0, _NONE
        intensity = num_ops / tensor_size
        memory_perf = bandwidth * intensity
        if memory_perf < self.peak:
            bound, perf = _MEMORY, memory_perf
        else:
            bound, perf = _COMPUTE, self.peak
        if perf <= 0:
            return 0, bound
        return int(num_ops / perf * 1e9), bound

    def summary(self) -> dict:
        return {"memory_bound_nodes": self.memory_bound, "compute_bound_nodes": self.compute_bound}
