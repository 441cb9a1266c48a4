"""Model FLOPs of a training step, counted as the published tables count them.

TFLOP/s per GPU = model FLOPs per step / (step time x GPUs); MFU = that / the GPU's dense peak of
the job's precision. Which count a table uses moves the figure by up to 12%, so each comparison
names one (benchmarks/data/training-runs.yaml quotes each source). A run's own report uses
`megatron_bridge` (REPORTED): it counts causal attention as the kernels run it, so the rate it gives
can never exceed the rate the compute model runs kernels at, while `nemo`'s full s^2 attention can
(at long sequences attention dominates, and half of it is never computed).

A mixture of experts counts each MoE layer's topk routed experts and shared experts in place of its
dense MLP, as Megatron-Core's num_floating_point_operations does (the router's h x experts GEMM
is left out there and here); `nemo` counts them the same way with its full s^2 attention.

Multi-head latent attention and multi-token prediction (DeepSeek-V3) are counted by Megatron-Core's
formula only (num_floating_point_operations at d98e8a64, = Megatron-Bridge v0.2.0's
flop_utils.transformer_flops, which the 25.09 tables used): per latent attention layer the q
down- and up-projections (or the q projection), the kv down-projection with the rope part and the
up-projection, the output projection, one multiply-add per latent element for the latents' norms
(`+ 1`), and causal core attention of q.k over nope + rope and p.v over v (each half the s x s
matrix); each MTP layer counts as one more transformer layer of the last layer's kind (dense or
MoE), plus its norms (3h), eh_proj (2h^2) and one more output layer. The other formulas describe
no such model (NeMo's own deepseekv3 function has changed between its commits).

- `nemo`: NeMo's nemo/utils/flops_formulas.py (llama2/llama3/gpt3), forward and backward without
  recomputation, attention counted as full s^2, the unpadded vocabulary:
  gbs s L h^2 (12 + 12 G/A + 18 F/h + 12 s/h + 6 V/(L h)) for SwiGLU models (12 F/h ... for a
  GELU MLP, i.e. 24 h^2 per layer with F = 4h: GPT-3).
- `megatron_bridge`: Megatron-Bridge's flop_utils.transformer_flops, which is Megatron-Core's
  num_floating_point_operations for a dense model (NVIDIA/Megatron-LM megatron/training/training.py
  at d98e8a64ddf34856e74b24714e3bedb2f5a39553, transformer_flops: "/ 2  # causal mask"): the same
  linear layers, causal attention counted half (s/2), the vocabulary padded to 128 x TP.
- `dgxc_mha`: NVIDIA/dgxc-benchmarking's README notes for Nemotron-4 and GPT-3 (at 35a9aecc):
  s (24 L h^2 + 12 L h s + 48 L h^2 + 6 V h) per sequence, multi-head attention projections
  whatever the model's query groups.
- `megatron_bridge_v030`: Megatron-Bridge v0.3.0's flop_utils.transformer_flops as it counts a
  model with sliding windows or a gated MLP other than SwiGLU (GPT-OSS; NVIDIA-NeMo/Megatron-Bridge
  src/megatron/bridge/training/utils/flop_utils.py at v0.3.0, 21b02e0c, the 26.02 release): every
  layer's attention as full causal (s/2: the window is not counted) and the MLP gated only when its
  activation is SiLU (gated_linear_multiplier 3/2 only for F.silu; GPT-OSS's quick_gelu GLU counts as
  two GEMMs of the expert FFN, not three). Its "Model TFLOP/sec/GPU" for GPT-OSS is this count.
  `megatron_bridge` counts what the kernels run: the GLU's three GEMMs and each windowed layer's
  (w (2 s - w + 1) - s) / (2 s) keys per query (attention_variants.py) instead of s / 2, as
  Megatron-Bridge counts them from v0.6.0 (flop_utils.py at 51885cf1: ffn_expansion_factor 3 for
  any gated unit; calculate_swa_context's w - w (w - 1) / (2 s) is half a key more: it counts the
  diagonal whole, the causal convention here half).
- `megatron_sc21`: Narayanan et al., SC'21 (arXiv 2104.04473), eq. 3:
  96 B s l h^2 (1 + s / (6 h) + V / (16 l h)), counting the forward pass recomputed by full
  activation recomputation.
"""

from __future__ import annotations

from chakra_core.jobs.attention_variants import attention_chunks, chunked_mean_keys, layer_window, mean_keys
from chakra_core.jobs.spec import JobSpec

FORMULAS = ("nemo", "megatron_bridge", "megatron_sc21", "dgxc_mha")
BRIDGE_V030 = "megatron_bridge_v030"
"""Megatron-Bridge 0.3.0's count, reported beside the others for the models it counts differently."""
REPORTED = "megatron_bridge"
"""The formula of a run's own TFLOP/s and MFU."""
DESCRIPTIONS = {
    "nemo": "NeMo's nemo/utils/flops_formulas.py: forward and backward without recomputation, attention "
            "counted as the full s x s matrix",
    "megatron_bridge": "Megatron-Core's num_floating_point_operations (= Megatron-Bridge's flop_utils): "
                       "forward and backward without recomputation, causal attention counted as the kernels "
                       "run it (half the s x s matrix), the padded vocabulary",
    BRIDGE_V030: "Megatron-Bridge v0.3.0's flop_utils (26.02): as megatron_bridge, but every layer's attention "
                 "counted full causal (no sliding window) and a GLU counted gated only with SiLU",
    "megatron_sc21": "Narayanan et al. SC'21 eq. 3: forward, backward and one recomputed forward, attention "
                     "counted as the full s x s matrix",
    "dgxc_mha": "NVIDIA dgxc-benchmarking's Nemotron and GPT-3 notes: 72 L h^2 + 12 L h s + 6 V h per token, "
                "attention projections counted as multi-head (query groups ignored), a 4h MLP, full s x s attention",
}


def model_flops(job: JobSpec, formula: str = "nemo") -> float:
    """FLOPs of one step under `formula`."""
    m, t = job.shape, job.training
    B, s, l, h = t.global_batch, t.seq, m.layers, m.hidden
    if m.mla or m.mtp_layers:
        if formula != REPORTED:
            raise ValueError(f"the {formula!r} formula counts no latent attention or MTP layers; "
                             f"use {REPORTED!r}")
        return _megatron_core(job)
    if formula == "megatron_sc21":
        V = m.vocab
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    if formula == "dgxc_mha":
        return float(B * s * (72 * l * h * h + 12 * l * h * s + 6 * m.vocab * h))
    if formula not in (*FORMULAS, BRIDGE_V030):
        raise ValueError(f"unknown FLOPs formula {formula!r}; known: {', '.join((*FORMULAS, BRIDGE_V030))}")
    d, f = m.head_dim, m.ffn_hidden
    mlp = (3 if m.gated and (formula != BRIDGE_V030 or m.mlp == "swiglu") else 2) * h
    linear = h * (m.heads + 2 * m.groups) * d + m.heads * d * h + mlp * f
    # causal core attention counted half: 6 s h per token and layer is 12 s (a d) / 2
    if formula == "nemo":
        attention, V = 12 * s * m.heads * d, m.vocab          # per token and layer, fwd + bwd, full s^2
    else:
        attention, V = 6 * s * m.heads * d, m.padded_vocab(job.parallel.tp)   # causal: half
    # MoE layers (Megatron-LM training.py num_floating_point_operations at d98e8a64): the dense MLP
    # replaced by topk routed experts of moe_ffn_hidden and the shared experts; the router's GEMM
    # is not counted there, nor here
    moe = m.moe_layers * mlp * (m.expert_ffn * m.router_topk + m.shared_ffn - f)
    total = float(B * s * (l * (6 * linear + attention) + 6 * moe + 6 * h * V))
    if formula == REPORTED and m.window is not None:   # windowed layers: their keys, not s / 2
        total += B * s * 12 * m.heads * d * sum(mean_keys(s, layer_window(m, layer)) - s / 2 for layer in range(l))
    if formula == REPORTED and attention_chunks(m, s) > 1 and m.attention_chunk:   # chunked: a chunk's keys
        total += B * s * 12 * m.heads * d * l * (chunked_mean_keys(s, m.attention_chunk) - s / 2)
    return total


def _megatron_core(job: JobSpec) -> float:
    """Megatron-Core's num_floating_point_operations (transformer_flops) for any model this job
    describes, latent attention and MTP layers included (see the module docstring)."""
    m, t = job.shape, job.training
    h, a, s, mtp = m.hidden, m.heads, t.seq, m.mtp_layers
    gated = 3 if m.gated else 2
    last_moe = 1 if m.is_moe_layer(m.layers - 1) else 0
    dense_layers = m.layers - m.moe_layers + (1 - last_moe) * mtp
    moe_layers = m.moe_layers + last_moe * mtp
    mlp = h * (m.ffn_hidden * gated * dense_layers
               + (m.expert_ffn * m.router_topk + m.shared_ffn) * gated * moe_layers)
    if m.mla:
        q_lora, kv_lora = m.q_lora_rank, m.kv_lora_rank or 0
        q = q_lora * (h + a * m.qk_dim + 1) if q_lora else h * a * m.qk_dim
        projections = q + kv_lora * (h + a * (m.nope_dim + m.v_dim) + 1) + h * m.rope_dim + a * m.v_dim * h
        core = a * m.qk_dim / 2 + a * m.v_dim / 2
    else:
        query, kv = m.head_dim * a, m.head_dim * m.groups
        projections = h * (query + 2 * kv) + query * h
        core = query / 2 * 2
    layers = m.layers + mtp
    tokens = t.global_batch * s
    per_token = 6 * (mlp + layers * projections + mtp * (3 * h + 2 * h * h) + h * m.padded_vocab(job.parallel.tp)
                     * (mtp + 1))
    return float(tokens * per_token + t.global_batch * s * s * 6 * core * layers)


def formulas(job: JobSpec) -> tuple[str, ...]:
    """The formulas that describe the job's model: the dense tables' own (SC'21, dgxc) count no
    experts, so a mixture of experts is reported by Megatron-Core's and NeMo's only (and
    Megatron-Bridge 0.3.0's where it differs from Megatron-Core's); latent attention and MTP layers
    by Megatron-Core's alone."""
    m = job.shape
    if m.mla or m.mtp_layers:   # latent attention and MTP: Megatron-Core's count alone
        return (REPORTED,)
    if m.window is not None or m.mlp == "clamped-swiglu":   # Megatron-Bridge 0.3.0 counts these differently
        return (*FORMULAS[:2], BRIDGE_V030)
    return FORMULAS[:2] if m.moe else FORMULAS
