"""Collective algorithms, multi-dimensional phases, every collective type, deadlock freedom."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core.engine.events import EventQueue
from chakra_core.errors import SimulationError
from chakra_core.contract.hookspecs import hookimpl
from chakra_core.contract.network import Dimension, NetworkModel
from chakra_core.contract.layers import PluginConfig
from chakra_core.schema import pb
from chakra_core.system.native.algorithms import (Chain, Direct, DoubleBinaryTree, HalvingDoubling, Ring, Star, resolve_algorithm)
from chakra_core.contract.algorithm import PhaseContext
from chakra_core.system.native.tree_machines import binary_tree
from chakra_core.system.native.runner import IsolatedPhase, NetworkPhase
from tests.simhelpers import PairDelayNetwork, collective, comp, hop_ns, manifest, simulate, write_ranks

AR, AG, RS, A2A = pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL


def network(topology, npus, bandwidth, latency):
    return {"plugin": "analytical", "topology": topology, "npus_count": npus,
            "bandwidth": bandwidth, "latency": latency}


def one_run(tmp_path, comm_type, n, size, algorithm, net=None, **system):
    prefix = write_ranks(tmp_path, [[collective(1, comm_type, size)]] * n)
    field = {AR: "all-reduce-implementation", AG: "all-gather-implementation",
             RS: "reduce-scatter-implementation", A2A: "all-to-all-implementation"}.get(comm_type)
    settings_ = {"preferred-dataset-splits": 1, **system}
    if field:
        settings_[field] = [algorithm]
    net = net or network(["FullyConnected"], [n], [50.0], [500.0])
    return simulate(manifest(prefix, net, system=settings_))


# Closed forms, one dimension, one chunk, every member starting together ----------------------------
params = dict(k=st.integers(1, 4), size=st.integers(1 << 10, 1 << 22), bandwidth=st.floats(5, 500),
              latency=st.floats(0, 3000), endpoint=st.integers(0, 50), mem_bw=st.floats(50, 5000))


@settings(max_examples=12, deadline=None)
@given(**params)
def test_direct_closed_forms(tmp_path_factory, k, size, bandwidth, latency, endpoint, mem_bw):
    n = 2 ** k + 1   # any n works for direct
    net = network(["FullyConnected"], [n], [bandwidth], [latency])
    E, piece = endpoint, size // n

    def d(b):
        return hop_ns(b, bandwidth, latency)

    def R(b):
        return 3 * int(b / mem_bw)

    expected = {A2A: 2 * E + d(piece), RS: 2 * E + d(piece) + R(piece), AG: 2 * E + d(size),
                AR: 3 * E + 2 * d(piece) + R(piece)}
    for comm_type, value in expected.items():
        tmp = tmp_path_factory.mktemp("direct")
        got = one_run(tmp, comm_type, n, size, "direct", net, **{"endpoint-delay": E, "local-mem-bw": mem_bw})
        assert got["finish_ns"] == value, pb.CollectiveCommType.Name(comm_type)


@settings(max_examples=12, deadline=None)
@given(**params)
def test_halving_doubling_closed_forms(tmp_path_factory, k, size, bandwidth, latency, endpoint, mem_bw):
    n = 2 ** k
    size = (size >> (k + 1)) << (k + 1)   # halvings stay exact (ASTRA-sim truncates odd sizes)
    net = network(["FullyConnected"], [n], [bandwidth], [latency])
    E = endpoint

    def d(b):
        return hop_ns(b, bandwidth, latency)

    def R(b):
        return 3 * int(b / mem_bw)

    halves = [size // 2 ** j for j in range(1, k + 1)]          # S/2, S/4, ..., S/2^k
    # Reduce-scatter: k exchanges of halving size; the data of exchanges 1..k-1 is reduced before
    # it is forwarded (ASTRA-sim's packet accounting leaves the last one unreduced).
    rs = E + sum(d(b) + E for b in halves) + sum(R(b) for b in halves[1:])
    ag = E + sum(d(size * 2 ** j) + E for j in range(k))
    ar = E + 2 * sum(d(b) + E for b in halves) + sum(R(b) for b in halves[1:])
    for comm_type, value in {RS: rs, AG: ag, AR: ar}.items():
        tmp = tmp_path_factory.mktemp("hd")
        got = one_run(tmp, comm_type, n, size, "halvingDoubling", net,
                      **{"endpoint-delay": E, "local-mem-bw": mem_bw})
        assert got["finish_ns"] == value, pb.CollectiveCommType.Name(comm_type)


@settings(max_examples=12, deadline=None)
@given(**params)
def test_double_binary_tree_closed_form(tmp_path_factory, k, size, bandwidth, latency, endpoint, mem_bw):
    n = 2 ** k
    net = network(["FullyConnected"], [n], [bandwidth], [latency])
    E, d, R = endpoint, hop_ns(size, bandwidth, latency), 3 * int(size / mem_bw)
    # Up the tree (k hops to the root, each d + E + R), down again (k-1 hops), then the leaves.
    expected = 2 * E + (2 * k - 1) * (d + E + R) + d
    tmp = tmp_path_factory.mktemp("dbt")
    got = one_run(tmp, AR, n, size, "doubleBinaryTree", net, **{"endpoint-delay": E, "local-mem-bw": mem_bw})
    assert got["finish_ns"] == expected
    # The root finishes first: after the reduction reached it and it sent the result down.
    assert min(r["finish_ns"] for r in got["ranks"]) == E + k * (d + E + R)


def test_binary_trees_match_astra_sims_layout():
    tree = binary_tree(8, root_max=True)
    assert tree[7] == (-1, 3, -1)                      # root: highest id, one child
    assert tree[3] == (7, 1, 5) and tree[1] == (3, 0, 2) and tree[0] == (1, -1, -1)
    low = binary_tree(8, root_max=False)
    assert low[0] == (-1, -1, 4) and low[4] == (0, 2, 6)


# Multi-dimensional decomposition ------------------------------------------------------------------------
def ring_time(comm_type, n, size, bandwidth, latency, hops=1, E=10, mem_bw=1600.0):
    d_piece, d_whole = hop_ns(size // n, bandwidth, latency, hops), hop_ns(size, bandwidth, latency, hops)
    R = 3 * int((size // n) / mem_bw)
    return {AR: E + 2 * (n - 1) * (d_piece + E) + (n - 1) * R,
            RS: E + (n - 1) * (d_piece + E + R),
            AG: E + (n - 1) * (d_whole + E)}[comm_type]


def test_two_dimensional_all_reduce_is_reduce_scatter_all_reduce_all_gather(tmp_path):
    net = network(["Ring", "Switch"], [4, 4], [200.0, 50.0], [100.0, 1000.0])
    size = 1 << 20
    got = one_run(tmp_path / "bw", AR, 16, size, "ring", net, **{"collective-optimization": "localBWAware"})
    expected = (ring_time(RS, 4, size, 200.0, 100.0) + ring_time(AR, 4, size // 4, 50.0, 1000.0, hops=2)
                + ring_time(AG, 4, size // 4, 200.0, 100.0))
    assert got["finish_ns"] == expected
    baseline = one_run(tmp_path / "base", AR, 16, size, "ring", net, **{"collective-optimization": "baseline"})
    assert baseline["finish_ns"] == (ring_time(AR, 4, size, 200.0, 100.0)
                                     + ring_time(AR, 4, size, 50.0, 1000.0, hops=2))


def test_all_gather_runs_the_dimensions_in_reverse(tmp_path):
    net = network(["Ring", "Switch"], [4, 4], [200.0, 50.0], [100.0, 1000.0])
    size = 1 << 16
    got = one_run(tmp_path, AG, 16, size, "ring", net)
    # Last dimension first with each rank's input, then dimension 0 with 4x the data.
    assert got["finish_ns"] == (ring_time(AG, 4, size, 50.0, 1000.0, hops=2)
                                + ring_time(AG, 4, 4 * size, 200.0, 100.0))


def test_involved_dim_restricts_the_phases(tmp_path):
    net = network(["Ring", "Switch"], [4, 4], [200.0, 50.0], [100.0, 1000.0])
    size = 1 << 20
    node = collective(1, AR, size)
    node.attr.add(name="involved_dim").bool_list.values.extend([True, False])
    prefix = write_ranks(tmp_path, [[node]] * 16)
    got = simulate(manifest(prefix, net, system={"preferred-dataset-splits": 1}))
    assert got["finish_ns"] == ring_time(AR, 4, size, 200.0, 100.0)


def test_one_variants_treat_all_npus_as_one_ring(tmp_path):
    net = network(["Ring", "Switch"], [4, 4], [200.0, 50.0], [100.0, 1000.0])
    flat = one_run(tmp_path / "one", AR, 16, 1 << 20, "oneRing", net)["finish_ns"]
    # One 16-member ring over ranks 0..15. Neighbours i and i+1 always differ in their
    # dimension-0 coordinate (3 -> 4 is (3,0) -> (0,1)), and the network routes a message in the
    # first dimension that differs: every hop is one dimension-0 ring hop.
    piece = (1 << 20) // 16
    expected = 10 + 30 * (hop_ns(piece, 200.0, 100.0) + 10) + 15 * 3 * int(piece / 1600)
    assert flat == expected


def test_algorithm_names_with_a_window():
    available = {"direct": Direct, "ring": Ring}
    assert resolve_algorithm("direct4", available).value == 4
    assert resolve_algorithm("ring4", available) is None
    assert resolve_algorithm("direct", available).value is None


def test_windowed_direct_is_slower_than_unlimited(tmp_path):
    size, n = 1 << 20, 8
    unlimited = one_run(tmp_path / "u", A2A, n, size, "direct")["finish_ns"]
    window2 = one_run(tmp_path / "w", A2A, n, size, "direct2")["finish_ns"]
    assert window2 > unlimited


def test_power_of_two_algorithms_reject_other_sizes(tmp_path):
    with pytest.raises(SimulationError, match="power-of-two number of members, not 6"):
        one_run(tmp_path, AR, 6, 1 << 16, "halvingDoubling")


def test_halving_doubling_all_to_all_is_rejected_only_when_used(tmp_path):
    system = {"all-to-all-implementation": ["halvingDoubling"]}
    ok = one_run(tmp_path / "ar", AR, 4, 1 << 16, "ring", **system)
    assert ok["finish_ns"] > 0
    with pytest.raises(SimulationError, match="'halvingDoubling' does not implement ALL_TO_ALL"):
        one_run(tmp_path / "a2a", A2A, 4, 1 << 16, "halvingDoubling")


# Every collective type -------------------------------------------------------------------------------
def rooted_run(tmp_path, comm_type, n, size, algorithm, root=None):
    attrs = {} if root is None else {"root_rank": root}
    prefix = write_ranks(tmp_path, [[collective(1, comm_type, size, **attrs)]] * n)
    field = {pb.BROADCAST: "broadcast", pb.REDUCE: "reduce", pb.GATHER: "gather",
             pb.SCATTER: "scatter"}[comm_type] + "-implementation"
    return simulate(manifest(prefix, network(["FullyConnected"], [n], [50.0], [500.0]),
                             system={"preferred-dataset-splits": 1, field: [algorithm]}))


@pytest.mark.parametrize("n", [2, 5])
def test_rooted_collectives_closed_forms(tmp_path, n):
    size, E = 1 << 16, 10
    d, R = hop_ns(size), 3 * int(size / 1600)
    cases = {
        (pb.BROADCAST, "star"): 2 * E + d,                          # root -> all, then E at each
        (pb.BROADCAST, "chain"): E + (n - 1) * (d + E),             # pipelined hop by hop
        (pb.REDUCE, "star"): 2 * E + d + R,
        (pb.REDUCE, "chain"): E + (n - 1) * (d + E + R),
        (pb.GATHER, "star"): 2 * E + d,
        (pb.GATHER, "chain"): E + sum(hop_ns(size * m) + E for m in range(1, n)),
        (pb.SCATTER, "star"): 2 * E + d,
        (pb.SCATTER, "chain"): E + sum(hop_ns(size * m) + E for m in range(n - 1, 0, -1)),
    }
    for (comm_type, algorithm), expected in cases.items():
        got = rooted_run(tmp_path / f"{comm_type}{algorithm}", comm_type, n, size, algorithm)
        assert got["finish_ns"] == expected, (pb.CollectiveCommType.Name(comm_type), algorithm)


def test_root_attribute_and_errors(tmp_path):
    got = rooted_run(tmp_path / "r", pb.BROADCAST, 4, 4096, "star", root=2)
    finish = [r["finish_ns"] for r in got["ranks"]]
    assert finish[2] == min(finish) < finish[0]      # the root only sends
    with pytest.raises(SimulationError, match="root 9 .* is not a member"):
        rooted_run(tmp_path / "bad", pb.BROADCAST, 4, 4096, "star", root=9)


def test_barrier_and_reduce_scatter_block(tmp_path):
    barrier = one_run(tmp_path / "b", pb.BARRIER, 4, 0, "ring")
    # a zero-byte ring all-reduce: 2(n-1) latency-only steps
    assert barrier["finish_ns"] == 10 + 6 * (500 + 10)
    block = one_run(tmp_path / "rsb", pb.REDUCE_SCATTER_BLOCK, 4, 1 << 16, "ring")
    plain = one_run(tmp_path / "rs", RS, 4, 1 << 16, "ring")
    assert block["finish_ns"] == plain["finish_ns"]


# State machines: isolated and through the network agree -------------------------------------------------
ALGORITHMS = [(Ring(), [AR, AG, RS, A2A]), (Direct(), [AR, AG, RS, A2A]), (Direct(2), [AR, AG, RS, A2A]),
              (HalvingDoubling(), [AR, AG, RS]), (DoubleBinaryTree(), [AR]),
              (Chain(), [pb.BROADCAST, pb.REDUCE, pb.GATHER, pb.SCATTER]),
              (Star(), [pb.BROADCAST, pb.REDUCE, pb.GATHER, pb.SCATTER])]


@settings(max_examples=40, deadline=None)
@given(choice=st.integers(0, len(ALGORITHMS) - 1), k=st.integers(1, 3), size=st.integers(0, 50_000),
       data=st.data())
def test_isolated_and_network_runs_agree(choice, k, size, data):
    algorithm, types = ALGORITHMS[choice]
    comm_type = data.draw(st.sampled_from(types))
    n = 2 ** k
    members = list(range(n))
    starts = data.draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n))
    delays = {(i, j): data.draw(st.integers(0, 2000)) for i in members for j in members}

    def reduce(b):
        return b // 500

    isolated = IsolatedPhase(members, PairDelayNetwork(None, delays, 13).message_delay)
    machines = algorithm.members(PhaseContext(isolated, n, 7, reduce), comm_type, size, 0, 0)
    expected = isolated.run(starts, lambda pos: machines[pos].start())
    assert sorted(expected) == members
    assert min(expected.values()) >= 0

    queue = EventQueue()
    done = {}
    live = NetworkPhase(members, PairDelayNetwork(queue, delays, 13), queue, lambda pos: done.__setitem__(pos, queue.now))
    live_machines = algorithm.members(PhaseContext(live, n, 7, reduce), comm_type, size, 0, 0)
    for pos in members:
        queue.schedule_at(starts[pos], lambda p: live_machines[p].start(), pos)
    queue.run()
    assert done == expected
    assert live.bytes_sent == isolated.bytes_sent


# No deadlock for any combination of splits, active chunks and policy -------------------------------------
class _JitterConfig(PluginConfig):
    seed: int
    dims: list[int]


class _Jitter(NetworkModel):
    """Contention-free, with a random delay per NPU pair: desynchronises ranks the way
    asymmetric fabrics do (astra-sim issue 370)."""

    name, fidelity, Config, contention_free = "jitter", "random per-pair delays", _JitterConfig, True

    def __init__(self, config, context):
        super().__init__(config, context)
        self.dims = tuple(Dimension("Ring", d, 1, 1) for d in config.dims)
        self.npus_count = 1
        for d in config.dims:
            self.npus_count *= d
        rng = random.Random(config.seed)
        self.table = {(i, j): rng.randint(10, 20_000) for i in range(self.npus_count)
                      for j in range(self.npus_count)}

    def message_delay(self, src, dst, size):
        return self.table[(src, dst)] + size // 50

    def send(self, src, dst, size, on_arrival, arg=None):
        self.context.scheduler.schedule(self.message_delay(src, dst, size), on_arrival, arg)


class _JitterPlugin:
    @hookimpl
    def chakra_sim_register_network(self, registry):
        registry.add(_Jitter)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), dims=st.sampled_from([[4, 4], [2, 2, 4], [8]]),
       algorithm=st.sampled_from(["ring", "direct", "halvingDoubling", "doubleBinaryTree"]),
       splits=st.integers(1, 8), active=st.integers(1, 3), policy=st.sampled_from(["LIFO", "FIFO"]))
def test_chunk_scheduling_never_deadlocks(tmp_path_factory, seed, dims, algorithm, splits, active, policy):
    n = 1
    for d in dims:
        n *= d
    nodes = [collective(1, AR, 1 << 20), collective(2, RS, 1 << 18, deps=[1]), collective(3, AG, 1 << 14, deps=[2])]
    prefix = write_ranks(tmp_path_factory.mktemp("jit"), [nodes] * n)
    system = {"all-reduce-implementation": [algorithm], "reduce-scatter-implementation": [algorithm],
              "all-gather-implementation": [algorithm], "preferred-dataset-splits": splits,
              "active-chunks-per-dimension": active, "scheduling-policy": policy,
              "collective-optimization": "localBWAware"}
    results = simulate(manifest(prefix, {"plugin": "jitter", "seed": seed, "dims": dims}, system=system),
                       extra_plugins=[("jitter", _JitterPlugin())])
    assert {r["native"]["collectives"] for r in results["ranks"]} == {3}
    # One collective at a time per rank: the fixed per-dimension order alone prevents cycles.
    assert results["layers"]["system"]["summary"]["oversubscribed_chunk_starts"] == 0


def test_concurrent_collectives_that_would_deadlock_complete_with_a_warning(tmp_path):
    nodes = [collective(1, AR, 1 << 20), collective(2, AG, 1 << 16), collective(3, RS, 1 << 20)]
    prefix = write_ranks(tmp_path, [nodes] * 16)
    system = {"all-reduce-implementation": ["ring"], "all-gather-implementation": ["ring"],
              "reduce-scatter-implementation": ["ring"], "preferred-dataset-splits": 8,
              "active-chunks-per-dimension": 1, "collective-optimization": "localBWAware"}
    results = simulate(manifest(prefix, {"plugin": "jitter", "seed": 3, "dims": [4, 4]}, system=system,
                                resources={"comm": 3}), extra_plugins=[("jitter", _JitterPlugin())])
    assert {r["native"]["collectives"] for r in results["ranks"]} == {3}
    assert results["layers"]["system"]["summary"]["oversubscribed_chunk_starts"] > 0
    assert any("astra-sim issue 370" in w for w in results["warnings"])



@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), dims=st.sampled_from([[4, 4], [2, 2, 4], [8], [2, 4]]),
       algorithm=st.sampled_from(["ring", "direct", "direct2", "halvingDoubling", "doubleBinaryTree"]),
       splits=st.integers(1, 6), active=st.integers(1, 3),
       optimization=st.sampled_from(["localBWAware", "baseline"]),
       skew=st.lists(st.integers(0, 30), min_size=16, max_size=16))
def test_whole_collective_solve_equals_event_by_event(tmp_path_factory, seed, dims, algorithm, splits,
                                                      active, optimization, skew):
    """With one collective in flight per rank, a collective is solved in one step once all its
    members issued it; with two allowed it runs phase by phase on the chunk queues. When the
    trace never has two collectives in flight at once, both must give every rank the same times."""
    n = 1
    for d in dims:
        n *= d
    ranks = []
    for rank in range(n):
        nodes = [comp(1, skew[rank % 16]), collective(2, AR, 1 << 20, deps=[1]),
                 comp(3, skew[(rank + 5) % 16], deps=[2]), collective(4, RS, 1 << 18, deps=[3]),
                 collective(5, AG, 1 << 14, deps=[4]), collective(6, A2A, 1 << 16, deps=[5])]
        ranks.append(nodes)
    prefix = write_ranks(tmp_path_factory.mktemp("whole"), ranks)
    impl = "ring" if algorithm in ("halvingDoubling", "doubleBinaryTree") else algorithm
    system = {"all-reduce-implementation": [algorithm], "reduce-scatter-implementation": [algorithm],
              "all-gather-implementation": [algorithm], "all-to-all-implementation": [impl],
              "preferred-dataset-splits": splits, "active-chunks-per-dimension": active,
              "collective-optimization": optimization}
    network = {"plugin": "jitter", "seed": seed, "dims": dims}
    plugins = [("jitter", _JitterPlugin())]
    solved = simulate(manifest(prefix, network, system=system), extra_plugins=plugins)
    stepped = simulate(manifest(prefix, network, system=system, resources={"comm": 2}), extra_plugins=plugins)
    for key in ("finish_ns", "bytes_sent", "bytes_received", "exposed_network_ns", "waiting_ns"):
        assert [r[key] for r in solved["ranks"]] == [r[key] for r in stepped["ranks"]], key
    assert solved["events"] <= stepped["events"]
