"""Composition: roofline compute takes its bandwidth from the hbm memory layer in a real run."""

from __future__ import annotations

import pytest

from chakra_core import pb
from chakra_core.testing import make_node, manifest, uniform_network, simulate, write_ranks

PEAK_TFLOPS = 100.0
MEMORY_BOUND = {"num_ops": 10**9, "tensor_size": 10**9}      # 1 FLOP/B: X GB/s x 1 << 100 TFLOP/s
COMPUTE_BOUND = {"num_ops": 10**12, "tensor_size": 10**6}    # 10^6 FLOP/B: the peak is the roof


@pytest.fixture(autouse=True)
def _needs_installed_plugins():
    from chakra_core.plugins import make_plugin_host

    try:
        host = make_plugin_host()
        for layer, name in (("compute", "roofline"), ("memory", "hbm"), ("network", "analytical")):
            host.get(layer, name)
    except Exception as exc:  # a plugin not installed
        pytest.skip(str(exc))


def kernel_times(tmp_path, bandwidth_gbps: float) -> tuple[int, int, dict]:
    """compute_ns of rank 0 (one memory-bound kernel) and rank 1 (one compute-bound kernel)."""
    ranks = [[make_node(1, pb.COMP_NODE, duration_micros=1, attrs=MEMORY_BOUND)],
             [make_node(1, pb.COMP_NODE, duration_micros=1, attrs=COMPUTE_BOUND)]]
    prefix = write_ranks(tmp_path / f"bw{bandwidth_gbps}", ranks)
    data = manifest(prefix, uniform_network(2),
                    compute={"plugin": "roofline", "peak_tflops": PEAK_TFLOPS},    # no memory_bandwidth_gbps
                    memory={"plugin": "hbm", "bandwidth_gbps": bandwidth_gbps})
    results = simulate(data, base_dir=tmp_path)
    return results["ranks"][0]["compute_ns"], results["ranks"][1]["compute_ns"], results


def test_doubling_hbm_bandwidth_halves_memory_bound_kernels_only(tmp_path):
    memory_1x, compute_1x, results = kernel_times(tmp_path, 1000.0)
    memory_2x, compute_2x, _ = kernel_times(tmp_path, 2000.0)
    # 10^9 FLOP at 1000 GB/s x 1 FLOP/B = 10^12 FLOP/s: 1 ms; at 2000 GB/s: 0.5 ms
    assert (memory_1x, memory_2x) == (1_000_000, 500_000)
    # 10^12 FLOP at 100 TFLOP/s: 10 ms whatever the bandwidth
    assert compute_1x == compute_2x == 10_000_000
    assert results["layers"]["compute"]["summary"] == {"memory_bound_nodes": 1, "compute_bound_nodes": 1}
    assert results["layers"]["memory"]["summary"]["bandwidth_gbps"] == 1000.0


def test_an_explicit_roofline_bandwidth_wins_over_the_memory_layer(tmp_path):
    ranks = [[make_node(1, pb.COMP_NODE, duration_micros=1, attrs=MEMORY_BOUND)]]
    prefix = write_ranks(tmp_path, ranks)
    data = manifest(prefix, uniform_network(1),
                    compute={"plugin": "roofline", "peak_tflops": PEAK_TFLOPS, "memory_bandwidth_gbps": 4000.0},
                    memory={"plugin": "hbm", "bandwidth_gbps": 1000.0})
    assert simulate(data, base_dir=tmp_path)["ranks"][0]["compute_ns"] == 250_000
