"""Sliding-window attention (`attn_window`): the band's key tiles at the non-causal rate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from chakra_core import LayerContext, NodeView, RunInputs
from chakra_core.hardware.profiles import load_profile
from chakra_core.testing import EventQueue, comp
from chakra_sim_compute_achievable import AchievableCompute, AchievableConfig
from chakra_sim_compute_achievable.effects import AchievableEffects
from chakra_sim_compute_achievable.section import AchievableSpec, interpolate
from chakra_sim_compute_achievable.windowed import band

ACH = load_profile("h100-sxm-hgx").section("gpu.achievable", AchievableSpec)
assert ACH is not None
GAP_NS = ACH.kernel_gap_us.value * 1e3


def model() -> AchievableCompute:
    """Kernels alone on the GPU, as benchmarked."""
    context = LayerContext(num_ranks=1, scheduler=EventQueue(), inputs=RunInputs())
    bare = {name: False for name in AchievableEffects.model_fields}
    return AchievableCompute(AchievableConfig(profile="h100-sxm-hgx", effects=bare), context)


def windowed(seq: int, window: int | None, passname: str = "forward", batch: int = 512, d: int = 64) -> NodeView:
    """A causal kernel with the generator's FLOPs: (w (2 s - w + 1) - s) / 2 pairs in the band."""
    w = min(window or seq, seq)
    flops = 4 * batch * d * (w * (2 * seq - w + 1) - seq) // 2 * (2.5 if passname == "backward" else 1)
    attrs = {"kernel": "attention", "attn_batch": batch, "attn_seq_q": seq, "attn_seq_kv": seq, "attn_head_dim": d,
             "attn_causal": True, "attn_pass": passname, "dtype": "bf16", "num_ops": int(flops)}
    if window is not None:
        attrs["attn_window"] = ("uint64_val", window)
    return NodeView(comp(1, 5, **attrs))


def test_band_counts_the_key_tiles_a_query_tile_touches():
    # 4096 queries in 32 tiles of 128, window 128: the first tile touches 1 key tile, the others 2
    keys, share = band(4096, 4096, 128, 128)
    assert keys == 256
    assert share == pytest.approx((128 * 129 // 2 + (4096 - 128) * 128) / ((1 + 31 * 2) * 128 * 128))
    assert band(4096, 4096, 129, 128)[0] == 256 and band(4096, 4096, 130, 128)[0] == 384


@settings(max_examples=200, deadline=None)
@given(seq=st.integers(1, 3000), window=st.integers(1, 3000), tile=st.sampled_from([64, 128]))
def test_band_agrees_with_counting_tiles_and_pairs(seq, window, tile):
    """Brute force: each query tile's key tiles from its first row's band start to its diagonal,
    each query's keys i - w + 1 ... i."""
    computed = sum(row // tile - max(0, row - window + 1) // tile + 1 for row in range(0, seq, tile))
    useful = sum(min(i + 1, window) for i in range(seq))
    keys, share = band(seq, seq, window, tile)
    assert share == pytest.approx(useful / (computed * tile * tile), rel=1e-12)
    assert 0 < share <= 1 and keys == (-(-(window - 1) // tile) + 1) * tile


@pytest.mark.parametrize("passname", ["forward", "backward"])
def test_a_windowed_kernel_runs_its_band_at_the_non_causal_rate(passname):
    node = windowed(4096, 128, passname)
    ns = model().compute_time_ns(0, node)
    keys, share = band(4096, 4096, 128, 128)
    rate = interpolate(ACH.attention["bf16"][passname], keys) * 1e12 * share
    assert ns - GAP_NS == pytest.approx(node.int("num_ops") / rate * 1e9, abs=1)
    assert node.int("num_ops") / (ns * 1e-9) < rate   # the masked part of the tiles costs time too


def test_a_window_as_long_as_the_sequence_is_the_causal_kernel():
    assert model().compute_time_ns(0, windowed(2048, 2048)) == model().compute_time_ns(0, windowed(2048, None))
    assert model().compute_time_ns(0, windowed(2048, 4096)) == model().compute_time_ns(0, windowed(2048, None))


def test_a_window_costs_less_than_the_whole_causal_kernel():
    assert model().compute_time_ns(0, windowed(8192, 128)) < model().compute_time_ns(0, windowed(8192, None)) / 10
