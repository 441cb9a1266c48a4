"""The max-min fair rate solver (fairshare.py) and fair-mode links built on it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core import pb
from chakra_core.testing import EventQueue, collective, manifest, recv, send, simulate, write_ranks
from chakra_sim_network_congestion import fairshare
from chakra_sim_network_congestion.fairshare import VECTOR_MIN_FLOWS, MaxMinFair, max_min_fair
from chakra_sim_network_congestion.fairlinks import FairLinks

GIB = 1 << 30
TOL = 1e-9
PATHS = [2, VECTOR_MIN_FLOWS]
"""vector_min_flows values: 2 solves every component of two flows or more with numpy, the
default solves these small ones in plain Python."""


def progressive_filling(capacity: list[float], routes: dict[int, tuple[int, ...]]) -> dict[int, float]:
    """Reference: one bottleneck link at a time over all flows (FairLinks before fairshare.py)."""
    left = {link: capacity[link] for route in routes.values() for link in route}
    unfrozen = {link: sum(link in route for route in routes.values()) for link in left}
    rates: dict[int, float] = {}
    while len(rates) < len(routes):
        link = min((l for l, n in unfrozen.items() if n), key=lambda l: (left[l] / unfrozen[l], l))
        share = left[link] / unfrozen[link]
        for flow in sorted(routes):
            if flow not in rates and link in routes[flow]:
                rates[flow] = share
                for other in routes[flow]:
                    left[other] -= share
                    unfrozen[other] -= 1
    return rates


def check_max_min(capacity: list[float], routes: dict[int, tuple[int, ...]], rates: dict[int, float]) -> None:
    """Feasible, and every flow has a bottleneck: a full link on which no flow gets more."""
    load = [0.0] * len(capacity)
    top = [0.0] * len(capacity)
    for flow, route in routes.items():
        assert rates[flow] > 0
        for link in route:
            load[link] += rates[flow]
            top[link] = max(top[link], rates[flow])
    for link, cap in enumerate(capacity):
        assert load[link] <= cap * (1 + TOL)
    for flow, route in routes.items():
        assert any(load[link] >= capacity[link] * (1 - TOL) and rates[flow] >= top[link] * (1 - TOL)
                   for link in route), f"flow {flow} has no bottleneck"


capacities = st.one_of(st.sampled_from([1.0, 2.0, 3.0, 10.0]), st.floats(0.01, 1000.0))


@st.composite
def flow_sets(draw, max_links: int = 8, max_flows: int = 14) -> tuple[list[float], dict[int, tuple]]:
    links = draw(st.integers(1, max_links))
    capacity = draw(st.lists(capacities, min_size=links, max_size=links))
    route = st.lists(st.integers(0, links - 1), min_size=1, max_size=min(links, 5), unique=True).map(tuple)
    routes = draw(st.lists(route, min_size=1, max_size=max_flows))
    return capacity, dict(enumerate(routes))


# Properties ------------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(case=flow_sets(), vector_min_flows=st.sampled_from(PATHS))
def test_rates_are_feasible_max_min_and_those_of_progressive_filling(case, vector_min_flows):
    capacity, routes = case
    rates = max_min_fair(capacity, routes, vector_min_flows)
    check_max_min(capacity, routes, rates)
    reference = progressive_filling(capacity, routes)
    assert rates == pytest.approx(reference, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), vector_min_flows=st.sampled_from(PATHS))
def test_incremental_updates_equal_a_solve_from_scratch(data, vector_min_flows):
    links = data.draw(st.integers(1, 10))
    capacity = data.draw(st.lists(capacities, min_size=links, max_size=links))
    route = st.lists(st.integers(0, links - 1), min_size=1, max_size=min(links, 4), unique=True).map(tuple)
    solver = MaxMinFair(capacity, vector_min_flows)
    routes: dict[int, tuple[int, ...]] = {}
    next_id = 0
    for _ in range(data.draw(st.integers(1, 40))):
        action = data.draw(st.sampled_from(["add", "add", "remove", "update"]))
        if action == "add":
            routes[next_id] = data.draw(route)
            solver.add(next_id, routes[next_id])
            next_id += 1
        elif action == "remove" and routes:
            flow = data.draw(st.sampled_from(sorted(routes)))
            solver.remove(flow)
            del routes[flow]
        elif action == "update":
            before = dict(solver.rates)
            solved = solver.update()
            assert solved == sorted(set(solved))
            # bit for bit: a component's rates depend on the component alone
            assert solver.rates == max_min_fair(capacity, routes, vector_min_flows)
            for flow, rate in solver.rates.items():
                if flow in solved:
                    assert before.get(flow) != rate    # reported: new or changed
                else:
                    assert before[flow] == rate        # not reported: unchanged
    solver.update()
    assert solver.rates == max_min_fair(capacity, routes, vector_min_flows)
    check_max_min(capacity, routes, solver.rates)


def test_update_reports_the_rates_that_changed():
    solver = MaxMinFair([1.0, 1.0, 1.0, 10.0])
    solver.add(0, (0,))
    solver.add(1, (1, 2))
    assert solver.update() == [0, 1] and solver.rates == {0: 1.0, 1: 1.0}
    solver.add(2, (2,))
    assert solver.update() == [1, 2]                 # flow 0 shares no link with them
    assert solver.rates == {0: 1.0, 1: 0.5, 2: 0.5}
    solver.remove(1)
    assert solver.update() == [2]
    assert solver.rates == {0: 1.0, 2: 1.0}
    # flow 3 is held to 1/2 by link 0 whether flow 5 shares link 3 with it or not
    solver.add(3, (0, 3))
    solver.add(4, (3,))
    assert solver.update() == [0, 3, 4]
    assert solver.rates == {0: 0.5, 2: 1.0, 3: 0.5, 4: 9.5}
    solver.add(5, (3,))
    assert solver.update() == [4, 5]
    assert solver.rates == {0: 0.5, 2: 1.0, 3: 0.5, 4: 4.75, 5: 4.75}
    assert solver.components([3, 1, 2]) == [[0, 3, 4, 5], [2]]
    with pytest.raises(ValueError, match="increase"):
        solver.add(1, (0,))
    with pytest.raises(ValueError, match="each once"):
        solver.add(6, (1, 1))


# Closed forms --------------------------------------------------------------------------------------
@pytest.mark.parametrize("vector_min_flows", PATHS)
@pytest.mark.parametrize("flows", [1, 2, 7, 500])
def test_equal_flows_through_one_link_get_equal_shares(flows, vector_min_flows):
    # each flow also crosses its own access link, faster than the shared one
    capacity = [12.5] + [100.0] * flows
    routes = {f: (f + 1, 0) for f in range(flows)}
    assert max_min_fair(capacity, routes, vector_min_flows) == {f: 12.5 / flows for f in range(flows)}


@pytest.mark.parametrize("vector_min_flows", PATHS)
def test_a_flow_crossing_two_bottlenecks_gets_the_smaller_share(vector_min_flows):
    # link 0 (10): flows 0, 1; link 1 (3): flows 0, 2, 3. Flow 0 is held to 1 by link 1,
    # flow 1 takes what it leaves on link 0.
    routes = {0: (0, 1), 1: (0,), 2: (1,), 3: (1,)}
    rates = max_min_fair([10.0, 3.0], routes, vector_min_flows)
    assert rates == pytest.approx({0: 1.0, 1: 9.0, 2: 1.0, 3: 1.0}, rel=1e-15)


@pytest.mark.parametrize("vector_min_flows", PATHS)
@pytest.mark.parametrize("links", [1, 3, 40])
def test_parking_lot(links, vector_min_flows):
    # a long flow over a line of links, one short flow per link: everyone gets half
    routes = {0: tuple(range(links)), **{1 + link: (link,) for link in range(links)}}
    rates = max_min_fair([8.0] * links, routes, vector_min_flows)
    assert rates == {flow: 4.0 for flow in routes}
    # two short flows on the first link: it holds the long flow to a third, the others give it
    # less than half, so their short flows get the rest
    routes[links + 1] = (0,)
    rates = max_min_fair([9.0] * links, routes, vector_min_flows)
    assert rates == pytest.approx({0: 3.0, 1: 3.0, links + 1: 3.0, **{1 + l: 6.0 for l in range(1, links)}})


def test_levels_of_a_large_component():
    # 300 flows in one component (numpy path), all through link 2, a third also through link 0,
    # a third through link 1: three bottleneck levels
    capacity = [30.0, 60.0, 1000.0]
    routes = {f: (f % 3, 2) if f % 3 < 2 else (2,) for f in range(300)}
    rates = max_min_fair(capacity, routes)
    assert rates == pytest.approx({f: [0.3, 0.6, 9.1][f % 3] for f in range(300)}, rel=1e-12)
    check_max_min(capacity, routes, rates)


def test_a_symmetric_phase_takes_one_round(monkeypatch):
    # 50 bottleneck links of 8 flows each, all joined into one component by a fast shared link:
    # the 50 tied links are filled together, in one round of the numpy solver
    groups, per = 50, 8
    flows = groups * per
    capacity = [3.0] * groups + [1e9]
    routes = {f: (f // per, groups) for f in range(flows)}
    rounds = []
    real = fairshare._segments
    monkeypatch.setattr(fairshare, "_segments", lambda start, which: rounds.append(1) or real(start, which))
    assert max_min_fair(capacity, routes, vector_min_flows=2) == {f: 3.0 / per for f in range(flows)}
    assert not rounds    # one round freezes every flow: none is left to take off its links


# Fair-mode links ------------------------------------------------------------------------------------
def test_a_flow_slows_down_when_another_joins_and_speeds_up_when_it_leaves():
    queue = EventQueue()
    links = FairLinks([1.0], [0.0], queue)       # 1 byte/ns, no latency
    arrivals: dict[str, int] = {}

    def start(name: str, size: int) -> None:
        links.send((0,), size, lambda n: arrivals.__setitem__(n, queue.now), name)

    queue.schedule_at(0, lambda _: start("a", 1000))
    queue.schedule_at(200, lambda _: start("b", 1000))
    queue.run()
    # a: 200 bytes alone, 800 at half rate (until 1800); b: 800 at half rate, 200 alone
    assert arrivals == {"a": 1800, "b": 2000}
    stats = links.stats
    assert (stats.bytes, stats.messages, stats.peak, stats.busy) == ([2000], [2], [2], [2000.0])


@pytest.mark.parametrize("n,size,bw,lat", [(4, 1 << 20, 50.0, 500.0), (7, 123_457, 12.5, 333.0)])
def test_flows_sharing_one_bottleneck_finish_together_end_to_end(tmp_path, n, size, bw, lat):
    # NPUs 1..n send to NPU 0 at once through one switch: the switch->npu0 link is shared by n
    # flows, so each finishes after n single-flow transfer times, plus both links' latency.
    ranks = [[recv(i, i, size, tag=i) for i in range(1, n + 1)]] + [[send(1, 0, size, tag=i)]
                                                                       for i in range(1, n + 1)]
    prefix = write_ranks(tmp_path, ranks)
    network = {"plugin": "congestion", "mode": "fair", "topology": ["Switch"], "npus_count": [n + 1],
               "bandwidth": [bw], "latency": [lat]}
    results = simulate(manifest(prefix, network, system={}))
    assert results["finish_ns"] == int(2 * lat + n * size / (bw * GIB / 1e9))
    assert {row["finish_ns"] for row in results["ranks"]} == {results["finish_ns"]}
    assert simulate(manifest(prefix, network, system={})) == results      # deterministic


def test_ring_all_reduce_on_a_ring_takes_the_fifo_time(tmp_path):
    # one flow per link at a time over one hop: cut-through and store-and-forward agree
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_REDUCE, 1 << 20)]] * 8)
    finish = {}
    for mode in ("fair", "fifo"):
        network = {"plugin": "congestion", "mode": mode, "topology": ["Ring"], "npus_count": [8],
                   "bandwidth": [50], "latency": [500]}
        finish[mode] = simulate(manifest(prefix, network, system={"all-reduce-implementation": ["ring"]}))[
            "finish_ns"]
    assert finish["fair"] == finish["fifo"] == 43025
