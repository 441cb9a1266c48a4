"""Bandwidth sharing: a rank's concurrent HBM accesses, and `pool_sharing: fair` across NPUs.

Expected times are worked out by hand in each test (bytes / (bytes per ns) = ns).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from chakra_core import pb
from chakra_core.testing import EventQueue
from chakra_sim_memory_hbm.sharing import SharedBandwidth, exact
from hbm_helpers import REMOTE, REMOTE_NS, SIZE, make, mem_node, run

MB = 10**6


def issue_at(model, queue, schedule):
    """schedule: (time ns, rank, node); returns {(rank, node id): completion time}."""
    finished = {}
    for time, rank, node in schedule:
        def go(_, rank=rank, node=node):
            model.access(rank, node, lambda node_id: finished.setdefault((rank, node_id), queue.now))
        queue.schedule_at(time, go)
    queue.run()
    return finished


# Local HBM: processor sharing ----------------------------------------------------------------------
def test_two_concurrent_equal_loads_take_twice_as_long_as_one():
    model, queue = make(bandwidth_gbps=1000.0)
    assert run(model, queue, [(0, mem_node(1, MB))]) == {(0, 1): 1000}
    model, queue = make(bandwidth_gbps=1000.0)
    assert run(model, queue, [(0, mem_node(1, MB)), (0, mem_node(2, MB))]) == {(0, 1): 2000, (0, 2): 2000}
    assert model.summary()["local_sharing_delay_ns"] == 2 * 1000


def test_a_short_access_starting_during_a_long_one():
    """Long 3 MB at t=0 alone at 1000 B/ns until t=1000 (2 MB left); short 1 MB joins: both get
    500 B/ns, the short one ends at 1000 + 2000 = 3000; the long one has 1 MB left and ends at 4000."""
    model, queue = make(bandwidth_gbps=1000.0)
    done = issue_at(model, queue, [(0, 0, mem_node(1, 3 * MB)), (1000, 0, mem_node(2, MB))])
    assert done == {(0, 2): 3000, (0, 1): 4000}
    # 4 MB at 1000 B/ns: the memory never idles, so the last access ends at 4000 either way
    assert model.summary()["local_sharing_delay_ns"] == (4000 - 3000) + (3000 - 1000 - 1000)


def test_ranks_do_not_share_their_hbm():
    model, queue = make(bandwidth_gbps=1000.0)
    assert run(model, queue, [(0, mem_node(1, MB)), (1, mem_node(1, MB))]) == {(0, 1): 1000, (1, 1): 1000}


def test_three_staggered_accesses():
    """A 1 MB at t=0, B 1 MB at t=500, C 2 MB at t=600, on 1000 B/ns.
    0-500: A alone, 0.5 MB. 500-600: A and B at 500 B/ns: A has 0.55 MB, B 0.05 MB.
    600-: three at 1000/3 B/ns: A needs 0.45 MB -> 1350 ns -> t=1950; B then has 0.5 MB, C 0.45 MB.
    1950-: two at 500 B/ns: B needs 0.5 MB -> 1000 ns -> t=2950; C then has 0.95 MB.
    2950-: C alone needs 1.05 MB -> t=4000 (4 MB at 1000 B/ns, never idle)."""
    model, queue = make(bandwidth_gbps=1000.0)
    done = issue_at(model, queue, [(0, 0, mem_node(1, MB)), (500, 0, mem_node(2, MB)),
                                   (600, 0, mem_node(3, 2 * MB))])
    assert done == {(0, 1): 1950, (0, 2): 2950, (0, 3): 4000}


def test_channels_cap_one_access_and_share_beyond():
    """channels 2 at 1000 B/ns: one access gets 500 B/ns; two get 500 each; three get 1000/3 each."""
    for count, expected in ((1, 2000), (2, 2000), (3, 3000)):
        model, queue = make(bandwidth_gbps=1000.0, channels=2)
        done = run(model, queue, [(0, mem_node(i, MB)) for i in range(count)])
        assert set(done.values()) == {expected}, count
    model, _ = make(bandwidth_gbps=1000.0, channels=2)
    assert model.local_time_ns(MB) == 2000


def test_latency_comes_before_the_shared_transfer():
    """Both wait 100 ns, then share: 100 + 2 MB / 1000 B/ns = 2100. A third access issued at
    t=50 is still in its latency until t=150, so it joins the transfer then."""
    model, queue = make(bandwidth_gbps=1000.0, latency_ns=100.0)
    assert run(model, queue, [(0, mem_node(1, MB)), (0, mem_node(2, MB))]) == {(0, 1): 2100, (0, 2): 2100}
    model, queue = make(bandwidth_gbps=1000.0, latency_ns=100.0)
    done = issue_at(model, queue, [(0, 0, mem_node(1, MB)), (50, 0, mem_node(2, MB))])
    # 100-150: first alone (50 KB); 150-: two at 500 B/ns: first has 950 KB left -> t=2050;
    # the second has 50 KB left then, alone -> 50 ns -> t=2100
    assert done == {(0, 1): 2050, (0, 2): 2100}


def test_integer_ns_with_fractional_rates():
    """10 B and 10 B together on 3 B/ns: 1.5 B/ns each, 6.67 ns -> both end at t=6 (whole ns, floor);
    alone 10 B takes int(10/3) = 3 ns."""
    model, queue = make(bandwidth_gbps=3.0)
    assert run(model, queue, [(0, mem_node(1, 10))]) == {(0, 1): 3}
    model, queue = make(bandwidth_gbps=3.0)
    assert run(model, queue, [(0, mem_node(1, 10)), (0, mem_node(2, 10))]) == {(0, 1): 6, (0, 2): 6}


def test_zero_byte_accesses_end_after_their_latency():
    model, queue = make(bandwidth_gbps=1000.0, latency_ns=7.0)
    assert run(model, queue, [(0, mem_node(1, 0)), (0, mem_node(2, 0))]) == {(0, 1): 7, (0, 2): 7}


def test_shared_bandwidth_counts_busy_time_and_ignores_stale_events():
    queue = EventQueue()
    link = SharedBandwidth(queue, Fraction(1000))
    ended = []
    link.start(3 * MB, lambda arg, left: ended.append((arg, queue.now, left)), "long")
    queue.schedule_at(1000, lambda _: link.start(MB, lambda arg, left: ended.append((arg, queue.now, left)),
                                                 "short"))
    queue.run()
    assert ended == [("short", 3000, 0), ("long", 4000, 0)]
    assert link.busy_ns == 4000 and link.transfers == 2
    # the event planned for t=3000 at t=0 (long alone) was superseded; t=3000 was replanned
    assert queue.executed == 1 + 1 + 1 + 1     # start(short), stale(long @3000), short end, long end


def test_exact_reads_the_decimal_the_user_wrote():
    assert exact(819.2, "x") == Fraction(4096, 5)
    assert exact(3, "x") == 3
    with pytest.raises(ValueError, match="finite"):
        exact(float("nan"), "x")


def test_sharing_is_deterministic():
    def once():
        model, queue = make(bandwidth_gbps=777.7, latency_ns=3.3, channels=3)
        sizes = [(i * 7919) % 50_000 + 1 for i in range(40)]
        done = issue_at(model, queue, [(i * 37, i % 2, mem_node(i, size)) for i, size in enumerate(sizes)])
        return sorted(done.items()), model.summary()
    assert once() == once()


# Remote memory: fifo (ASTRA-sim) vs fair ----------------------------------------------------------
FAIR_2 = 100 + int(2 * SIZE / 50)          # two 1 MiB transfers sharing 50 B/ns after 100 ns latency


def test_pool_fifo_vs_fair_across_npus():
    model, queue = make(**{"memory-type": "MEMORY_POOL", **REMOTE})
    assert run(model, queue, [(0, mem_node(1, SIZE)), (3, mem_node(2, SIZE))]) == {
        (0, 1): REMOTE_NS, (3, 2): 2 * REMOTE_NS}
    model, queue = make(**{"memory-type": "MEMORY_POOL", "pool_sharing": "fair", **REMOTE})
    assert run(model, queue, [(0, mem_node(1, SIZE)), (3, mem_node(2, SIZE))]) == {
        (0, 1): FAIR_2, (3, 2): FAIR_2}
    summary = model.summary()
    assert summary["remote_queueing_delay_ns"] == 0
    assert summary["remote_sharing_delay_ns"] == 2 * (FAIR_2 - (100 + int(SIZE / 50)))


def test_fair_pool_short_access_during_a_long_one_from_another_npu():
    """Pool 50 B/ns, latency 100. Rank 0: 100 KB at t=0 (transfer from 100). Rank 1: 10 KB at
    t=900 (transfer from 1000). 100-1000: 45 KB done; then 25 B/ns each: 10 KB -> 400 ns -> t=1400;
    rank 0 then has 100 - 45 - 10 = 45 KB alone -> 900 ns -> t=2300. FIFO would give 2100 and 2300."""
    fair, queue = make(**{"memory-type": "MEMORY_POOL", "pool_sharing": "fair", **REMOTE})
    done = issue_at(fair, queue, [(0, 0, mem_node(1, 100_000)), (900, 1, mem_node(2, 10_000))])
    assert done == {(1, 2): 1400, (0, 1): 2300}
    fifo, queue = make(**{"memory-type": "MEMORY_POOL", **REMOTE})
    done = issue_at(fifo, queue, [(0, 0, mem_node(1, 100_000)), (900, 1, mem_node(2, 10_000))])
    assert done == {(0, 1): 2100, (1, 2): 2100 + 300}


def test_fair_per_node_memory_is_shared_within_a_node_only():
    model, queue = make(**{"memory-type": "PER_NODE_MEMORY_EXPANSION", "num-npus-per-node": 2,
                           "pool_sharing": "fair", **REMOTE})
    done = run(model, queue, [(0, mem_node(1, SIZE)), (1, mem_node(1, SIZE)), (2, mem_node(1, SIZE))])
    assert done == {(0, 1): FAIR_2, (1, 1): FAIR_2, (2, 1): REMOTE_NS}


def test_fair_per_npu_memory_is_shared_by_one_npu_accesses():
    fifo, queue = make(**{"memory-type": "PER_NPU_MEMORY_EXPANSION", **REMOTE})
    assert set(run(fifo, queue, [(0, mem_node(1, SIZE)), (0, mem_node(2, SIZE))]).values()) == {REMOTE_NS}
    fair, queue = make(**{"memory-type": "PER_NPU_MEMORY_EXPANSION", "pool_sharing": "fair", **REMOTE})
    done = run(fair, queue, [(0, mem_node(1, SIZE)), (0, mem_node(2, SIZE)), (1, mem_node(1, SIZE))])
    assert done == {(0, 1): FAIR_2, (0, 2): FAIR_2, (1, 1): REMOTE_NS}


def test_fair_lone_access_uses_exact_arithmetic():
    """ASTRA-sim's float arithmetic makes 15 B at 1 B/ns take 14 ns (fifo keeps that); fair takes 15."""
    settings = {"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-bw": 1}
    fifo, queue = make(**settings)
    assert run(fifo, queue, [(0, mem_node(1, 15))]) == {(0, 1): 14}
    fair, queue = make(pool_sharing="fair", **settings)
    assert run(fair, queue, [(0, mem_node(1, 15))]) == {(0, 1): 15}


def test_mem_location_local_shares_hbm_not_the_pool():
    model, queue = make(bandwidth_gbps=1000.0, **{"memory-type": "MEMORY_POOL", "pool_sharing": "fair",
                                                  **REMOTE})
    done = run(model, queue, [(0, mem_node(1, SIZE)), (0, mem_node(2, SIZE, location="local")),
                              (1, mem_node(3, SIZE))])
    assert done == {(0, 1): FAIR_2, (0, 2): int(SIZE / 1000), (1, 3): FAIR_2}


# Through the engine --------------------------------------------------------------------------------
@pytest.mark.parametrize("resources, finish, sharing_delay", [
    (None, 3000, 0),                 # default: memory ops share the comm slot, one at a time
    ({"memory": 4}, 4000, 2 * 1000),  # a memory slot of 4: both loads in flight, sharing the HBM
])
def test_engine_resources_decide_whether_loads_overlap(tmp_path, installed_plugins, resources, finish,
                                                       sharing_delay):
    """Two independent 1 MB loads at 1000 GB/s and a 2 us kernel after the first load.
    One at a time: load 1 ends at 1000, the kernel runs 1000-3000 (load 2 ends at 2000).
    Overlapping: both loads end at 2000, the kernel runs 2000-4000."""
    from chakra_core.testing import make_node, manifest, uniform_network, simulate, write_ranks

    nodes = [make_node(1, pb.MEM_LOAD_NODE, attrs={"tensor_size": MB}),
             make_node(2, pb.MEM_LOAD_NODE, attrs={"tensor_size": MB}),
             make_node(3, pb.COMP_NODE, data_deps=[1], duration_micros=2)]
    prefix = write_ranks(tmp_path, [nodes])
    workload = {} if resources is None else {"resources": resources}
    results = simulate(manifest(prefix, uniform_network(1), compute={"plugin": "replay"},
                                memory={"plugin": "hbm", "bandwidth_gbps": 1000.0}, **workload),
                       base_dir=tmp_path, host=installed_plugins)
    assert results["ranks"][0]["finish_ns"] == finish
    assert results["layers"]["memory"]["summary"]["local_sharing_delay_ns"] == sharing_delay
