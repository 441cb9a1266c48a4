"""The order in which a pipeline stage runs its micro-batches.

`stage_schedule` gives ("F" | "B", micro-batch, model chunk) steps as Megatron-LM runs them: 1F1B
(PipeDream-Flush) with one chunk per stage, and interleaved 1F1B with `vp` chunks per stage,
following megatron/core/pipeline_parallel/schedules.py (forward_backward_pipelining_without_
interleaving and ..._with_interleaving: the warm-up count, get_model_chunk_id and the micro-batch
of a virtual step). `pipeline_steps` adds the schedules of `parallel.schedule` that Megatron-LM
does not run, as PyTorch's torch.distributed.pipelining runs them (pytorch/pytorch at
00722e648b740f91d0e71494baa17891749fd291, torch/distributed/pipelining/schedules.py):
- gpipe (ScheduleGPipe): every micro-batch's forward, then every backward in the same order;
- zb-h1 (ScheduleInterleavedZeroBubble with one stage per rank, the ZB1P of Qi et al., "Zero
  Bubble Pipeline Parallelism", ICLR 2024, arXiv:2401.10241, sec. 3.1 "ZB-H1"): the backward is
  split in B, the input gradients, and W, the weight gradients ("I" and "W" there). The warm-up
  is 1F1B's (_get_warmup_ops with multiply_factor 1: pp - stage - 1 forwards); then each
  forward is followed by a B, and the i-th B by the oldest W still owed once i >= stage
  (_get_1f1b_rank_ops with enable_zero_bubble and num_1f1b_microbatches = stage): stage s keeps
  up to s weight gradients back, so the later stages return input gradients sooner and the W
  they kept fill the cool-down. The W left are run last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

Step = tuple[str, int, int]
SCHEDULES = ("1f1b", "gpipe", "zb-h1")
ZB_SOURCE = ("sail-sg/zero-bubble-pipeline-parallelism at 39f2c186a27580b7051eb51e0f651e1efd0a8170, "
             "megatron/core/zbpp_utils.py WeightGradStore.is_supported")
"""The zero-bubble authors' Megatron-LM: when it splits the backward (else it runs the plain schedule)."""


COMBINED_EXTRA_WARMUP = 1
"""Forward steps the combined 1F1B schedule of --overlap-moe-expert-parallel-comm runs before the
first backward beyond 1F1B's (get_pp_rank_microbatches: "one extra micro-batch forward step")."""


def extra_warmup(job: JobSpec) -> int:
    """The job's warm-up forwards beyond 1F1B's: COMBINED_EXTRA_WARMUP with the combined schedule."""
    return COMBINED_EXTRA_WARMUP if job.parallel.overlap_moe_expert_parallel_comm else 0


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


def pipeline_steps(stage: int, pp: int, vp: int, microbatches: int, schedule: str = "1f1b") -> list[Step]:
    """The steps of `schedule` ("F", "B" and, zero bubble, "W" for the weight gradients); gpipe runs
    one model chunk per stage, zb-h1 with vp chunks is PyTorch's interleaved ZB1P."""
    if schedule == "1f1b":
        return stage_schedule(stage, pp, vp, microbatches)
    if schedule == "gpipe":
        return [("F", mb, 0) for mb in range(microbatches)] + [("B", mb, 0) for mb in range(microbatches)]
    if schedule != "zb-h1":
        raise ValueError(f"unknown pipeline schedule {schedule!r} (one of {', '.join(SCHEDULES)})")
    # ScheduleInterleavedZeroBubble runs the forwards and the input gradients in Megatron's orders
    # (rounds of pp micro-batches per chunk: vp > 1 needs microbatches % pp == 0), after a warm-up of
    # _get_warmup_ops(multiply_factor=1); the i-th B is followed by the oldest W once i >= stage
    plain = stage_schedule(stage, pp, vp, microbatches)
    forwards = [step for step in plain if step[0] == "F"]
    backwards = [step for step in plain if step[0] == "B"]
    warmup = min((vp - 1) * pp + pp - stage - 1, len(forwards))
    steps = forwards[:warmup]
    owed = 0   # the W run so far: those of the first `owed` Bs
    for i, backward in enumerate(backwards):
        steps += forwards[warmup + i:warmup + i + 1]
        steps.append(backward)
        if i >= stage:
            steps.append(("W", *backwards[owed][1:]))
            owed += 1
    return steps + [("W", *backward[1:]) for backward in backwards[owed:]]


def schedule_problems(job: JobSpec) -> list[str]:
    """What `parallel.schedule` needs, each naming its keys."""
    p, t, m = job.parallel, job.training, job.shape
    if p.schedule == "1f1b":
        return []
    out, named = [], f"parallel.schedule {p.schedule}"
    if job.vp > 1 and p.schedule == "gpipe":
        out.append(f"{named} runs one model chunk per stage: remove parallel.vp / the layout's virtual stages")
    if p.overlap_moe_expert_parallel_comm:
        out.append(f"{named} excludes parallel.overlap_moe_expert_parallel_comm (a 1F1B schedule of its own)")
    if t.use_megatron_fsdp:
        out.append(f"{named} with training.use_megatron_fsdp is not modelled")
    if p.schedule != "zb-h1":
        return out
    if p.pp == 1:   # is_supported: "pipeline_model_parallel_size <= 1" runs the plain schedule
        out.append(f"{named} needs pp > 1 ({ZB_SOURCE})")
    if t.overlap_grad_reduce:   # is_supported: "the logic of overlapping grad reduce should be changed"
        out.append(f"{named} reduces gradients after the last weight gradients: set training.overlap_grad_reduce: "
                   f"false ({ZB_SOURCE} refuses it)")
    if p.tp_comm_overlap and p.tp > 1:
        out.append(f"{named} with parallel.tp_comm_overlap is not modelled (userbuffers overlap the weight "
                   "gradients with the backward's gathers)")
    unmodelled = [what for what, used in (("a mixture of experts", m.moe), ("latent attention", m.mla),
                                           ("multi-token prediction", m.mtp_layers > 0)) if used]
    if unmodelled:
        out.append(f"{named} with {' and '.join(unmodelled)} is not modelled (only the linear layers' weight "
                   "gradients are deferred)")
    return out
