"""A job's step with fewer micro-batches, for the engine to fold in time
(chakra_core.contract.time_folding): how many micro-batches the traces keep, and where each rank's
trace repeats.

Once a pipeline is full, Megatron's 1F1B schedule runs forward/backward pairs whose work repeats
every micro-batch; interleaved, every `pp` micro-batches (the model chunks come round after pp x vp
pairs: schedule.py); so does the combined 1F1B schedule of overlap_moe_expert_parallel_comm, whose
pairs are single merged steps (moe_overlap.py). A rank's repeating nodes are its pairs but the
first and last period's (the first forwards launch parameter gathers and cast fp8 weights, the last
backward reduces gradients). The traces keep enough micro-batches for every rank to be inside its
repeating nodes for a few periods at once; a step with more micro-batches differs from them only by
whole periods inserted before the cool-down, which the engine adds back.
"""

from __future__ import annotations

from typing import Callable

from chakra_core.contract.time_folding import RankPeriods
from chakra_core.et.attrs import NodeView
from chakra_core.schema import pb
from chakra_core.jobs.schedule import extra_warmup, stage_schedule, warmup_steps
from chakra_core.jobs.spec import JobSpec

STEADY_PERIODS = 4
"""Periods every rank spends inside its repeating nodes at the same time, in the traces kept: the
engine needs two instants a period apart there, each with its nodes in flight inside too."""
FEWEST_STEADY_PERIODS = 2
"""What a first try keeps instead where STEADY_PERIODS would leave no period out, and so the whole
step be simulated: two are often enough (measured: SC'21's 530B GPT, PP 35 interleaved, 280
micro-batches, folds keeping 210; Llama 3 70B on 1,024 H100 with VP 5 keeps 48 of 64; each the same
step to the ns), not always (Megatron-Bridge's Qwen3-235B-A22B on 256 H100, PP 8, VP 4: three
stages had not settled after 2 periods of 8 micro-batches, where 4 fold), hence not the default."""
RETRY_STEADY_PERIODS = 16
"""The steady periods of a second try when the first saw no instant repeat (at least pp + 2:
jobs/expand.py): room for a cycle of about a dozen periods (a pipeline whose stages take turns
to wait: Llama 3.1 405B on H100 with PP 8 and CP 2 repeats every 6 micro-batches)."""


def steady_periods(job: JobSpec) -> int:
    """The steady periods a first try keeps: STEADY_PERIODS, or FEWEST_STEADY_PERIODS where those
    would leave nothing out (the alternative is then the whole step, not a fold keeping more); with
    the tensors listed, at least tensor_steady_periods."""
    least = tensor_steady_periods(job)
    most, fewest = max(STEADY_PERIODS, least), max(FEWEST_STEADY_PERIODS, least)
    if simulated_microbatches(job, most)[1] and not simulated_microbatches(job, fewest)[1]:
        return fewest
    return most


def tensor_steady_periods(job: JobSpec) -> int:
    """The steady periods in which two instants a period apart can look alike to a memory layer
    that follows the traces' tensors (0: the tensors are not listed).

    An activation lives from its forward to its backward. Until the activations of the forwards
    before the repeating nodes (the warm-up's and the first period's) are freed, each instant holds
    some that no later instant can (the same storage with fewer references to come, where a period
    on holds a newer one), so no two match: the first instant that can is the first period start
    after the first stage's last such backward (the stage with the longest warm-up), and the second
    a period later, which must come before the last period's start (the look at the end of the
    repeating nodes counts only where the nodes after them repeat too, found as the traces are
    written). Measured with hbm on small jobs whose traces keep exactly the steady periods asked
    (PP 2, 3, 4 and 8 without interleaving, PP 3 and 4 with VP 2): one period fewer than this finds
    no repeat; PP 2 with VP 2 or 4 folds with one fewer (its end look counts)."""
    if not job.tensors:
        return 0
    pp, vp = job.parallel.pp, job.vp
    steps = stage_schedule(0, pp, vp, job.microbatches, extra_warmup(job))
    warmup = warmup_steps(0, pp, vp, job.microbatches, extra_warmup(job))
    period = period_microbatches(job) * vp                      # pairs
    backward = {(mb, chunk): position for position, (kind, mb, chunk) in enumerate(steps) if kind == "B"}
    last = max(((backward[mb, chunk] - warmup) // 2 for position, (kind, mb, chunk) in enumerate(steps)
                if kind == "F" and position < warmup + 2 * period), default=0)   # the pair freeing it
    first_clean = max(0, -(-(last + 1 - period) // period))     # periods into the repeating nodes
    return first_clean + 2


def period_microbatches(job: JobSpec) -> int:
    """Micro-batches after which a rank's schedule repeats."""
    return 1 if job.vp == 1 else job.parallel.pp


def simulated_microbatches(job: JobSpec, steady: int | None = None, multiple: int = 2) -> tuple[int, str]:
    """The micro-batches a folded-in-time step's traces keep (the job's own when nothing would be
    left out), with `steady` periods in steady state (None: steady_periods) and the periods left out a multiple of
    `multiple` (the cycle the engine may find: 2 by default, a pipeline that repeats every two
    periods folding too), and why not fewer ("" when fewer)."""
    if job.parallel.schedule != "1f1b":
        return job.microbatches, f"the {job.parallel.schedule} schedule is not folded in time"
    period, pp, vp = period_microbatches(job), job.parallel.pp, job.vp
    steady = steady_periods(job) if steady is None else steady
    # the pipeline fills and drains in about 2 pp pairs, besides the first and last periods (and
    # the combined schedule's extra warm-up forward)
    floor = (steady + 2) * period + (pp - 1 if vp == 1 else 2 * pp) + extra_warmup(job)
    periods = (job.microbatches - floor) // period
    if periods < max(2, multiple):
        least = tensor_steady_periods(job)
        alive = (f"; with the tensors listed a repeat needs {least} steady periods: the activations of the "
                 "forwards before them live into them" if least > FEWEST_STEADY_PERIODS else "")
        return job.microbatches, (f"{job.microbatches} micro-batch(es): too few to repeat (time folding keeps "
                                  f"{floor} and folds from {max(2, multiple)} periods of {period} left out{alive})")
    periods -= periods % multiple
    return job.microbatches - periods * period, ""


def reduced_job(job: JobSpec, microbatches: int) -> JobSpec:
    """The job with `microbatches` micro-batches per replica (its global batch cut to match)."""
    training = job.training.model_copy(update={"global_batch": microbatches * job.dp * job.training.micro_batch})
    return job.model_copy(update={"training": training})


def rank_periods(job: JobSpec, stage: int, step_starts: list[int]) -> RankPeriods | None:
    """Where a rank's trace repeats, from the node count before each of its schedule's steps
    (RankProgram.step_starts: a forward or a backward, or with the combined schedule a merged
    forward and backward, which is one step); None when its pairs are too few or not alike."""
    pp, vp, microbatches, extra = job.parallel.pp, job.vp, job.microbatches, extra_warmup(job)
    warmup = warmup_steps(stage, pp, vp, microbatches, extra)
    pairs = microbatches * vp - warmup
    steps_per_pair = 1 if job.parallel.overlap_moe_expert_parallel_comm else 2   # merged, or F and B
    if len(step_starts) != 2 * warmup + steps_per_pair * pairs:
        return None
    per_period = period_microbatches(job) * vp       # pairs per period
    if pairs < 4 * per_period:
        return None

    def pair(index: int) -> int:
        return step_starts[warmup + steps_per_pair * index]

    periods = (pairs - 2 * per_period) // per_period      # whole periods between the first and the last
    starts = [pair(per_period * (1 + j)) for j in range(periods + 1)]
    nodes = starts[1] - starts[0]
    if nodes <= 0 or any(b - a != nodes for a, b in zip(starts, starts[1:])):
        return None
    return RankPeriods(starts[0], starts[-1], nodes)


COMPARED_FIELDS = ("type", "start_time_micros", "duration_micros", "inputs", "outputs", "storage")
"""Node's fields _alike compares as they are; with the id, name, dependencies and attributes, every
field of the schema (a test holds the schema to it)."""


REACH_NODES = 1024
"""How far past the repeating nodes `reach` looks at most: a rank's state at an instant names its
lowest unfinished node and the few above it in flight, ready or finished (a handful to a few
hundred), so more would cost time at every generation and rarely let a look count."""

_P2P = (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
"""The nodes that carry a tag (et.build.p2p_attrs)."""


def _alike(node: pb.Node, earlier: pb.Node, shift: int, first: int, tag_shift: Callable[[], int]) -> bool:
    """`node` does what `earlier` does `shift` ids before it: every field equal but the name, the id
    and the dependencies from `first` on moved by `shift`, and a p2p tag moved by `tag_shift()`."""
    if node.id != earlier.id + shift or any(getattr(node, f) != getattr(earlier, f) for f in COMPARED_FIELDS):
        return False
    if list(node.data_deps) != [d + shift if d >= first else d for d in earlier.data_deps] or \
            list(node.ctrl_deps) != [d + shift if d >= first else d for d in earlier.ctrl_deps]:
        return False
    if node.attr == earlier.attr:
        return node.type not in _P2P or _tag(node) is None or tag_shift() == 0
    if [a for a in node.attr if a.name != "comm_tag"] != [a for a in earlier.attr if a.name != "comm_tag"]:
        return False
    mine, theirs = _tag(node), _tag(earlier)
    return mine is not None and theirs is not None and mine == theirs + tag_shift()


def _tag(node: pb.Node) -> int | None:
    return NodeView(node).int("comm_tag", None)


def reach(nodes: list[pb.Node], span: RankPeriods) -> int:
    """Where the trace stops repeating: `span.end`, or further (by a period and REACH_NODES at most)
    where the nodes after the repeating ones still do what the nodes a period before them do
    (their p2p tags moved as from the period before that). A longer step holds the same nodes
    there (its next period), so two instants whose states name nodes below it may be compared
    (chakra_core.engine.time_folding)."""
    at, n = span.end, span.nodes
    if span.end - span.first < 2 * n:
        return at

    def tag_shift() -> int:
        """How far the p2p tag of the node a period before `at` moved from the period before that."""
        tags = _tag(nodes[at - n]), _tag(nodes[at - 2 * n])
        return 0 if tags[0] is None or tags[1] is None else tags[0] - tags[1]

    while at < min(len(nodes), span.end + n, span.end + REACH_NODES):
        if not _alike(nodes[at], nodes[at - n], n, span.first, tag_shift):
            break
        at += 1
    return at
