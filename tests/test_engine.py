"""The event queue and the per-rank workload driver."""

from __future__ import annotations

import json

import pytest

from chakra_core.engine.events import EventQueue
from chakra_core.errors import DeadlockError, PluginError, SimulationError
from chakra_core.contract.hookspecs import hookimpl
from chakra_core.contract.layers import ComputeModel, PluginConfig
from chakra_core.schema import pb
from tests.helpers import make_node
from tests.simhelpers import collective, comp, manifest, ring_network, simulate, write_ranks


# Event queue ---------------------------------------------------------------------------------
def test_events_run_in_time_order_and_fifo_at_equal_times():
    queue, seen = EventQueue(), []
    queue.schedule(5, seen.append, "b")
    queue.schedule(1, seen.append, "a")
    queue.schedule(5, seen.append, "c")
    queue.schedule_at(5, seen.append, "d")
    queue.run()
    assert seen == ["a", "b", "c", "d"]
    assert queue.now == 5 and queue.executed == 4


@pytest.mark.parametrize("delay", [-1, 1.5, "3"])
def test_schedule_rejects_bad_delays(delay):
    with pytest.raises(SimulationError, match="non-negative int"):
        EventQueue().schedule(delay, print)


def test_schedule_at_rejects_the_past():
    queue = EventQueue()
    queue.schedule(10, lambda _: queue.schedule_at(3, print))
    with pytest.raises(SimulationError, match=">= now"):
        queue.run()


def test_a_cancelled_event_does_not_run_and_its_empty_instant_is_skipped():
    queue, seen = EventQueue(), []
    moved, stays = ("moved",), ("stays",)
    queue.schedule(5, seen.append, moved)
    queue.schedule(7, seen.append, stays)
    queue.schedule(7, seen.append, ("also",))
    queue.cancel(5, seen.append, moved)
    queue.schedule_at(9, seen.append, moved)
    assert len(queue) == 3
    queue.run()
    assert seen == [stays, ("also",), moved] and queue.executed == 3 and queue.now == 9
    with pytest.raises(SimulationError, match="no event"):
        queue.cancel(12, seen.append, moved)   # never scheduled there
    scheduled = ["late"]
    queue.schedule(3, seen.append, scheduled)
    with pytest.raises(SimulationError, match="no event"):
        queue.cancel(12, seen.append, ["late"])   # an equal argument is not the one scheduled


# Driver: resources and ordering ------------------------------------------------------------------
def _run(tmp_path, ranks, **kwargs):
    prefix = write_ranks(tmp_path / "t", ranks)
    return simulate(manifest(prefix, ring_network(len(ranks)), **kwargs))


def test_gpu_kernels_serialise_by_default_and_overlap_with_more_slots(tmp_path):
    nodes = [comp(1, 10), comp(2, 20)]
    assert _run(tmp_path, [nodes, nodes])["finish_ns"] == 30_000
    wide = _run(tmp_path / "w", [nodes, nodes], resources={"gpu": 2})
    assert wide["finish_ns"] == 20_000


def test_cpu_and_gpu_operations_overlap(tmp_path):
    nodes = [comp(1, 10, is_cpu_op=True), comp(2, 20)]
    results = _run(tmp_path, [nodes, nodes])
    assert results["finish_ns"] == 20_000
    rank = results["ranks"][0]
    # the CPU operation ran under the GPU kernel: no CPU-only time
    assert (rank["gpu_compute_ns"], rank["cpu_compute_ns"], rank["compute_ns"]) == (20_000, 0, 20_000)


def test_dependencies_order_execution_and_zero_duration_takes_one_ns(tmp_path):
    nodes = [comp(1, 10), comp(2, 0, deps=[1]), make_node(3, pb.COMP_NODE, ctrl_deps=[2], duration_micros=5)]
    results = _run(tmp_path, [nodes, nodes])
    assert results["finish_ns"] == 10_000 + 1 + 5_000


def test_metadata_invalid_and_storage_nodes_take_no_time_and_are_counted(tmp_path):
    nodes = [make_node(1, pb.METADATA_NODE), make_node(2, pb.INVALID_NODE, data_deps=[1]),
             make_node(3, pb.STORAGE_NODE, data_deps=[2]), comp(4, 3, deps=[3])]
    results = _run(tmp_path, [nodes, nodes])
    assert results["finish_ns"] == 3_000
    assert results["ranks"][0]["node_counts"] == {
        "COMP_NODE": 1, "INVALID_NODE": 1, "METADATA_NODE": 1, "STORAGE_NODE": 1}


def test_exposed_communication_excludes_time_hidden_behind_compute(tmp_path):
    # The all-reduce (node 1) overlaps a long kernel (node 2): nothing is exposed.
    long_kernel = [collective(1, pb.ALL_REDUCE, 1 << 20), comp(2, 1000)]
    results = _run(tmp_path, [long_kernel] * 2, system={"preferred-dataset-splits": 1})
    rank = results["ranks"][0]
    assert rank["finish_ns"] == 1_000_000
    assert rank["exposed_comm_ns"] == 0 < rank["comm_ns"]
    # Alone, the same all-reduce is fully exposed.
    alone = _run(tmp_path / "alone", [[collective(1, pb.ALL_REDUCE, 1 << 20)]] * 2)
    assert alone["ranks"][0]["exposed_comm_ns"] == alone["finish_ns"] > 0


def test_collectives_wait_for_the_comm_slot_in_id_order(tmp_path):
    one = _run(tmp_path / "one", [[collective(1, pb.ALL_REDUCE, 4096)]] * 2)["finish_ns"]
    two = _run(tmp_path / "two", [[collective(1, pb.ALL_REDUCE, 4096),
                                   collective(2, pb.ALL_REDUCE, 4096)]] * 2)["finish_ns"]
    assert two == 2 * one


def test_results_are_deterministic(tmp_path):
    ranks = [[comp(1, 3), collective(2, pb.ALL_GATHER, 12345, deps=[1]), comp(3, 1, deps=[2])]] * 4
    first = json.dumps(_run(tmp_path / "a", ranks))
    again = json.dumps(_run(tmp_path / "a", ranks))
    assert first == again


# Errors ------------------------------------------------------------------------------------------
def test_deadlock_reports_the_collective_and_the_missing_ranks(tmp_path):
    ranks = [[collective(1, pb.ALL_REDUCE, 1024)], [comp(1, 1)], [collective(1, pb.ALL_REDUCE, 1024)],
             [comp(1, 1)]]
    with pytest.raises(DeadlockError) as info:
        _run(tmp_path, ranks)
    message = str(info.value)
    assert "rank 0" in message and "rank 2" in message
    assert "ALL_REDUCE" in message and "rank(s) 1, 3" in message
    assert set(info.value.unfinished) == {0, 2}


def test_deadlock_reports_a_receive_without_send(tmp_path):
    recv = make_node(1, pb.COMM_RECV_NODE, attrs={"comm_src": 1, "comm_size": 64, "comm_tag": 7})
    with pytest.raises(DeadlockError, match="from rank 1 with tag 7"):
        _run(tmp_path, [[recv], [comp(1, 1)]])


def test_mismatched_collectives_are_an_error(tmp_path):
    with pytest.raises(SimulationError, match="collectives do not match.*ALL_GATHER.*ALL_REDUCE"):
        _run(tmp_path, [[collective(1, pb.ALL_REDUCE, 1024)], [collective(1, pb.ALL_GATHER, 1024)]])


def test_memory_node_without_memory_model_is_an_error(tmp_path):
    load = make_node(1, pb.MEM_LOAD_NODE, attrs={"tensor_size": 64})
    with pytest.raises(SimulationError, match="no memory model is selected"):
        _run(tmp_path, [[load], [load]])


def test_rank_count_must_match_the_network(tmp_path):
    prefix = write_ranks(tmp_path / "t", [[comp(1, 1)]] * 2)
    with pytest.raises(SimulationError, match="2 rank.*4 NPUs"):
        simulate(manifest(prefix, ring_network(4)))


class _Boom(ComputeModel):
    name = "boom"
    fidelity = "raises on the third node"
    Config = PluginConfig

    def compute_time_ns(self, rank, node):
        if node.id == 3:
            raise ZeroDivisionError("bad kernel")
        return 1


class _BoomPlugin:
    @hookimpl
    def chakra_sim_register_compute(self, registry):
        registry.add(_Boom)


def test_a_plugin_that_raises_is_named(tmp_path):
    prefix = write_ranks(tmp_path / "t", [[comp(1, 1), comp(2, 1), comp(3, 1)]] * 2)
    with pytest.raises(PluginError, match=r"plugin 'boom-plugin'.*ZeroDivisionError: bad kernel"):
        simulate(manifest(prefix, ring_network(2), compute={"plugin": "boom"}),
                 extra_plugins=[("boom-plugin", _BoomPlugin())])


class _NodeLog:
    def __init__(self):
        self.seen = []

    @hookimpl
    def chakra_sim_node_finished(self, rank, node, start_ns, end_ns):
        self.seen.append((rank, node.id, start_ns, end_ns))


class _RunLog:
    def __init__(self):
        self.calls = []

    @hookimpl
    def chakra_sim_simulation_start(self, run):
        self.calls.append(("start", run["num_ranks"]))

    @hookimpl
    def chakra_sim_simulation_end(self, run, results):
        self.calls.append(("end", results["finish_ns"]))
        return {"seen": len(self.calls), "ranks": (0, 1)}


def test_observer_hooks_see_every_node_and_the_run(tmp_path):
    prefix = write_ranks(tmp_path / "t", [[comp(1, 2), comp(2, 3, deps=[1])]] * 2)
    nodes, runs = _NodeLog(), _RunLog()
    results = simulate(manifest(prefix, ring_network(2)), extra_plugins=[("nodes", nodes), ("runs", runs)])
    assert sorted(nodes.seen) == [(0, 1, 0, 2000), (0, 2, 2000, 5000), (1, 1, 0, 2000), (1, 2, 2000, 5000)]
    assert runs.calls == [("start", 2), ("end", 5000)]
    # What the end hook returns is stored under its plugin's name, as results.json will hold it.
    assert results["plugins"] == {"runs": {"seen": 2, "ranks": [0, 1]}}


def test_without_observer_returns_there_is_no_plugins_key(tmp_path):
    prefix = write_ranks(tmp_path / "t", [[comp(1, 2)]] * 2)
    assert "plugins" not in simulate(manifest(prefix, ring_network(2)), extra_plugins=[("nodes", _NodeLog())])


# Restarts: a layer asks, the loop stops, every layer is built again with the hint ------------------
class _Hint:
    pass


class _Replanning(ComputeModel):
    """Asks for a restart at its first kernel until the run hands it a hint; counts attempts."""

    name, fidelity, Config = "replanning", "for tests", PluginConfig
    attempts: list[tuple[int, bool]] = []
    always = False

    def __init__(self, config, context):
        super().__init__(config, context)
        self.hinted = bool(context.inputs.hints(_Hint))
        type(self).attempts.append((len(context.inputs.restart_hints), context.inputs.closed_form))

    def compute_time_ns(self, rank, node):
        if not self.hinted or self.always:
            self.context.request_restart("replanning wants another go", _Hint())
            return 1 / 0      # whatever follows a request is thrown away, errors included
        return 7


class _ReplanningPlugin:
    @hookimpl
    def chakra_sim_register_compute(self, registry):
        registry.add(_Replanning)


def test_a_restart_request_stops_the_attempt_and_hands_the_hint_to_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr(_Replanning, "attempts", [])
    prefix = write_ranks(tmp_path, [[comp(1, 5), comp(2, 5, deps=[1])]] * 2)
    results = simulate(manifest(prefix, ring_network(2), compute={"plugin": "replanning"}, fold="off"),
                       extra_plugins=[("replanning", _ReplanningPlugin())])
    assert _Replanning.attempts == [(0, True), (1, True)]
    assert results["finish_ns"] == 14
    assert results["warnings"] == ["the run started over (1 time(s)): replanning wants another go"]


def test_a_layer_that_always_asks_to_start_over_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(_Replanning, "attempts", [])
    monkeypatch.setattr(_Replanning, "always", True)
    prefix = write_ranks(tmp_path, [[comp(1, 5)]] * 2)
    with pytest.raises(SimulationError, match="started over 9 times and a layer still asks to start over: "
                                              "replanning wants another go"):
        simulate(manifest(prefix, ring_network(2), compute={"plugin": "replanning"}, fold="off"),
                 extra_plugins=[("replanning", _ReplanningPlugin())])
    assert [closed_form for _, closed_form in _Replanning.attempts] == [True] * 8 + [False, False]


def test_stop_ends_the_loop_after_the_running_callback():
    queue = EventQueue()
    seen = []

    def first(_):
        seen.append("first")
        queue.stop()
        queue.schedule(0, lambda _: seen.append("after stop"))

    queue.schedule(5, first)
    queue.schedule(5, lambda _: seen.append("same instant"))
    queue.schedule(9, lambda _: seen.append("later"))
    queue.run()
    assert seen == ["first"] and len(queue) == 0
