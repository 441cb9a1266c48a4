"""The manifest section of `plugin: achievable`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, field_validator

from chakra_core import PEAK_DTYPES, PluginConfig, shipped_or_file
from chakra_sim_compute_achievable.effects import AchievableEffects

DEFAULT_DTYPE = "bf16"


class AchievableConfig(PluginConfig):
    profile: str = Field(
        ..., description="a shipped hardware profile (h100-sxm-hgx, ...) or a .yaml file relative to the "
                         "manifest; it must have a gpu.achievable section")
    dtype: Literal[PEAK_DTYPES] = Field(  # type: ignore[valid-type]
        DEFAULT_DTYPE, description="the data type of nodes that do not tell theirs, and of nodes whose "
                                   "data type the profile has no achievable rate for (a warning names it)")
    kernel_times: str | None = Field(
        None, description="CSV of measured kernel times (µs) that replace the model, relative to the "
                          "manifest: columns name,time_us (fnmatch pattern on the node name, first match "
                          "wins) or kernel,m,n,k,batch,dtype,time_us (GEMM shapes)")
    launch_overhead_us: NonNegativeFloat | None = Field(
        None, description="GPU idle time per kernel, µs; default the profile's gpu.achievable.kernel_gap_us")
    fp32_as_tf32: bool = Field(
        False, description="time fp32 GEMMs and attention at the tf32 rates (PyTorch's allow_tf32)")
    effects: AchievableEffects = Field(
        default_factory=AchievableEffects, description="what a training step adds to kernels benchmarked "
                                                       "alone, one switch each (all on)")

    @field_validator("profile")
    @classmethod
    def _shipped_or_file(cls, value: str) -> str:
        return shipped_or_file(value)
