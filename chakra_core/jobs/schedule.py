"""The order in which a pipeline stage runs its micro-batches, as Megatron-LM runs them.

`stage_schedule` gives ("F" | "B", micro-batch, model chunk) steps: 1F1B (PipeDream-Flush) with
one chunk per stage, and interleaved 1F1B with `vp` chunks per stage, following
megatron/core/pipeline_parallel/schedules.py (forward_backward_pipelining_without_interleaving and
..._with_interleaving: the warm-up count, get_model_chunk_id and the micro-batch of a virtual step).
"""

from __future__ import annotations

Step = tuple[str, int, int]


def warmup_steps(stage: int, pp: int, vp: int, microbatches: int, extra: int = 0) -> int:
    """Forward steps before the first backward; `extra` more with --overlap-moe-expert-parallel-comm
    (get_pp_rank_microbatches: "one extra micro-batch forward step before the 1f1b stages"; without
    pipelining combined_1f1b.py runs the first micro-batch's forward alone)."""
    if vp == 1:
        return min(pp - stage - 1 + extra, microbatches)
    # mcore's get_pp_rank_microbatches; older Megatron-LM also ran every forward first when
    # microbatches == pp, current mcore does not
    return min((pp - stage - 1) * 2 + (vp - 1) * pp + extra, microbatches * vp)


def stage_schedule(stage: int, pp: int, vp: int, microbatches: int, extra_warmup: int = 0) -> list[Step]:
    warmup = warmup_steps(stage, pp, vp, microbatches, extra_warmup)
    if vp == 1:
        steps: list[Step] = [("F", mb, 0) for mb in range(warmup)]
        for i in range(microbatches - warmup):
            steps += [("F", warmup + i, 0), ("B", i, 0)]
        steps += [("B", mb, 0) for mb in range(microbatches - warmup, microbatches)]
        return steps
    total = microbatches * vp

    def chunk(k: int, forward: bool) -> int:
        c = (k % (pp * vp)) // pp
        return c if forward else vp - c - 1

    def microbatch(k: int) -> int:
        return (k // (pp * vp)) * pp + k % pp

    steps = [("F", microbatch(k), chunk(k, True)) for k in range(warmup)]
    for i in range(total - warmup):
        k = warmup + i
        steps += [("F", microbatch(k), chunk(k, True)), ("B", microbatch(i), chunk(i, False))]
    steps += [("B", microbatch(k), chunk(k, False)) for k in range(total - warmup, total)]
    return steps


def bubble_fraction(pp: int, vp: int, microbatches: int) -> float:
    """The idle share of a pipeline with equal forward/backward times and free communication:
    (p - 1) / (m + p - 1) without interleaving; interleaving divides the bubble by vp
    (Narayanan et al., SC'21, sections 2.2.1 and 2.2.2)."""
    bubble = (pp - 1) / vp
    return bubble / (microbatches + bubble)
