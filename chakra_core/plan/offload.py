"""Offload in the search (`chakra-sim plan --offload`): a layout that does not fit in memory is
tried again with the fewest layers' activations offloaded to host memory that make it fit
(training.cpu_offloading_num_layers, jobs/offload.py), as Megatron-Bridge's recipes offload just
enough layers (e.g. 40 of Llama 3 70B's 80 on 64 GB200 under Megatron-FSDP), and with the smallest
quarter of its optimizer offloaded that makes it fit (training.optimizer_offload_fraction,
jobs/optimizer_offload.py: Megatron-Bridge's docs/training/cpu-offloading.md measures 25% steps and
advises 25-50% under moderate memory pressure; it works with pp > 1 and recomputation). Offload
never makes a step faster (its copies and host steps only add time), so a layout that fits keeps
none, and the step's lower bound is the layout's own.
"""

from __future__ import annotations

import bisect
import dataclasses

from pydantic import ValidationError

from chakra_core.hardware.profiles import Profile
from chakra_core.plan.headroom import Headroom
from chakra_core.plan.layouts import Enumeration, job_with
from chakra_core.plan.memory import overflow, predict_memory


OPTIMIZER_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
"""The optimizer offload fractions tried, smallest first."""


def add_offload_variants(enumeration: Enumeration, index: int, job: dict[str, object], headroom: Headroom,
                         profile: Profile) -> None:
    """After enumeration.layouts[index], a layout that does not fit, its variants that do: the
    smallest optimizer offload (with the distributed optimizer, on a profile that gives the host's
    rates), then the fewest activation layers (sorting puts them so: the offload fields come last)."""
    _add_activation_variant(enumeration, index, job, headroom, profile.gpu.architecture)
    layout = enumeration.layouts[index]
    spec = enumeration.specs[layout]
    if (layout.fsdp or not layout.distributed_optimizer or spec.training.optimizer_offload_fraction
            or profile.node.host_adam_ns_per_param is None or profile.node.host_optimizer_call_us is None):
        return
    for fraction in OPTIMIZER_FRACTIONS:
        variant = dataclasses.replace(layout, optimizer_offload=fraction)
        try:
            variant_spec = job_with(job, variant)
        except ValidationError:
            return   # what Megatron refuses of optimizer offload (fp8 parameters without delayed scaling)
        peak = predict_memory(variant_spec, profile.gpu.architecture)
        if overflow(peak, headroom.usable, headroom.reserve(variant, peak.total).total) is None:
            enumeration.layouts.insert(index + 1, variant)
            enumeration.specs[variant] = variant_spec
            return


def _add_activation_variant(enumeration: Enumeration, index: int, job: dict[str, object], headroom: Headroom,
                            architecture: str) -> None:
    """After enumeration.layouts[index], a layout that does not fit, its variant with the fewest
    layers offloaded that make it fit, if any (Megatron-Core allows pp 1 without recomputation, k <
    layers). Inserted right after it, where sorting puts it: it differs in `offload` alone. Memory
    never rises with k (tests/test_offload.py), so k is bisected."""
    layout = enumeration.layouts[index]
    spec = enumeration.specs[layout]
    if layout.pp > 1 or layout.recompute != "none" or spec.training.cpu_offloading_num_layers:
        return
    try:
        job_with(job, dataclasses.replace(layout, offload=1))
    except ValidationError:
        return   # what Megatron refuses of offload, whatever k

    def fits(k: int) -> bool:
        variant = dataclasses.replace(layout, offload=k)
        peak = predict_memory(job_with(job, variant), architecture)
        return overflow(peak, headroom.usable, headroom.reserve(variant, peak.total).total) is None

    layers = range(1, spec.shape.layers)
    k = layers[0] + bisect.bisect_left(layers, True, key=fits)
    if k in layers:
        variant = dataclasses.replace(layout, offload=k)
        enumeration.layouts.insert(index + 1, variant)
        enumeration.specs[variant] = job_with(job, variant)
