"""The roofline model: memory- vs compute-bound nodes, replay fallbacks, the memory layer's bandwidth."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chakra_core import LayerContext, MemoryModel, NodeView, SimulationError, pb
from chakra_core.testing import EventQueue
from chakra_sim_compute_roofline import RooflineCompute, RooflineConfig

MiB = 1 << 20


def comp_node(num_ops: int | None = None, tensor_size: int | None = None, cpu: bool = False,
              node_id: int = 1) -> NodeView:
    node = pb.Node(id=node_id, name="kernel", type=pb.COMP_NODE, duration_micros=7)
    if num_ops is not None:
        node.attr.append(pb.AttributeProto(name="num_ops", uint64_val=num_ops))
    if tensor_size is not None:
        node.attr.append(pb.AttributeProto(name="tensor_size", uint64_val=tensor_size))
    if cpu:
        node.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=True))
    return NodeView(node)


class FakeMemory(MemoryModel):
    """A memory layer that only reports a bandwidth (GB/s) per rank."""

    name = "fake"
    fidelity = "test double"

    def __init__(self, per_rank: list[float]):
        super().__init__(MemoryModel.Config(), LayerContext(num_ranks=len(per_rank), scheduler=EventQueue()))
        self.per_rank = per_rank

    def bandwidth_gbps(self, rank: int) -> float:
        return self.per_rank[rank]

    def access(self, rank, node, done):
        raise AssertionError("the roofline model never accesses memory")


def make(peak_tflops: float, memory_bandwidth_gbps: float | None = None,
         memory: MemoryModel | None = None) -> RooflineCompute:
    config = RooflineConfig(peak_tflops=peak_tflops, memory_bandwidth_gbps=memory_bandwidth_gbps)
    return RooflineCompute(config, LayerContext(num_ranks=2, scheduler=EventQueue(), memory=memory))


def roofline_ns(num_ops: float, tensor_size: float, peak_tflops: float, bandwidth_gbps: float) -> int:
    """int(num_ops / min(peak, bw x num_ops / tensor_size) x 1e9), FLOP/s and B/s."""
    perf = min(peak_tflops * 1e12, bandwidth_gbps * 1e9 * num_ops / tensor_size)
    return int(num_ops / perf * 1e9)


# Bounds -----------------------------------------------------------------------------------------
def test_memory_bound_node():
    model = make(100.0, 1000.0)
    # intensity 1 FLOP/B: 1000 GB/s x 1 = 1 TFLOP/s < 100 TFLOP/s; 10^6 FLOP at 10^12 FLOP/s = 1000 ns
    assert model.compute_time_ns(0, comp_node(10**6, 10**6)) == 1000 == roofline_ns(1e6, 1e6, 100.0, 1000.0)
    assert model.summary() == {"memory_bound_nodes": 1, "compute_bound_nodes": 0}


def test_compute_bound_node():
    model = make(100.0, 1000.0)
    # intensity 10^6 FLOP/B: the memory roof (10^18) is above the peak; 10^12 FLOP at 10^14 FLOP/s = 10 ms
    expected = roofline_ns(1e12, 1e6, 100.0, 1000.0)
    assert model.compute_time_ns(0, comp_node(10**12, 10**6)) == 10**7 == expected
    assert model.summary() == {"memory_bound_nodes": 0, "compute_bound_nodes": 1}


@pytest.mark.parametrize("num_ops, tensor_size", [
    (1, 1), (12345, 678), (10**9, 3 * MiB), (5 * 10**11, 7), (2**40, 2**20), (999_999_937, 1_000_003)])
def test_time_formula(num_ops, tensor_size):
    model = make(312.0, 2039.0)
    assert model.compute_time_ns(1, comp_node(num_ops, tensor_size)) == roofline_ns(
        num_ops, tensor_size, 312.0, 2039.0)


def test_ridge_point_is_compute_bound():
    """At intensity peak / bandwidth both roofs meet; the node counts as compute-bound."""
    model = make(100.0, 1000.0)          # ridge at 100 FLOP/B
    assert model.compute_time_ns(0, comp_node(100 * 10**6, 10**6)) == 1000     # 10^8 FLOP at 10^14 FLOP/s
    assert model.summary() == {"memory_bound_nodes": 0, "compute_bound_nodes": 1}


def test_astra_sim_reference():
    """ASTRA-sim roofline with peak-perf 100, local-mem-bw 1600: 30 GFLOP over 16 MiB is compute-bound."""
    model = make(100.0, 1600.0)
    num_ops, tensor_size = 30 * 10**9, 16 * MiB
    expected = int(num_ops / min(100e12, 1600e9 * (num_ops / tensor_size)) * 1e9)
    assert model.compute_time_ns(0, comp_node(num_ops, tensor_size)) == expected
    assert expected == 300_000                   # 3e10 FLOP / 1e14 FLOP/s = 300 us


# Replay fallbacks and edge cases ------------------------------------------------------------------
def test_cpu_ops_replay():
    model = make(100.0, 1000.0)
    assert model.compute_time_ns(0, comp_node(10**9, 10**6, cpu=True)) is None


def test_nodes_without_num_ops_replay():
    model = make(100.0, 1000.0)
    assert model.compute_time_ns(0, comp_node(tensor_size=10**6)) is None
    assert model.compute_time_ns(0, comp_node()) is None


def test_zero_tensor_size_takes_no_time():
    model = make(100.0, 1000.0)
    assert model.compute_time_ns(0, comp_node(10**9, 0)) == 0
    assert model.compute_time_ns(0, comp_node(10**9)) == 0          # tensor_size absent counts as 0
    assert model.summary() == {"memory_bound_nodes": 0, "compute_bound_nodes": 0}


def test_zero_ops_takes_no_time():
    model = make(100.0, 1000.0)
    assert model.compute_time_ns(0, comp_node(0, 10**6)) == 0


def test_times_are_ints():
    model = make(100.0, 1000.0)
    assert type(model.compute_time_ns(0, comp_node(12345, 678))) is int


# Bandwidth from the memory layer ------------------------------------------------------------------
def test_bandwidth_comes_from_the_memory_layer():
    model = make(100.0, memory=FakeMemory([1000.0, 250.0]))
    node = comp_node(10**6, 10**6)
    assert model.compute_time_ns(0, node) == roofline_ns(1e6, 1e6, 100.0, 1000.0) == 1000
    assert model.compute_time_ns(1, node) == roofline_ns(1e6, 1e6, 100.0, 250.0) == 4000


def test_doubling_memory_bandwidth_halves_memory_bound_time_only():
    memory_bound, compute_bound = comp_node(10**6, 10**6), comp_node(10**12, 10**6)
    slow = make(100.0, memory=FakeMemory([1000.0, 1000.0]))
    fast = make(100.0, memory=FakeMemory([2000.0, 2000.0]))
    assert fast.compute_time_ns(0, memory_bound) * 2 == slow.compute_time_ns(0, memory_bound) == 1000
    assert fast.compute_time_ns(0, compute_bound) == slow.compute_time_ns(0, compute_bound) == 10**7


def test_configured_bandwidth_overrides_the_memory_layer():
    model = make(100.0, 500.0, memory=FakeMemory([1000.0, 1000.0]))
    assert model.compute_time_ns(0, comp_node(10**6, 10**6)) == roofline_ns(1e6, 1e6, 100.0, 500.0) == 2000


def test_error_without_any_bandwidth():
    with pytest.raises(SimulationError, match="memory_bandwidth_gbps"):
        make(100.0)


def test_reads_the_hbm_plugin_bandwidth_when_installed():
    hbm = pytest.importorskip("chakra_sim_memory_hbm")
    queue = EventQueue()
    memory = hbm.HBMMemory(hbm.HBMConfig(bandwidth_gbps=1000.0), LayerContext(num_ranks=2, scheduler=queue))
    model = make(100.0, memory=memory)
    assert model.compute_time_ns(0, comp_node(10**6, 10**6)) == 1000


# Config -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("data, key", [
    ({}, "peak_tflops"), ({"peak_tflops": 0}, "peak_tflops"),
    ({"peak_tflops": 100, "memory_bandwidth_gbps": -1}, "memory_bandwidth_gbps"),
    ({"peak_tflops": 100, "peak-perf": 100}, "peak-perf")])
def test_config_errors_name_the_key(data, key):
    with pytest.raises(ValidationError) as info:
        RooflineConfig.model_validate(data)
    assert {e["loc"][0] for e in info.value.errors()} == {key}
