"""A GPU's achievable (not peak) rates: what kernels reach in practice, for the `achievable`
compute model. The plugin owns the profile's `gpu.achievable` section (docs/hardware.md): its
schema, its cross-check against the GPU's peaks and the rates that hold only for the GPU they
were measured on."""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Any, Literal, Mapping, cast

from pydantic import Field, field_validator, model_validator

from chakra_core import PEAK_DTYPES as DTYPES, Profile, SimulationError, Sourced
from chakra_core.contract import ProfileSectionModel as _Strict

KEY = "gpu.achievable"
"""Where a profile gives the section."""


class AttentionCurve(_Strict):
    """Achieved attention-kernel throughput against sequence length, as a paper's figure gives it."""

    seq_len: list[int] = Field(..., min_length=1, description="sequence lengths of the points, ascending")
    tflops: list[float] = Field(..., min_length=1, description="achieved TFLOP/s at each sequence length")
    head_dim: int = Field(..., gt=0, description="the head dimension the figure measured")
    source: str = Field(..., min_length=1)
    note: str | None = None
    derived: str | None = Field(None, min_length=1, description="how the curve follows from another GPU's "
                                                                "(no measurement of this one): listed by a run")

    @model_validator(mode="after")
    def _points(self) -> "AttentionCurve":
        if len(self.seq_len) != len(self.tflops):
            raise ValueError("seq_len and tflops need one entry each per point")
        if any(b <= a for a, b in zip(self.seq_len, self.seq_len[1:])) or self.seq_len[0] <= 0:
            raise ValueError("seq_len must be positive and strictly ascending")
        if any(value <= 0 for value in self.tflops):
            raise ValueError("tflops must be positive")
        return self


AttentionPasses = dict[Literal["forward", "forward_causal", "backward"], AttentionCurve]
Kernel = Literal["flash2", "flash3", "cudnn"]
"""Attention libraries (a job's training.attention_kernel)."""


class AchievableSpec(_Strict):
    """What kernels reach in practice (vendor or public micro-benchmark measurements of kernels,
    never of training steps): below the datasheet peaks they refine."""

    matmul_tflops: dict[str, Sourced] = Field(
        ..., description="maximum achievable matmul FLOP/s (MAMF) per data type, TFLOP/s")
    hbm_gbps: Sourced = Field(..., description="achievable HBM bandwidth (STREAM-like kernel), GB/s (10^9 B/s)")
    sm_count: Sourced = Field(..., description="streaming multiprocessors: the width of one wave of CTAs")
    kernel_gap_us: Sourced = Field(..., description="GPU idle time between back-to-back kernels on a stream, µs")
    host_launch_us: Sourced | None = Field(
        None, description="host time to launch one kernel eagerly, µs: a stream of kernels shorter than "
                          "this waits for the host")
    gemm_schedule: Literal["waves", "stream_k"] = Field(
        "waves", description="how cuBLAS's GEMMs spread tiles over SMs: in whole waves (NVIDIA's Matrix "
                             "Multiplication Background guide), or stream_k: persistent blocks sharing the "
                             "main loops out evenly (no wave quantization)")
    gemm_schedule_source: str | None = Field(None, description="the public evidence for stream_k")
    sustained_fraction: Sourced | None = Field(
        None, description="fraction of the kernel benchmarks' compute rate a power-capped, "
                                      "continuous training load sustains (clock or power throttling)")
    speed_spread: Sourced | None = Field(
        None, description="speed difference between the fastest and slowest of 8 GPUs of one "
                                      "model (chip-to-chip variation): a synchronous job runs at its slowest")
    attention: dict[str, AttentionPasses] = Field(
        default_factory=dict, description="fused attention throughput per data type and pass "
                                          "(forward_causal: the causal forward kernel; else forward)")
    attention_kernel: Kernel | None = Field(
        None, description="the library whose kernels `attention` measured: flash2 (FlashAttention-2), "
                          "flash3 (FlashAttention-3) or cudnn (cuDNN's fused attention)")
    attention_kernels: dict[Kernel, dict[str, AttentionPasses]] = Field(
        default_factory=dict, description="other libraries' attention curves on this GPU, as `attention`: "
                                          "the ones a job's training.attention_kernel can name besides it "
                                          "(null in a profile that extends another: none of its parent's)")

    @field_validator("matmul_tflops", "attention")
    @classmethod
    def _known_dtypes(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(DTYPES))
        if unknown:
            raise ValueError(f"unknown data type(s) {unknown}; known: {', '.join(DTYPES)}")
        return value

    @field_validator("attention_kernels", mode="before")
    @classmethod
    def _kernels_dtypes(cls, value: Any) -> Any:
        if value is None:   # a what-if drops the parent's libraries, measured on the parent's GPU
            return {}
        for per_dtype in _mapping(value).values():
            cls._known_dtypes(dict(_mapping(per_dtype)))
        return value

    @model_validator(mode="after")
    def _fractions(self) -> "AchievableSpec":
        if self.gemm_schedule != "waves" and not self.gemm_schedule_source:
            raise ValueError("gemm_schedule stream_k needs gemm_schedule_source (the public evidence)")
        if self.sustained_fraction is not None and not 0 < self.sustained_fraction.value <= 1:
            raise ValueError("sustained_fraction must be in (0, 1]")
        if self.speed_spread is not None and not 0 <= self.speed_spread.value < 1:
            raise ValueError("speed_spread must be in [0, 1)")
        if self.attention_kernels and self.attention_kernel is None:
            raise ValueError("attention_kernels needs attention_kernel: the library `attention` measured")
        if self.attention_kernel in self.attention_kernels:
            raise ValueError(f"attention_kernels.{self.attention_kernel}: the library `attention` measured already")
        return self


class AttentionLibraries:
    """A profile's attention curves per library, data type (those with a peak) and pass."""

    def __init__(self, ach: AchievableSpec, peaks: Mapping[str, float], profile: str):
        self.ach, self.peaks, self.profile = ach, peaks, profile
        self._curves: dict[str, dict[str, dict[str, AttentionCurve]]] = {}

    def of(self, kernel: str, who: str) -> dict[str, dict[str, AttentionCurve]]:
        """The curves of library `kernel` ("": the profile's own) that `who` (a node) names."""
        if kernel not in self._curves:
            ach = self.ach
            found = ach.attention if not kernel or kernel == ach.attention_kernel else \
                ach.attention_kernels.get(cast(Kernel, kernel))
            if found is None:
                libraries = ", ".join(filter(None, [ach.attention_kernel, *ach.attention_kernels])) or "unnamed"
                raise SimulationError(f"{who}: profile '{self.profile}' measures no {kernel} attention "
                                      f"(attn_kernel); its attention curves are of: {libraries}")
            self._curves[kernel] = {d: {str(name): c for name, c in p.items()} for d, p in found.items()
                                    if d in self.peaks}
        return self._curves[kernel]


def below_peak(ach: AchievableSpec, profile: Profile) -> None:
    """Achieved <= achievable <= peak: an achievable rate above the datasheet is a typo."""
    gpu = profile.gpu
    # a data type without a peak is not checked here; the compute model ignores its rates
    for dtype, rate in ach.matmul_tflops.items():
        peak = gpu.peak_tflops.get(dtype)
        if peak is not None and rate.value > peak.value:
            raise ValueError(f"matmul_tflops.{dtype} ({rate.value:g}) is above the {dtype} peak ({peak.value:g})")
    if ach.hbm_gbps.value > gpu.memory_bandwidth_gbps.value:
        raise ValueError(f"hbm_gbps ({ach.hbm_gbps.value:g}) is above the GPU's memory_bandwidth_gbps "
                         f"({gpu.memory_bandwidth_gbps.value:g})")
    for where, per_dtype in [("attention", ach.attention),
                             *((f"attention_kernels.{k}", curves) for k, curves in ach.attention_kernels.items())]:
        for dtype, passes in per_dtype.items():
            peak = gpu.peak_tflops.get(dtype)
            for name, curve in passes.items():
                if peak is not None and max(curve.tflops) > peak.value:
                    raise ValueError(f"{where}.{dtype}.{name}: above the {dtype} peak ({peak.value:g})")


ARCHITECTURE = "gpu.architecture"


def measured_for(raw: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The section's rates and what each holds for: a matmul rate or an attention curve for the
    type's peak, the STREAM bandwidth for the HBM's, counts and measurements of the chip and its
    host (not of its clocks) for the GPU's model; every one of them for the GPU's architecture."""
    found: dict[str, tuple[str, ...]] = {}
    for dtype in _mapping(raw.get("matmul_tflops")):
        found[f"matmul_tflops.{dtype}"] = (f"gpu.peak_tflops.{dtype}", ARCHITECTURE)
    if "hbm_gbps" in raw:
        found["hbm_gbps"] = ("gpu.memory_bandwidth_gbps", ARCHITECTURE)
    for key in ("sm_count", "kernel_gap_us", "host_launch_us", "sustained_fraction", "speed_spread"):
        if key in raw:
            found[key] = ("gpu.model", ARCHITECTURE)
    for dtype, passes in _mapping(raw.get("attention")).items():
        for name in _mapping(passes):
            found[f"attention.{dtype}.{name}"] = (f"gpu.peak_tflops.{dtype}", ARCHITECTURE)
    for kernel, per_dtype in _mapping(raw.get("attention_kernels")).items():
        for dtype, passes in _mapping(per_dtype).items():
            for name in _mapping(passes):
                found[f"attention_kernels.{kernel}.{dtype}.{name}"] = (f"gpu.peak_tflops.{dtype}", ARCHITECTURE)
    return found


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def interpolate(curve: AttentionCurve, seq: float) -> float:
    """TFLOP/s at `seq`, linear in log2(seq) between the figure's points, flat beyond them."""
    points, values = curve.seq_len, curve.tflops
    if seq <= points[0]:
        return values[0]
    if seq >= points[-1]:
        return values[-1]
    i = bisect_left(points, seq)
    x0, x1 = math.log2(points[i - 1]), math.log2(points[i])
    t = (math.log2(seq) - x0) / (x1 - x0)
    return values[i - 1] + t * (values[i] - values[i - 1])


def matmul_ceiling(ach: AchievableSpec, dtype: str) -> float:
    """The highest FLOP/s the model times a `dtype` matmul at: its MAMF; a type without one is timed
    at compute.dtype's, which the fastest rate of any type bounds."""
    rates = {d: rate.value * 1e12 for d, rate in ach.matmul_tflops.items()}
    return rates.get(dtype) or max(rates.values())


def attention_ceiling(ach: AchievableSpec, dtype: str, backward: bool) -> float | None:
    """The top of the curve the model times a (causal) attention pass at: the type's own, or, when
    it lacks the pass, compute.dtype's, i.e. any type's; None without a curve."""
    passes = ("backward",) if backward else ("forward_causal", "forward")

    def top(per: Mapping[Any, AttentionCurve]) -> float:
        found = next((per[name] for name in passes if name in per), None)
        return 0.0 if found is None else max(found.tflops) * 1e12

    own = ach.attention.get(dtype, {})
    fastest = top(own) if passes[-1] in own else max((top(per) for per in ach.attention.values()), default=0.0)
    return fastest or None
