"""One rank's training step under Megatron-FSDP (`use_megatron_fsdp`): the rank program with the
distributed optimizer's buckets replaced by Megatron-FSDP's, gathered, released and reduced at the
module hooks where Megatron-FSDP does it (chakra_core.jobs.sharding cites the rules).

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/distributed/fsdp/:
- Streams (src/megatron_fsdp/megatron_fsdp.py _init_fsdp_param_and_grad_buffer; param_and_grad_buffer.py
  AllGatherPipeline.all_gather_params, GradReducePipeline._bucket_group_gradient_reduce): all-gathers
  run on a stream of their own and reductions on another, each after the compute enqueued so far
  (wait_stream); the compute waits for a gather before its module runs (wait_bucket_ready: an event
  wait) and for a reduction when it is dequeued. Collectives of one process group run in the order
  they were launched, whichever stream launched them (src/docs/runtime_schedule.md, footnote 1: the
  NCCL communicator keeps the host's launch order), so each group's collectives are chained here.
- Sizes: an all-gather moves one rank's shard of the bucket, ceil(parameters / group) x 2 B (bf16
  parameters); a reduction the whole bucket in grad_reduce_dtype, which is Megatron-FSDP's main
  gradient dtype (at d98e8a64 --megatron-fsdp-main-grads-dtype, default the parameters' dtype; in
  the releases before adfe9e11d9, such as Megatron-Bridge 0.3.0's b0cc2706, fp32 with
  grad_reduce_in_fp32, else the parameters'). Megatron pads each bucket to a multiple of the group
  size times a row's elements; not modelled.
- Model state (param_and_grad_buffer.py _init_each_parameter_group_buffers, update_main_grads):
  bf16 weights (sharded with optim_grads_params; buckets outside units then also stay gathered), fp32
  main weights and Adam's two moments (sharded unless no_shard), main gradients (sharded with
  optim_grads and optim_grads_params), and an fp32 copy of 16-bit gradients for the optimizer.
- fp8: the weights are cast once per step after their gather (Transformer Engine's cached fp8 weights,
  as without FSDP); fp8 parameters (fp8_param_gather) are gathered in fp8 and transposed after each
  backward gather instead (jobs/fp8_params.py).

With `tensors: true` the transient buffers are listed so a memory layer sees them: a gathered
bucket from the first compute node after its gather is launched to the last one before it is freed;
an unsharded gradient bucket from its first unit's backward to the last compute node before its
reduction is waited for (Megatron allocates it at the unit's first weight gradient).
"""

from __future__ import annotations

from bisect import bisect_left

from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.schedule import stage_schedule
from chakra_core.jobs.sharding import EMBEDDING, HEAD, job_buckets, job_schedule
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb

_NAMES = {EMBEDDING: "embedding", HEAD: "head"}


def rank_program(job: JobSpec, placement: Placement, rank: int) -> RankProgram:
    """The rank's program: Megatron-FSDP's with use_megatron_fsdp, else the distributed optimizer's."""
    program = ShardedRankProgram if job.training.use_megatron_fsdp else RankProgram
    return program(job, placement, rank)


class ShardedRankProgram(RankProgram):
    """A rank's step with Megatron-FSDP (see the module docstring); one pipeline stage (sharding.py)."""

    def __init__(self, job: JobSpec, placement: Placement, rank: int):
        super().__init__(job, placement, rank)
        layers = self.chunk_layers(0)
        self.fsdp_buckets = job_buckets(job, layers, self.unit_params, self.expert_unit_params)
        self.fsdp = job_schedule(job, self.fsdp_buckets)
        self.gather_node: dict[int, int | None] = {}   # bucket -> its last all-gather
        self.reduce_node: dict[int, int | None] = {}   # bucket -> its reduction in flight
        self.gathered_at: dict[int, tuple[int, int]] = {}   # bucket -> (its transient storage, launch point)
        self.unsharded: dict[int, int] = {}            # bucket -> its unsharded gradient storage
        self.spans: list[tuple[int, int, int]] = []    # (storage, first point, last point) for the ledger
        self.pending_alloc: list[tuple[int, int]] = []   # (storage, point): first compute node from there

    # Sizes ----------------------------------------------------------------------------------------
    def shards(self, bucket: int) -> int:
        role = self._role(bucket)
        return len(self.groups[role]) if role in self.groups else 1

    def _role(self, bucket: int) -> str:
        return "edp" if self.fsdp_buckets[bucket].expert else "dp_cp"

    def local(self, bucket: int, sharded: bool) -> int:
        params = self.fsdp_buckets[bucket].params
        return -(-params // self.shards(bucket)) if sharded else params

    def local_linear(self, bucket: int, sharded: bool) -> int:
        """Of `local`, the fp8 weights (fp8_params.py)."""
        b = self.fsdp_buckets[bucket]
        linear = self.bucket_linear(b.units, b.expert)
        return -(-linear // self.shards(bucket)) if sharded else linear

    def _shard_bytes(self, bucket: int) -> int:
        return self.shard_bytes(self.fsdp_buckets[bucket].params, self.local_linear(bucket, False), self.shards(bucket))

    def _name(self, bucket: int) -> str:
        b = self.fsdp_buckets[bucket]
        where = ".".join(_NAMES.get(u, f"L{u}") for u in b.units) if b.in_unit or len(b.units) < 3 else f"b{bucket}"
        return where + (".experts" if b.expert else "")

    # Collectives ----------------------------------------------------------------------------------
    def _chained(self, name: str, bucket: int, kind: int, size: int, role: str | None = None,
                 after: list[int] | None = None) -> int | None:
        """A collective of the bucket's group (or `role`'s), chained on that group (`_dp_collective`)."""
        return self._dp_collective(name, role or self._role(bucket), kind, size, after)

    def _all_gather(self, ids: list[int], backward: bool = False, wait: bool = True, mb: int | None = None) -> None:
        """A module's unshard hook: free what the pipeline recycles, launch the window, wait for `ids`."""
        done = self.fsdp.gather(ids, backward)
        for bucket in done.freed:   # release_bucket waits for the gather first
            self.stream.wait(self.gather_node.get(bucket))
            self._end(bucket)
        prefix = "" if mb is None else f"mb{mb}."
        for bucket in done.launched:
            self.gather_node[bucket] = node = self._chained(
                f"{prefix}fsdp.all_gather.{self._name(bucket)}", bucket, pb.ALL_GATHER, self._shard_bytes(bucket))
            if self.ledger.enabled and self.fsdp.releases and self.fsdp_buckets[bucket].in_unit and \
                    self.shards(bucket) > 1:
                storage = self.weight_storage(self.fsdp_buckets[bucket].params, self.local_linear(bucket, False))
                self.ledger.refer(node, storage, output=True)
                self.gathered_at[bucket] = (storage, len(self.stream.nodes))
        if wait:
            self.stream.wait(*(self.gather_node.get(bucket) for bucket in ids))

    def _end(self, bucket: int) -> None:
        """A gathered unit bucket is freed here (the ledger lists it until the last compute node)."""
        span = self.gathered_at.pop(bucket, None)
        if span is not None:
            self.spans.append((span[0], span[1], len(self.stream.nodes)))

    def _release(self, unit: int) -> None:
        for bucket in self.fsdp.release(unit):
            self._end(bucket)

    def _reduce(self, bucket: int, prefix: str, queued: bool = True) -> None:
        """A bucket's reduction, after the queued ones over the capacity are waited for (`queued`)."""
        for waited in self.fsdp.reduce(bucket, queued):
            self._waited(waited)
        kind, what = (pb.ALL_REDUCE, "all_reduce") if self.fsdp.strategy == "no_shard" else \
            (pb.REDUCE_SCATTER, "reduce_scatter")
        node = self._chained(f"{prefix}fsdp.{what}.{self._name(bucket)}", bucket, kind,
                             self.fsdp_buckets[bucket].params * self.grad_bytes)
        if "dp_outer" in self.groups and (self._last_backward or not self.fsdp.grads_sharded):
            # HSDP: the last reduction of the step goes on across the replicas (sharding.py)
            node = self._chained(f"{prefix}fsdp.outer_all_reduce.{self._name(bucket)}", bucket, pb.ALL_REDUCE,
                                 self.local(bucket, self.fsdp.grads_sharded) * self.grad_bytes, "dp_outer",
                                 [] if node is None else [node])
        self.reduce_node[bucket] = node
        if bucket in self.unsharded:
            self.ledger.refer(node, self.unsharded[bucket], output=False)

    def _waited(self, bucket: int) -> None:
        self.stream.wait(self.reduce_node.pop(bucket, None))
        storage = self.unsharded.pop(bucket, None)
        if storage is not None:
            self.spans.append((storage, -1, len(self.stream.nodes)))

    def _reducing(self) -> bool:
        """Gradients are reduced in this backward: every one when sharded, else the last's (overlapped)."""
        return self.fsdp.grads_sharded or (self.job.training.overlap_grad_reduce and self._last_backward)

    # Hooks (kernels.LayerKernels, program.RankProgram) ---------------------------------------------
    _mb = 0

    def _await_params(self, unit: int) -> None:
        if unit < 0 and self.part == "forward":   # a layer's hook runs in _fp8_weights, before its cast
            self._all_gather(self.fsdp.of(unit), mb=self._mb)

    def _fp8_weights(self, layer: int) -> None:
        self._all_gather(self.fsdp.of(layer), mb=self._mb)
        if not self.fp8_primary:   # fp8 parameters: transposed in the backward (fp8_params.py)
            super()._fp8_weights(layer)

    def layer_forward(self, mb: int, layer: int) -> None:
        super().layer_forward(mb, layer)
        if self.part != "recompute":
            self._release(layer)

    def layer_backward(self, mb: int, layer: int, ready: bool = True) -> None:
        self._all_gather(self.fsdp.of(layer), backward=True, mb=mb)
        self._unshard_grads(layer)
        start = len(self.stream.nodes)
        self.weight_transpose(f"mb{mb}.L{layer}.weights", self.linear_weights(layer))
        transposed = len(self.stream.nodes) > start and self.ledger.enabled
        super().layer_backward(mb, layer, ready)
        if transposed:   # the transpose cache is dropped after the layer's backward
            self.spans.append((self.ledger.new(self.linear_weights(layer), 1), start, len(self.stream.nodes)))
        self._release(layer)

    def head_backward(self, mb: int) -> None:
        self._unshard_grads(HEAD)
        super().head_backward(mb)

    def embedding_backward(self, mb: int) -> None:
        self._unshard_grads(EMBEDDING)
        super().embedding_backward(mb)

    def _unshard_grads(self, unit: int) -> None:
        """Sharded gradients: the unsharded buckets whose first gradients this unit's backward makes."""
        if not (self.ledger.enabled and self.fsdp.grads_sharded):
            return
        for bucket, first in enumerate(self.fsdp.first_at):
            if first == unit and self.shards(bucket) > 1:
                storage = self.unsharded[bucket] = self.ledger.new(self.fsdp_buckets[bucket].params, self.grad_bytes)
                self.pending_alloc.append((storage, len(self.stream.nodes)))

    def _grad_ready(self, unit: int) -> None:
        if not self._reducing():
            return
        ready = [b for b, at in enumerate(self.fsdp.ready_at) if at == unit]
        for bucket in sorted(ready, key=lambda b: not self.fsdp_buckets[b].expert):   # experts' wgrads come first
            self._reduce(bucket, f"mb{self._mb}.")

    def _forward_step(self, mb: int, chunk: int) -> None:
        self._mb = mb
        super()._forward_step(mb, chunk)

    def _backward_step(self, mb: int, chunk: int) -> None:
        self._mb = mb
        self.fsdp.backward_starts()
        super()._backward_step(mb, chunk)
        if self._reducing():   # _root_post_backward: the reduction pipeline's reset waits for all
            for bucket in self.fsdp.drain():
                self._waited(bucket)

    # The step -------------------------------------------------------------------------------------
    def build(self) -> list[pb.Node]:
        job, t = self.job, self.job.training
        if t.overlap_param_gather:   # start_param_sync after the previous step: bucket 0 and its prefetch
            self._all_gather(self.fsdp.of(EMBEDDING), wait=False)
        if job.effects.step_overheads:   # zero_grad_buffer: the main gradients this rank holds
            self.part = "optimizer"
            zeroed = sum(self.local(b, self.fsdp.grads_sharded) for b in range(len(self.fsdp_buckets)))
            self.elementwise("optimizer.zero_grad_buffer", zeroed, zeroed * self.grad_bytes)
        for kind, mb, chunk in stage_schedule(self.stage, self.pp, self.vp, job.microbatches):
            if kind == "F":
                self._forward_step(mb, chunk)
            else:
                self._backward_step(mb, chunk)
        optimizer = self._step()
        if self.ledger.enabled:
            self._list_state(optimizer)
            self.ledger.write(self.stream.nodes)
        return self.stream.nodes

    def _step(self) -> int:
        """finish_grad_sync (the reductions left), finalize_model_grads, the optimizer step (returned)
        and, without overlap_param_gather, the parameters' all-gather."""
        t, buckets = self.job.training, range(len(self.fsdp_buckets))
        self.part = "dp"
        if not t.overlap_grad_reduce:   # start_grad_sync: every bucket launched, then all waited for
            for bucket in buckets:
                self._reduce(bucket, "", queued=False)
        for bucket in self.fsdp.drain():
            self._waited(bucket)
        self.fsdp.finish()
        sharded = self.fsdp.strategy != "no_shard"
        self._finalize_grads(len(self.groups.get("dp_cp", (0,))) if sharded else 1)
        step = self._adam(sum(self.local(bucket, sharded) for bucket in buckets),
                          sum(self.local_linear(bucket, sharded) for bucket in buckets),
                          self.fp8_weight_tensors(self.chunk_layers(0)))
        if self.fsdp.gathers and not t.overlap_param_gather:   # start_param_sync(force_sync)
            for bucket in buckets:
                self.gather_node[bucket] = self._chained(f"fsdp.all_gather.{self._name(bucket)}", bucket,
                                                         pb.ALL_GATHER, self._shard_bytes(bucket))
            self.stream.wait(*self.gather_node.values())
        return step

    def _list_state(self, optimizer: int) -> None:
        """Model state per bucket (sharded as the strategy says) from the first node to the optimizer,
        then the transient buffers over the compute nodes that bound them (module docstring)."""
        ledger, f = self.ledger, self.fsdp
        state = []
        copies = 3 if self.grad_bytes == 4 else 4   # master weight, two moments (and a gradient copy)
        for bucket, b in enumerate(self.fsdp_buckets):
            state.append(self.weight_storage(self.local(bucket, f.releases), self.local_linear(bucket, f.releases)))
            if f.releases and not b.in_unit and self.shards(bucket) > 1:   # kept gathered (preserved)
                state.append(self.weight_storage(b.params, self.local_linear(bucket, False)))
            state.append(ledger.new(self.local(bucket, f.grads_sharded), self.grad_bytes))
            state += [ledger.new(self.local(bucket, f.strategy != "no_shard"), 4) for _ in range(copies)]
        if self.fp8 and not self.fp8_primary:   # TE's fp8 weight (and its transpose), per linear weight
            state += [ledger.new(self.linear_weights(layer), 1) for layer in self.chunk_layers(0)
                      for _ in range(self.fp8_weight_copies)]
        for storage in state:
            ledger.refer(0, storage, output=True)
            ledger.refer(optimizer, storage, output=False)
        comps = [i for i, node in enumerate(self.stream.nodes) if node.type == pb.COMP_NODE]
        for storage, point in self.pending_alloc:   # the first compute node at or after the point
            ledger.refer(comps[bisect_left(comps, point)], storage, output=True)
        for storage, first, last in self.spans:     # ... and the last one before the end
            if first >= 0:
                ledger.refer(comps[bisect_left(comps, first)], storage, output=True)
            ledger.refer(comps[bisect_left(comps, last) - 1], storage, output=False)
