"""Physics every run must obey, for every collective type and algorithm (hypothesis).

Agreeing with ASTRA-sim is not enough: these check the numbers against what
hardware allows.

- Bytes are conserved: what the ranks send, the ranks receive.
- No rank receives data faster than its links deliver it. On the
  congestion-unaware backend (ASTRA-sim's), messages never slow each other
  down, so the bound is per pair of NPUs: the bytes a rank gets from one peer
  take at least bytes / bandwidth (with one chunk in flight per dimension, no
  algorithm may have two messages on one pair at once). On the
  congestion-aware backend links are real: a rank's received bytes take at
  least bytes / (total bandwidth of the links into it), and no link is busy
  longer than the run.
- N back-to-back collectives never take less than the bound for N times the
  data (the bounds above grow with the bytes, so checking them on N
  iterations checks this).
- The per-rank time categories sum to the finish time exactly.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chakra_core.contract.hookspecs import hookimpl
from chakra_core.schema import pb
from tests.simhelpers import GIB, collective, manifest, simulate, write_ranks

BREAKDOWN = ("gpu_compute_ns", "cpu_compute_ns", "memory_ns", "exposed_network_ns", "waiting_ns", "idle_ns")

AR, AG, RS, A2A = pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL
SYMMETRIC = [AR, AG, RS, A2A, pb.BARRIER, pb.REDUCE_SCATTER_BLOCK]
ROOTED = [pb.BROADCAST, pb.REDUCE, pb.GATHER, pb.SCATTER]
# (algorithm, collective types it runs, needs a power-of-two group)
ALGORITHMS = [
    ("ring", SYMMETRIC, False), ("direct", SYMMETRIC, False), ("direct2", SYMMETRIC, False),
    ("halvingDoubling", [AR, AG, RS, pb.BARRIER, pb.REDUCE_SCATTER_BLOCK], True),
    ("doubleBinaryTree", [AR, pb.BARRIER], True),
    ("chain", ROOTED, False), ("star", ROOTED, False),
]
FIELD = {AR: "all-reduce", pb.BARRIER: "all-reduce", AG: "all-gather", RS: "reduce-scatter",
         pb.REDUCE_SCATTER_BLOCK: "reduce-scatter", A2A: "all-to-all", pb.BROADCAST: "broadcast",
         pb.REDUCE: "reduce", pb.GATHER: "gather", pb.SCATTER: "scatter"}


def _recording_plugin():
    """The analytical backend with every message recorded (it then runs message by message)."""
    from chakra_sim_network_analytical.model import AnalyticalNetwork

    class Recording(AnalyticalNetwork):
        name = "recording"
        fidelity = "analytical, recording every message (tests)"

        def __init__(self, config, context):
            super().__init__(config, context)
            self.contention_free = False      # every message through send(), so it is seen
            self.pair_bytes: dict[tuple[int, int], int] = defaultdict(int)

        def send(self, src, dst, size, on_arrival, arg=None):
            self.pair_bytes[(src, dst)] += size
            super().send(src, dst, size, on_arrival, arg)

        def summary(self):
            return {"pair_bytes": [[s, d, b] for (s, d), b in sorted(self.pair_bytes.items())]}

    class Plugin:
        @hookimpl
        def chakra_sim_register_network(self, registry):
            registry.add(Recording)

    return ("recording", Plugin())


cases = st.sampled_from([(alg, t, pow2) for alg, types, pow2 in ALGORITHMS for t in types])


def _run(folder: Path, network: dict, comm_type: int, algorithm: str, n: int, size: int, iterations: int,
         splits: int, active: int, extra_plugins=()) -> dict:
    nodes = [collective(i + 1, comm_type, size, deps=[i] if i else []) for i in range(iterations)]
    prefix = write_ranks(folder, [nodes] * n)
    system = {f"{FIELD[comm_type]}-implementation": [algorithm], "preferred-dataset-splits": splits,
              "active-chunks-per-dimension": active}
    return simulate(manifest(prefix, network, system=system), extra_plugins=extra_plugins)


def _check_breakdown_and_conservation(results: dict) -> None:
    ranks = results["ranks"]
    for row in ranks:
        assert sum(row[key] for key in BREAKDOWN) == row["finish_ns"], row
        assert min(row[key] for key in BREAKDOWN) >= 0
    assert sum(r["bytes_sent"] for r in ranks) == sum(r["bytes_received"] for r in ranks)


def _group_size(pow2: bool, exponent: int, n: int) -> int:
    return 1 << exponent if pow2 else n


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases, n=st.integers(2, 7), exponent=st.integers(1, 3),
       topology=st.sampled_from(["Ring", "FullyConnected", "Switch"]),
       size=st.integers(1, 1 << 20), iterations=st.integers(1, 3), splits=st.integers(1, 4))
def test_unaware_backend_never_beats_a_pairs_bandwidth(tmp_path_factory, case, n, exponent, topology, size,
                                                      iterations, splits):
    algorithm, comm_type, pow2 = case
    n = _group_size(pow2, exponent, n)
    bandwidth, latency = 50.0, 500.0
    network = {"topology": [topology], "npus_count": [n], "bandwidth": [bandwidth], "latency": [latency]}
    folder = tmp_path_factory.mktemp("phys")
    recorded = _run(folder / "rec", {"plugin": "recording", **network}, comm_type, algorithm, n, size,
                    iterations, splits, 1, extra_plugins=[_recording_plugin()])
    plain = _run(folder / "plain", {"plugin": "analytical", **network}, comm_type, algorithm, n, size,
                 iterations, splits, 1)
    # The closed-form path and the message-level path give the same answer.
    assert [r["finish_ns"] for r in plain["ranks"]] == [r["finish_ns"] for r in recorded["ranks"]]
    _check_breakdown_and_conservation(plain)
    bpns = bandwidth * GIB / 1e9
    finish = [r["finish_ns"] for r in plain["ranks"]]
    pairs = recorded["layers"]["network"]["summary"]["pair_bytes"]
    assert sum(b for _, _, b in pairs) == sum(r["bytes_received"] for r in plain["ranks"])
    for src, dst, sent in pairs:
        # a message of b bytes takes int(hops x latency + b / bw) >= b / bw - 1 ns; allow 1 ns per chunk
        bound = sent / bpns - splits * iterations
        assert finish[dst] >= bound, (src, dst, sent, finish[dst], bound)


def _ingress_links(results: dict) -> dict[int, int]:
    """Number of links into each NPU (congestion backend's link table)."""
    count: dict[int, int] = defaultdict(int)
    for row in results["layers"]["network"]["summary"]["hottest_links"]:
        dst = row["link"].split("->")[1]
        if dst.startswith("npu"):
            count[int(dst[3:])] += 1
    return count


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases, n=st.integers(2, 7), exponent=st.integers(1, 3),
       topology=st.sampled_from(["Ring", "FullyConnected", "Switch"]),
       size=st.integers(1, 1 << 20), iterations=st.integers(1, 3), splits=st.integers(1, 4),
       active=st.integers(1, 3))
def test_congestion_backend_never_beats_link_bandwidth(tmp_path_factory, case, n, exponent, topology, size,
                                                      iterations, splits, active):
    algorithm, comm_type, pow2 = case
    n = _group_size(pow2, exponent, n)
    network = {"plugin": "congestion", "topology": [topology], "npus_count": [n], "bandwidth": [50.0],
               "latency": [500.0]}
    results = _run(tmp_path_factory.mktemp("cong"), network, comm_type, algorithm, n, size, iterations,
                   splits, active)
    _check_breakdown_and_conservation(results)
    makespan = results["finish_ns"]
    bpns = 50.0 * GIB / 1e9      # every link of a one-dimensional spec has the dimension's bandwidth
    links = results["layers"]["network"]["summary"]["hottest_links"]
    for row in links:
        assert row["busy_ns"] <= makespan, row
        assert row["busy_ns"] >= row["bytes"] / bpns - row["messages"], row
    ingress = _ingress_links(results)
    messages = sum(row["messages"] for row in links)
    for row in results["ranks"]:
        bound = row["bytes_received"] / (ingress[row["rank"]] * bpns) - messages
        assert row["finish_ns"] >= bound, (row["rank"], row["finish_ns"], bound)


def test_back_to_back_broadcasts_pay_for_every_byte(tmp_path):
    """The reported bug: 3 chained 1 MiB broadcasts took 80 ns more than one (senders finished
    before their data left, so every chunk shared the link at full bandwidth)."""
    n, size = 8, 1 << 20
    network = {"plugin": "analytical", "topology": ["Ring"], "npus_count": [n], "bandwidth": [50.0],
               "latency": [500.0]}
    finishes = [_run(tmp_path / str(k), network, pb.BROADCAST, "chain", n, size, k, 4, 1)["finish_ns"]
                for k in (1, 3)]
    link_ns = size / (50.0 * GIB / 1e9)
    assert finishes[1] >= finishes[0] + 2 * link_ns      # two more MiB over the root's link
    once = _run(tmp_path / "star", network, pb.BROADCAST, "star", n, size, 1, 4, 1)
    # rank 1 gets 1 MiB from the root over one link: at least 19.5 us
    assert once["ranks"][1]["finish_ns"] >= link_ns


def test_a_barrier_moves_no_data_whatever_its_size(tmp_path):
    network = {"plugin": "analytical", "topology": ["Ring"], "npus_count": [8], "bandwidth": [50.0],
               "latency": [500.0]}
    big = _run(tmp_path / "big", network, pb.BARRIER, "ring", 8, 1 << 20, 1, 1, 1)
    empty = _run(tmp_path / "zero", network, pb.BARRIER, "ring", 8, 0, 1, 1, 1)
    assert big["finish_ns"] == empty["finish_ns"] == 10 + 14 * (500 + 10)
    assert all(r["bytes_sent"] == 0 for r in big["ranks"])
    assert any("a barrier moves no data" in w for w in big["warnings"])
