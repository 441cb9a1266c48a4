"""A layer's self-attention block: QKV projection, QK norms, RoPE, core attention, output projection
(a mixin of `kernels.LayerKernels`; multi-head latent attention is `mla.LatentAttention`).

Megatron-Core's SelfAttention (megatron/core/transformer/attention.py at NVIDIA/Megatron-LM
d98e8a64ddf34856e74b24714e3bedb2f5a39553): the fused norm + QKV GEMM (TELayerNormColumnParallelLinear),
sliding windows and sinks (attention_variants.py), the output projection's bias (linear_biases.py),
with `qk_layernorm` an RMSNorm of each head's query and of each key head (q_layernorm / k_layernorm
of head size, applied after the split and before RoPE), the core attention (FlashAttention, or the
unfused batched GEMMs around a softmax), the row-parallel output projection. Core attention's
FLOPs: the forward's two matmuls q.k (head size dqk) and p.v (dv), 2 s_q s_kv (dqk + dv) per head,
half of it under a causal mask; FlashAttention's backward runs five (it recomputes the scores):
2 s_q s_kv (3 dqk + 2 dv). With dqk = dv = d these are 4 s_q s_kv d and 2.5 times it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core.jobs.attention_variants import attention_chunks, windowed_flops
from chakra_core.jobs.primitives import Attr, KernelPrimitives
from chakra_core.schema import pb


NORM_OPS = 4
"""Per element of an RMSNorm/LayerNorm: square, accumulate, scale, weight."""


class SelfAttention(KernelPrimitives):
    """The attention block of a layer (see the module docstring)."""

    b: int
    s: int
    a: int
    g: int
    d: int
    dqk: int
    dv: int
    cp: int
    local_seq: int
    act_dtype: str
    dropout: bool
    mask: int
    _saving: bool

    if TYPE_CHECKING:   # provided by kernels.LayerKernels and its mixins
        def ring_attention(self, name: str, backward: bool, role: str = "cp", heads: int | None = None) -> int:
            raise NotImplementedError

        def a2a_attention(self, name: str, backward: bool, hierarchical: bool = False) -> int:
            raise NotImplementedError

        def _kv_bytes(self) -> int:
            raise NotImplementedError

        def attention_window(self, seq_kv: int, causal: bool) -> int | None:
            raise NotImplementedError

        def sink_ops(self, rows: int, backward: bool) -> int:
            raise NotImplementedError

        def attention_output_bias(self, p: str, backward: bool) -> None:
            raise NotImplementedError

    # The block ------------------------------------------------------------------------------------
    def self_attention_forward(self, p: str) -> None:
        """After the layer's first norm (fused into the QKV GEMM): QKV, QK norms, RoPE, attention,
        output projection."""
        h, a, g, d, n, act_bytes = self.h, self.a, self.g, self.d, self.n, self.act_bytes
        qkv = self._gemm_with(p + "qkv", n, h, (a + 2 * g) * d, gather=True)
        self._keep(qkv, "qkv_in", self.local_tokens * h, self.gemm_in, output=False)
        self._keep(qkv, "qkv", n * (a + 2 * g) * d, act_bytes)
        if self.job.shape.qk_layernorm:
            self._keep(self._qk_norms(p, backward=False), "qk_normed", n * (a + g) * d, act_bytes)
        if self.job.shape.position == "rope":
            self.elementwise(p + "rope", n * (a + g) * d, 2 * n * (a + g) * d * self.act_bytes, 3)
        self._keep(self.attention(p + "attention", backward=False), "attn_out", n * a * d, act_bytes)
        proj = self._row_gemm(p + "proj", n, a * d, h)
        self.attention_output_bias(p, backward=False)
        if self.fp8:   # TE saves its own fp8 copy of the input beside the one FlashAttention keeps
            self._keep(proj, "proj_in", n * a * d, 1, output=False)

    def self_attention_backward(self, p: str) -> None:
        h, a, g, d, n = self.h, self.a, self.g, self.d, self.n
        self.attention_output_bias(p, backward=True)
        self._read(self._row_backward(p + "proj", n, a * d, h)[1], "attn_out", "proj_in")
        if self.job.training.recomputes("core_attn") and self.job.training.attention == "unfused":
            # selective recompute re-runs the core attention it did not keep (Korthikanti et al. 2022
            # sec. 5: QK^T, softmax, softmax dropout, attention over V); FlashAttention does it anyway
            part, self.part, self._saving = self.part, "recompute", False
            self._unfused_attention(p + "attention", backward=False)
            self.part, self._saving = part, True
        self.attention(p + "attention.bwd", backward=True)
        if self.job.shape.position == "rope":
            self.elementwise(p + "rope.bwd", n * (a + g) * d, 2 * n * (a + g) * d * self.act_bytes, 3)
        if self.job.shape.qk_layernorm:
            self._read(self._qk_norms(p, backward=True), "qk_normed")
        self._read(self._column_backward(p + "qkv", n, h, (a + 2 * g) * d)[1], "qkv_in")

    def _qk_norms(self, p: str, backward: bool) -> int:
        """RMSNorm over each query head and each key head (head size d, one weight each); the
        backward reads the input and the output gradient and writes the input gradient."""
        last = -1
        for what, heads in (("q_norm", self.a), ("k_norm", self.g)):
            elements = self.n * heads * self.d
            if backward:
                last = self.elementwise(p + what + ".bwd", elements, 4 * elements * self.act_bytes, 2 * NORM_OPS)
            else:
                last = self.elementwise(p + what, elements, (2 * elements + self.d) * self.act_bytes, NORM_OPS)
        return last

    def attention_linear_weights(self) -> int:
        """Elements of a layer's attention weights on this rank (what fp8 quantizes)."""
        h, d, a, g = self.h, self.d, self.a, self.g
        return h * (a + 2 * g) * d + a * d * h

    # Core attention -------------------------------------------------------------------------------
    def attention(self, name: str, backward: bool) -> int:
        """The attention of a layer; returns the node that writes (forward) or reads (backward) its output."""
        if self.job.training.attention == "unfused":
            return self._unfused_attention(name, backward)
        chunks = attention_chunks(self.job.shape, self.s)
        if chunks > 1:   # Llama 4: causal chunks as batch entries (attention_variants; refused with CP)
            chunk = self.job.shape.attention_chunk or self.s
            return self.flash_attention(name, backward, chunk, chunk, True, self.a, chunks)
        if self.cp > 1 and self.job.parallel.cp_comm_type == "p2p":
            return self.ring_attention(name, backward)
        if self.cp > 1 and self.job.parallel.cp_comm_type in ("a2a", "a2a+p2p"):
            return self.a2a_attention(name, backward, hierarchical=self.job.parallel.cp_comm_type == "a2a+p2p")
        # one kernel over the whole sequence: this rank's queries (its 2 load-balanced chunks of a
        # causal split) against every key; with allgather CP the key/value blocks are gathered beside it
        kv = self._kv_bytes()
        gathered = self.collective(name + ".cp_kv_all_gather", "cp", pb.ALL_GATHER, kv) if self.cp > 1 else None
        node = self.flash_attention(name, backward, self.local_seq, self.s, True, self.a)
        self.stream.wait(gathered)
        if backward and self.cp > 1:
            self.blocking(name + ".cp_dkv_reduce_scatter", "cp", pb.REDUCE_SCATTER, kv * self.cp)
        return node

    def flash_attention(self, name: str, backward: bool, seq_q: int, seq_kv: int, causal: bool, heads: int,
                        chunks: int = 1) -> int:
        """One fused attention kernel: `heads` query heads (and their share of the key/value heads)
        of `seq_q` queries against `seq_kv` keys, for the micro-batch (times `chunks` when the
        sequence is cut into chunks); q and k of head size dqk, v and the output of dv
        (`attn_head_dim`, and `attn_head_dim_v` when they differ)."""
        b, dqk, dv = self.b * chunks, self.dqk, self.dv
        kv_heads = self.g * heads // self.a
        causal_half = 2 if causal else 1
        qkvo = b * (heads * seq_q + kv_heads * seq_kv) * (dqk + dv) * self.act_bytes
        attrs: list[Attr] = [("uint", "attn_batch", b * heads), ("uint", "attn_seq_q", seq_q),
                             ("uint", "attn_seq_kv", seq_kv), ("uint", "attn_head_dim", dqk),
                             ("bool", "attn_causal", causal), ("str", "attn_pass", "backward" if backward else "forward"),
                             ("uint", "attn_kv_heads", kv_heads)]
        if self.job.training.attention_kernel != "auto":   # else the compute layer's own curves
            attrs.append(("str", "attn_kernel", self.job.training.attention_kernel))
        if dqk == dv:
            flops = 4 * b * heads * seq_q * seq_kv * dqk // causal_half
            window = self.attention_window(seq_kv, causal)
            if window is not None:   # the keys in the band, and the band for the compute layer (attention_variants)
                flops = windowed_flops(b * heads, seq_q, seq_kv, dqk, window)
                attrs.append(("uint", "attn_window", window))
            # FlashAttention's backward: 5 matmuls to the forward's 2 (it recomputes the scores)
            ops = flops * 5 // 2 if backward else flops
        else:   # latent attention: 3 of the backward's matmuls over dqk, 2 over dv (no window: refused)
            attrs.append(("uint", "attn_head_dim_v", dv))
            pairs = b * heads * seq_q * seq_kv
            ops = 2 * pairs * ((3 * dqk + 2 * dv) if backward else (dqk + dv)) // causal_half
        nbytes = 2 * qkvo if backward else qkvo
        ops += self.sink_ops(b * heads * seq_q, backward)
        node = self._kernel(name, "attention", ops, nbytes, self.act_dtype, attrs)
        if backward:
            self._read(node, "qkv", "attn_out")
        return node

    def _unfused_attention(self, name: str, backward: bool) -> int:
        """Attention as Megatron-LM ran it before FlashAttention: batched GEMMs around a fused
        scale-mask-softmax over the whole s x s score matrix (and its dropout), written to memory.
        The softmax output, dropout mask and dropout output are kept for the backward unless
        selective recompute rebuilds them."""
        b, a, d, s = self.b, self.a, self.d, self.s
        scores = b * a * s * s
        mask = self.mask
        kept = not self.job.training.recomputes("core_attn")
        if not backward:
            self.bmm(name + ".scores", b * a, s, d, s)
            softmax = self.elementwise(name + ".softmax", scores, 2 * scores * self.act_bytes, 4)
            self._keep(softmax if kept else None, "probs", scores, self.act_bytes)
            if self.dropout:
                drop = self.elementwise(name + ".dropout", scores, scores * (2 * self.act_bytes + mask), 2)
                self._keep(drop if kept else None, "attn_mask", scores, mask)
                self._keep(drop if kept else None, "attn_dropped", scores, self.act_bytes)
            return self.bmm(name + ".context", b * a, s, s, d)
        context = self.bmm(name + ".context.dgrad", b * a, s, d, s)
        self._read(context, "qkv", "attn_out")
        self._read(self.bmm(name + ".context.wgrad", b * a, s, s, d), "attn_dropped", "probs")
        if self.dropout:
            self._read(self.elementwise(name + ".dropout", scores, scores * (2 * self.act_bytes + mask), 1),
                       "attn_mask")
        self._read(self.elementwise(name + ".softmax", scores, 3 * scores * self.act_bytes, 3), "probs")
        self.bmm(name + ".scores.dgrad", b * a, s, s, d)
        self._read(self.bmm(name + ".scores.wgrad", b * a, s, s, d), "qkv")
        return context
