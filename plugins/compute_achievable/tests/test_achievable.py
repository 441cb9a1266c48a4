"""The achievable compute model: GEMM quantization, attention, other kernels, CSV overrides,
data-type fallbacks, device warnings, and a run end to end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from chakra_sim_compute_achievable.section import AchievableSpec
from chakra_core import LayerContext, NodeView, RunInputs, SimulationError, pb
from chakra_core.hardware.profiles import load_profile
from chakra_core.testing import EventQueue, comp, make_metadata, manifest, simulate, uniform_network, write_et
from chakra_sim_compute_achievable import AchievableCompute, AchievableConfig
from chakra_sim_compute_achievable.effects import AchievableEffects
from chakra_sim_compute_achievable.gemm import gemm_time, quantization

H100 = load_profile("h100-sxm-hgx")
A100 = load_profile("a100-sxm-hgx")


BARE = {name: False for name in AchievableEffects.model_fields}
"""Kernels alone on the GPU, as benchmarked (test_effects.py switches each effect on)."""


def model(profile: str = "h100-sxm-hgx", inputs: RunInputs | None = None, **config) -> AchievableCompute:
    context = LayerContext(num_ranks=1, scheduler=EventQueue(), inputs=inputs or RunInputs())
    config.setdefault("effects", BARE)
    return AchievableCompute(AchievableConfig(profile=profile, **config), context)


def gemm(m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16", node_id: int = 1, name: str = "mm") -> NodeView:
    attrs = {"kernel": "gemm", "gemm_m": ("uint64_val", m), "gemm_n": ("uint64_val", n),
             "gemm_k": ("uint64_val", k), "gemm_batch": ("uint64_val", batch), "dtype": dtype,
             "num_ops": 2 * m * n * k * batch, "tensor_size": 2 * (m * k + k * n + m * n) * batch}
    node = comp(node_id, 5, **attrs)
    node.name = name
    return NodeView(node)


def tflops(flops: float, ns: int) -> float:
    return flops / ns / 1e3


# GEMMs -----------------------------------------------------------------------------------------------
def test_a_large_bf16_gemm_on_h100_lands_at_the_mamf():
    ns = model().compute_time_ns(0, gemm(8192, 8192, 8192))
    mamf = H100.section("gpu.achievable", AchievableSpec).matmul_tflops["bf16"].value
    assert tflops(2 * 8192**3, ns) == pytest.approx(mamf, rel=0.04)
    assert tflops(2 * 8192**3, ns) <= mamf


def test_a_tiny_gemm_is_launch_bound():
    compute = model()
    ns = compute.compute_time_ns(0, gemm(16, 16, 16))
    gap_ns = H100.section("gpu.achievable", AchievableSpec).kernel_gap_us.value * 1e3
    assert gap_ns <= ns <= gap_ns + 100          # the arithmetic is a rounding error next to the gap
    assert model(launch_overhead_us=5.0).compute_time_ns(0, gemm(16, 16, 16)) >= 5000


def test_tile_quantization_rounds_m_up_to_whole_tiles():
    # NVIDIA's guide: with 128-row tiles, M = 257 costs as much as M = 384 (3 tiles; 3 SMs: one wave)
    assert quantization(257, 128, 1, 128, 128, 3) == pytest.approx(257 / 384)
    assert quantization(384, 128, 1, 128, 128, 3) == 1.0
    assert gemm_time(257, 128, 4096, 1, 1e12, 1e15, 2, 3).seconds == pytest.approx(
        gemm_time(384, 128, 4096, 1, 1e12, 1e15, 2, 3).seconds, rel=1e-12)


def test_wave_quantization_one_tile_more_than_the_sms_costs_a_second_wave():
    # A100, 108 SMs, 256x128 tiles: 9 x 12 = 108 tiles fill one wave, 9 x 13 = 117 need two
    assert quantization(2304, 1536, 1, 256, 128, 108) == 1.0
    assert quantization(2304, 1664, 1, 256, 128, 108) == pytest.approx(117 / 216)
    one = gemm_time(2304, 1536, 4096, 1, 271.2e12, 1759e9, 2, 108)
    two = gemm_time(2304, 1664, 4096, 1, 271.2e12, 1759e9, 2, 108)
    assert two.seconds > one.seconds * 1664 / 1536      # worse than proportional: the partial wave


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 20000), k=st.integers(1, 20000), batch=st.integers(1, 64),
       dtype=st.sampled_from(["bf16", "fp16", "fp8", "tf32"]))
def test_achieved_never_exceeds_mamf_nor_peak(m, n, k, batch, dtype):
    compute = model()
    ns = compute.compute_time_ns(0, gemm(m, n, k, batch, dtype))
    achieved = tflops(2.0 * m * n * k * batch, ns)
    mamf = H100.section("gpu.achievable", AchievableSpec).matmul_tflops[dtype].value
    assert achieved <= mamf * (1 + 1e-6) <= H100.gpu.peak_tflops[dtype].value


def test_larger_gemms_never_take_less_time():
    compute = model()
    times = [compute.compute_time_ns(0, gemm(m, 4096, 4096, node_id=m)) for m in range(128, 4096, 128)]
    assert times == sorted(times)


# Attention and other kernels ---------------------------------------------------------------------------
def attention(seq: int, passname: str = "forward", causal: bool = False, batch: int = 128, dtype: str = "bf16",
              head_dim: int = 128) -> NodeView:
    flops = 4 * batch * seq * seq * head_dim * (2.5 if passname == "backward" else 1) / (2 if causal else 1)
    return NodeView(comp(1, 5, kernel="attention", attn_batch=batch, attn_seq_q=seq, attn_seq_kv=seq,
                         attn_head_dim=head_dim, attn_causal=causal, attn_pass=passname, dtype=dtype,
                         num_ops=int(flops)))


def test_attention_follows_the_flashattention3_figure_points():
    curve = H100.section("gpu.achievable", AchievableSpec).attention["bf16"]
    for passname, seq in (("forward", 2048), ("backward", 8192)):
        node = attention(seq, passname)
        ns = model().compute_time_ns(0, node)
        gap = H100.section("gpu.achievable", AchievableSpec).kernel_gap_us.value * 1e3
        expected = curve[passname].tflops[curve[passname].seq_len.index(seq)]
        assert tflops(node.int("num_ops"), ns - gap) == pytest.approx(expected, rel=1e-3)


def test_attention_interpolates_and_longer_sequences_are_more_efficient():
    rates = [tflops(n.int("num_ops"), model().compute_time_ns(0, n)) for n in (attention(s) for s in (512, 1536, 4096))]
    assert rates == sorted(rates)


def test_too_few_attention_ctas_leave_sms_idle():
    full, small = model().compute_time_ns(0, attention(1024, batch=132)), model().compute_time_ns(0, attention(1024, batch=1))
    assert small * 132 > full * 8   # 8 CTAs on 132 SMs: far less than 132x cheaper


def named(node_id: int, name: str, **attrs) -> NodeView:
    node = comp(node_id, 5, **attrs)
    node.name = name
    return NodeView(node)


def test_other_kernels_are_bound_by_hbm_or_the_cuda_core_peak():
    ach = H100.section("gpu.achievable", AchievableSpec)
    ns = model().compute_time_ns(0, named(1, "aten::add", num_ops=10**6, tensor_size=10**9))
    assert ns == pytest.approx(1e9 / (ach.hbm_gbps.value * 1e9) * 1e9 + ach.kernel_gap_us.value * 1e3, abs=1)
    softmax = model().compute_time_ns(0, named(2, "aten::softmax", num_ops=10**12, tensor_size=10))
    assert softmax >= 1e12 / H100.peak_flops("fp32") * 1e9
    # a matmul known only by its name runs on the tensor cores at the MAMF, not the CUDA-core peak
    mm = model().compute_time_ns(0, named(3, "aten::mm", num_ops=10**12, tensor_size=10, dtype="bf16"))
    assert mm == pytest.approx(1e12 / 794.5e12 * 1e9 + ach.kernel_gap_us.value * 1e3, abs=1)


def test_a_gemm_without_its_shape_runs_at_the_mamf():
    """`chakra-sim generate transformer` writes kernel: gemm with num_ops but no gemm_m/n/k."""
    ach = H100.section("gpu.achievable", AchievableSpec)
    node = comp(4, 5, kernel="gemm", num_ops=10**12, tensor_size=10, dtype="bf16")
    node.name = "mb0.L0.qkv"
    ns = model().compute_time_ns(0, NodeView(node))
    assert ns == pytest.approx(1e12 / 794.5e12 * 1e9 + ach.kernel_gap_us.value * 1e3, abs=1)


def test_cpu_ops_and_nodes_without_num_ops_replay():
    compute = model()
    assert compute.compute_time_ns(0, NodeView(comp(1, 7, is_cpu_op=True, num_ops=5))) is None
    assert compute.compute_time_ns(0, NodeView(comp(2, 7))) is None
    assert compute.summary()["kinds"]["replayed"] == {"count": 2, "time_ns": 14000, "flops": 0.0,
                                                      "achieved_tflops": 0.0}


# Data types --------------------------------------------------------------------------------------------
def test_fp8_on_a100_falls_back_to_bf16_with_one_warning():
    compute = model("a100-sxm-hgx")
    fp8 = compute.compute_time_ns(0, gemm(4096, 4096, 4096, dtype="fp8"))
    bf16 = compute.compute_time_ns(0, gemm(4096, 4096, 4096, dtype="bf16", node_id=2))
    compute.compute_time_ns(0, gemm(4096, 4096, 4096, dtype="fp8", node_id=3))
    assert fp8 == pytest.approx(bf16, rel=0.01)
    warnings = [w for w in compute.context.warnings if "fp8" in w]
    assert len(warnings) == 1 and "A100" in warnings[0] and "bf16" in warnings[0]


def test_fp8_on_h100_is_faster_than_bf16_but_under_its_mamf():
    compute = model()
    fp8 = compute.compute_time_ns(0, gemm(8192, 8192, 8192, dtype="fp8"))
    bf16 = compute.compute_time_ns(0, gemm(8192, 8192, 8192, node_id=2))
    assert bf16 / fp8 == pytest.approx(1402.6 / 794.5, rel=0.02)


def test_a_profile_without_an_achievable_section_is_an_error(tmp_path):
    import yaml
    data = yaml.safe_load(open(load_profile.__globals__["BUILTIN_DIR"] / "h100-sxm-hgx.yaml"))
    del data["gpu"]["achievable"]
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SimulationError, match="no gpu.achievable"):
        model(str(tmp_path / "bare.yaml"))


# Measured kernel times ----------------------------------------------------------------------------------
def test_csv_by_name_first_match_wins(tmp_path):
    (tmp_path / "times.csv").write_text("name,time_us\nflash*,100\n*,7\n")
    compute = model(kernel_times="times.csv", inputs=RunInputs(base_dir=tmp_path), launch_overhead_us=0)
    assert compute.compute_time_ns(0, gemm(64, 64, 64, name="flash_fwd")) == 100_000
    assert compute.compute_time_ns(0, gemm(64, 64, 64, node_id=2, name="other")) == 7_000


def test_csv_by_gemm_shape(tmp_path):
    (tmp_path / "times.csv").write_text("kernel,m,n,k,batch,dtype,time_us\ngemm,4096,4096,4096,1,bf16,250.5\n")
    compute = model(kernel_times="times.csv", inputs=RunInputs(base_dir=tmp_path), launch_overhead_us=0)
    assert compute.compute_time_ns(0, gemm(4096, 4096, 4096)) == 250_500
    assert compute.compute_time_ns(0, gemm(4096, 4096, 4096, dtype="fp8", node_id=2)) != 250_500
    assert compute.summary()["kinds"]["measured"]["count"] == 1


@pytest.mark.parametrize("text, match", [
    ("name,micros\nx,1\n", r"times.csv:1: columns"),
    ("name,time_us\nx,fast\n", r"times.csv:2: time_us 'fast'"),
    ("name,time_us\nx,1\ny,-3\n", r"times.csv:3: time_us must be"),
    ("kernel,m,n,k,batch,dtype,time_us\nconv,1,1,1,1,bf16,1\n", r"times.csv:2: kernel 'conv'"),
    ("kernel,m,n,k,batch,dtype,time_us\ngemm,1,1,1,1,int4,1\n", r"times.csv:2: dtype 'int4'"),
    ("kernel,m,n,k,batch,dtype,time_us\ngemm,1,1\n", r"times.csv:2: 3 fields"),
    ("", r"empty file"),
])
def test_bad_csv_rows_are_errors_naming_file_and_line(tmp_path, text, match):
    (tmp_path / "times.csv").write_text(text)
    with pytest.raises(SimulationError, match=match):
        model(kernel_times="times.csv", inputs=RunInputs(base_dir=tmp_path))


# Replayed durations from another device -----------------------------------------------------------------
@pytest.mark.parametrize("attrs, warns", [({"device": "NVIDIA A100-SXM4-80GB"}, True),
                                          ({"device": "NVIDIA H100 80GB HBM3"}, False),
                                          ({"peak_tflops": "312.0"}, True),
                                          ({"peak_tflops": 989.5}, False), ({}, False)])
def test_replaying_another_devices_durations_warns_once(tmp_path, attrs, warns):
    path = write_et(tmp_path / "t.0.et", [comp(1, 5)], metadata=make_metadata(attrs=attrs))
    compute = model(inputs=RunInputs(trace_files=[path]))
    for node_id in (1, 2):
        compute.compute_time_ns(0, NodeView(comp(node_id, 5)))
    assert len([w for w in compute.context.warnings if "replayed durations" in w]) == (1 if warns else 0)


# End to end ----------------------------------------------------------------------------------------------
def test_a_run_through_the_engine(tmp_path):
    from chakra_core.testing import write_ranks
    nodes = [comp(1, 0, kernel="gemm", gemm_m=8192, gemm_n=8192, gemm_k=8192, gemm_batch=1, dtype="bf16",
                  num_ops=2 * 8192**3), comp(2, 3, deps=[1])]
    prefix = write_ranks(tmp_path, [nodes, nodes])
    results = simulate(manifest(prefix, uniform_network(2), compute={"plugin": "achievable", "profile": "h100-sxm-hgx"}))
    summary = results["layers"]["compute"]["summary"]
    assert summary["kinds"]["gemm"]["count"] == 2 and summary["achieved_within_peak"] is True
    assert summary["kinds"]["gemm"]["achieved_tflops"] <= 794.5
    assert results["finish_ns"] >= 2 * 8192**3 / 794.5e12 * 1e9 + 3000
