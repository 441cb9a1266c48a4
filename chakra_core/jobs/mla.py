"""Multi-head latent attention (DeepSeek-V2/V3) as Megatron-Core runs it (a mixin of
`kernels.LayerKernels`).

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553:
megatron/core/transformer/multi_latent_attention.py (MLASelfAttention: get_query_key_value_tensors,
qkv_up_proj_and_rope_apply, forward), megatron/core/models/gpt/gpt_layer_specs.py (the Transformer
Engine spec: input_layernorm a TENorm of its own; linear_q_down_proj and linear_kv_down_proj
TELinear, built with parallel_mode "duplicated"; with qk_layernorm the up-projections are
TELayerNormColumnParallelLinear, the latents' norms fused into them; linear_proj
TERowParallelLinear; core attention TEDotProductAttention with k_channels = qk_head_dim +
qk_pos_emb_head_dim and v_channels = v_head_dim) and megatron/core/extensions/transformer_engine.py
(TELinear "duplicated": the weight whole on every TP rank, marked sequence_parallel so that
finalize_model_grads all-reduces its gradient over TP).

Per layer, with t the rank's sequence-parallel tokens and n the tokens after the gather, a the
rank's heads, dqk = nope + rope, dv the value head size:
- q down-projection [t, h] x [h, q_lora] and kv down-projection [t, h] x [h, kv_lora + rope], on
  the rank's own tokens with the whole weight (no TP communication); each TE Linear casts its input;
- the rope part of the keys all-gathered over TP (gather_from_sequence_parallel_region);
- q norm and q up-projection [n, q_lora] x [q_lora, a dqk] (the latent all-gathered over TP, as a
  column-parallel LayerNormLinear gathers its normalized input), or without q_lora_rank one q
  projection [n, h] x [h, a dqk]; kv norm and kv up-projection [n, kv_lora] x [kv_lora, a (nope + dv)];
- RoPE on the queries' and the keys' rope parts and the copies that assemble q, k (the rope key
  broadcast to every head) and v, as Megatron's unfused path runs them (apply_rope_fusion false, the
  DeepSeek recipes' default): each modelled as one memory-bound kernel of what it reads and writes;
- core attention with q.k of head size dqk and p.v of dv (attention.SelfAttention.flash_attention);
- output projection [n, a dv] x [a dv, h], row-parallel.
The backward mirrors it; the two down-projections' input gradients are added before the norm's
backward, and the rope keys' gradient is reduce-scattered over TP.

Not modelled: Megatron's fused down-projection (--mla-down-proj-fusion), the fused MLA RoPE
kernels (apply_rope_fusion), selective recomputation of the up-projections (recompute_modules
mla_up_proj), absorbed (latent-cached) inference paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core.jobs.attention import NORM_OPS
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

ROPE_OPS = 3
"""Per rotated element: two products and a sum."""


def latent_attention_problems(job: "JobSpec") -> list[str]:
    """Latent attention settings this model does not cover, each naming its key."""
    m, p, t = job.shape, job.parallel, job.training
    if not m.mla:
        return []
    out = []
    if p.tp > 1 and p.sp is False:
        out.append("parallel.sp false with tp > 1 and latent attention: Megatron-Core's MLA all-gathers its "
                   "sequence-parallel latents; without SP it is not modelled")
    if p.tp_comm_overlap:
        out.append("parallel.tp_comm_overlap with latent attention is not modelled")
    if t.attention == "unfused":
        out.append("training.attention unfused with latent attention is not modelled (flash only)")
    return out


class LatentAttention:
    """The latent attention block of a layer (see the module docstring)."""

    job: "JobSpec"
    h: int
    a: int
    n: int
    tp: int
    sp: bool
    dqk: int
    dv: int
    local_tokens: int
    act_bytes: int
    fp8: bool
    linear_fp8: bool

    if TYPE_CHECKING:   # provided by kernels.LayerKernels and its mixins
        def elementwise(self, name: str, elements: int, nbytes: int, ops_per: int = 1, dtype: str = "bf16") -> int:
            raise NotImplementedError

        def gemm(self, name: str, m: int, k: int, n: int, cast: bool = False, tp_amax: bool = False,
                 sm_margin: int = 0, accumulate: bool = False, chunks: int = 1) -> int:
            raise NotImplementedError

        def norm(self, name: str, feeds_fp8: bool = True, width: int | None = None) -> int:
            raise NotImplementedError

        def blocking(self, name: str, role: str, comm_type: int, size: int, part: str | None = None) -> None:
            raise NotImplementedError

        def tp_gather(self, name: str, te: bool = True, width: int | None = None) -> int | None:
            raise NotImplementedError

        def _gemm_with(self, name: str, m: int, k: int, n: int, gather: bool, cast: bool = False,
                       tp_amax: bool = False, te: bool = True, width: int | None = None) -> int:
            raise NotImplementedError

        def _row_gemm(self, name: str, m: int, k: int, n: int) -> int:
            raise NotImplementedError

        def _row_backward(self, name: str, m: int, k: int, n: int) -> tuple[int, int]:
            raise NotImplementedError

        def _column_backward(self, name: str, m: int, k: int, n: int, te: bool = True,
                             width: int | None = None) -> tuple[int, int]:
            raise NotImplementedError

        def attention(self, name: str, backward: bool) -> int:
            raise NotImplementedError

        def _keep(self, node: int | None, what: str, elements: int, size: int, output: bool = True) -> None:
            raise NotImplementedError

        def _read(self, node: int | None, *what: str) -> None:
            raise NotImplementedError

        @property
        def gemm_in(self) -> int:
            raise NotImplementedError

    def latent_linear_weights(self) -> int:
        """Elements of a latent attention layer's linear weights on this rank (all TE modules)."""
        m, h, a = self.job.shape, self.h, self.a
        q = h * m.q_lora_rank + m.q_lora_rank * a * self.dqk if m.q_lora_rank else h * a * self.dqk
        kv_lora = m.kv_lora_rank or 0
        return q + h * (kv_lora + m.rope_dim) + kv_lora * a * (m.nope_dim + self.dv) + a * self.dv * h

    def latent_attention_forward(self, p: str) -> None:
        """After the layer's input norm (bf16): down-projections, latent norms and up-projections,
        RoPE, core attention, output projection (see the module docstring)."""
        m = self.job.shape
        h, a, n, t, b = self.h, self.a, self.n, self.local_tokens, self.act_bytes
        q_lora, kv_lora, rope, dqk, dv = m.q_lora_rank, m.kv_lora_rank or 0, m.rope_dim, self.dqk, self.dv
        fused = bool(m.qk_layernorm)   # latent norms fused into the up-projections (LayerNormLinear)
        if q_lora:
            q_down = self.gemm(p + "q_down", t, h, q_lora, cast=True)
            self._keep(q_down, self._down_input("q_down_in"), t * h, self.gemm_in, output=False)
            self._keep(q_down if fused else None, "q_lat", t * q_lora, b)
        kv_down = self.gemm(p + "kv_down", t, h, kv_lora + rope, cast=True)
        if self.gemm_in == 1 or not q_lora:   # in bf16 both read the norm's output, listed once
            self._keep(kv_down, self._down_input("kv_down_in"), t * h, self.gemm_in, output=False)
        self._keep(kv_down if fused else None, "kv_lat", t * kv_lora, b)
        self.tp_gather(p + "k_pos_emb", te=False, width=rope)
        if q_lora:
            if fused:
                self.norm(p + "q_norm", width=q_lora)
            q = self._gemm_with(p + "q_up", n, q_lora, a * dqk, gather=True, cast=not fused, width=q_lora)
            self._keep(q, "q_up_in", t * q_lora, self.gemm_in, output=False)
        else:
            q = self._gemm_with(p + "q_proj", n, h, a * dqk, gather=True, cast=True)
            self._keep(q, "q_up_in", t * h, self.gemm_in, output=False)
        if fused:
            self.norm(p + "kv_norm", width=kv_lora)
        kv = self._gemm_with(p + "kv_up", n, kv_lora, a * (m.nope_dim + dv), gather=True, cast=not fused,
                             width=kv_lora)
        self._keep(kv, "kv_up_in", t * kv_lora, self.gemm_in, output=False)
        self.elementwise(p + "rope_q", n * a * rope, 2 * n * a * rope * b, ROPE_OPS)
        self.elementwise(p + "rope_k", n * rope, 2 * n * rope * b, ROPE_OPS)
        qkv = n * a * (2 * dqk + dv)   # query, key (rope part broadcast to every head), value
        assemble = self.elementwise(p + "qkv_assemble", qkv, 2 * qkv * b)
        self._keep(assemble, "qkv", qkv, b)
        self._keep(self.attention(p + "attention", backward=False), "attn_out", n * a * dv, b)
        proj = self._row_gemm(p + "proj", n, a * dv, h)
        if self.fp8:   # TE saves its own fp8 copy of the input beside the one FlashAttention keeps
            self._keep(proj, "proj_in", n * a * dv, 1, output=False)

    def latent_attention_backward(self, p: str) -> None:
        m = self.job.shape
        h, a, n, t, b = self.h, self.a, self.n, self.local_tokens, self.act_bytes
        q_lora, kv_lora, rope, dqk, dv = m.q_lora_rank, m.kv_lora_rank or 0, m.rope_dim, self.dqk, self.dv
        fused = bool(m.qk_layernorm)
        self._read(self._row_backward(p + "proj", n, a * dv, h)[1], "attn_out", "proj_in")
        self.attention(p + "attention.bwd", backward=True)
        qkv = n * a * (2 * dqk + dv)   # the gradients split back to q, the nope keys and values, the rope key
        self.elementwise(p + "qkv_assemble.bwd", qkv, 2 * qkv * b)
        self.elementwise(p + "rope_q.bwd", n * a * rope, 2 * n * a * rope * b, ROPE_OPS)
        self.elementwise(p + "rope_k.bwd", n * rope, 2 * n * rope * b, ROPE_OPS)
        self._read(self._column_backward(p + "kv_up", n, kv_lora, a * (m.nope_dim + dv), width=kv_lora)[1],
                   "kv_up_in")
        if fused:
            self._read(self._norm_backward(p + "kv_norm", kv_lora), "kv_lat")
        if q_lora:
            self._read(self._column_backward(p + "q_up", n, q_lora, a * dqk, width=q_lora)[1], "q_up_in")
            if fused:
                self._read(self._norm_backward(p + "q_norm", q_lora), "q_lat")
        else:
            self._read(self._column_backward(p + "q_proj", n, h, a * dqk)[1], "q_up_in")
        if self.sp and self.tp > 1:   # backward of the rope keys' all-gather
            self.blocking(p + "k_pos_emb.bwd.tp_reduce_scatter", "tp", pb.REDUCE_SCATTER, n * rope * b)
        self.gemm(p + "kv_down.dgrad", t, kv_lora + rope, h, cast=True)
        self._read(self.gemm(p + "kv_down.wgrad", kv_lora + rope, t, h, accumulate=True),
                   self._down_input("kv_down_in"))
        if q_lora:
            self.gemm(p + "q_down.dgrad", t, q_lora, h, cast=True)
            self._read(self.gemm(p + "q_down.wgrad", q_lora, t, h, accumulate=True), self._down_input("q_down_in"))
        # the input's gradient from the kv and q paths added before the norm's backward
        self.elementwise(p + "latent_grad_add", t * h, 3 * t * h * b)

    def _down_input(self, what: str) -> str:
        """The saved input of a down-projection: each TE Linear's own fp8 copy, or in bf16 the norm's
        output that both read."""
        return what if self.gemm_in == 1 else "down_in"

    def _norm_backward(self, name: str, width: int) -> int:
        elements = self.local_tokens * width
        return self.elementwise(name + ".bwd", elements, 4 * elements * self.act_bytes, 2 * NORM_OPS)
