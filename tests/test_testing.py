"""chakra_core.testing: what a plugin's own tests use to build traces and run them."""

from __future__ import annotations

from pathlib import Path

import chakra_core
from chakra_core.et.io import read_trace
from chakra_core.contract.hookspecs import hookimpl
from chakra_core.contract.layers import ComputeModel, PluginConfig
from chakra_core.schema import pb
from chakra_core.testing import (GIB, collective, comp, make_node, manifest, recv, send, simulate,
                                 uniform_network, write_ranks)


def test_write_ranks_writes_one_readable_trace_per_rank(tmp_path):
    prefix = write_ranks(tmp_path / "deep" / "er", [[comp(1, 5, is_cpu_op=True)], [send(1, 0, 64, tag=2)]])
    assert prefix == str(tmp_path / "deep" / "er" / "trace")
    trace = read_trace(f"{prefix}.1.et")
    node, = trace.nodes
    assert node.type == pb.COMM_SEND_NODE
    assert {a.name: a.int64_val for a in node.attr} == {"comm_dst": 0, "comm_size": 64, "comm_tag": 2}
    assert trace.metadata.version == "0.0.4"


def test_send_and_recv_match_on_the_uniform_network(tmp_path):
    size = 1 << 20
    prefix = write_ranks(tmp_path, [[send(1, 1, size, tag=3)], [recv(1, 0, size, tag=3)]])
    results = simulate(manifest(prefix, uniform_network(2, bandwidth_gbps=50.0, latency_ns=500)))
    assert results["finish_ns"] == 500 + int(size / (50.0 * GIB / 1e9))
    assert results["layers"]["network"]["plugin"] == "testing_uniform"


def test_collectives_on_the_uniform_network_are_timed_in_closed_form(tmp_path):
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_REDUCE, 1 << 20)]] * 4)
    system = {"endpoint-delay": 0, "local-mem-bw": 1e9}
    results = simulate(manifest(prefix, uniform_network(4), system=system))
    # ring all-reduce on 4 NPUs: 2(n-1) = 6 steps of a quarter of the data
    assert results["finish_ns"] == 6 * (500 + int((1 << 18) / (50.0 * GIB / 1e9)))


class _Doubled(ComputeModel):
    name = "doubled"
    fidelity = "twice the traced duration"
    Config = PluginConfig

    def compute_time_ns(self, rank, node):
        return 2000 * node.duration_micros


class _DoubledPlugin:
    @hookimpl
    def chakra_sim_register_compute(self, registry):
        registry.add(_Doubled)


def test_simulate_runs_in_process_plugins(tmp_path):
    nodes = [comp(1, 3), make_node(2, pb.COMP_NODE, data_deps=[1], duration_micros=4)]
    prefix = write_ranks(tmp_path, [nodes])
    data = manifest(prefix, uniform_network(1), compute={"plugin": "doubled"})
    assert simulate(data, extra_plugins=[("doubling", _DoubledPlugin())])["finish_ns"] == 14_000


def test_the_package_ships_its_type_marker():
    assert (Path(chakra_core.__file__).parent / "py.typed").is_file()
