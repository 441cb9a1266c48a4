"""Attention libraries (`attn_kernel`, a job's training.attention_kernel): a node naming one is timed
with the profile's curves of that library, one naming the profile's own library (or none) with its
`attention` curves; a library the profile does not measure is an error naming those it does."""

from __future__ import annotations

import pytest

from chakra_core import LayerContext, NodeView, RunInputs, SimulationError
from chakra_core.hardware.profiles import load_profile
from chakra_core.testing import EventQueue, comp
from chakra_sim_compute_achievable import AchievableCompute, AchievableConfig
from chakra_sim_compute_achievable.effects import AchievableEffects
from chakra_sim_compute_achievable.section import AchievableSpec

BARE = {name: False for name in AchievableEffects.model_fields}


def model(profile: str) -> AchievableCompute:
    context = LayerContext(num_ranks=1, scheduler=EventQueue(), inputs=RunInputs())
    return AchievableCompute(AchievableConfig(profile=profile, effects=BARE), context)


def attention(seq: int, passname: str, causal: bool, kernel: str | None) -> NodeView:
    flops = 4 * 128 * seq * seq * 128 * (2.5 if passname == "backward" else 1) / (2 if causal else 1)
    attrs = {"kernel": "attention", "attn_batch": 128, "attn_seq_q": seq, "attn_seq_kv": seq, "attn_head_dim": 128,
             "attn_causal": causal, "attn_pass": passname, "dtype": "bf16", "num_ops": int(flops)}
    if kernel is not None:
        attrs["attn_kernel"] = kernel
    return NodeView(comp(1, 5, **attrs))


def achieved_tflops(profile: str, node: NodeView) -> float:
    gap = load_profile(profile).section("gpu.achievable", AchievableSpec).kernel_gap_us.value * 1e3
    return node.int("num_ops") / (model(profile).compute_time_ns(0, node) - gap) / 1e3


@pytest.mark.parametrize("kernel, curve_of", [("flash2", "flash2"), ("cudnn", "cudnn"), ("flash3", None), (None, None)])
@pytest.mark.parametrize("passname, causal", [("forward", False), ("forward", True), ("backward", False)])
def test_each_library_is_timed_at_its_own_figure_points(kernel, curve_of, passname, causal):
    ach = load_profile("h100-sxm-hgx").section("gpu.achievable", AchievableSpec)
    assert ach.attention_kernel == "flash3"
    curves = (ach.attention if curve_of is None else ach.attention_kernels[curve_of])["bf16"]
    curve = curves["forward_causal" if causal else passname]
    for seq in (2048, 8192):
        expected = curve.tflops[curve.seq_len.index(seq)]
        assert achieved_tflops("h100-sxm-hgx", attention(seq, passname, causal, kernel)) == \
            pytest.approx(expected, rel=1e-3)


def test_flashattention2_is_slower_than_3_and_cudnn_between_on_long_sequences():
    rates = [achieved_tflops("h100-sxm-hgx", attention(16384, "forward", True, k)) for k in ("flash2", "cudnn", "flash3")]
    assert rates == sorted(rates)


def test_an_a100_names_flashattention2_its_own_curves():
    own, named = (achieved_tflops("a100-sxm-hgx", attention(4096, "forward", False, k)) for k in (None, "flash2"))
    assert own == named


@pytest.mark.parametrize("profile, kernel, has", [("a100-sxm-hgx", "cudnn", "flash2"),
                                                  ("b200-sxm-hgx", "flash2", "unnamed")])
def test_a_library_the_profile_does_not_measure_is_an_error(profile, kernel, has):
    with pytest.raises(SimulationError, match=f"measures no {kernel} attention.*curves are of: {has}"):
        model(profile).compute_time_ns(0, attention(4096, "forward", False, kernel))


def test_the_section_refuses_the_own_library_twice_and_libraries_without_it():
    ach = load_profile("h100-sxm-hgx").section("gpu.achievable", AchievableSpec).model_dump(exclude_none=True)
    with pytest.raises(ValueError, match="attention_kernels.flash3: the library `attention` measured already"):
        AchievableSpec.model_validate({**ach, "attention_kernels": {**ach["attention_kernels"],
                                                                   "flash3": ach["attention"]}})
    with pytest.raises(ValueError, match="attention_kernels needs attention_kernel"):
        AchievableSpec.model_validate({k: v for k, v in ach.items() if k != "attention_kernel"})
