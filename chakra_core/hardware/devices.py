"""Does a trace say it was recorded (or estimated) for another GPU than a hardware profile's?

Replayed durations (nodes timed by their `duration_micros`) keep the device they came from;
`device_mismatch` says so when the trace's global metadata names another device, so that a
trace estimated for an A100 is not silently replayed as if it ran on an H100.
"""

from __future__ import annotations

import re
from pathlib import Path

from chakra_core.et.attrs import attr_value
from chakra_core.et.io import iter_trace
from chakra_core.hardware.profiles import Profile

_GPU = re.compile(r"\b(GH200|GB200|[ABHLV]\d{2,3}|MI\d{3}X?)", re.IGNORECASE)


def _gpu_token(text: str) -> str | None:
    found = _GPU.search(text)
    return found.group(1).upper() if found else None


def device_mismatch(trace: str | Path, profile: Profile) -> str | None:
    """A warning when the trace's global metadata names a device (`device`) or a peak
    (`peak_tflops`, written by generators that estimated durations) other than the profile's GPU."""
    try:
        metadata, _ = iter_trace(trace)
    except Exception:   # unreadable here: the feeder reports trace errors itself
        return None
    attrs = {attr.name: attr_value(attr) for attr in metadata.attr}
    gpu = profile.gpu.model
    device = attrs.get("device")
    if isinstance(device, str):
        theirs, ours = _gpu_token(device), _gpu_token(gpu)
        if theirs and ours and theirs != ours:
            return (f"replayed durations come from the trace, whose metadata names device {device!r}, not "
                    f"the profile's {gpu}: those nodes keep the other device's times")
    peak = attrs.get("peak_tflops")
    try:
        peak_value = float(peak) if peak is not None else None
    except (TypeError, ValueError):
        peak_value = None
    if peak_value and not any(abs(peak_value - s.value) <= 0.01 * s.value
                              for s in profile.gpu.peak_tflops.values()):
        return (f"replayed durations come from the trace, estimated for a {peak_value:g} TFLOP/s device "
                f"(metadata peak_tflops), not the profile's {gpu}: those nodes keep that device's times")
    return None
