"""Activation offload in the search (`chakra-sim plan --offload`): a layout that does not fit in
memory is tried again with the fewest layers' activations offloaded to host memory that make it
fit (training.cpu_offloading_num_layers, jobs/offload.py), as Megatron-Bridge's recipes offload
just enough layers (e.g. 40 of Llama 3 70B's 80 on 64 GB200 under Megatron-FSDP). Offload never
makes a step faster (its copies only add time), so a layout that fits keeps none, and the step's
lower bound is the layout's own.
"""

from __future__ import annotations

import dataclasses

from pydantic import ValidationError

from chakra_core.plan.headroom import Headroom
from chakra_core.plan.layouts import Enumeration, job_with
from chakra_core.plan.memory import overflow, predict_memory


def add_offload_variants(enumeration: Enumeration, job: dict[str, object], headroom: Headroom) -> int:
    """Add to `enumeration` each layout's offload variant where the layout overflows and some k
    makes it fit (Megatron-Core allows pp 1 without recomputation, k < layers). Returns how many."""
    added = 0
    for layout in list(enumeration.layouts):
        spec = enumeration.specs[layout]
        estimate = predict_memory(spec)
        if overflow(estimate, headroom.usable, headroom.reserve(layout, estimate.total).total) is None:
            continue
        if layout.pp > 1 or layout.recompute != "none" or spec.training.cpu_offloading_num_layers:
            continue
        for k in range(1, spec.shape.layers):
            variant = dataclasses.replace(layout, offload=k)
            try:
                offloaded = job_with(job, variant)
            except ValidationError:
                break   # what Megatron refuses of offload, whatever k
            peak = predict_memory(offloaded)
            if overflow(peak, headroom.usable, headroom.reserve(variant, peak.total).total) is None:
                enumeration.layouts.append(variant)
                enumeration.specs[variant] = offloaded
                added += 1
                break
    enumeration.layouts.sort()
    return added
