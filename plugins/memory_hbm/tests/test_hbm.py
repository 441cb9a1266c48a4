"""The hbm memory model driven directly: an EventQueue, a LayerContext, hand-made nodes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chakra_core import LayerContext, SimulationError, pb
from chakra_core.testing import EventQueue
from chakra_sim_memory_hbm import HBMConfig, HBMMemory
from hbm_helpers import REMOTE, REMOTE_NS, SIZE, make, mem_node, run


# Local HBM -----------------------------------------------------------------------------------------
def test_defaults_are_local_hbm_at_2000_gbps():
    model, _ = make()
    assert model.config.memory_type == "NO_MEMORY_EXPANSION"
    assert model.bandwidth_gbps(0) == 2000.0


@pytest.mark.parametrize("size, bandwidth, latency", [
    (SIZE, 2000.0, 0.0), (SIZE, 1600.0, 250.0), (3, 7.0, 0.5), (0, 1000.0, 40.0), (10**9, 819.2, 12.0)])
def test_local_access_time(size, bandwidth, latency):
    model, queue = make(bandwidth_gbps=bandwidth, latency_ns=latency)
    done = run(model, queue, [(0, mem_node(7, size))])
    assert done == {(0, 7): int(latency + size / bandwidth)} == {(0, 7): model.local_time_ns(size)}


def test_local_access_time_is_exact_decimal_arithmetic():
    """1 ns + 33 B at 1.1 B/ns is exactly 31 ns; float arithmetic says 30.999999999999996."""
    model, queue = make(bandwidth_gbps=1.1, latency_ns=1.0)
    assert int(1.0 + 33 / 1.1) == 30
    assert run(model, queue, [(0, mem_node(7, 33))]) == {(0, 7): 31}


def test_local_accesses_do_not_queue():
    model, queue = make(bandwidth_gbps=1000.0)
    done = run(model, queue, [(r, mem_node(r, SIZE)) for r in range(4)])
    assert set(done.values()) == {int(SIZE / 1000.0)}
    assert model.summary()["remote_queueing_delay_ns"] == 0


def test_bandwidth_is_what_roofline_reads():
    model, _ = make(num_ranks=2, bandwidth_gbps=3350.0)
    assert [model.bandwidth_gbps(r) for r in range(2)] == [3350.0, 3350.0]


# Remote memory (ASTRA-sim semantics) --------------------------------------------------------------
def test_remote_time_uses_astra_arithmetic():
    model, queue = make(**{"memory-type": "PER_NPU_MEMORY_EXPANSION", **REMOTE})
    done = run(model, queue, [(0, mem_node(1, SIZE))])
    assert done == {(0, 1): REMOTE_NS}
    # ASTRA-sim computes size / (bw * 1e9) * 1e9 and truncates: 15 B at 1 B/ns takes 14 ns there.
    model, queue = make(**{"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-bw": 1})
    assert run(model, queue, [(0, mem_node(1, 15))]) == {(0, 1): int(15 / 1e9 * 1e9)} == {(0, 1): 14}


def test_pool_serves_one_access_at_a_time_in_arrival_order():
    model, queue = make(**{"memory-type": "MEMORY_POOL", **REMOTE})
    done = run(model, queue, [(0, mem_node(1, SIZE)), (3, mem_node(2, SIZE))])
    assert done == {(0, 1): REMOTE_NS, (3, 2): 2 * REMOTE_NS}
    summary = model.summary()
    assert summary["remote_queueing_delay_ns"] == REMOTE_NS
    assert summary["remote_queued_accesses"] == 1


def test_pool_queue_drains_before_a_later_access():
    """An access arriving after the queue emptied starts at once."""
    model, queue = make(**{"memory-type": "MEMORY_POOL", **REMOTE})
    finished = {}
    model.access(0, mem_node(1, SIZE), lambda i: finished.setdefault(i, queue.now))
    queue.schedule(5 * REMOTE_NS, lambda _: model.access(
        1, mem_node(2, SIZE), lambda i: finished.setdefault(i, queue.now)))
    queue.run()
    assert finished == {1: REMOTE_NS, 2: 5 * REMOTE_NS + REMOTE_NS}
    assert model.summary()["remote_queueing_delay_ns"] == 0


def test_per_node_queues_are_independent_across_nodes():
    model, queue = make(**{"memory-type": "PER_NODE_MEMORY_EXPANSION", "num-npus-per-node": 2, **REMOTE})
    # ranks 0, 1 share node 0; ranks 2, 3 share node 1
    done = run(model, queue, [(0, mem_node(1, SIZE)), (2, mem_node(1, SIZE)),
                              (1, mem_node(2, SIZE)), (3, mem_node(2, SIZE)), (0, mem_node(3, SIZE))])
    assert done == {(0, 1): REMOTE_NS, (2, 1): REMOTE_NS,
                    (1, 2): 2 * REMOTE_NS, (3, 2): 2 * REMOTE_NS,
                    (0, 3): 3 * REMOTE_NS}
    assert model.summary()["remote_queueing_delay_ns"] == (1 + 1 + 2) * REMOTE_NS


def test_per_node_fifo_uses_each_access_own_size():
    model, queue = make(**{"memory-type": "PER_NODE_MEMORY_EXPANSION", "num-npus-per-node": 4,
                           "remote-mem-latency": 10, "remote-mem-bw": 1})
    done = run(model, queue, [(2, mem_node(1, 1000)), (0, mem_node(2, 10))])
    assert done == {(2, 1): 1010, (0, 2): 1010 + 20}


def test_per_npu_accesses_never_queue():
    model, queue = make(**{"memory-type": "PER_NPU_MEMORY_EXPANSION", **REMOTE})
    done = run(model, queue, [(r, mem_node(r, SIZE)) for r in range(4)] + [(0, mem_node(9, SIZE))])
    assert set(done.values()) == {REMOTE_NS}
    assert model.summary()["remote_queueing_delay_ns"] == 0


def test_num_nodes_must_cover_the_ranks():
    with pytest.raises(SimulationError, match="num-nodes 1"):
        make(num_ranks=4, **{"memory-type": "PER_NODE_MEMORY_EXPANSION", "num-nodes": 1,
                             "num-npus-per-node": 2, **REMOTE})
    make(num_ranks=4, **{"memory-type": "PER_NODE_MEMORY_EXPANSION", "num-nodes": 2,
                         "num-npus-per-node": 2, **REMOTE})


# mem_location attribute ---------------------------------------------------------------------------
def test_mem_location_local_bypasses_the_pool():
    model, queue = make(bandwidth_gbps=1000.0, **{"memory-type": "MEMORY_POOL", **REMOTE})
    done = run(model, queue, [(0, mem_node(1, SIZE)), (1, mem_node(2, SIZE, location="local")),
                              (2, mem_node(3, SIZE, location="remote"))])
    assert done == {(0, 1): REMOTE_NS, (1, 2): int(SIZE / 1000.0), (2, 3): 2 * REMOTE_NS}
    summary = model.summary()
    assert (summary["local_accesses"], summary["remote_accesses"]) == (1, 2)


def test_mem_location_remote_needs_an_expansion():
    model, queue = make()
    with pytest.raises(SimulationError, match=r"rank 1, node 4 .*NO_MEMORY_EXPANSION"):
        model.access(1, mem_node(4, SIZE, location="remote"), lambda i: None)


def test_mem_location_rejects_other_values():
    model, _ = make(**{"memory-type": "MEMORY_POOL", **REMOTE})
    with pytest.raises(SimulationError, match="'cxl'"):
        model.access(0, mem_node(4, SIZE, location="cxl"), lambda i: None)


# Errors and statistics ----------------------------------------------------------------------------
def test_missing_tensor_size_names_rank_and_node():
    model, queue = make()
    with pytest.raises(SimulationError, match=r"rank 2, node 42 .*tensor_size"):
        model.access(2, mem_node(42, None), lambda i: None)
    assert len(queue) == 0


def test_summary_counts_loads_and_stores_per_rank():
    model, queue = make(num_ranks=2)
    run(model, queue, [(0, mem_node(1, 100)), (0, mem_node(2, 30, store=True)),
                       (1, mem_node(1, 5, store=True)), (1, mem_node(2, 7))])
    # the memory nodes list no tensors: their peak is unknown, not 0 B
    assert model.rank_summary(0) == {"memory_bytes_loaded": 100, "memory_bytes_stored": 30,
                                     "peak_memory_bytes": None, "peak_memory_ns": None}
    assert model.rank_summary(1) == {"memory_bytes_loaded": 7, "memory_bytes_stored": 5,
                                     "peak_memory_bytes": None, "peak_memory_ns": None}
    summary = model.summary()
    assert (summary["accesses"], summary["bytes_loaded"], summary["bytes_stored"]) == (4, 107, 35)


def test_capacity_is_reported_in_bytes():
    queue = EventQueue()
    context = LayerContext(num_ranks=1, scheduler=queue)
    model = HBMMemory(HBMConfig(capacity_gib=80), context)
    assert context.warnings == []     # tracked tensors are checked against it
    assert (model.summary()["capacity_gib"], model.summary()["capacity_bytes"]) == (80, 80 << 30)


def test_capacity_without_tracking_warns_that_nothing_checks_it():
    context = LayerContext(num_ranks=1, scheduler=EventQueue())
    model = HBMMemory(HBMConfig(capacity_gib=80, track_tensors=False), context)
    assert model.tracks_tensors is False
    assert model.rank_summary(0)["peak_memory_bytes"] is None
    assert model.summary()["memory_series"] == {}
    assert any("capacity_gib" in w and "track_tensors" in w for w in context.warnings)


# Config -------------------------------------------------------------------------------------------
def test_config_accepts_astra_remote_memory_json_keys():
    astra = {"memory-type": "PER_NODE_MEMORY_EXPANSION", "remote-mem-latency": 500,
             "remote-mem-bw": 32, "num-nodes": 2, "num-npus-per-node": 8}
    config = HBMConfig.model_validate(astra)
    assert (config.memory_type, config.remote_mem_latency, config.remote_mem_bw,
            config.num_nodes, config.num_npus_per_node) == ("PER_NODE_MEMORY_EXPANSION", 500, 32, 2, 8)
    snake = HBMConfig.model_validate({k.replace("-", "_"): v for k, v in astra.items()})
    assert snake == config


def test_config_rejects_unknown_keys():
    with pytest.raises(ValidationError, match="remote-mem-bandwidth"):
        HBMConfig.model_validate({"remote-mem-bandwidth": 10})


@pytest.mark.parametrize("settings, key", [
    ({"memory-type": "CXL"}, "memory-type"),
    ({"bandwidth_gbps": 0}, "bandwidth_gbps"),
    ({"latency_ns": -1}, "latency_ns"),
    ({"memory-type": "MEMORY_POOL"}, "remote-mem-bw"),
    ({"memory-type": "PER_NODE_MEMORY_EXPANSION", "remote-mem-bw": 1}, "num-npus-per-node"),
    ({"memory-type": "MEMORY_POOL", "remote-mem-bw": 1, "remote-mem-latency": 1.5}, "remote-mem-latency"),
    ({"channels": 0}, "channels"),
    ({"pool_sharing": "lifo"}, "pool_sharing"),
    ({"lifetime": "never"}, "lifetime"),
    ({"oom": "ignore"}, "oom"),
    ({"series_points": 3}, "series_points"),
    ({"bandwidth_gbps": float("inf")}, "bandwidth_gbps"),
    ({"capacity_gib": 0}, "capacity_gib"),
])
def test_config_rejects_bad_values_naming_the_key(settings, key):
    with pytest.raises(ValidationError, match=key):
        HBMConfig.model_validate(settings)


def test_every_key_is_documented():
    for name, info in HBMConfig.model_fields.items():
        assert info.description, name


# Registration -------------------------------------------------------------------------------------
def test_registered_through_the_hook():
    """The installed entry point (pip install -e plugins/memory_hbm) provides `hbm`."""
    import importlib.metadata

    from chakra_core.plugins import make_plugin_host

    try:
        importlib.metadata.distribution("chakra-sim-memory-hbm")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("chakra-sim-memory-hbm is not installed")
    host = make_plugin_host()
    impl = host.get("memory", "hbm")
    assert impl.cls is HBMMemory
    assert impl.plugin.name == "memory_hbm"
    assert impl.plugin.distribution == "chakra-sim-memory-hbm"


def test_hook_registers_in_process():
    """Without relying on the installed entry point: the module itself is a valid plugin."""
    import chakra_sim_memory_hbm
    from chakra_core.plugins import make_plugin_host

    host = make_plugin_host(entry_points=[], extra_plugins=[("hbm-test", chakra_sim_memory_hbm)])
    assert host.get("memory", "hbm").cls is HBMMemory


# Through the engine -------------------------------------------------------------------------------
def test_end_to_end_with_an_astra_remote_memory_file(tmp_path, installed_plugins):
    """A manifest loads ASTRA-sim's remote-memory JSON as is; both ranks' loads queue in the pool."""
    import json

    from chakra_core import write_trace
    from chakra_core.run import load as load_config
    from chakra_core.run import simulate

    host = installed_plugins
    for rank in range(2):
        load = pb.Node(id=1, name="load", type=pb.MEM_LOAD_NODE,
                       attr=[pb.AttributeProto(name="tensor_size", uint64_val=SIZE)])
        store = pb.Node(id=2, name="store", type=pb.MEM_STORE_NODE, data_deps=[1],
                        attr=[pb.AttributeProto(name="tensor_size", uint64_val=SIZE),
                              pb.AttributeProto(name="mem_location", string_val="local")])
        write_trace(tmp_path / f"trace.{rank}.et", pb.GlobalMetadata(version="0.0.4"), [load, store])
    (tmp_path / "mem.json").write_text(json.dumps({"memory-type": "MEMORY_POOL", **REMOTE}))
    manifest = {
        "workload": {"trace": "trace"},
        "memory": {"plugin": "hbm", "astra_file": "mem.json", "bandwidth_gbps": 1000.0},
        "network": {"plugin": "analytical", "topology": ["Ring"], "npus_count": [2],
                    "bandwidth": [50.0], "latency": [500.0]},
    }
    results = simulate(load_config(manifest, host, base_dir=tmp_path, name="test.yml"), host).document
    local_ns = int(SIZE / 1000.0)
    assert [r["finish_ns"] for r in results["ranks"]] == [REMOTE_NS + local_ns, 2 * REMOTE_NS + local_ns]
    assert results["ranks"][1]["hbm"]["memory_bytes_loaded"] == SIZE
    assert results["ranks"][1]["hbm"]["memory_bytes_stored"] == SIZE
    summary = results["layers"]["memory"]["summary"]
    assert (summary["remote_accesses"], summary["local_accesses"]) == (2, 2)
    assert summary["remote_queueing_delay_ns"] == REMOTE_NS
    (warning,) = results["warnings"]     # the memory nodes list no tensors: no peak memory
    assert "no node listed a device tensor" in warning
