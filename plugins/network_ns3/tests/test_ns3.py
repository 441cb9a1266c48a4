"""The ns-3 network: timing of a lone flow, byte conservation, determinism, routes and errors."""

from __future__ import annotations

import pytest

pytest.importorskip("cppyy")
pytest.importorskip("ns")

from chakra_core import ManifestError, SimulationError  # noqa: E402
from chakra_core.schema import pb  # noqa: E402
from chakra_core.testing import collective, manifest, recv, send, simulate, write_ranks  # noqa: E402

import chakra_sim_network_ns3  # noqa: E402
from chakra_sim_network_ns3 import loader  # noqa: E402

PLUGINS = [("network_ns3", chakra_sim_network_ns3)]
BW, LAT = 50.0, 500          # GB/s (10^9 B/s), ns per link
MIB = 1 << 20


def leaf_spine(hosts: int = 16, radix: int = 8, **keys: object) -> dict:
    return {"kind": "fat_tree", "hosts": hosts, "radix": radix, "tiers": 2, "bandwidth_gbps": BW,
            "latency_ns": LAT, "ecmp": "dmodk", **keys}


def ns3(generator: dict, **keys: object) -> dict:
    return {"plugin": "ns3", "generator": generator, **keys}


def one_message(tmp_path, src: int, dst: int, size: int, hosts: int = 16) -> str:
    ranks: list[list] = [[] for _ in range(hosts)]
    ranks[src] = [send(1, dst=dst, size=size)]
    ranks[dst] = [recv(1, src=src, size=size)]
    return write_ranks(tmp_path, ranks)


def test_a_lone_flow_takes_hops_latency_and_serialisation_plus_what_tcp_adds(tmp_path):
    size = 32 * MIB
    prefix = one_message(tmp_path, 0, 15, size)          # npu0 -> leaf0 -> spine -> leaf3 -> npu15
    results = simulate(manifest(prefix, ns3(leaf_spine())), extra_plugins=PLUGINS)
    summary = results["layers"]["network"]["summary"]
    hops = 4
    ideal = hops * LAT + size / BW                        # the flow-level (cut-through) time
    segment = summary["segment_bytes"]
    segments = -(-size // segment)
    wire = size + segments * 42                           # + IPv4, TCP and PPP headers per segment
    handshake = 2 * hops * LAT                            # SYN, SYN-ACK (their serialisation: < 2 ns a hop)
    store_and_forward = (hops - 1) * (segment + 42) / BW  # the last segment, at every switch
    expected = handshake + hops * LAT + wire / BW + store_and_forward
    finish = results["finish_ns"]
    assert ideal < finish < 1.02 * ideal
    # and the packet-level account, but for at most one round trip at the start: the SYN's window
    # is at most 64 KiB, window scaling applies from the next segment on (RFC 7323)
    round_trip = 2 * hops * LAT + hops * (segment + 42) / BW
    assert expected <= finish < expected + round_trip
    assert summary["drops"] == 0 and summary["connections"] == 1


def test_bytes_are_conserved_on_every_link_of_every_route(tmp_path):
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_TO_ALL, 2 * MIB)]] * 16)
    results = simulate(manifest(prefix, ns3(leaf_spine()), system={"all-to-all-implementation": ["direct"]}),
                       extra_plugins=PLUGINS)
    summary = results["layers"]["network"]["summary"]
    # every message's payload crosses each link of its route once, and nothing is retransmitted
    from chakra_core.topology.graph import clos_fat_tree
    from chakra_core.topology.fabric import FabricRouter
    topo = clos_fat_tree(16, 8, BW, LAT, 2, ecmp="dmodk")
    router = FabricRouter(topo)
    per_pair = 2 * MIB // 16
    expected = [0] * len(topo.link_src)
    for src in range(16):
        for dst in range(16):
            if src != dst:
                for link in router.route(src, dst, 0):
                    expected[link] += per_pair
    carried = {row["link"]: row["bytes"] for row in summary["hottest_links"]}
    assert carried == {topo.link_name(link): expected[link] for link in range(len(expected))}
    assert summary["link_bytes"] == sum(expected)
    assert summary["message_bytes"] == 16 * 15 * per_pair
    assert summary["drops"] == 0


def test_two_runs_are_identical(tmp_path):
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_REDUCE, 4 * MIB)]] * 16)
    runs = [simulate(manifest(prefix, ns3(leaf_spine(oversubscription=3.0))), extra_plugins=PLUGINS)
            for _ in range(2)]
    assert runs[0]["finish_ns"] == runs[1]["finish_ns"]
    assert runs[0]["ranks"] == runs[1]["ranks"]
    assert runs[0]["layers"]["network"] == runs[1]["layers"]["network"]


def test_incast_shares_the_receivers_link(tmp_path):
    senders, size = 7, 2 * MIB
    ranks: list[list] = [[recv(s, src=s, size=size) for s in range(1, senders + 1)]]
    ranks += [[send(1, dst=0, size=size)] for _ in range(senders)] + [[] for _ in range(16 - senders - 1)]
    prefix = write_ranks(tmp_path, ranks)
    results = simulate(manifest(prefix, ns3(leaf_spine())), extra_plugins=PLUGINS)
    alone = senders * size / BW
    assert alone < results["finish_ns"] < 1.05 * alone
    top = results["layers"]["network"]["summary"]["hottest_links"][0]
    assert top["link"] == "leaf0->npu0" and top["peak_queue_packets"] > senders


def test_failed_links_are_avoided(tmp_path):
    prefix = one_message(tmp_path, 0, 15, MIB)
    gen = leaf_spine()
    results = simulate(manifest(prefix, ns3(gen, failed_links=["leaf0->spine3"])), extra_plugins=PLUGINS)
    rows = {r["link"]: r for r in results["layers"]["network"]["summary"]["hottest_links"]}
    assert rows["leaf0->spine3"]["packets"] == 0
    assert sum(r["bytes"] for r in rows.values()) == 4 * MIB


def test_hashed_routes_are_refused_with_a_hint(tmp_path):
    prefix = one_message(tmp_path, 0, 15, MIB)
    with pytest.raises(SimulationError, match="ecmp: dmodk"):
        simulate(manifest(prefix, ns3(leaf_spine(ecmp="hash"))), extra_plugins=PLUGINS)


def test_too_many_hosts_needs_max_hosts(tmp_path):
    prefix = one_message(tmp_path, 0, 1, 1024, hosts=2048)
    with pytest.raises(SimulationError, match="max_hosts"):
        simulate(manifest(prefix, ns3(leaf_spine(2048, 64, tiers=3))), extra_plugins=PLUGINS)


def test_unknown_failed_link_is_a_manifest_error(tmp_path):
    prefix = one_message(tmp_path, 0, 15, MIB)
    with pytest.raises(ManifestError, match="unknown link"):
        simulate(manifest(prefix, ns3(leaf_spine(), failed_links=["leaf0->spine99"])), extra_plugins=PLUGINS)


def test_missing_ns3_names_pip_install(monkeypatch):
    monkeypatch.setattr(loader, "_loaded", None)
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SimulationError, match="pip install ns3"):
        loader.load()
