"""What a mixture of experts' layer holds per GPU: the MoE terms of `chakra_core.plan.memory`.

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (megatron/core/), for the
block `chakra_core.jobs.moe` generates (alltoall dispatcher, grouped GEMMs, balanced routing).

Model state of a MoE layer on one GPU:
- dense part: attention and norms as a dense layer's, the router (h x E, replicated over TP:
  transformer/moe/router.py TopKRouter.weight) and the shared experts (an MLP of
  shared_expert_ffn split over TP: transformer/moe/shared_experts.py SharedExpertMLP);
- routed experts: E / ep experts (transformer/moe/moe_layer.py: num_local_experts =
  num_experts // ep), each a (gated) MLP of moe_ffn_hidden split over etp (experts.py
  TEGroupedMLP: fc1 column- and fc2 row-parallel over the expert TP group), so E (up + 1) h F
  / (ep etp) parameters.
Expert parameters sit in a gradient buffer of their own whose data-parallel group is the expert
data-parallel group, edp = tp cp dp / (ep etp) ranks (distributed/distributed_data_parallel.py:
`expert_parallel_buffers` over `intra_expt_dp_group`), and the distributed optimizer shards their
fp32 state over that group (optimizer/__init__.py: the expert parameter groups' optimizer on
`intra_expt_dp_group`); dense parameters keep dp x cp. Gradients are never sharded, as for a
dense model (the main-gradient buffer is whole on every rank).

Activations of a MoE layer's block, per micro-batch, besides the attention half of the layer (t
tokens of the residual stream here, the sequence-parallel share; k = topk; E experts):
- router: its input, t h bf16 (moe_utils.py RouterGatingLinearFunction saves `inp`); the
  probabilities, t E bf16, and the routing map, t E bool, which the dispatcher keeps from
  dispatch to combine (token_dispatcher.py MoEAlltoAllTokenDispatcher: self.routing_map,
  self.probs); the allgather dispatcher keeps its local experts' columns of the gathered map
  instead, t etp E bools (MoEAllGatherTokenDispatcher.local_map: etp ep times the tokens, 1 / ep
  of the experts);
- the second norm's input, 2 B per element as a dense layer's; the norm feeds the router and the
  dispatcher in bf16 (no fp8 LayerNormLinear), so no fc1 input is kept beside it;
- shared experts (if any): a dense MLP's terms at shared_expert_ffn (fc1's input, fc1's output,
  the activation's output);
- routed experts, over the r token copies this GPU computes: the dispatched tokens, kept as the
  grouped fc1's input (h per copy, fp8 under Transformer Engine), fc1's output (2 B x (2) F /
  etp per copy: fused_bias_swiglu.py WeightedSwiGLUFunction saves its input) and the activation's
  output, fc2's input (F / etp per copy, fp8 under TE). Balanced routing: every GPU sends t k
  copies (capped by the capacity factor: moe_utils.get_capacity) and computes etp times as many
  (the expert TP all-gather), each local expert's share rounded up as jobs.moe rounds it.
Not counted, as the generator does not list them either: the permuted probabilities the weighted
activation saves (4 B per copy, under 0.1% of a copy's 2 (h + (up + 1) F / etp) bytes at Qwen3's
shape) and the dispatcher's permutation and all-to-all buffers, which live only while one
layer's dispatch or combine runs (temporaries, as a dense layer's are not counted).
"""

from __future__ import annotations

from typing import NamedTuple

from chakra_core.jobs.fp8 import QUANTIZED
from chakra_core.jobs.routing import MAP_BYTES, expert_load
from chakra_core.jobs.spec import JobSpec

ACT_BYTES = 2
"""bf16 activations (as chakra_core.plan.memory)."""
FP8_BYTES = 1
"""An fp8 element: what a Transformer Engine GEMM saves of its input under fp8."""


class LayerParams(NamedTuple):
    """Parameters of one layer on one GPU."""

    dense: int     # reduced over dp x cp, optimizer sharded over dp x cp
    experts: int   # the routed experts: reduced over edp, optimizer sharded over edp
    linear: int    # of all these, the Transformer Engine linear weights (fp8 copies)


class BlockActivations(NamedTuple):
    """What a MoE layer's block keeps for the backward of one micro-batch on one GPU, beyond the
    attention half and the norms' inputs (bytes, or bytes per token where said)."""

    whole: int       # per token of the residual stream, kept whole by each TP rank unless sequence parallel
    split: int       # per token, split over TP
    total: int       # bytes: the routed experts' tensors (and the shared experts' gathered input with their overlap)
    recomputed: int  # bytes rebuilt during the layer's backward (recompute_modules layernorm, moe_act)


def moe_layer_params(job: JobSpec) -> LayerParams:
    """A MoE layer's parameters on one GPU (see the module docstring); with biases (add_bias_linear)
    each expert's, the router's and the shared experts' too (router.py: a bias per expert)."""
    m, p = job.shape, job.parallel
    h, up, experts = m.hidden, m.up_projections(), m.num_experts or 0
    shared = (up + 1) * h * m.shared_ffn // p.tp
    local = experts // p.ep
    routed = local * (up + 1) * h * (m.expert_ffn // p.expert_tp)
    biases = experts + (m.mlp_biases(m.shared_ffn) if m.shared_ffn else 0) if m.bias else 0
    attention = (h * (m.heads + 2 * m.groups) * m.head_dim + m.heads * m.head_dim * h) // p.tp
    dense = m.layer_params_on(p.tp) - m.mlp_params_on(p.tp) + h * experts + shared + biases
    # the router is a plain linear (router_gating_linear), not a TE module: no fp8 copy; nor are biases
    return LayerParams(dense, routed + local * m.mlp_biases(m.expert_ffn), attention + shared + routed)


def routed_copies(job: JobSpec) -> int:
    """Token copies this GPU's experts compute per micro-batch: t k sent (capped by the capacity),
    etp times as many received, rounded up to a whole number per local expert; with skewed routing
    (training.routing) the hottest EP rank's, as the generator writes every rank (jobs.routing)."""
    m, p = job.shape, job.parallel
    experts, local = m.num_experts or 1, (m.num_experts or 1) // p.ep
    tokens = job.training.micro_batch * (job.training.seq // p.cp) // (p.tp if job.sp else 1)
    load = expert_load(job, tokens)
    if load is not None:
        return sum(load.tokens)
    sent = tokens * m.router_topk
    if m.capacity_factor is not None:   # moe_utils.get_capacity: ceil(t k / E x factor) per expert
        sent = min(sent, experts * int(-(-sent * m.capacity_factor // experts)))
    return -(-sent * p.expert_tp // local) * local


def moe_block_activations(job: JobSpec) -> BlockActivations:
    """What a MoE layer's block keeps for the backward of one micro-batch on one GPU (BlockActivations).
    Selective recomputation of `layernorm` drops the pre-MLP norm's output (the router's and the
    shared experts' input) and of `moe_act` the experts' activation output, rebuilt in the backward
    (transformer_layer.py recompute_pre_mlp_layernorm, experts.py's activation checkpoint); the
    clamped SwiGLU (GPT-OSS) also keeps its clamped input, as fc1's output (2 B x (2)F / etp per copy);
    with --moe-shared-expert-overlap the shared fc1 keeps the gathered input, not the TP share."""
    m, p, t = job.shape, job.parallel, job.training
    fp8 = t.precision in QUANTIZED
    gemm_in = FP8_BYTES if fp8 else ACT_BYTES
    h, experts, up = m.hidden, m.num_experts or 0, m.up_projections()
    n = t.micro_batch * (t.seq // p.cp)                      # tokens of a micro-batch on this CP rank
    layernorm, moe_act = t.recomputes("layernorm"), t.recomputes("moe_act")
    shared_in = (gemm_in * h if m.shared_ffn else 0) * (not layernorm)
    gathered = p.moe_shared_expert_overlap and m.shared_ffn > 0
    kept_map = MAP_BYTES * experts * (p.expert_tp if p.moe_token_dispatcher == "allgather" else 1)
    whole = ACT_BYTES * h * (not layernorm) + ACT_BYTES * experts + kept_map + shared_in * (not gathered)
    split = ACT_BYTES * up * m.shared_ffn + gemm_in * m.shared_ffn
    ffn = m.expert_ffn // p.expert_tp
    clamped = ACT_BYTES * up * ffn if m.mlp == "clamped-swiglu" else 0
    act = gemm_in * ffn
    per_copy = gemm_in * h + ACT_BYTES * up * ffn + (clamped + act) * (not moe_act)
    copies = routed_copies(job)
    tokens = n // (p.tp if job.sp else 1)
    rebuilt = (tokens * ACT_BYTES * h * (2 if m.shared_ffn else 1) if layernorm else 0) \
        + (copies * (act + clamped) if moe_act else 0)
    return BlockActivations(whole, split, copies * per_copy + n * shared_in * gathered, rebuilt)
