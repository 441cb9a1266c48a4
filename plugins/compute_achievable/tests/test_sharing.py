"""Kernels re-timed as communication starts beside them (sharing.py): the work left runs at the
share of the GPU left from then on."""

from __future__ import annotations

from hypothesis import given, strategies as st

from chakra_core import GpuLoad, LayerContext, RunInputs
from chakra_core.testing import EventQueue
from chakra_sim_compute_achievable import AchievableCompute, AchievableConfig
from chakra_sim_compute_achievable.effects import AchievableEffects
from chakra_sim_compute_achievable.sharing import KernelsInFlight, Running, until_first_end

from test_effects import Loads, gemm


class _Relabel:
    def relabel(self, rank: int, node_id: int) -> int:
        return node_id

    def part(self, rank: int, node_id: int) -> str:
        return "repeats"


def test_the_work_left_runs_at_the_share_left_once_an_operation_starts():
    """1,000 ns alone: 400 ns alone leave 60%; at half the rate that takes 1,200 ns (end 1,600).
    With the operation expected to end at 1,000 (its issue plus its time alone), 600 ns at half
    the rate do 30%, and the 30% left runs alone again: end 1,300."""
    flight = KernelsInFlight()
    flight.add(0, 7, Running(None, 1, 0, 1000, 1000, None, 1000), 0)
    [(node, kernel, old)] = flight.retime(0, 400, lambda k: 2000, None)
    assert (node, kernel.end, old) == (7, 1600, 1000)
    flight = KernelsInFlight()
    flight.add(0, 7, Running(None, 1, 0, 1000, 1000, None, 1000), 0)
    [(_, kernel, _)] = flight.retime(0, 400, lambda k: 2000, 1000)
    assert (kernel.end, kernel.switch) == (1300, 1000)
    # a second operation at 700 (15% more done at half the rate: 45% left) at a third of the rate
    # until 1,000 (10% of the work), the 35% left alone: end 1,350
    [(_, kernel, old)] = flight.retime(0, 700, lambda k: 3000, 1000)
    assert old == 1300 and abs(kernel.left - 0.45) < 1e-12 and kernel.end == 1350
    assert flight.retime(0, kernel.end, lambda k: 5000, None) == []   # ended this instant
    assert flight.state(kernel.end, _Relabel()) == ((0, ()),)


def test_past_the_expected_end_the_rest_runs_alone_until_the_next_start():
    """Loaded (twice as long) until 500, alone after: at 700 it has done 25% + 20%; a new
    operation expected to end after it makes the 55% left take twice 550 ns."""
    flight = KernelsInFlight()
    flight.add(0, 1, Running(None, 1, 0, 2000, 1000, 500, 1250), 0)
    [(_, kernel, _)] = flight.retime(0, 700, lambda k: 2000, 10_000)
    assert abs(kernel.left - 0.55) < 1e-12 and kernel.end == 700 + 1100


def test_nothing_is_done_before_the_kernel_starts():
    """A kernel waiting 300 ns for its launch: a start before then times all of it at the new rate."""
    flight = KernelsInFlight()
    flight.add(0, 1, Running(None, 1, 300, 1000, 1000, None, 1300), 0)
    [(_, kernel, _)] = flight.retime(0, 100, lambda k: 1500, None)
    assert kernel.end == 1800 and kernel.left == 1.0


def test_ended_kernels_are_dropped_as_the_next_starts():
    flight = KernelsInFlight()
    for node in range(100):
        flight.add(0, node, Running(None, 1, node * 10, 10, 10, None, node * 10 + 10), node * 10)
    assert len(flight.ranks[0]) <= 8


def test_the_load_holds_until_the_first_operation_is_expected_to_end():
    assert until_first_end(2000, 1000, None, 0) == (2000, None)       # waiting for peers: loaded throughout
    assert until_first_end(2000, 1000, 500, 0) == (500 + 750, 500)    # a quarter loaded, the rest alone
    assert until_first_end(2000, 1000, 5000, 0) == (2000, None)


def reporting_model(loads: Loads, queue: EventQueue) -> AchievableCompute:
    """comm_sms alone, told of every start of communication (as the engine wires it)."""
    effects = {name: name == "comm_sms" for name in AchievableEffects.model_fields}
    context = LayerContext(num_ranks=1, scheduler=queue, inputs=RunInputs())
    context.gpu_load = loads
    context.comm_start = lambda rank: None
    return AchievableCompute(AchievableConfig(profile="h100-sxm-hgx", effects=effects), context)


def gemm_end(start_of_collective: int, collective_ns: int, collective_first: bool = True) -> int:
    """A one-wave GEMM issued at 1,000,000 ns beside a 24-channel collective issued at
    `start_of_collective` that takes `collective_ns` alone (and ends then): the GEMM's end. At one
    instant the collective starts first unless `collective_first` is false."""
    loads, queue = Loads(), EventQueue()
    compute = reporting_model(loads, queue)
    node, issue = gemm(11 * 256, 12 * 128, 8192), 1_000_000
    held = GpuLoad(ctas=24, until_ns=start_of_collective + collective_ns)
    after = start_of_collective > issue or (start_of_collective == issue and not collective_first)
    queue.now = issue
    if not after and issue < start_of_collective + collective_ns:
        loads.by_rank[0] = held
    end = issue + compute.compute_time_ns(0, node)
    if after and start_of_collective < end:
        queue.now, loads.by_rank[0] = start_of_collective, held
        end = dict(compute.retime(0)).get(node.id, end)
    return end


def test_a_gemm_is_timed_alike_whichever_reaches_the_simulator_first_at_an_instant():
    for length in (1, 20_000, 10**6):
        assert gemm_end(1_000_000, length, True) == gemm_end(1_000_000, length, False)


@given(st.integers(900_000, 1_100_000), st.integers(1, 200_000))
def test_a_gemms_end_is_continuous_in_when_a_collective_begins(start, length):
    """Moving the collective's start by 1 ns moves the GEMM's end by at most 2 ns (a ns of work
    and its rounding), on either side of the GEMM's own start: no edge at which the GEMM runs
    wholly alone or wholly beside it."""
    assert abs(gemm_end(start + 1, length) - gemm_end(start, length)) <= 2


@given(st.integers(0, 2_000_000), st.integers(1, 500_000))
def test_a_gemm_beside_communication_ends_between_alone_and_wholly_beside_it(start, length):
    alone = gemm_end(10**9, 1) - 1_000_000
    wholly = gemm_end(0, 10**8) - 1_000_000
    took = gemm_end(start, length) - 1_000_000
    assert alone <= took <= wholly
