"""The values a hardware profile is made of: a number with the public document it comes from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "mxfp8", "nvfp4")
"""Data types a profile may give a dense peak for (TFLOP/s, or TOP/s for int8); mxfp8 and nvfp4 are
Blackwell's block-scaled formats (8-bit elements with a scale per 32, 4-bit with a scale per 16)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sourced(_Strict):
    """A number and the public document it comes from."""

    value: float = Field(..., ge=0)
    source: str = Field(..., min_length=1)
    note: str | None = None
    derived: str | None = Field(
        None, min_length=1, description="set when the value is not a figure of this part but follows from "
                                        "another's (e.g. a measured fraction of another GPU's peak times "
                                        "this one's): how; the layers that use it list it in the results")
