"""What skewed routing costs a step, for the results' `training.routing` (chakra_core/jobs/routing.py).

The hottest EP rank's expert tokens against the balanced count, and the step's expert GEMMs (the
grouped fc1 and fc2 GEMMs, forward, recomputed and backward) on the reported rank, skewed and
balanced: the kernels of one MoE layer are written for both routings and each is timed alone by
the run's compute layer (`ComputeModel.alone_time_ns`: the GPU to itself, as the plan's bound
times kernels), then counted for the rank's MoE layers and micro-batches. What the imbalance
costs beyond them (the all-to-alls' larger buffers, the kernels around the experts) is in the
step itself: compare it with the same job balanced.
"""

from __future__ import annotations

from typing import Callable, Iterator

from chakra_core.contract.layers import ComputeModel
from chakra_core.et.attrs import NodeView
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.routing import BALANCED, Routing
from chakra_core.jobs.spec import JobSpec
from chakra_core.jobs.step import RoutingCost
from chakra_core.schema import pb


def routing_cost(job: JobSpec, gpus_per_node: int, architecture: str, rank: int,
                 compute: ComputeModel | None) -> RoutingCost | None:
    """The cost of the job's routing on `rank` of a job on `architecture` GPUs (None: balanced, or equal shares)."""
    routing = job.training.routing
    if not isinstance(routing, Routing):
        return None
    placement = Placement(job, gpus_per_node, architecture)
    program = RankProgram(job, placement, rank)
    load = program.expert_load()
    if load is None:
        return None
    balanced = job.model_copy(update={"training": job.training.model_copy(update={"routing": BALANCED})})
    even = RankProgram(balanced, placement, rank)
    per_expert = even.expert_tokens()
    assert isinstance(per_expert, int)   # balanced routing: one count for every expert
    return RoutingCost(routing.describe(), load.hottest, load.tokens, per_expert,
                       sum(load.tokens) / (per_expert * len(load.tokens)), 1 - load.kept / load.routed,
                       _expert_gemm_s(program, compute), _expert_gemm_s(even, compute))


def _expert_gemm_s(program: RankProgram, compute: ComputeModel | None) -> float | None:
    """Seconds of the rank's expert GEMMs in one step, each alone on the GPU."""
    if compute is None:
        return None
    job = program.job
    layers = [layer for chunk in range(program.vp) for layer in program.chunk_layers(chunk)
              if job.shape.is_moe_layer(layer)]
    if not layers:
        return 0.0
    stream = program.stream

    def timed(build: Callable[[str], Iterator[str]]) -> int:
        start = len(stream.nodes)
        for _ in build(f"mb0.L{layers[0]}."):   # the block's sub-modules (moe_overlap pauses at them)
            pass
        total = 0
        for node in stream.nodes[start:]:
            view = NodeView(node)
            if node.type == pb.COMP_NODE and ".moe.fc" in node.name and view.str("kernel", "") == "gemm":
                total += compute.alone_time_ns(view) or 0
        return total

    forward, backward = timed(program.moe_forward), timed(program.moe_backward)
    recomputed = sum(1 for layer in layers if layer in program.recomputed)
    return job.microbatches * ((len(layers) + recomputed) * forward + len(layers) * backward) / 1e9
