"""One rank's training step as a Chakra trace: its stage's layers for every micro-batch in the
pipeline schedule's order, the gradient reduction and the optimizer step.

Compute nodes carry what a compute model needs to time them: `num_ops` (FLOPs), `tensor_size`
(bytes moved), `kernel` (gemm, attention, elementwise, ...), GEMM shapes (`gemm_m/n/k/batch`)
or attention shapes (`attn_*`), and `dtype`. Every node says which part of the step it belongs
to (`step_part`: forward, backward, recompute, optimizer, or the communicator role tp, cp, dp,
pp, other), so a run can split the step (jobs.report). docs/training.md lists the kernels and
their FLOP and byte formulas; `comm_size` follows docs/collectives.md (an all-gather's size is
one rank's input, a reduce-scatter's and an all-reduce's the whole buffer).

Not modelled: the loss all-reduce (a few bytes). With `tensors: true` nodes list the tensors the
step keeps alive (chakra_core.jobs.tensors).
"""

from __future__ import annotations

from typing import Callable

from chakra_core.et.build import p2p_attrs, str_attr
from chakra_core.jobs.moe_overlap import combined_phases
from chakra_core.jobs.offload import ActivationOffload
from chakra_core.jobs.optimizer import AdamStep
from chakra_core.jobs.param_gathers import ParamGathers
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.schedule import pipeline_steps
from chakra_core.jobs.spec import JobSpec
from chakra_core.jobs.zero_bubble import WeightPasses
from chakra_core.schema import pb


class RankProgram(ActivationOffload, ParamGathers, AdamStep, WeightPasses):
    """Builds the node list of one rank (`build`)."""

    def __init__(self, job: JobSpec, placement: Placement, rank: int):
        super().__init__(job, placement, rank)
        self.pending_grads: list[int] = []
        self.chain: dict[str, int | None] = {}            # data-parallel group -> its last collective
        self.reductions = 0                               # gradient buckets reduced so far
        self.expert_reductions = 0                        # expert gradient buckets reduced so far
        self.expert_buckets: list[tuple[list[int], int]] = []
        self.expert_bucket_end: dict[int, int] = {}
        self._seen_forward: set[int] = set()               # chunks whose first forward has run
        self.step_starts: list[int] = []                   # node count before each schedule step (time_fold.py)
        t = job.training
        if t.recompute == "full":
            for chunk in range(self.vp):
                layers = self.chunk_layers(chunk)
                self.recomputed.update(layers[:t.recompute_layers or len(layers)])

    # Gradients and parameters -----------------------------------------------------------------------
    def _grad_ready(self, layer: int) -> None:
        """With overlap_grad_reduce, in the last backward of a chunk, launch the reduction of every
        bucket now complete (Megatron's register_grad_ready); without it, every bucket is reduced
        once after the backward passes (`_optimizer`: finish_grad_sync starts and waits for them)."""
        if self.job.training.overlap_grad_reduce and self._last_backward and layer in self.bucket_end:
            self._reduce_bucket(self.bucket_end[layer])
        if self.job.training.overlap_grad_reduce and self._last_backward and layer in self.expert_bucket_end:
            self._reduce_bucket(self.expert_bucket_end[layer], expert=True)

    def _reduce_bucket(self, params: int, expert: bool = False) -> None:
        """A bucket's reduction: dense gradients over dp x cp, expert gradients over the expert-data-
        parallel group (distributed_data_parallel.py at d98e8a64: expert_parallel_buffers on
        expert_data_parallel_group)."""
        role = "edp" if expert else "dp_cp"
        if role not in self.groups:
            return
        dist = self.job.training.distributed_optimizer
        kind, what = (pb.REDUCE_SCATTER, "reduce_scatter") if dist else (pb.ALL_REDUCE, "all_reduce")
        if expert:
            name = f"grads.edp_{what}.{self.expert_reductions}"
            self.expert_reductions += 1
        else:
            name = f"grads.dp_{what}.{self.reductions}"
            self.reductions += 1
        node = self._dp_collective(name, role, kind, params * self.grad_bytes)
        if node is not None:
            if self.job.training.overlap_grad_reduce:
                self.pending_grads.append(node)
            else:
                self.stream.wait(node)

    def _dp_collective(self, name: str, role: str, kind: int, size: int, after: list[int] | None = None) -> int | None:
        """A collective of a data-parallel group, after the compute so far (or `after`) and the group's
        last collective: Megatron-Core launches every bucket's reduction and parameter all-gather on the
        group's process group (param_and_grad_buffer.py at d98e8a64, start_grad_sync / start_param_sync),
        and PyTorch's ProcessGroupNCCL runs a group's collectives on one NCCL stream (ncclStreams_)."""
        last = self.chain.get(role)
        after = [*(self.stream.frontier if after is None else after), *([last] if last is not None else [])]
        node = self.collective(name, role, kind, size, "dp", after=after)
        if node is not None:
            self.chain[role] = node
        return node

    # Buckets --------------------------------------------------------------------------------------
    def chunk_layers(self, chunk: int) -> list[int]:
        return self.job.chunk_layers(self.stage, chunk)

    def has_embedding(self, chunk: int) -> bool:
        return self.stage == 0 and chunk == 0

    def has_head(self, chunk: int) -> bool:
        return self.stage == self.pp - 1 and chunk == self.vp - 1

    def unit_params(self, unit: int) -> int:
        """Parameters this rank holds for a layer (>= 0), the embedding (-1) or the head (-2)."""
        m, h = self.job.shape, self.h
        # an MTP layer (unit >= layers) adds its column-parallel eh_proj and replicated norms
        mtp = 2 * h * h // self.tp + m.mtp_extra_params() - 2 * h * h if unit >= m.layers else 0
        if unit >= 0 and m.is_moe_layer(unit):   # attention, norms, router and shared experts
            return m.layer_params_on(self.tp) - m.mlp_params_on(self.tp) + self.moe_dense_params_here() + mtp
        if unit >= 0:
            return m.layer_params_on(self.tp) + mtp
        if unit == -1:
            return self.vocab * h + (self.s * h if m.position == "learned" else 0)
        shared = m.tied_embeddings and self.pp == 1   # the head multiplies by the embedding itself
        # a last stage running MTP layers holds its own copy of the (untied) word embedding
        copy = self.vocab * h if self.mtp_here and not m.tied_embeddings and not self.has_embedding(self.vp - 1) else 0
        return (0 if shared else self.vocab * h) + h + copy

    def mtp_units(self, chunk: int) -> list[int]:
        """The MTP layers of a chunk, as units (layers + k)."""
        here = self.mtp_here if self.has_head(chunk) else 0
        return [self.job.shape.layers + k for k in range(here)]

    def backward_units(self, chunk: int) -> list[int]:
        # the MTP layers' gradients complete before the head's final norm (kernels.head_backward)
        units = self.mtp_units(chunk)[::-1] + ([-2] if self.has_head(chunk) else []) + self.chunk_layers(chunk)[::-1]
        return units + ([-1] if self.has_embedding(chunk) else [])

    def _by_chunk(self, buckets: list[tuple[list[int], int]]) -> list[list[tuple[list[int], int]]]:
        """The buckets of each model chunk (plan_buckets lists them chunk after chunk)."""
        chunk_of = {unit: chunk for chunk in range(self.vp) for unit in self.backward_units(chunk)}
        out: list[list[tuple[list[int], int]]] = [[] for _ in range(self.vp)]
        for units, size in buckets:
            out[chunk_of[units[0]]].append((units, size))
        return out

    def expert_unit_params(self, unit: int) -> int:
        """Routed experts' parameters this rank holds for a unit (0 but in MoE layers)."""
        return self.expert_params_here() if unit >= 0 and self.job.shape.is_moe_layer(unit) else 0

    def plan_buckets(self) -> list[tuple[list[int], int]]:
        """Megatron-Core's buckets: parameters in backward order, one set per model chunk, cut when
        a bucket reaches bucket_params, but only in the first pipeline stage's first chunk with
        overlap_grad_reduce; every other chunk is one bucket (NVIDIA/Megatron-LM
        megatron/training/training.py at d98e8a64: resolve_ddp_bucket_size gives None without
        overlap_grad_reduce, and get_model disables bucketing for chunks after the first and for
        pp ranks > 0, "since data-parallel communication on these stages is not on the critical
        path"). Returns each bucket's units and parameters; sets bucket_end (a bucket's last
        unit -> its parameters). A mixture of experts' routed experts are bucketed by the same rule
        in a buffer of their own (`expert_buckets`, `expert_bucket_end`; units without experts skipped)."""
        buckets = self._cut_buckets(self.unit_params, skip_empty=False)
        self.bucket_end = {units[-1]: size for units, size in buckets}
        if self.job.shape.moe:
            self.expert_buckets = self._cut_buckets(self.expert_unit_params, skip_empty=True)
            self.expert_bucket_end = {units[-1]: size for units, size in self.expert_buckets}
        return buckets

    def _cut_buckets(self, params_of: Callable[[int], int], skip_empty: bool) -> list[tuple[list[int], int]]:
        buckets: list[tuple[list[int], int]] = []
        bucketing = self.job.training.overlap_grad_reduce and self.stage == 0
        for chunk in range(self.vp):
            limit = self.job.bucket_params if bucketing and chunk == 0 else None
            units, size = [], 0
            for unit in self.backward_units(chunk):
                params = params_of(unit)
                if skip_empty and not params:
                    continue
                units.append(unit)
                size += params
                if limit is not None and size >= limit:
                    buckets.append((units, size))
                    units, size = [], 0
            if units:
                buckets.append((units, size))
        return buckets

    # The step -------------------------------------------------------------------------------------
    def build(self) -> list[pb.Node]:
        job, t = self.job, self.job.training
        m = job.microbatches
        buckets = self.plan_buckets()
        stage_params = sum(size for _, size in buckets)
        shards = len(self.groups.get("dp_cp", (0,)))
        dist = t.distributed_optimizer and self.dp_group is not None
        if dist and t.overlap_param_gather:   # parameters updated by the previous step, bucket by bucket
            self._plan_param_gathers(buckets)
        if self._expert_sharded and t.overlap_param_gather:
            self._plan_param_gathers(self.expert_buckets, expert=True)
        zeroed = stage_params + sum(size for _, size in self.expert_buckets)
        if job.effects.step_overheads:   # Megatron's train_step zeroes the grad buffers first
            self.part = "optimizer"
            self.elementwise("optimizer.zero_grad_buffer", zeroed, zeroed * self.grad_bytes)
        self.start_param_gathers()
        if job.parallel.overlap_moe_expert_parallel_comm:
            for forward, backward in combined_phases(self.stage, self.pp, self.vp, m):
                self.combined_step(forward, backward)
        else:
            for kind, mb, chunk in pipeline_steps(self.stage, self.pp, self.vp, m, job.parallel.schedule):
                if kind == "F":
                    self._forward_step(mb, chunk)
                elif kind == "B":
                    self._backward_step(mb, chunk)
                else:
                    self._weight_step(mb, chunk)
        optimizer = self._optimizer(stage_params, shards, dist, buckets)
        if self.ledger.enabled:
            self._list_model_state(buckets, shards if dist else 1, optimizer)
            self.ledger.write(self.stream.nodes)
        return self.stream.nodes

    def _begin_forward(self, chunk: int) -> None:
        """A chunk's first forward quantizes fp8 weights and launches the parameter gathers due."""
        self._first_forward = chunk not in self._seen_forward
        self._seen_forward.add(chunk)
        if self._first_forward:
            for unit in self.gather_with.pop(chunk, ()):
                self.param_gather[unit] = self._gather_params(unit)

    def _forward_step(self, mb: int, chunk: int) -> None:
        self.step_starts.append(len(self.stream.nodes))
        self.part = "forward"
        self._begin_forward(chunk)
        self._receive("fwd", mb, chunk)
        if self.has_embedding(chunk):
            self.embedding_forward(mb)
        for layer in self.chunk_layers(chunk):
            self._fp8_weights(layer)
            self.layer_forward(mb, layer)
        if self.has_head(chunk):
            self.head_forward(mb)
        self._send("fwd", mb, chunk)
        self.amax_reduction(f"mb{mb}.c{chunk}.fwd", len(self.chunk_layers(chunk)))

    def _backward_step(self, mb: int, chunk: int) -> None:
        self.step_starts.append(len(self.stream.nodes))
        self._last_backward = mb == self.job.microbatches - 1
        self._receive("bwd", mb, chunk)
        self.part = "backward"
        if self.has_head(chunk):
            self.head_backward(mb)
        layers = self.chunk_layers(chunk)
        for layer in reversed(layers):
            if layer in self.recomputed:
                self.part = "recompute"
                self.layer_forward(mb, layer)
                self.part = "backward"
            self.layer_backward(mb, layer)
        if self.has_embedding(chunk):
            self.embedding_backward(mb)
        self._send("bwd", mb, chunk)
        self.amax_reduction(f"mb{mb}.c{chunk}.bwd", len(layers))

    def _list_model_state(self, buckets: list[tuple[list[int], int]], shards: int, optimizer: int) -> None:
        """Weights, main gradients and optimizer shards per bucket, and fp8 weight copies per layer:
        listed by the rank's first node (they exist before the step) and read by the optimizer."""
        ledger = self.ledger
        state = []
        fp32_copies = 3 if self.grad_bytes == 4 else 4   # master weight, two moments (and a gradient copy)
        expert_shards = len(self.groups["edp"]) if self._expert_sharded else 1
        for (units, size), split, expert in [*((bucket, shards, False) for bucket in buckets),
                                             *((bucket, expert_shards, True) for bucket in self.expert_buckets)]:
            state += [self.weight_storage(size, self.bucket_linear(units, expert)), ledger.new(size, self.grad_bytes)]
            shard = -(-size // split)   # less what lives on the host (optimizer_offload.py)
            state += [ledger.new(shard - self.offloaded_elements(shard), 4) for _ in range(fp32_copies)]
        if self.fp8:   # TE's fp8 copies of each linear weight (fp8_params.py)
            for chunk in range(self.vp):
                for layer in self.chunk_layers(chunk) + self.mtp_units(chunk):
                    state += [ledger.new(self.linear_weights(layer), 1) for _ in range(self.fp8_weight_copies)]
        for storage in state:
            ledger.refer(0, storage, output=True)
            ledger.refer(optimizer, storage, output=False)

    _first_forward = True
    _last_backward = False

    def _fp8_weights(self, layer: int) -> None:
        """fp8: each linear weight is quantized (and transposed for the backward) once per step; fp8
        parameters are transposed after their gather (fp8_params.py)."""
        if self.fp8 and self._first_forward:
            fp8_ready = self.weight_transpose if self.fp8_primary else self.quantize
            fp8_ready(f"L{layer}.weights", self.linear_weights(layer))

    def _optimizer(self, stage_params: int, shards: int, dist: bool, buckets: list[tuple[list[int], int]]) -> int:
        """The gradient reductions left, the optimizer step (returned) and the parameters' all-gather."""
        t = self.job.training
        if not t.overlap_grad_reduce:
            self.part = "dp"
            for _, size in buckets:
                self._reduce_bucket(size)
            for _, size in self.expert_buckets:
                self._reduce_bucket(size, expert=True)
        self.stream.wait(*self.pending_grads)
        self._finalize_grads()
        updated = -(-stage_params // shards) if dist else stage_params
        expert_shards = len(self.groups["edp"]) if self._expert_sharded else 1
        updated += sum(-(-size // expert_shards) for _, size in self.expert_buckets)   # their own shards
        linear = [self.bucket_linear(units) for units, _ in buckets]
        expert_linear = [self.bucket_linear(units, True) for units, _ in self.expert_buckets]
        step = self._adam(updated, (-(-sum(linear) // shards) if dist else sum(linear)) +
                          sum(-(-size // expert_shards) for size in expert_linear),
                          self.fp8_weight_tensors([unit for units, _ in buckets for unit in units]))
        if dist and not t.overlap_param_gather:
            for i, ((_, size), fp8) in enumerate(zip(buckets, linear)):
                self.blocking(f"params.dp_all_gather.{i}", "dp_cp", pb.ALL_GATHER, self.shard_bytes(size, fp8, shards),
                              "dp")
        if self._expert_sharded and not t.overlap_param_gather:
            for i, ((_, size), fp8) in enumerate(zip(self.expert_buckets, expert_linear)):
                self.blocking(f"params.edp_all_gather.{i}", "edp", pb.ALL_GATHER,
                              self.shard_bytes(size, fp8, expert_shards), "dp")
        return step

    def _finalize_grads(self, shards: int = 1) -> None:
        """finalize_model_grads after the data-parallel reductions; `shards`: the TP-replicated norms'
        gradients are each rank's shard of them (Megatron-FSDP's local tensors)."""
        m = self.job.shape
        units = [unit for chunk in range(self.vp) for unit in self.chunk_layers(chunk) + self.mtp_units(chunk)]
        routers = sum(1 for unit in units if m.is_moe_layer(unit))
        if self.job.effects.step_overheads and (self.sp or m.qk_layernorm):
            # finalize_model_grads: _allreduce_non_tensor_model_parallel_grads (replicated norms, duplicated
            # linears, QK norms, and MoE routers: router.py marks their weight sequence_parallel); without
            # SP only the QK norms
            if self.sp:
                mtp_norms = len(self.mtp_units(self.vp - 1)) * (m.mtp_extra_params() - 2 * self.h * self.h)
                norms = len(units) * m.tp_replicated_params() + routers * self.h * (m.num_experts or 0) + mtp_norms
            else:
                norms = len(units) * (m.tp_replicated_params() - m.norm_params())
            self.blocking("grads.tp_norm_all_reduce", "tp", pb.ALL_REDUCE, -(-norms // shards) * self.grad_bytes, "tp")
        if routers and "stage" in self.groups:   # the routers' token counts, for the expert bias (fp32)
            self.blocking("grads.expert_bias_all_reduce", "stage", pb.ALL_REDUCE, routers * (m.num_experts or 0) * 4,
                          "other")
        if "emb" in self.groups:   # tied word embedding: first and last stage add their gradients
            self.blocking("grads.embedding_all_reduce", "emb", pb.ALL_REDUCE, self.vocab * self.h * self.grad_bytes,
                          "dp")

    @property
    def _expert_sharded(self) -> bool:
        """Expert parameters' optimizer state is sharded over the expert-data-parallel group."""
        return self.job.training.distributed_optimizer and "edp" in self.groups

    # Pipeline ---------------------------------------------------------------------------------------
    def _receive(self, direction: str, mb: int, chunk: int) -> None:
        self.stream.wait(self._exchange(False, direction, mb, chunk))

    def _send(self, direction: str, mb: int, chunk: int) -> None:
        self._exchange(True, direction, mb, chunk)

    def _exchange(self, send: bool, direction: str, mb: int, chunk: int) -> int | None:
        """The send or receive of a chunk's activations ("fwd") or their gradients ("bwd") with
        the neighbouring virtual stage: the stage before (wrapping to the last stage's previous
        chunk) or after (wrapping to the first stage's next chunk); none at either end."""
        if self.pp == 1:
            return None
        upstream = (direction == "fwd") != send      # the peer comes before this chunk
        first = self.stage == 0 and chunk == 0
        last = self.stage == self.pp - 1 and chunk == self.vp - 1
        if first if upstream else last:
            return None
        step = -1 if upstream else 1
        peer = self.place.peer(self.rank, step)
        # tagged with the sender's chunk: a peer across the wrap holds the chunk before or after
        sender_chunk = chunk if send else chunk + (self.stage + step) // self.pp
        tag = (mb * self.vp + sender_chunk) * 2 + (0 if direction == "fwd" else 1)
        src, dst = (self.rank, peer) if send else (peer, self.rank)
        attrs = [*p2p_attrs(src, dst, tag, self._p2p_bytes()), str_attr("step_part", "pp")]
        if send:
            return self.stream.launch(pb.COMM_SEND_NODE, f"send.{direction}.mb{mb}.c{chunk}", attrs=attrs)
        return self.stream.launch(pb.COMM_RECV_NODE, f"recv.{direction}.mb{mb}.c{chunk}", attrs=attrs)

    def _p2p_bytes(self) -> int:
        return self.local_tokens * self.h * self.act_bytes
