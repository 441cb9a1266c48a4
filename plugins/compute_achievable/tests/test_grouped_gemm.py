"""Grouped GEMMs with each group's own m or k (`gemm_m_list` / `gemm_k_list`: a mixture of experts'
experts under skewed routing): equal groups time as the batch does, tiles are quantized per group,
more tokens in a group never take less time, bad lists are errors naming the node."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from chakra_core import NodeView, SimulationError, pb
from chakra_core.testing import comp
from chakra_sim_compute_achievable.gemm import gemm_time, grouped_gemm_time
from test_achievable import gemm, model   # same folder (pytest puts it on sys.path)


def uint_list_attr(name: str, values: list[int]) -> pb.AttributeProto:
    attr = pb.AttributeProto(name=name)
    attr.uint64_list.values.extend(values)
    return attr


def grouped(ms: list[int], n: int, ks: list[int], node_id: int = 2, c_bytes: int | None = None) -> NodeView:
    attrs = {"kernel": "gemm", "gemm_m": ("uint64_val", max(ms)), "gemm_n": ("uint64_val", n),
             "gemm_k": ("uint64_val", max(ks)), "gemm_batch": ("uint64_val", len(ms)), "dtype": "bf16",
             "num_ops": 2 * n * sum(m * k for m, k in zip(ms, ks)),
             "tensor_size": 2 * sum(m * k + k * n + m * n for m, k in zip(ms, ks))}
    if c_bytes:
        attrs["gemm_c_bytes"] = ("uint64_val", c_bytes)
    node = comp(node_id, 5, **attrs)
    node.name = "grouped"
    if len(set(ms)) > 1:
        node.attr.append(uint_list_attr("gemm_m_list", ms))
    if len(set(ks)) > 1:
        node.attr.append(uint_list_attr("gemm_k_list", ks))
    return NodeView(node)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 8192), st.integers(1, 8192), st.integers(1, 16), st.booleans(),
       st.sampled_from([0.0, 2.0, 8.0]), st.integers(0, 40))
def test_equal_groups_are_the_batch(m, n, k, batch, stream_k, c_bytes, busy):
    alone = gemm_time(m, n, k, batch, 700e12, 3e12, 2, 132, 120, c_bytes, busy, stream_k)
    groups = grouped_gemm_time(((m, k),) * batch, n, 700e12, 3e12, 2, 132, 120, c_bytes, busy, stream_k)
    assert groups.seconds == pytest.approx(alone.seconds, rel=1e-12) and groups.tile == alone.tile


def test_a_grouped_node_is_timed_by_its_groups():
    """Two experts of 129 tokens need four 128-row tiles where 256 and 2 need three; the node with
    equal groups writes no list and times as the batch; the per-group rows are what counts, not gemm_m."""
    compute = model()
    spread = compute.compute_time_ns(0, grouped([129, 129], 4096, [4096, 4096], node_id=3))
    assert spread == compute.compute_time_ns(0, gemm(129, 4096, 4096, batch=2, node_id=4))
    uneven = compute.compute_time_ns(0, grouped([200, 58], 4096, [4096, 4096], node_id=5))
    largest = compute.compute_time_ns(0, gemm(200, 4096, 4096, batch=2, node_id=6))
    assert uneven < largest


@pytest.mark.parametrize("profile", ["h100-sxm-hgx"])   # stream-K
@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=2, max_size=8), st.integers(0, 7), st.integers(1, 600))
def test_more_tokens_in_a_group_never_take_less_time(profile, ms, which, extra):
    """Forward (each group its m) and weight gradient (each group its k), with stream-K. Whole
    waves (A100) do not keep this: a group's new tiles move the wave boundaries of the groups
    launched after it, and a wave's depth is its deepest tile's, so more tokens can take less time
    (A100, weight gradient, k [1, 0, 16, 0, 2316] -> [1, 65, 16, 0, 2316]: 122.7 us -> 95.0 us;
    65 of 6,000 random cases, up to 24%). A known defect of the whole-wave model, not fixed."""
    compute = model(profile)
    if max(ms) == 0:
        ms[0] = 1
    more = list(ms)
    more[which % len(ms)] += extra
    fwd = [compute.compute_time_ns(0, grouped(x, 4096, [1024] * len(x), node_id=10 + i)) for i, x in enumerate((ms, more))]
    wgrad = [compute.compute_time_ns(0, grouped([1024] * len(x), 4096, x, node_id=20 + i, c_bytes=8))
             for i, x in enumerate((ms, more))]
    assert fwd[0] <= fwd[1] and wgrad[0] <= wgrad[1]


def test_a_list_of_the_wrong_length_is_an_error_naming_the_node():
    node = grouped([10, 20], 64, [64, 64])
    node.pb.attr[-1].uint64_list.values.append(30)
    with pytest.raises(SimulationError, match=r"node 2 \('grouped'\): gemm_m_list must list gemm_batch = 2 sizes"):
        model().compute_time_ns(0, node)
