"""Peak memory per GPU of a training job's layout, as Megatron-LM (mcore) trains it.

Model state, per parameter a GPU holds (its layers' share under TP, its stage's layers under PP):
- weights: 2 B (bf16/fp16). fp8 (Transformer Engine) adds 2 B per linear-layer weight: TE keeps
  the high-precision weight plus an fp8 copy for the forward and, on Hopper, a transposed fp8 copy
  for the backward (TE docs, Performance Considerations, "Handling transposes" and "Memory usage",
  https://github.com/NVIDIA/TransformerEngine/blob/main/docs/features/low_precision_training/performance_considerations/performance_considerations.rst);
  on Blackwell no transpose with delayed and current scaling, 1 B (jobs/fp8.py fp8_transposes).
  With fp8 parameters (fp8_param_gather) the linear weights have no high-precision copy: the fp8
  weight and its transpose (1 B on Blackwell), or MXFP8's two copies (jobs/fp8_params.py).
- gradients: the main-gradient buffer in `grad_reduce_dtype` (fp32 4 B, bf16 2 B), never sharded.
- optimizer: Adam's fp32 master weight and two moments, 12 B, plus an fp32 copy of the gradients
  (4 B) when they are reduced in bf16; divided by dp x cp with the distributed optimizer (mcore
  shards over the data-parallel group with context parallelism). Megatron-LM's table
  (docs/source/api-guide/dist_optimizer.md, https://github.com/NVIDIA/Megatron-LM/blob/main/docs/source/api-guide/dist_optimizer.md):
  "float16 param, fp32 grads: 18 | 6 + 12/d", "float16 param, float16 grads: 20 | 4 + 16/d".

Activations of one layer and micro-batch (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", sec. 4, https://arxiv.org/abs/2205.05198), per token,
2 B per element, h hidden, a heads, g key/value heads, d head dim, F ffn_hidden:
- kept whole by every TP rank unless sequence parallel (then / t): the two norms' inputs 4h; the
  QKV GEMM's input 2h; the first MLP GEMM's input 2h; with dropout two 1 B masks 2h;
- split by TP: Q, K, V 2(a + 2g)d; the output projection's input (the attention output) 2ad; the
  activation's input 2F (GeLU) or 4F (SwiGLU: the gated GEMM's two halves); the second MLP
  GEMM's input 2F;
- unfused attention without selective recompute also keeps, per token and head, the softmax output
  over the s keys, 2s, and with dropout its mask s and output 2s (the paper's 5as^2 b).
  FlashAttention recomputes the scores, and selective recompute does for unfused attention.
With QK norms (Qwen3: qk_layernorm; megatron/core/transformer/attention.py q_layernorm, k_layernorm)
Q and K are kept again, normalized (the core attention saves its inputs), 2(a + g)d, split by TP.
For GPT (g = a, d = h/a, F = 4h, dropout): 10h + 24h = 34h per token, s b h (34 + 5as/h) per layer,
sbh (10 + 24/t + 5as/(ht)) with TP only, and everything / t with sequence parallelism: the paper's
Table 2. fp8: TE saves its GEMMs' inputs in fp8 (1 B) instead of bf16, except the attention output,
which FlashAttention keeps in bf16 besides TE's fp8 copy (the TE page above). With CP every
per-token term counts the sequence per CP rank. A layer under full recompute keeps only its
input, 2h per token (/ t with sequence parallelism: Megatron checkpoints the sequence-parallel
shard); `recompute_layers` recomputes the first N layers of each chunk (--recompute-method block).

A mixture of experts' MoE layers replace the MLP's parameters and activations by the MoE block's
(chakra_core.plan.expert_memory): routed experts split over ep x etp, their gradients in a buffer
of their own and their optimizer state sharded over the expert data-parallel group (edp = tp cp dp
/ (ep etp)) instead of dp x cp; the router's and shared experts' state as the dense parameters';
per micro-batch the router's input, probabilities and routing map, the shared experts' MLP terms
and, per routed token copy the GPU's experts compute, the dispatched token, fc1's output and the
activation's output.

Around the layers, per micro-batch: the first stage keeps the token ids (int64, 8 B per token) and,
with dropout, the embedding's mask, as Megatron's own estimate counts them
(megatron/training/theoretical_memory_usage.py, https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/theoretical_memory_usage.py);
the last keeps the final norm's and output layer's inputs and the vocab-parallel cross entropy's
fp32 softmax, 4 B per logit (megatron/core/tensor_parallel/cross_entropy.py saves exp_logits of the
logits cast to float), while the bf16 logits (2 B) exist only during the forward and their
gradient only during the backward of that micro-batch.

In-flight micro-batches: each stage runs mcore's schedule (megatron/core/pipeline_parallel/
schedules.py, get_pp_rank_microbatches and get_schedule_table,
https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/core/pipeline_parallel/schedules.py):
1F1B warms up with pp - stage - 1 forwards, so the first stage holds min(pp, microbatches);
interleaved 1F1B warms up with 2(pp - stage - 1) + (vp - 1) pp chunk forwards, the paper's
(1 + (pp - 1)/(pp vp)) pp micro-batches of the first stage (sec. 4.2.3). The peak is found by
walking the schedule the generated traces run (chakra_core.jobs.schedule): a forward adds its
chunk's activations; a backward releases them in the order it runs (the output layer, the layers
in reverse, the embedding), and transient tensors sit on top where they exist: the bf16 logits
at the loss's forward, their gradient at its backward, and a recomputed layer's activations
(besides the checkpointed input they are rebuilt from) while its backward runs.
Current mcore no longer runs every forward first when microbatches == pp (older Megatron-LM did).

buffers is 0 (with Megatron-FSDP, its gathered layers and unsharded gradients at the peak:
plan.fsdp_memory): NCCL's buffers, the CUDA context, cuBLAS/TE workspaces and allocator fragmentation
are outside what the allocator holds for a job (torch.cuda.max_memory_allocated, the figure
Megatron logs, leaves out NCCL and the context as well); the plan holds the prediction against the
GPU's usable memory less a reserve for them (chakra_core.plan.headroom). Not counted either:
activation gradients and temporaries of the backward of one layer, FlashAttention's softmax
statistics (4 B per head and query, about 0.1% of a layer at head dim 128) and RNG states.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from chakra_core.jobs.fp8 import QUANTIZED, fp8_transposes, gemm_dtype, quantized_copies
from chakra_core.jobs.schedule import pipeline_steps
from chakra_core.jobs.spec import DTYPE_BYTES, JobSpec
from chakra_core.plan.expert_memory import LayerParams, moe_block_activations, moe_layer_params
from chakra_core.plan.fsdp_memory import sharded_parts

GIB = 1 << 30
PARAM_BYTES = 2
"""bf16/fp16 parameters (dist_optimizer.md: "float16 param")."""
ACT_BYTES = 2
"""Activations are bf16 or fp16 (Korthikanti et al., sec. 4.1: "16-bit floating point")."""
MASK_BYTES = 1
"""A dropout mask element (Korthikanti et al., sec. 4.1: a mask of size sbh, one byte each)."""
FP8_BYTES = 1
"""An fp8 element (TE docs, Memory usage: "1 MB (input in FP8 saved for backward)" for 1M elements)."""
TOKEN_ID_BYTES = 8
"""int64 token ids per token (theoretical_memory_usage.py: "Input to embedding", 8 s b)."""
SOFTMAX_BYTES = 4
"""fp32 softmax the vocab-parallel cross entropy keeps per logit (megatron/core/tensor_parallel/
cross_entropy.py: save_for_backward(exp_logits, ...) of the logits cast to float)."""
ADAM_BYTES = 12
"""fp32 master weight and two fp32 moments (dist_optimizer.md: 18 = 2 + 4 + 12)."""
MAIN_GRAD_COPY_BYTES = 4
"""fp32 copy of 16-bit gradients the optimizer keeps (dist_optimizer.md: 20 B per parameter with float16
grads, 18 with fp32 ones; its key steps copy each rank's shard of the grads "into fp32 main grad elements")."""


@dataclass(frozen=True)
class MemoryEstimate:
    stage: int            # pipeline stage this estimate is for
    weights: int          # bytes per GPU
    gradients: int
    optimizer: int
    activations: int      # everything the stage holds for its in-flight micro-batches at its peak
    buffers: int          # communication / workspace buffers with a public size: none (see the module docstring)

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers

    def parts(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "buffers": self.buffers}


def _tokens(job: JobSpec) -> int:
    """Tokens of one micro-batch on one CP rank."""
    return job.training.micro_batch * (job.training.seq // job.parallel.cp)


def layer_activations(job: JobSpec, recomputed: bool = False, moe: bool = False) -> int:
    """Bytes one transformer layer keeps for the backward of one micro-batch on one GPU (the terms
    of the module docstring); `recomputed`: the layer is under full recompute; `moe`: a mixture of
    experts' layer, its MLP replaced by the MoE block (chakra_core.plan.expert_memory)."""
    m, t, tp = job.shape, job.training, job.parallel.tp
    sp = tp if job.sp else 1                          # sequence parallelism splits what TP keeps whole
    h, f, a, g, d = m.hidden, m.ffn_hidden, m.heads, m.groups, m.head_dim
    n = _tokens(job)
    if recomputed:
        return n * ACT_BYTES * h // sp
    fp8 = t.precision in QUANTIZED
    gemm_in = FP8_BYTES if fp8 else ACT_BYTES        # what a TE GEMM saves of its input
    mask = MASK_BYTES if t.dropout > 0 else 0
    # the norms' inputs, the QKV GEMM's input, the dropout masks; Q, K, V and the attention output
    whole = 2 * ACT_BYTES * h + gemm_in * h + 2 * mask * h
    split = ACT_BYTES * (a + 2 * g) * d + (ACT_BYTES + (FP8_BYTES if fp8 else 0)) * a * d
    if m.qk_layernorm and not m.mla:   # Qwen3's RMSNorm of each query and key head keeps its output
        split += ACT_BYTES * (a + g) * d
    routed = 0
    if moe:
        block = moe_block_activations(job)
        whole, split, routed = whole + block.whole, split + block.split, block.total
    else:   # the MLP: the first GEMM's input; the activation's input(s) and the second GEMM's input
        whole += gemm_in * h
        split += ACT_BYTES * (2 if m.gated else 1) * f + gemm_in * f
    if t.attention == "unfused" and not t.recomputes("core_attn"):
        split += a * job.training.seq * (ACT_BYTES + (MASK_BYTES + ACT_BYTES if mask else 0))
    return n * whole // sp + n * split // tp + routed


def _layer_params(job: JobSpec) -> tuple[int, int]:
    """Parameters of one dense layer on one GPU, and of those the linear-layer weights (fp8 copies)."""
    m, tp = job.shape, job.parallel.tp
    h = m.hidden
    norms = (2 if m.norm == "layernorm" else 1) * 2 * h
    row_biases = 2 * h if m.bias else 0            # the row-parallel GEMMs' biases are not split
    linear = h * (m.heads + 2 * m.groups) * m.head_dim + m.heads * m.head_dim * h \
        + (3 if m.gated else 2) * h * m.ffn_hidden
    return (m.layer_params() - norms - row_biases) // tp + norms + row_biases, linear // tp


def _stage_params(job: JobSpec, stage: int) -> LayerParams:
    """Parameters a GPU of `stage` holds: dense ones (embedding and output layer included), routed
    experts' (MoE layers), and of those the layers' linear weights."""
    m, p = job.shape, job.parallel
    layers = [layer for chunk in range(job.vp) for layer in job.chunk_layers(stage, chunk)]
    moe = sum(map(m.is_moe_layer, layers))
    per_layer, linear = _layer_params(job)
    params, linear_params, experts = (len(layers) - moe) * per_layer, (len(layers) - moe) * linear, 0
    if moe:
        block = moe_layer_params(job)
        params, linear_params, experts = params + moe * block.dense, linear_params + moe * block.linear, \
            moe * block.experts
    vocab_h = m.padded_vocab(p.tp) // p.tp * m.hidden
    if stage == 0:
        params += vocab_h + ((m.max_seq or job.training.seq) * m.hidden if m.position == "learned" else 0)
    if stage == p.pp - 1:   # a tied output layer is the embedding itself only without PP
        params += (0 if m.tied_embeddings and p.pp == 1 else vocab_h) \
            + (2 if m.norm == "layernorm" else 1) * m.hidden
    return LayerParams(params, experts, linear_params)


@dataclass(frozen=True)
class _Chunk:
    """What a model chunk holds per micro-batch: `kept` from its forward to its backward, `forward_top`
    on top at the end of its forward, and its backward as (bytes on top, bytes released) in the
    order the backward runs: the output layer, the layers in reverse, the embedding."""

    kept: int
    forward_top: int
    backward: tuple[tuple[int, int], ...]
    deferred: int = 0   # zb-h1: what the backward left for the W step, which releases it
    forward_sizes: tuple[int, ...] = ()   # activation offload: what each layer's forward keeps, in order
    offloaded: tuple[int, ...] = ()       # and what layers 0..k-1 copy to host memory


def _chunk_activations(job: JobSpec, stage: int, chunk: int, memo: dict[Any, _Chunk] | None = None) -> _Chunk:
    """`memo`: one job's chunks already worked out (a chunk depends on its layers' kinds, whether
    it is the first or the last, and the job: every stage of a layout shares most)."""
    t, p, m = job.training, job.parallel, job.shape
    layers = job.chunk_layers(stage, chunk)
    first, last = stage == 0 and chunk == 0, stage == p.pp - 1 and chunk == job.vp - 1
    if memo is None or t.cpu_offloading_num_layers:   # offload's chunks depend on the layers' numbers
        return _new_chunk(job, layers, first, last)
    key = (tuple(map(m.is_moe_layer, layers)), first, last)
    if key not in memo:
        memo[key] = _new_chunk(job, layers, first, last)
    return memo[key]


def _new_chunk(job: JobSpec, layers: list[int], first: bool, last: bool) -> _Chunk:
    t, p, m = job.training, job.parallel, job.shape
    sp = p.tp if job.sp else 1
    recomputed = len(layers[:t.recompute_layers or len(layers)]) if t.recompute == "full" else 0
    checkpoint = layer_activations(job, recomputed=True)
    kinds = {m.is_moe_layer(layer) for layer in layers}
    full = {kind: layer_activations(job, moe=kind) for kind in kinds}
    # what a MoE layer's selective recomputation rebuilds sits on top during its backward
    rebuilt = {kind: moe_block_activations(job).recomputed if kind else 0 for kind in kinds}
    # the backward runs the layers in reverse: the last ones (not recomputed) first; a recomputed
    # layer is rebuilt for its backward, and the input it keeps is the checkpoint itself
    backward = [(rebuilt[m.is_moe_layer(layer)], full[m.is_moe_layer(layer)]) for layer in reversed(layers[recomputed:])]
    backward += [(full[m.is_moe_layer(layer)] - checkpoint, checkpoint) for layer in reversed(layers[:recomputed])]
    forward_top = 0
    n, h = _tokens(job), job.shape.hidden
    if last:
        logits = n * (job.shape.padded_vocab(p.tp) // p.tp)
        # the bf16 logits during the loss's forward, their gradient during its backward
        forward_top = ACT_BYTES * logits
        backward.insert(0, (ACT_BYTES * logits, 2 * n * ACT_BYTES * h // sp + SOFTMAX_BYTES * logits))
    if first:
        backward.append((0, TOKEN_ID_BYTES * n + (n * MASK_BYTES * h // sp if t.dropout > 0 else 0)))
    kept = sum(released for _, released in backward)
    if t.cpu_offloading_num_layers:
        return _offloaded(job, layers, [full[m.is_moe_layer(layer)] for layer in layers], kept, forward_top, backward)
    if p.schedule != "zb-h1":
        return _Chunk(kept, forward_top, tuple(backward))
    # the weight gradients' inputs and each linear layer's output gradient stay for the W step, the
    # output gradients put on top from the layer's start (an upper bound: see _deferred)
    held, grads = _deferred(job)
    deferred, index = [], 0
    if last:   # the output layer's: its input and the logits' gradient
        head = n * ACT_BYTES * h // sp + ACT_BYTES * logits
        deferred.append((ACT_BYTES * logits, backward[0][1] - head))
        index = 1
    for on_top, released in backward[index:index + len(layers)]:
        deferred.append((on_top + grads, released - held - grads))
    deferred += backward[index + len(layers):]
    total = sum(released for _, released in backward) - sum(released for _, released in deferred)
    return _Chunk(kept, forward_top, tuple(deferred), total)


def _offloaded(job: JobSpec, layers: list[int], sizes: list[int], kept: int, forward_top: int,
               backward: list[tuple[int, int]]) -> _Chunk:
    """Activation offload (jobs/offload.py; pp 1, no recompute): layer i < k leaves when layer L-k+i
    starts its forward and comes back when layer L-1-k+i starts its backward, so at most L-k layers'
    activations are on the GPU at once. Every saved tensor counts as offloaded, although TE keeps
    those under 256 Ki elements on the GPU (so do the traces): a job saving such tensors peaks above
    the prediction by their bytes."""
    k, total = job.training.cpu_offloading_num_layers, job.shape.layers
    offloaded = tuple(sizes[:k])
    head = 1     # pp 1: the output layer's entry comes first
    entries = list(backward)
    for position, layer in enumerate(reversed(layers)):
        reloaded = layer - (total - 1 - k)
        if 0 <= reloaded < k:
            on_top, released = entries[head + position]
            entries[head + position] = (on_top + offloaded[reloaded], released - offloaded[reloaded])
    return _Chunk(kept - sum(offloaded), forward_top, tuple(entries), forward_sizes=tuple(sizes), offloaded=offloaded)


def _deferred(job: JobSpec) -> tuple[int, int]:
    """zb-h1 (jobs/zero_bubble.py): bytes a dense layer's deferred weight gradients keep of what the
    layer saved (the QKV and first MLP GEMMs' inputs, the attention output and TE's fp8 copy of it,
    the second MLP GEMM's input), and the output gradients they keep (QKV, projection, fc1, fc2:
    the row-parallel ones gathered whole). The backward's peak is bounded from above: the output
    gradients count from the layer's first kernel, and its own releases at its end."""
    m, t, tp = job.shape, job.training, job.parallel.tp
    sp = tp if job.sp else 1
    h, f, a, g, d, n = m.hidden, m.ffn_hidden, m.heads, m.groups, m.head_dim, _tokens(job)
    gemm_in = FP8_BYTES if t.precision in QUANTIZED else ACT_BYTES
    fp8_copy = FP8_BYTES if t.precision in QUANTIZED else 0
    saved = n * 2 * gemm_in * h // sp + n * ((ACT_BYTES + fp8_copy) * a * d + gemm_in * f) // tp
    up = (2 if m.gated else 1) * f
    grads = ACT_BYTES * (n * ((a + 2 * g) * d + up) // tp + 2 * n * h)
    return saved, grads


def _peak_activations(job: JobSpec, stage: int, memo: dict[Any, _Chunk] | None = None) -> int:
    pp, vp = job.parallel.pp, job.vp
    chunks = tuple(_chunk_activations(job, stage, c, memo) for c in range(vp))
    # Once warm, the chunks in flight repeat every pp x vp forwards: 5 pp micro-batches cover the
    # warm-up and two such periods, so the walk stays short for long gradient accumulation.
    # gpipe holds every micro-batch before its first backward: walk them all
    walked = job.microbatches if job.parallel.schedule == "gpipe" else min(job.microbatches, 5 * pp)
    return _walk(chunks, stage, pp, vp, walked, job.parallel.schedule)


@lru_cache(maxsize=4096)
def _walk(chunks: tuple[_Chunk, ...], stage: int, pp: int, vp: int, microbatches: int, schedule: str) -> int:
    """The peak of the stage's schedule over its chunks' activations (layouts that differ only
    where activations do not, such as the optimizer or a MoE's ep, walk it once)."""
    held = peak = 0
    for kind, _, index in pipeline_steps(stage, pp, vp, microbatches, schedule):
        chunk = chunks[index]
        if kind == "F":
            held += chunk.kept
            peak = max(peak, held + chunk.forward_top)
        elif kind == "W":
            held -= chunk.deferred
        else:
            for on_top, released in chunk.backward:
                peak = max(peak, held + on_top)
                held -= released
            peak = max(peak, held)   # zb-h1: a backward may leave more than it found
    return peak


def fp8_weight_copies(job: JobSpec, architecture: str) -> int:
    """Quantized copies TE keeps of each linear weight (the fp8 parameter itself among them): rowwise
    and columnwise, or the one copy delayed and current scaling need where fp8 GEMMs run in every
    layout (jobs/fp8.py fp8_transposes); none without quantized GEMMs."""
    t = job.training
    if t.precision not in QUANTIZED:
        return 0
    return quantized_copies(gemm_dtype(t), fp8_transposes(architecture))


def stage_memory(job: JobSpec, stage: int, architecture: str = "hopper",
                 memo: dict[Any, _Chunk] | None = None) -> MemoryEstimate:
    """The memory of one GPU of pipeline stage `stage` (Megatron-FSDP's: plan.fsdp_memory) on
    `architecture` GPUs (the profile's gpu.architecture); `memo`: the job's chunks worked out so far."""
    t, p = job.training, job.parallel
    state = _stage_params(job, stage)
    params = state.dense + state.experts
    fp8_copies = fp8_weight_copies(job, architecture) * FP8_BYTES * state.linear
    # fp8 parameters (jobs/fp8_params.py): no 16-bit copy of the linear weights, only the fp8 copies
    weights = PARAM_BYTES * (params - (state.linear if t.fp8_param_gather else 0)) + fp8_copies
    per_param = ADAM_BYTES + (MAIN_GRAD_COPY_BYTES if t.grad_reduce_dtype != "fp32" else 0)
    if t.use_megatron_fsdp:   # one stage (jobs/sharding.py)
        return MemoryEstimate(stage, **sharded_parts(job, _chunk_activations(job, 0, 0), _layer_params(job),
                                                     fp8_copies, PARAM_BYTES, per_param,
                                                     fp8_transposes(architecture)))
    shards = job.dp * p.cp if t.distributed_optimizer else 1
    # routed experts' state is sharded over the expert data-parallel group (expert_memory)
    expert_shards = job.dp * p.cp * p.tp // (p.ep * p.expert_tp) if t.distributed_optimizer else 1
    optimizer = -(-state.dense * per_param // shards) + -(-state.experts * per_param // expert_shards)
    optimizer -= round(t.optimizer_offload_fraction * optimizer)   # on the host (jobs/optimizer_offload.py)
    return MemoryEstimate(stage=stage, weights=weights, gradients=DTYPE_BYTES[t.grad_reduce_dtype] * params,
                          optimizer=optimizer, activations=_peak_activations(job, stage, memo), buffers=0)


def memory_by_stage(job: JobSpec, architecture: str = "hopper") -> list[MemoryEstimate]:
    """One estimate per pipeline stage (the embedding on the first, output layer and loss on the last)."""
    memo: dict[Any, _Chunk] = {}
    return [stage_memory(job, stage, architecture, memo) for stage in range(job.parallel.pp)]


def predict_memory(job: JobSpec, architecture: str = "hopper") -> MemoryEstimate:
    """The stage with the largest total (the first of equals) on `architecture` GPUs."""
    return max(memory_by_stage(job, architecture), key=lambda e: e.total)


def overflow(estimate: MemoryEstimate, capacity_bytes: int, reserve_bytes: int = 0) -> str | None:
    """None if the estimate and `reserve_bytes` (what else the GPU must hold: chakra_core.plan.headroom)
    fit in `capacity_bytes`; else one line: the need, the excess and the parts, largest first."""
    need = estimate.total + reserve_bytes
    if need <= capacity_bytes:
        return None
    parts = sorted(((v, k) for k, v in estimate.parts().items() if v > 0), reverse=True)
    listed = ", ".join(f"{name} {value / GIB:.1f} GiB" for value, name in parts)
    reserve = f" + {reserve_bytes / GIB:.1f} GiB reserve" if reserve_bytes else ""
    return (f"needs {estimate.total / GIB:.1f} GiB{reserve} of {capacity_bytes / GIB:.1f} GiB "
            f"({(need - capacity_bytes) / GIB:.1f} GiB over): {listed}")
