"""Peak memory per GPU under Megatron-FSDP (`use_megatron_fsdp`): the model state as its strategy
shards it, and the activations walked module by module with the buffers Megatron-FSDP holds beside
them, gathered and released by the same schedule the traces follow (chakra_core.jobs.sharding).

Per parameter of a bucket, N its group (dp x cp, with hybrid sharding one replica's dp x cp / R, or the expert data-parallel group for routed
experts; param_and_grad_buffer.py _init_each_parameter_group_buffers at NVIDIA/Megatron-LM d98e8a64):
- weights: 2 B, / N with optim_grads_params, whose buckets outside units (embedding, final norm,
  output layer) also stay gathered, 2 B more (AllGatherPipeline.reset(preserve_non_fsdp_units));
  fp8 adds Transformer Engine's two fp8 copies per linear weight, as without FSDP (plan.memory);
- gradients: the main gradient in grad_reduce_dtype, / N with optim_grads and optim_grads_params;
- optimizer: fp32 main weight and Adam's two moments, 12 B, and an fp32 copy of 16-bit gradients
  (update_main_grads casts them to the main weights' dtype), 4 B; / N unless no_shard.
Transient, on top of the activations where they exist:
- with optim_grads_params, each unit bucket gathered (bf16, whole) from the first compute after its
  all-gather is launched until released (after the unit's forward or backward, or recycled at the
  next launch of a backward);
- with optim_grads and optim_grads_params, each bucket's unsharded gradient from its first unit's
  backward until its reduce-scatter is waited for (queue over capacity, or the end of the backward).
The walk visits the modules in the traces' order (embedding, layers, output layer and loss; then
backward), a module's peak being what it holds at its end in the forward (plus the logits at the
loss) and at its start in the backward (plus what a recomputation rebuilds), as plan.memory's walk.
One pipeline stage (sharding.py refuses pp > 1); the first two micro-batches (later ones repeat the
second: every gradient bucket is waited for at the end of each backward that reduces).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from chakra_core.jobs.sharding import EMBEDDING, HEAD, Bucket, Schedule, job_buckets, job_schedule
from chakra_core.jobs.spec import DTYPE_BYTES, JobSpec
from chakra_core.plan.expert_memory import moe_layer_params

if TYPE_CHECKING:   # plan.memory hands its counts in (it calls this module)
    from chakra_core.plan.memory import _Chunk


def fsdp_buckets(job: JobSpec, dense_layer: int) -> list[Bucket]:
    """The stage's buckets, sized as plan.memory counts its parameters (`dense_layer`: a dense layer's)."""
    m, p = job.shape, job.parallel
    block = moe_layer_params(job) if m.moe else None
    vocab_h = m.padded_vocab(p.tp) // p.tp * m.hidden

    def dense(unit: int) -> int:
        if unit == EMBEDDING:
            return vocab_h + ((m.max_seq or job.training.seq) * m.hidden if m.position == "learned" else 0)
        if unit == HEAD:
            return (0 if m.tied_embeddings else vocab_h) + (2 if m.norm == "layernorm" else 1) * m.hidden
        return block.dense if block is not None and m.is_moe_layer(unit) else dense_layer

    def experts(unit: int) -> int:
        return block.experts if block is not None and unit >= 0 and m.is_moe_layer(unit) else 0
    return job_buckets(job, job.chunk_layers(0, 0), dense, experts)


def linear_params(job: JobSpec, bucket: Bucket, dense_linear: int) -> int:
    """Of a bucket's parameters, the linear weights (fp8 parameters: jobs/fp8_params.py);
    `dense_linear`: a dense layer's."""
    m = job.shape
    if not m.moe:
        return len([u for u in bucket.units if u >= 0]) * dense_linear
    block, local = moe_layer_params(job), (m.num_experts or 0) // job.parallel.ep
    routed = block.experts - local * m.mlp_biases(m.expert_ffn)
    if bucket.expert:
        return sum(routed for u in bucket.units if u >= 0 and m.is_moe_layer(u))
    return sum((block.linear - routed if m.is_moe_layer(u) else dense_linear) for u in bucket.units if u >= 0)


def sharded_parts(job: JobSpec, chunk: _Chunk, dense_layer: tuple[int, int], fp8_copies: int, param_bytes: int,
                  optimizer_bytes: int, transposed: bool = True) -> dict[str, int]:
    """MemoryEstimate's parts for a GPU of the (one) stage under Megatron-FSDP, from plan.memory's
    counts: the chunk's activations, a dense layer's parameters and linear weights, the fp8 weight
    copies' bytes, the bytes of a weight and of a parameter's optimizer state. With fp8 parameters
    the linear weights are 1 B wherever they are, TE keeps no fp8 copies beside them, and a layer's
    backward holds its weights' transpose where there is one (`transposed`: jobs/fp8_params.py)."""
    t, p = job.training, job.parallel
    buckets = fsdp_buckets(job, dense_layer[0])
    primary = t.fp8_param_gather       # Float8Tensor parameters (MXFP8 ones are refused under FSDP)
    linear = [linear_params(job, b, dense_layer[1]) if primary else 0 for b in buckets]
    sched = job_schedule(job, buckets)
    # the dense buckets' group: one hybrid-sharding replica's block of dp x cp
    groups = (job.dp * p.cp // t.num_distributed_optimizer_instances, job.dp * p.cp * p.tp // (p.ep * p.expert_tp))

    def shards(bucket: int) -> int:
        return groups[buckets[bucket].expert]

    def local(bucket: int, sharded: bool) -> int:
        return -(-buckets[bucket].params // shards(bucket)) if sharded else buckets[bucket].params

    def weight_bytes(bucket: int, sharded: bool) -> int:
        fp8 = -(-linear[bucket] // shards(bucket)) if sharded else linear[bucket]
        return param_bytes * (local(bucket, sharded) - fp8) + fp8
    grad = DTYPE_BYTES[t.grad_reduce_dtype]
    every = range(len(buckets))
    weights = (0 if primary else fp8_copies) + sum(weight_bytes(b, sched.releases) for b in every) + sum(
        weight_bytes(b, False) for b in every if sched.releases and not buckets[b].in_unit and shards(b) > 1)
    optimizer = sum(optimizer_bytes * local(b, sched.strategy != "no_shard") for b in every)
    gradients = sum(grad * local(b, sched.grads_sharded) for b in every)
    m = job.shape
    moe_linear = moe_layer_params(job).linear if m.moe else 0

    def transpose(layer: int) -> int:
        if not (primary and transposed and job.effects.fp8_overheads):
            return 0
        return moe_linear if m.is_moe_layer(layer) else dense_layer[1]
    activations, buffers = _walk(job, chunk, sched, shards, grad, lambda b: weight_bytes(b, False), transpose)
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer, "activations": activations,
            "buffers": buffers}


def _walk(job: JobSpec, chunk: _Chunk, sched: Schedule, shards: Callable[[int], int], grad: int,
          gathered_bytes: Callable[[int], int], transpose: Callable[[int], int]) -> tuple[int, int]:
    """(activations, buffers) at the peak of activations + transient buffers over the modules;
    `transpose`: a layer's fp8 weight transpose, held through its backward."""
    buckets = sched.buckets
    layers = job.chunk_layers(0, 0)
    head, *by_layer, embedding = chunk.backward            # backward order: head, layers reversed, embedding
    layer_of = dict(zip(reversed(layers), by_layer))
    gathered: dict[int, int] = {}      # bucket -> bytes of its transient gathered buffer
    unsharded: dict[int, int] = {}     # bucket -> bytes of its unsharded gradient
    best = (0, 0)
    held = 0

    def gather(ids: list[int], backward: bool = False) -> None:
        done = sched.gather(ids, backward)
        for bucket in done.freed:
            gathered.pop(bucket, None)
        for bucket in done.launched:
            if sched.releases and buckets[bucket].in_unit and shards(bucket) > 1:
                gathered[bucket] = gathered_bytes(bucket)

    def release(unit: int) -> None:
        for bucket in sched.release(unit):
            gathered.pop(bucket, None)

    def peak(acts: int) -> None:
        nonlocal best
        transient = sum(gathered.values()) + sum(unsharded.values())
        if acts + transient > sum(best):
            best = (acts, transient)

    def backward(unit: int, on_top: int, released: int, reducing: bool) -> None:
        nonlocal held
        if sched.grads_sharded:
            unsharded.update({b: grad * buckets[b].params for b, first in enumerate(sched.first_at)
                              if first == unit and shards(b) > 1})
        peak(held + on_top)
        held -= released
        release(unit)
        if reducing:
            ready = [b for b, at in enumerate(sched.ready_at) if at == unit]
            for bucket in sorted(ready, key=lambda b: not buckets[b].expert):
                for waited in sched.reduce(bucket):
                    unsharded.pop(waited, None)

    if job.training.overlap_param_gather:
        gather(sched.of(EMBEDDING))
    micro = job.microbatches
    for mb in range(min(micro, 2)):
        reducing = sched.grads_sharded or (job.training.overlap_grad_reduce and mb == micro - 1)
        gather(sched.of(EMBEDDING))
        held += embedding[1]
        peak(held)
        for index, layer in enumerate(layers):
            gather(sched.of(layer))
            if chunk.offloaded:   # plan.memory._offloaded: layer i leaves as layer L-k+i starts
                leaving = layer - (job.shape.layers - len(chunk.offloaded))
                held -= chunk.offloaded[leaving] if 0 <= leaving < len(chunk.offloaded) else 0
            held += chunk.forward_sizes[index] if chunk.forward_sizes else layer_of[layer][1]
            peak(held)
            release(layer)
        gather(sched.of(HEAD))
        held += head[1]
        peak(held + chunk.forward_top)
        sched.backward_starts()
        backward(HEAD, head[0], head[1], reducing)
        for layer in reversed(layers):
            gather(sched.of(layer), backward=True)
            on_top, released = layer_of[layer]
            backward(layer, on_top + transpose(layer), released, reducing)
        backward(EMBEDDING, embedding[0], embedding[1], reducing)
        if reducing:
            for waited in sched.drain():
                unsharded.pop(waited, None)
    return best
