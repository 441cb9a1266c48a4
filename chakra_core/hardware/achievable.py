"""A GPU's achievable (not peak) rates: what kernels reach in practice, for the `achievable`
compute model (`gpu.achievable` of a profile; docs/hardware.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from chakra_core.hardware.values import DTYPES, Sourced, _Strict


class AttentionCurve(_Strict):
    """Achieved attention-kernel throughput against sequence length, as a paper's figure gives it."""

    seq_len: list[int] = Field(..., min_length=1, description="sequence lengths of the points, ascending")
    tflops: list[float] = Field(..., min_length=1, description="achieved TFLOP/s at each sequence length")
    head_dim: int = Field(..., gt=0, description="the head dimension the figure measured")
    source: str = Field(..., min_length=1)
    note: str | None = None

    @model_validator(mode="after")
    def _points(self) -> "AttentionCurve":
        if len(self.seq_len) != len(self.tflops):
            raise ValueError("seq_len and tflops need one entry each per point")
        if any(b <= a for a, b in zip(self.seq_len, self.seq_len[1:])) or self.seq_len[0] <= 0:
            raise ValueError("seq_len must be positive and strictly ascending")
        if any(value <= 0 for value in self.tflops):
            raise ValueError("tflops must be positive")
        return self


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
    attention: dict[str, dict[Literal["forward", "forward_causal", "backward"], AttentionCurve]] = Field(
        default_factory=dict, description="fused attention throughput per data type and pass "
                                          "(forward_causal: the causal forward kernel; else forward)")

    @field_validator("matmul_tflops", "attention")
    @classmethod
    def _known_dtypes(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(DTYPES))
        if unknown:
            raise ValueError(f"unknown data type(s) {unknown}; known: {', '.join(DTYPES)}")
        return value

    @model_validator(mode="after")
    def _fractions(self) -> "AchievableSpec":
        if self.gemm_schedule != "waves" and not self.gemm_schedule_source:
            raise ValueError("gemm_schedule stream_k needs gemm_schedule_source (the public evidence)")
        if self.sustained_fraction is not None and not 0 < self.sustained_fraction.value <= 1:
            raise ValueError("sustained_fraction must be in (0, 1]")
        if self.speed_spread is not None and not 0 <= self.speed_spread.value < 1:
            raise ValueError("speed_spread must be in [0, 1)")
        return self
