"""What makes kernels in a training step slower than the same kernels benchmarked alone, one switch
each (`compute.effects`), so that docs/training-accuracy.md can say what each one moves.

- comm_sms: communication kernels in flight hold SMs (NCCL: one thread block per channel;
  Transformer Engine's userbuffers: `num_sm`), and a kernel beside them runs on the SMs left, in
  more waves, its work left re-timed as they start (sharing.py); a GEMM Transformer
  Engine launches with an SM margin (`sm_margin` attribute) runs on the SMs left by the margin.
- comm_hbm: their copies and reductions take HBM bandwidth from memory-bound work.
- sustained_clock: compute-bound work at the rate a power-capped, continuous training load
  sustains (the profile's `gpu.achievable.sustained_fraction`), not the short benchmarks'.
- gemm_epilogue: a GEMM writes (and, accumulating into fp32 main gradients, reads) its output
  after its main loop, at the achievable HBM bandwidth, instead of hiding it behind the main loop.
- causal_backward: a causal attention backward runs at the causal forward's share of the
  non-causal rate (the FlashAttention-3 paper gives no causal backward curve).
- host_launch: the host launches one kernel per `gpu.achievable.host_launch_us`; a stream of
  kernels shorter than that waits for it.
- gpu_variation: chips of one model differ in speed (`gpu.achievable.speed_spread`), and a
  synchronous job runs at its slowest GPU's pace: the expected slowest of the job's GPUs.

A profile without the number an effect needs leaves that effect out, and the run says so.
"""

from __future__ import annotations

from statistics import NormalDist

from pydantic import Field

from chakra_core import PluginConfig
from chakra_sim_compute_achievable.host import HostLaunches
from chakra_sim_compute_achievable.section import AchievableSpec

RANGE_OF_8 = 2.8472
"""Expected range of 8 samples of a standard normal distribution (in standard deviations):
`speed_spread`, the spread of 8 GPUs, is that many standard deviations of the chips' speed."""


class AchievableEffects(PluginConfig):
    comm_sms: bool = Field(True, description="communication kernels' thread blocks take SMs from kernels "
                                             "running beside them; GEMMs with an SM margin run on the rest")
    comm_hbm: bool = Field(True, description="communication copies take HBM bandwidth from memory-bound work")
    sustained_clock: bool = Field(True, description="compute-bound work at the rate a power-capped training "
                                                    "load sustains (gpu.achievable.sustained_fraction)")
    gemm_epilogue: bool = Field(True, description="a GEMM writes its output after its main loop, at the "
                                                  "achievable HBM bandwidth")
    causal_backward: bool = Field(True, description="causal attention backward at the causal forward's share "
                                                    "of the non-causal rate")
    host_launch: bool = Field(True, description="kernels wait for the host, which launches one per "
                                                "gpu.achievable.host_launch_us")
    gpu_variation: bool = Field(True, description="the job runs at its slowest GPU's pace "
                                                  "(gpu.achievable.speed_spread, expected slowest of the job's GPUs)")


def slowest_of(gpus: int, spread: float) -> float:
    """How much slower than a typical chip the slowest of `gpus` chips is expected to be, when the
    fastest and slowest of 8 differ by `spread` and speeds are normally distributed: sigma x the
    expected maximum of `gpus` standard normals (Blom's approximation, exact enough for a
    mean-of-extremes; 0 for one GPU)."""
    if gpus <= 1 or spread <= 0:
        return 0.0
    sigma = spread / RANGE_OF_8
    return sigma * NormalDist().inv_cdf((gpus - 0.375) / (gpus + 0.25))


class EffectFactors:
    """What the switched-on effects make of a profile's achievable section for a run of `ranks`
    GPUs: the compute-bound rates' scale, the slowest chip's excess, the host's launches, and the
    effects left out for want of their number (`missing`)."""

    def __init__(self, ach: AchievableSpec, on: AchievableEffects, ranks: int):
        self.missing: list[str] = []
        self.compute_scale, self.slowest_excess = 1.0, 0.0
        self.host: HostLaunches | None = None
        if on.sustained_clock:
            if ach.sustained_fraction is None:
                self.missing.append("sustained_clock (gpu.achievable.sustained_fraction)")
            else:
                self.compute_scale = ach.sustained_fraction.value
        if on.gpu_variation:
            if ach.speed_spread is None:
                self.missing.append("gpu_variation (gpu.achievable.speed_spread)")
            else:
                self.slowest_excess = slowest_of(ranks, ach.speed_spread.value)
                self.compute_scale /= 1 + self.slowest_excess
        if on.host_launch:
            if ach.host_launch_us is None:
                self.missing.append("host_launch (gpu.achievable.host_launch_us)")
            else:
                self.host = HostLaunches(ach.host_launch_us.value * 1e-6)
