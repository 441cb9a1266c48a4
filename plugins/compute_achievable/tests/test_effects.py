"""What a training step adds to kernels benchmarked alone (effects.py): each effect on its own,
against its source where the source gives a number to check."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from chakra_sim_compute_achievable.section import AchievableSpec
from chakra_core import GpuLoad, LayerContext, NodeView, RunInputs
from chakra_core.hardware.profiles import load_profile
from chakra_core.testing import EventQueue, comp
from chakra_sim_compute_achievable import AchievableCompute, AchievableConfig
from chakra_sim_compute_achievable.effects import AchievableEffects, slowest_of
from chakra_sim_compute_achievable.gemm import gemm_time

H100 = load_profile("h100-sxm-hgx")
ACH = H100.section("gpu.achievable", AchievableSpec)
assert ACH is not None


@dataclass
class Loads:
    """A stand-in system layer: what communication holds on each rank."""

    by_rank: dict[int, GpuLoad] = field(default_factory=dict)

    def __call__(self, rank: int) -> GpuLoad:
        return self.by_rank.get(rank, GpuLoad())


def model(only: str | None = None, ranks: int = 1, loads: Loads | None = None, queue: EventQueue | None = None,
          profile: str = "h100-sxm-hgx") -> AchievableCompute:
    """The model with one effect on (None: all off)."""
    effects = {name: name == only for name in AchievableEffects.model_fields}
    context = LayerContext(num_ranks=ranks, scheduler=EventQueue() if queue is None else queue, inputs=RunInputs())
    if loads is not None:
        context.gpu_load = loads
    return AchievableCompute(AchievableConfig(profile=profile, effects=effects), context)


def gemm(m: int, n: int, k: int, dtype: str = "bf16", node_id: int = 1, **extra) -> NodeView:
    attrs = {"kernel": "gemm", "gemm_m": ("uint64_val", m), "gemm_n": ("uint64_val", n),
             "gemm_k": ("uint64_val", k), "gemm_batch": ("uint64_val", 1), "dtype": dtype,
             "num_ops": 2 * m * n * k, "tensor_size": 2 * (m * k + k * n + m * n), **extra}
    return NodeView(comp(node_id, 5, **attrs))


def elementwise(nbytes: int, node_id: int = 2) -> NodeView:
    return NodeView(comp(node_id, 5, kernel="elementwise", num_ops=nbytes // 4, tensor_size=nbytes, dtype="bf16"))


# GEMM epilogue -------------------------------------------------------------------------------------------
DEEPGEMM = [(4096, 2112, 7168, 1058), (4096, 24576, 1536, 990), (4096, 32768, 512, 590),
            (4096, 7168, 16384, 1358), (4096, 4096, 7168, 1304), (4096, 7168, 2048, 1025)]
"""deepseek-ai/DeepGEMM README at a6d97a1c, 'Normal GEMMs for dense models', H800 (H100 SXM's SMs,
clocks and HBM), FP8, M = 4096: (M, N, K, TFLOP/s)."""


def test_the_epilogue_reproduces_deepgemms_published_fp8_table():
    """The MAMF as the main loop's rate and C written after it at the achievable HBM bandwidth:
    within 6% root-mean-square of DeepGEMM's table, unbiased within 3%; without the epilogue the
    K = 512 row is more than twice too fast (nothing fitted: the MAMF and HBM rate are the profile's)."""
    mamf, hbm, sms = ACH.matmul_tflops["fp8"].value * 1e12, ACH.hbm_gbps.value * 1e9, int(ACH.sm_count.value)
    logs = []
    for m, n, k, published in DEEPGEMM:
        seconds = gemm_time(m, n, k, 1, mamf, hbm, 1, sms, None, 2.0).seconds
        logs.append(math.log(2 * m * n * k / seconds / 1e12 / published))
    assert math.sqrt(sum(x * x for x in logs) / len(logs)) < 0.06
    assert abs(sum(logs) / len(logs)) < 0.03
    m, n, k, published = DEEPGEMM[2]
    assert 2 * m * n * k / gemm_time(m, n, k, 1, mamf, hbm, 1, sms).seconds / 1e12 > 2 * published


def test_an_accumulating_weight_gradient_moves_more_in_its_epilogue():
    plain = model("gemm_epilogue").compute_time_ns(0, gemm(4096, 4096, 4096))
    accumulating = model("gemm_epilogue").compute_time_ns(0, gemm(4096, 4096, 4096, gemm_c_bytes=("uint64_val", 8)))
    extra = 4096 * 4096 * 6 / (ACH.hbm_gbps.value * 1e9) * 1e9
    assert accumulating - plain == pytest.approx(extra, rel=0.01)


# SMs and HBM taken by communication ----------------------------------------------------------------------
def test_a_one_wave_gemm_beside_a_24_channel_collective_takes_two_waves():
    """In whole waves (A100) a GEMM of exactly as many tiles as SMs takes two beside a 24-block
    collective: the NVIDIA forum's case ('nearly doubles'); a stream-K kernel (H100) shares its
    work out over the SMs left: 132/108 as long, the 18.9% Lee et al. measured on average."""
    loads = Loads()
    node = gemm(11 * 256, 12 * 128, 8192)   # 11 x 12 = 132 tiles of 256 x 128
    alone = model("comm_sms", loads=loads).compute_time_ns(0, node)
    loads.by_rank[0] = GpuLoad(ctas=24)
    beside = model("comm_sms", loads=loads).compute_time_ns(0, node)
    assert 1.1 < beside / alone <= 132 / 108
    loads.by_rank[0] = GpuLoad(ctas=24, until_ns=alone // 4)   # the collective ends early
    assert alone < model("comm_sms", loads=loads).compute_time_ns(0, node) < beside
    a100 = Loads({0: GpuLoad(ctas=24)})   # whole waves: 108 tiles on 84 SMs take two
    one_wave = gemm(9 * 256, 12 * 128, 8192)
    ratio = (model("comm_sms", loads=a100, profile="a100-sxm-hgx").compute_time_ns(0, one_wave)
             / model("comm_sms", profile="a100-sxm-hgx").compute_time_ns(0, one_wave))
    assert 1.8 < ratio <= 2.0


def test_an_sm_margin_runs_the_gemm_on_the_sms_left():
    """Transformer Engine tells cuBLAS of the margin: on H100 (stream-K) its main loop runs on the
    116 SMs left, 132/116 as long (the epilogue and the gap are not the SMs'); on A100 (whole
    waves) cuBLAS may pick another tile for the SMs left, never beating losing their share."""
    node = gemm(11 * 256, 12 * 128, 8192, sm_margin=("uint64_val", 16))
    with_margin, alone = model("comm_sms").compute_time_ns(0, node), model("comm_sms").compute_time_ns(0, gemm(11 * 256, 12 * 128, 8192))
    assert alone < with_margin <= alone * 132 / 116
    a100 = model("comm_sms", profile="a100-sxm-hgx")
    node = gemm(9 * 256, 12 * 128, 8192, sm_margin=("uint64_val", 16))
    with_margin, alone = a100.compute_time_ns(0, node), model("comm_sms", profile="a100-sxm-hgx").compute_time_ns(0, gemm(9 * 256, 12 * 128, 8192))
    assert alone * 108 / 92 * 0.99 <= with_margin <= 2 * alone
    # with the effect off, the margin is not taken
    assert model().compute_time_ns(0, gemm(11 * 256, 12 * 128, 8192, sm_margin=("uint64_val", 16))) == \
        model().compute_time_ns(0, gemm(11 * 256, 12 * 128, 8192))


def test_communication_copies_slow_memory_bound_kernels_only():
    loads = Loads({0: GpuLoad(hbm_gbps=ACH.hbm_gbps.value / 2)})
    alone = model("comm_hbm").compute_time_ns(0, elementwise(10**9))
    beside = model("comm_hbm", loads=loads).compute_time_ns(0, elementwise(10**9))
    gap = ACH.kernel_gap_us.value * 1e3
    assert beside - gap == pytest.approx(2 * (alone - gap), rel=1e-3)


# Clocks, variation, the host -------------------------------------------------------------------------------
def test_compute_bound_work_runs_at_the_sustained_share_and_memory_bound_work_does_not():
    fraction = ACH.sustained_fraction.value
    gap = ACH.kernel_gap_us.value * 1e3
    compute = (model("sustained_clock").compute_time_ns(0, gemm(8192, 8192, 8192)) - gap,
               model().compute_time_ns(0, gemm(8192, 8192, 8192)) - gap)
    assert compute[0] == pytest.approx(compute[1] / fraction, rel=1e-4)
    memory = (model("sustained_clock").compute_time_ns(0, elementwise(10**9)), model().compute_time_ns(0, elementwise(10**9)))
    assert memory[0] == memory[1]


def test_the_slowest_of_more_gpus_is_slower():
    spread = ACH.speed_spread.value
    assert slowest_of(1, spread) == 0
    excess = [slowest_of(n, spread) for n in (8, 64, 1024, 16384)]
    assert excess == sorted(excess) and excess[0] == pytest.approx(spread / 2, rel=0.02)   # ~half the range of 8
    one, many = model("gpu_variation", ranks=1), model("gpu_variation", ranks=1024)
    assert many.compute_time_ns(0, gemm(8192, 8192, 8192)) > one.compute_time_ns(0, gemm(8192, 8192, 8192))


def test_short_kernels_wait_for_the_host_and_long_ones_do_not():
    host_ns = ACH.host_launch_us.value * 1e3
    queue = EventQueue()
    compute = model("host_launch", queue=queue)
    tiny = [compute.compute_time_ns(0, elementwise(64, node_id=i)) for i in range(2, 12)]   # all at t = 0
    assert tiny == sorted(tiny) and tiny[-1] >= 10 * host_ns     # the tenth waits for ten launches
    long = model("host_launch", queue=EventQueue()).compute_time_ns(0, gemm(8192, 8192, 8192))
    assert long == model().compute_time_ns(0, gemm(8192, 8192, 8192)) + math.ceil(host_ns)


def test_a_node_of_many_kernels_waits_for_each_launch_and_a_sync_restarts_the_host():
    """`launches`: the last of a node's kernels starts after the host's last launch; `host_sync`:
    the host waits for the node's end and launches the next kernel a launch after it."""
    host_ns = ACH.host_launch_us.value * 1e3
    gap_ns = ACH.kernel_gap_us.value * 1e3

    def node(node_id: int, **extra) -> NodeView:
        return NodeView(comp(node_id, 5, kernel="elementwise", num_ops=16, tensor_size=64, dtype="bf16", **extra))
    one = model().compute_time_ns(0, node(1))
    alone = model().compute_time_ns(0, node(1, launches=("uint64_val", 16)))
    assert alone == pytest.approx(one + 15 * gap_ns, abs=1)   # 16 kernels, each with its gap
    many = model("host_launch").compute_time_ns(0, node(1, launches=("uint64_val", 16)))
    assert many == pytest.approx(16 * host_ns + alone / 16, abs=1)   # the last launched, then its share
    queue = EventQueue()
    compute = model("host_launch", queue=queue)
    long = compute.compute_time_ns(0, gemm(8192, 8192, 8192, host_sync=True))
    queue.now = long // 2     # a kernel that starts meanwhile was launched before the host waited
    assert compute.compute_time_ns(0, node(2)) == one
    queue.now = long + 10     # once the sync is over the host starts again from its end
    assert compute.compute_time_ns(0, node(3)) == pytest.approx(host_ns - 10 + one, abs=1)


def test_a_causal_backward_runs_at_the_causal_forwards_share():
    def node(causal: bool) -> NodeView:
        return NodeView(comp(1, 5, kernel="attention", attn_batch=128, attn_seq_q=4096, attn_seq_kv=4096,
                             attn_head_dim=128, attn_causal=causal, attn_pass="backward", dtype="bf16",
                             num_ops=10**13))
    curves = ACH.attention["bf16"]
    share = curves["forward_causal"].tflops[3] / curves["forward"].tflops[3]   # at 4096
    gap = ACH.kernel_gap_us.value * 1e3
    on, off = model("causal_backward").compute_time_ns(0, node(True)), model().compute_time_ns(0, node(True))
    assert (off - gap) / (on - gap) == pytest.approx(share, rel=1e-3)
    assert model("causal_backward").compute_time_ns(0, node(False)) == model().compute_time_ns(0, node(False))


def test_a_profile_without_the_numbers_leaves_the_effects_out_and_says_so(tmp_path):
    path = tmp_path / "bare.yaml"
    path.write_text("extends: h100-sxm-hgx\ndescription: without sustained clocks\n")
    import yaml
    data = yaml.safe_load((load_profile.__globals__["BUILTIN_DIR"] / "h100-sxm-hgx.yaml").read_text())
    del data["gpu"]["achievable"]["sustained_fraction"], data["gpu"]["achievable"]["speed_spread"]
    path.write_text(yaml.safe_dump(data))
    context = LayerContext(num_ranks=64, scheduler=EventQueue(), inputs=RunInputs(base_dir=tmp_path))
    compute = AchievableCompute(AchievableConfig(profile=str(path)), context)
    assert any("sustained_clock" in w and "gpu_variation" in w for w in context.warnings)
    assert compute.slowest_excess == 0
