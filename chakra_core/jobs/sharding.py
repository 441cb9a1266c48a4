"""Megatron-FSDP (`use_megatron_fsdp`): which settings it takes, its buckets, and when it gathers,
releases and reduces them. Pure: the generator (jobs.fsdp) and the memory prediction
(plan.fsdp_memory) run the same `Schedule` at the same hooks, so the traces and the plan agree.

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/distributed/:
- Strategies (fsdp/src/megatron_fsdp/param_and_grad_buffer.py, _init_each_parameter_group_buffers):
  `no_shard` shards nothing; `optim` the fp32 main weights and Adam's state (ZeRO-1); `optim_grads`
  the main gradients too (ZeRO-2); `optim_grads_params` the bf16 weights too (ZeRO-3). The group is
  dp x cp (fsdp/mcore_fsdp_adapter.py _init_dist_index: dp_cp_group), experts' the expert
  data-parallel group (expt_dp_group). --data-parallel-sharding-strategy defaults to
  optim_grads_params (megatron/training/arguments.py).
- FSDP units (mcore_fsdp_adapter.py FullyShardedDataParallelV1.__init__): each TransformerLayer /
  MoETransformerLayer, for every strategy but no_shard. Buckets (param_and_grad_buffer.py
  _get_parameter_groups): parameters grouped in named_parameters order by (dtype, expert, unit), so
  the modules outside units (embedding, final norm, output layer) form the first group, cut into
  buckets at the DDP bucket size (max(40M, 1M x dp x cp); none without overlap_grad_reduce:
  training.py resolve_ddp_bucket_size), then each layer its dense and its expert bucket. no_shard
  has no units: one dense and one expert group in layer order, cut the same way.
- Gathers (param_and_grad_buffer.py AllGatherPipeline.all_gather_params): a module's forward
  pre-hook (megatron_fsdp.py _pre_forward_param_unshard) gathers its buckets and prefetches the next
  bucket ids while the prefetched elements are below suggested_communication_unit_size / 2, each
  bucket group in one coalesced all-gather, then waits for its own; a unit's backward pre-hook
  (_pre_backward_param_unshard) does the same downwards. Only empty buckets are gathered. The size
  defaults to max(1e9, 2 x a unit's mean parameters) with optim_grads_params, else max(1e9, bucket
  size) (megatron_fsdp.py _init_fsdp_param_and_grad_buffer). The first gather (bucket 0 and its
  prefetch) is launched after the previous step's optimizer (start_param_sync), here at the step's
  start. With optim_grads_params a unit's buckets are released after its forward (_post_forward)
  and after its backward (_post_backward_release_module); the root's backward pre-hook marks every
  unit bucket releasable (_root_pre_backward), and the next launch frees those still held
  (recycle_unused_buckets), waiting for their gather first (release_bucket). Buckets outside units
  stay gathered (reset(preserve_non_fsdp_units=True)). Other strategies gather each bucket once per
  step into the unsharded buffer (no release before finish_grad_sync); without overlap_param_gather
  (optim, optim_grads) they are gathered after the optimizer step.
- Reductions (megatron_fsdp.py _process_post_backward_gradients, GradReducePipeline): a bucket
  group is reduced once all its gradients are in, every micro-batch with optim_grads and
  optim_grads_params, else on the last micro-batch (overlap_grad_reduce) or after the backward
  passes (start_grad_sync); a reduce-scatter, an all-reduce with no_shard. Before each launch the
  compute stream waits for the oldest reductions while those queued hold more than
  suggested_communication_unit_size elements (wait_for_previous_grad_reduce), and at the end of a
  backward that reduced, for all of them (_root_post_backward: reset). A sharded gradient's bucket is
  unsharded while it is reduced and freed when waited for.
- Hybrid sharding, HSDP (num_distributed_optimizer_instances = R > 1; mcore_fsdp_adapter.py
  _init_dist_index, parallel_state.py): the dp x cp ranks split into R consecutive blocks
  (the intra-instance group) that shard, gather and reduce-scatter as above, and the inter-instance
  group of the ranks at the same place in each block. On the last micro-batch a bucket's reduction
  is followed by an all-reduce over the inter-instance group (GradReducePipeline, DP-Outer gradient
  reduction on a stream of its own after the reduce-scatter's): of the gradient shard with
  optim_grads and optim_grads_params, of the whole bucket with optim, whose gradient buffer is not
  sharded. The outer group's sharding (outer_dp_sharding_strategy) is no_shard, the default; optim
  there (HFSDP) is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
DEFAULT_STRATEGY = "optim_grads_params"
"""--data-parallel-sharding-strategy's default (megatron/training/arguments.py)."""
MIN_COMMUNICATION_UNIT = 1_000_000_000
"""megatron_fsdp.py: suggested_communication_unit_size = max(1_000_000_000, ...) when not given."""
EMBEDDING, HEAD = -1, -2
"""The units outside FSDP units: the embedding, and the final norm with the output layer."""


def strategy(job: JobSpec) -> str | None:
    """The job's data_parallel_sharding_strategy with Megatron-FSDP, else None."""
    t = job.training
    return (t.data_parallel_sharding_strategy or DEFAULT_STRATEGY) if t.use_megatron_fsdp else None


def sharding_problems(job: JobSpec) -> list[str]:
    """What Megatron-LM refuses or overrides with Megatron-FSDP, and what is not modelled."""
    t, p, m = job.training, job.parallel, job.shape
    replicas = t.num_distributed_optimizer_instances
    if not t.use_megatron_fsdp:
        partial = [] if replicas == 1 else ["training.num_distributed_optimizer_instances > 1 without "
                                            "use_megatron_fsdp (the partial distributed optimizer) is not modelled"]
        return [f"training.{key} needs training.use_megatron_fsdp" for key in
                ("data_parallel_sharding_strategy", "suggested_communication_unit_size") if getattr(t, key) is not None] + \
            partial
    out, sharded = [], strategy(job)
    if replicas > 1:
        out += hybrid_problems(job, sharded)
    if not t.distributed_optimizer:   # arguments.py: "Megatron-FSDP v1 is only compatible with ..."
        out.append("training.use_megatron_fsdp runs the distributed optimizer (Megatron-LM switches it on): "
                   "remove training.distributed_optimizer: false")
    if sharded in ("optim_grads", "optim_grads_params") and not t.overlap_grad_reduce:
        out.append(f"data_parallel_sharding_strategy {sharded} reduce-scatters gradients during the backward "
                   "(Megatron-FSDP forces overlap_grad_reduce on): remove training.overlap_grad_reduce: false")
    if sharded == "optim_grads_params" and not t.overlap_param_gather:
        out.append("data_parallel_sharding_strategy optim_grads_params gathers parameters unit by unit "
                   "(Megatron-FSDP forces overlap_param_gather on): remove training.overlap_param_gather: false")
    not_modelled = [("parallel.pp > 1", p.pp > 1), ("model.mtp_num_layers", m.mtp_layers > 0),
                    ("parallel.overlap_moe_expert_parallel_comm (fine-grained unshard hooks)",
                     p.overlap_moe_expert_parallel_comm),
                    ("training.recompute full with optim_grads_params (the recomputed forward re-enters "
                     "the units' hooks)", t.recompute == "full" and sharded == "optim_grads_params")]
    out += [f"training.use_megatron_fsdp with {what} is not modelled" for what, bad in not_modelled if bad]
    return out


@dataclass(frozen=True)
class Bucket:
    """One of Megatron-FSDP's parameter groups (buckets), in bucket-id order."""

    units: tuple[int, ...]
    """Its units in forward order: EMBEDDING, layers (>= 0), HEAD."""
    params: int
    """Parameters (unsharded elements) on this rank's model replica."""
    expert: bool
    """Routed experts': sharded over the expert data-parallel group."""
    in_unit: bool
    """An FSDP unit's (a layer's), released after use with optim_grads_params."""


def plan_buckets(layers: Sequence[int], dense: Callable[[int], int], experts: Callable[[int], int],
                 strategy: str, bucket_size: int | None) -> list[Bucket]:
    """The buckets of a model replica whose layers are `layers` (forward order), `dense(unit)` and
    `experts(unit)` its parameters (see the module docstring)."""
    def cut(units: Sequence[int], size: Callable[[int], int], expert: bool) -> list[Bucket]:
        out, run, total = [], [], 0
        for unit in units:
            if not size(unit):
                continue
            run.append(unit)
            total += size(unit)
            if bucket_size is not None and total >= bucket_size:
                out.append(Bucket(tuple(run), total, expert, False))
                run, total = [], 0
        return out + ([Bucket(tuple(run), total, expert, False)] if run else [])
    if strategy == "no_shard":
        return cut([EMBEDDING, *layers, HEAD], dense, False) + cut(layers, experts, True)
    units = [Bucket((layer,), size(layer), expert, True) for layer in layers
             for size, expert in ((dense, False), (experts, True)) if size(layer)]
    return cut([EMBEDDING, HEAD], dense, False) + units


def communication_unit(job: JobSpec, buckets: Sequence[Bucket], bucket_size: int | None) -> int:
    """suggested_communication_unit_size: the reduce-scatter queue's capacity, twice the prefetch."""
    given = job.training.suggested_communication_unit_size
    if given is not None:
        return given
    if strategy(job) == "optim_grads_params":
        layers = {unit for bucket in buckets if bucket.in_unit for unit in bucket.units}
        size = sum(b.params for b in buckets if b.in_unit) // max(len(layers), 1) * 2
    else:
        size = bucket_size if bucket_size is not None else MIN_COMMUNICATION_UNIT
    return max(MIN_COMMUNICATION_UNIT, size)


@dataclass
class Gather:
    """What a gather call does: buckets freed first (their gathers waited for), buckets launched."""

    freed: list[int] = field(default_factory=list)
    launched: list[int] = field(default_factory=list)


def bucket_size(job: JobSpec) -> int | None:
    """Megatron's DDP bucket size, which cuts the buckets outside units (none without overlap_grad_reduce)."""
    return job.bucket_params if job.training.overlap_grad_reduce else None


def job_buckets(job: JobSpec, layers: Sequence[int], dense: Callable[[int], int],
                experts: Callable[[int], int]) -> list[Bucket]:
    """plan_buckets with the job's strategy and bucket size: the generator's and the memory walk's."""
    return plan_buckets(layers, dense, experts, strategy(job) or "", bucket_size(job))


def job_schedule(job: JobSpec, buckets: Sequence[Bucket]) -> Schedule:
    """The hooks' schedule of `buckets` with the job's strategy and communication unit."""
    return Schedule(buckets, strategy(job) or "", communication_unit(job, buckets, bucket_size(job)))


class Schedule:
    """The state of one rank's buckets through the hooks of a step (module docstring)."""

    def __init__(self, buckets: Sequence[Bucket], strategy: str, unit_size: int):
        self.buckets = list(buckets)
        self.strategy = strategy
        self.prefetch = unit_size // 2       # suggested_AG_prefetch_size
        self.capacity = unit_size            # suggested_RS_queue_capacity
        self.gathered: set[int] = set()      # buckets gathered or being gathered (READY / COMMUNICATING)
        self.releasable: set[int] = set()    # bucket_can_be_released
        self.queue: list[int] = []           # reductions launched and not yet waited for
        order = [HEAD, *sorted({u for b in buckets for u in b.units if u >= 0}, reverse=True), EMBEDDING]
        position = {unit: i for i, unit in enumerate(order)}
        # a bucket is reduced after its last unit's backward and unsharded from its first unit's
        self.ready_at = [max(b.units, key=position.__getitem__) for b in buckets]
        self.first_at = [min(b.units, key=position.__getitem__) for b in buckets]

    @property
    def gathers(self) -> bool:
        return self.strategy != "no_shard"

    @property
    def releases(self) -> bool:
        return self.strategy == "optim_grads_params"

    @property
    def grads_sharded(self) -> bool:
        return self.strategy in ("optim_grads", "optim_grads_params")

    def of(self, unit: int) -> list[int]:
        """The buckets holding a unit's parameters."""
        return [i for i, b in enumerate(self.buckets) if unit in b.units]

    def gather(self, ids: Sequence[int], backward: bool = False) -> Gather:
        """A module's unshard: its buckets and the prefetch window (AllGatherPipeline.all_gather_params)."""
        out = Gather()
        if not self.gathers or not ids:
            return out
        window = sorted(set(ids))
        self.releasable -= set(window)
        base = sum(self.buckets[i].params for i in window)
        nxt = self._next(window, backward)
        while nxt is not None and sum(self.buckets[i].params for i in window) - base < self.prefetch:
            window = sorted({*window, nxt})   # each bucket is a bucket group of its own here
            nxt = self._next(window, backward)
        out.launched = [i for i in window if i not in self.gathered]
        if out.launched:   # the first async_bucket_gather frees the releasable ones (recycle_unused_buckets)
            self.releasable -= set(out.launched)
            out.freed = sorted(self.releasable & self.gathered)
            self.gathered -= self.releasable
            self.releasable.clear()
            self.gathered |= set(out.launched)
        return out

    def _next(self, window: list[int], backward: bool) -> int | None:
        """next_bucket_id: the first id past the contiguous run from the window's first (forward) or
        last (backward) bucket."""
        step = -1 if backward else 1
        nxt = (window[-1] if backward else window[0]) + step
        for i in (reversed(window[:-1]) if backward else window[1:]):
            if i != nxt:
                break
            nxt += step
        return nxt if 0 <= nxt < len(self.buckets) else None

    def release(self, unit: int) -> list[int]:
        """optim_grads_params: a unit's buckets after its forward or backward."""
        if not self.releases:
            return []
        freed = [i for i in self.of(unit) if i in self.gathered and self.buckets[i].in_unit]
        self.gathered -= set(freed)
        return freed

    def backward_starts(self) -> None:
        """_root_pre_backward: with optim_grads_params, every unit bucket may be freed."""
        if self.releases:
            self.releasable |= {i for i, b in enumerate(self.buckets) if b.in_unit}

    def reduce(self, bucket: int, queued: bool = True) -> list[int]:
        """Before a bucket's reduction is launched: the queued ones waited for (oldest first), unless
        not `queued` (start_grad_sync launches every bucket, then waits for all)."""
        waited = []
        while queued and self.queue and sum(self.buckets[i].params for i in self.queue) > self.capacity:
            waited.append(self.queue.pop(0))
        self.queue.append(bucket)
        return waited

    def drain(self) -> list[int]:
        """Every queued reduction waited for (GradReducePipeline.reset)."""
        waited, self.queue = self.queue, []
        return waited

    def finish(self) -> None:
        """finish_grad_sync: unit buckets released; the others kept, but gathered again at their
        next use (PRESERVED), so every bucket counts as not gathered."""
        self.gathered.clear()
        self.releasable.clear()


def hybrid_problems(job: JobSpec, sharded: str | None) -> list[str]:
    """Hybrid sharding (HSDP) as Megatron-LM takes it (parallel_state.py at d98e8a64: dp x cp must divide
    into the instances); what is not modelled."""
    replicas, m = job.training.num_distributed_optimizer_instances, job.shape
    out = []
    if (job.dp * job.parallel.cp) % replicas:
        out.append(f"training.num_distributed_optimizer_instances {replicas} must divide dp x cp = "
                   f"{job.dp * job.parallel.cp}")
    if sharded == "no_shard":
        out.append("training.num_distributed_optimizer_instances > 1 with data_parallel_sharding_strategy no_shard "
                   "shards nothing to replicate: not modelled")
    if m.moe:   # mcore_fsdp_adapter.py: the experts' hybrid groups "has not been tested yet"
        out.append("training.num_distributed_optimizer_instances > 1 with a mixture of experts is not modelled")
    return out
