"""Activation offload in the search (`chakra-sim plan --offload`): a layout that does not fit in
memory is tried again with the fewest layers' activations offloaded to host memory that make it
fit (training.cpu_offloading_num_layers, jobs/offload.py), as Megatron-Bridge's recipes offload
just enough layers (e.g. 40 of Llama 3 70B's 80 on 64 GB200 under Megatron-FSDP). Offload never
makes a step faster (its copies only add time), so a layout that fits keeps none, and the step's
lower bound is the layout's own.
"""

from __future__ import annotations

import bisect
import dataclasses

from pydantic import ValidationError

from chakra_core.plan.headroom import Headroom
from chakra_core.plan.layouts import Enumeration, job_with
from chakra_core.plan.memory import overflow, predict_memory


def add_offload_variant(enumeration: Enumeration, index: int, job: dict[str, object], headroom: Headroom,
                        architecture: str) -> None:
    """After enumeration.layouts[index], a layout that does not fit, its variant with the fewest
    layers offloaded that make it fit, if any (Megatron-Core allows pp 1 without recomputation, k <
    layers). Inserted right after it, where sorting puts it: it differs in `offload` alone, the last
    field layouts sort by. Memory never rises with k (tests/test_offload.py), so k is bisected."""
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
