"""Where a mixture-of-experts step's time goes by kind of work (for docs/training-accuracy.md).

The simulated split (chakra_core.jobs.report) is by part of the step (forward, backward, ...) and
by communicator; a MoE run is read by kind of work instead: attention, the MoE block's compute,
the dispatcher's exposed communication, and the rest. The first two are the kernels' own times
(the run's compute model, each kernel alone) summed over the slowest pipeline stage's trace; the
exposed dispatch/combine is the simulated `exposed_ep`; the rest (dense MLPs, norms, embedding and
output layer, optimizer, other exposed communication, bubble, and any slowdown kernels suffered
from running beside communication) is the stage's step minus those three, so the four sum to it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from chakra_core.contract.layers import ComputeModel
from chakra_core.contract.time_folding import TimeFolding
from chakra_core.et.attrs import NodeView
from chakra_core.et.io import read_trace
from chakra_core.schema import pb

LAYER_KERNEL = re.compile(r"\.L\d+\.(.*)$")
ATTENTION = ("qkv", "attention", "proj", "rope", "q_norm", "k_norm", "qk_norm", "mla", "q_down", "q_up",
             "kv_down", "kv_up", "q_layernorm", "kv_layernorm", "sink", "window")
"""Layer-local kernel names of the attention block (its projections, norms, rope and core attention)."""
MOE = ("moe.", "shared.")
"""The MoE block: router, permute, grouped expert GEMMs, activation, unpermute, shared experts."""


def kind(name: str) -> str | None:
    """'attention', 'moe' or None (the rest) for a kernel's name."""
    match = LAYER_KERNEL.search(name)
    if match is None:
        return None
    local = match.group(1)
    if local.startswith(MOE):
        return "moe"
    if local.split(".")[0] in ATTENTION or local.startswith(ATTENTION):
        return "attention"
    return None


def moe_split(trace_dir: Path, job_name: str, pp: int, gpus: int, compute: ComputeModel,
              by_stage: Mapping[str, Mapping[str, float]], time_folding: TimeFolding | None = None) -> dict[str, float]:
    """Seconds of the slowest stage: attention, MoE compute, exposed dispatch/combine, rest, step.
    A run folded in time read its traces of fewer micro-batches: each repeating period's kernels
    count once more per period left out."""
    stage = max(by_stage, key=lambda s: (sum(by_stage[s].values()), -int(s)))
    parts = by_stage[stage]
    step = sum(parts.values())
    head = int(stage) * (gpus // pp)
    seconds = {"attention": 0.0, "moe": 0.0}
    span = None if time_folding is None else time_folding.ranks[head]
    trace = trace_dir / f"{job_name}.{head}.et" if span is None else trace_dir / "time-folded" / f"{job_name}.{head}.et"
    for node in read_trace(trace).nodes:
        if node.type != pb.COMP_NODE:
            continue
        which = kind(node.name)
        if which is not None:
            duration = compute.alone_time_ns(NodeView(node))
            weight = 1 if span is None or not span.first <= node.id < span.first + span.nodes else 1 + time_folding.periods
            seconds[which] += weight * (node.duration_micros * 1000 if duration is None else duration) / 1e9
    exposed = parts.get("exposed_ep", 0.0)
    return {"attention": seconds["attention"], "moe": seconds["moe"], "exposed_ep": exposed,
            "rest": step - seconds["attention"] - seconds["moe"] - exposed, "step": step, "stage": int(stage)}
