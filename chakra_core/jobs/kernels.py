"""The kernels and tensor/context parallel communication of one rank's transformer layers.

`LayerKernels` writes nodes: GEMMs, attention, elementwise kernels (each with the attributes a
compute model times it by: num_ops, tensor_size, kernel, dtype, GEMM or attention shapes,
step_part) and the collectives of tensor parallelism (with sequence parallelism: all-gather
before and reduce-scatter after each parallel block, as Megatron-LM does) and of context
parallelism (ring attention). `program.RankProgram` strings them into a training step.
docs/training.md lists the kernels and their FLOP and byte formulas.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import Iterable, Iterator, Sequence

from chakra_core.et.build import Stream, bool_attr, read_collective, str_attr, uint_attr
from chakra_core.jobs.attention_variants import AttentionVariants, windowed_flops
from chakra_core.jobs.context_parallel import ContextParallel
from chakra_core.jobs.expert_activation import ExpertActivation
from chakra_core.jobs.fp8 import Fp8Quantization
from chakra_core.jobs.linear_biases import LinearBiases
from chakra_core.jobs.moe import MixtureOfExperts
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.tensor_parallel import TensorParallel
from chakra_core.jobs.spec import DTYPE_BYTES, JobSpec
from chakra_core.jobs.tensors import TensorLedger
from chakra_core.schema import pb

@lru_cache(maxsize=None)
def _attr(kind: str, name: str, value: int | str | bool) -> pb.AttributeProto:
    """One attribute message per distinct (name, value): a step repeats the same few thousands of
    times, and extending a node with a message copies it."""
    if kind == "uint":
        return uint_attr(name, int(value))
    if kind == "bool":
        return bool_attr(name, bool(value))
    return str_attr(name, str(value))


NORM_OPS = 4
"""Per element of an RMSNorm/LayerNorm: square, accumulate, scale, weight."""


class LayerKernels(TensorParallel, ContextParallel, Fp8Quantization, MixtureOfExperts, ExpertActivation, LinearBiases,
                   AttentionVariants):
    """A rank's place in the job and the nodes of its layers (see the module docstring).

    Shapes use the Megatron papers' letters: h hidden, f MLP hidden, a and g this rank's query
    heads and query groups, d head size, b micro-batch, s sequence, n the tokens a GEMM sees.
    """

    def __init__(self, job: JobSpec, placement: Placement, rank: int):
        self.job, self.place, self.rank = job, placement, rank
        m, p, t = job.shape, job.parallel, job.training
        c = placement.coord(rank)
        self.stage, self.pp, self.vp = c.pp, p.pp, job.vp
        self.tp, self.cp = p.tp, p.cp
        self.sp = job.sp
        self.act_bytes = 2                                # activations are bf16
        self.grad_bytes = DTYPE_BYTES[t.grad_reduce_dtype]
        self.fp8 = t.precision == "fp8"
        self.gemm_dtype = t.precision
        self.act_dtype = "fp16" if t.precision == "fp16" else "bf16"
        self.dropout = t.dropout > 0
        self.mask = 1 if self.dropout else 0              # bytes per element of a dropout mask
        self.linear_fp8 = True   # off around the output layer
        self.b, self.s = t.micro_batch, t.seq
        self.local_seq = t.seq // p.cp                    # this rank's share of the sequence
        self.n = self.b * self.local_seq                  # tokens a GEMM sees
        # tokens of the residual stream held here
        self.local_tokens = self.n // p.tp if self.sp else self.n
        self.h, self.f, self.d = m.hidden, m.ffn_hidden, m.head_dim
        self.a, self.g = m.heads // p.tp, m.groups // p.tp   # local query heads and query groups
        self.vocab = m.padded_vocab(p.tp) // p.tp
        self.groups = placement.groups(rank)
        self.names = {role: Placement.group_name(role, members) for role, members in self.groups.items()}
        self.stream = Stream()
        self.stream.define_groups([(self.names[r], list(members)) for r, members in self.groups.items()])
        self.part = "forward"
        self.dp_group = "dp_cp" if "dp_cp" in self.groups else None
        self.ledger = TensorLedger(job.tensors)
        self.recomputed: set[int] = set()   # layers under full recompute (set by the step)
        self._layer_key: tuple[int, int | str] = (0, 0)   # (micro-batch, layer) whose tensors are listed
        self._saving = True                 # False in the forward of a layer under full recompute
        self._cp_exchanges = 0              # ring attention's exchanges so far (their tags)

    # Nodes ----------------------------------------------------------------------------------------
    def _kernel(self, name: str, kind: str, ops: int, nbytes: int, dtype: str,
                extra: Iterable[pb.AttributeProto] = ()) -> int:
        attrs = [_attr("bool", "is_cpu_op", False), _attr("uint", "num_ops", ops), _attr("uint", "tensor_size", nbytes),
                 _attr("str", "kernel", kind), _attr("str", "dtype", dtype), _attr("str", "step_part", self.part),
                 *extra]
        return self.stream.step(pb.COMP_NODE, name, attrs=attrs)

    def elementwise(self, name: str, elements: int, nbytes: int, ops_per: int = 1, dtype: str = "bf16") -> int:
        return self._kernel(name, "elementwise", ops_per * elements, nbytes, dtype)

    def bmm(self, name: str, batch: int, m: int, k: int, n: int) -> int:
        """`batch` independent [m,k] x [k,n] products (attention without FlashAttention), in the
        activations' type (Transformer Engine's fp8 covers the linear layers only)."""
        shape = [_attr("uint", "gemm_m", m), _attr("uint", "gemm_n", n), _attr("uint", "gemm_k", k),
                 _attr("uint", "gemm_batch", batch)]
        return self._kernel(name, "bmm", 2 * batch * m * k * n,
                            batch * (m * k + k * n + m * n) * self.act_bytes, self.act_dtype, shape)

    def gemm(self, name: str, m: int, k: int, n: int, cast: bool = False, tp_amax: bool = False,
             sm_margin: int = 0, accumulate: bool = False, chunks: int = 1) -> int:
        """[m,k] x [k,n]. In fp8 (Transformer Engine) `cast` first quantizes the [m,k] operand and
        its transpose (fp8.Fp8Quantization.quantize; `tp_amax`: its amax is reduced over TP),
        unless a fused norm already wrote it (LayerNormLinear) or, in the backward, the dgrad's
        cast serves the wgrad too. `sm_margin`: SMs Transformer Engine keeps from the GEMM for the
        communication beside it. `accumulate`: a weight gradient added into the main gradients
        (Megatron's gradient accumulation fusion: C is read and written in their type). `chunks`:
        run as that many GEMMs of m / chunks rows one after the other (`gemm_chunks`)."""
        fp8 = self.fp8 and self.linear_fp8
        if fp8 and cast:
            self.quantize(name, m * k, tp_amax)
        shape = [_attr("uint", "gemm_m", m), _attr("uint", "gemm_n", n), _attr("uint", "gemm_k", k),
                 _attr("uint", "gemm_batch", 1)]
        if sm_margin:
            shape.append(_attr("uint", "sm_margin", sm_margin))
        if chunks > 1:
            shape.append(_attr("uint", "gemm_chunks", chunks))
        out = 2 * self.grad_bytes if accumulate else self.act_bytes
        if accumulate:
            shape.append(_attr("uint", "gemm_c_bytes", out))
        opnd = 1 if fp8 else self.act_bytes
        return self._kernel(name, "gemm", 2 * m * k * n, (m * k + k * n) * opnd + m * n * out,
                            self.gemm_dtype if fp8 else self.act_dtype, shape)

    def collective(self, name: str, role: str, comm_type: int, size: int, part: str | None = None,
                   after: Sequence[int] | None = None, ctas: int = 0) -> int | None:
        """A collective of `role`'s group; `ctas`: run by Transformer Engine's userbuffers on that
        many thread blocks (`comm_ctas`) rather than by NCCL."""
        if role not in self.groups or size <= 0:
            return None
        attrs = [*read_collective(comm_type, size, self.names[role]), str_attr("step_part", part or role)]
        if ctas:
            attrs.append(_attr("uint", "comm_ctas", ctas))
        return self.stream.launch(pb.COMM_COLL_NODE, name, attrs=attrs, after=after)

    def blocking(self, name: str, role: str, comm_type: int, size: int, part: str | None = None) -> None:
        self.stream.wait(self.collective(name, role, comm_type, size, part))

    def linear_weights(self, layer: int) -> int:
        """Elements of a layer's linear weights on this rank (what fp8 quantizes)."""
        gated = 2 if self.job.shape.gated else 1
        h, d, a, g, fl = self.h, self.d, self.a, self.g, self.f // self.tp
        if self.job.shape.is_moe_layer(layer):
            return h * (a + 2 * g) * d + a * d * h + self.moe_linear_weights()
        return h * (a + 2 * g) * d + a * d * h + (gated + 1) * h * fl

    # Saved tensors (tensors.TensorLedger) ------------------------------------------------------------
    @property
    def gemm_in(self) -> int:
        """Bytes per element of the input a GEMM saves: fp8 under Transformer Engine, else bf16."""
        return 1 if self.fp8 and self.linear_fp8 else self.act_bytes

    def _keep(self, node: int | None, what: str, elements: int, size: int, output: bool = True) -> None:
        if self._saving and what not in self._dropped:
            self.ledger.save(node, (*self._layer_key, what), elements, size, output)

    def _read(self, node: int | None, *what: str) -> None:
        self.ledger.use(node, *((*self._layer_key, w) for w in what))

    # A transformer layer ----------------------------------------------------------------------------
    def norm(self, name: str, feeds_fp8: bool = True) -> int:
        """RMSNorm/LayerNorm before a GEMM; in fp8 its output is quantized as TE's LayerNormLinear
        does (fused under delayed scaling, after it under current scaling)."""
        out = self.norm_output_bytes() if feeds_fp8 else self.act_bytes
        elements = self.local_tokens * self.h
        node = self.elementwise(name, elements, elements * (self.act_bytes + out) + self.h * self.act_bytes, NORM_OPS)
        if feeds_fp8 and self.current_scaling:
            self.quantize(name, self.local_tokens * self.h, tp_amax=self.sp, amax_done=True)
        return node

    def attention(self, name: str, backward: bool) -> int:
        """The attention of a layer; returns the node that writes (forward) or reads (backward) its output."""
        if self.job.training.attention == "unfused":
            return self._unfused_attention(name, backward)
        if self.cp > 1 and self.job.parallel.cp_comm_type == "p2p":
            return self.ring_attention(name, backward)
        if self.cp > 1 and self.job.parallel.cp_comm_type == "a2a":
            return self.a2a_attention(name, backward)
        # one kernel over the whole sequence: this rank's queries (its 2 load-balanced chunks of a
        # causal split) against every key; with allgather CP the key/value blocks are gathered beside it
        kv = self._kv_bytes()
        gathered = self.collective(name + ".cp_kv_all_gather", "cp", pb.ALL_GATHER, kv) if self.cp > 1 else None
        node = self.flash_attention(name, backward, self.local_seq, self.s, True, self.a)
        self.stream.wait(gathered)
        if backward and self.cp > 1:
            self.blocking(name + ".cp_dkv_reduce_scatter", "cp", pb.REDUCE_SCATTER, kv * self.cp)
        return node

    def flash_attention(self, name: str, backward: bool, seq_q: int, seq_kv: int, causal: bool, heads: int) -> int:
        """One fused attention kernel: `heads` query heads (and their share of the key/value heads)
        of `seq_q` queries against `seq_kv` keys, for the micro-batch."""
        b, d = self.b, self.d
        kv_heads = self.g * heads // self.a
        flops = 4 * b * heads * seq_q * seq_kv * d // (2 if causal else 1)
        qkvo = b * (2 * heads * seq_q + 2 * kv_heads * seq_kv) * d * self.act_bytes
        attrs = [uint_attr("attn_batch", b * heads), uint_attr("attn_seq_q", seq_q), uint_attr("attn_seq_kv", seq_kv),
                 uint_attr("attn_head_dim", d), bool_attr("attn_causal", causal),
                 str_attr("attn_pass", "backward" if backward else "forward"), uint_attr("attn_kv_heads", kv_heads)]
        window = self.attention_window(seq_kv, causal)
        if window is not None:   # the keys in the band, and the band for the compute layer (attention_variants)
            flops = windowed_flops(b * heads, seq_q, seq_kv, d, window)
            attrs.append(uint_attr("attn_window", window))
        # FlashAttention's backward: 5 matmuls to the forward's 2 (it recomputes the scores)
        ops, nbytes = (flops * 5 // 2, 2 * qkvo) if backward else (flops, qkvo)
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

    def layer_forward(self, mb: int, layer: int) -> None:
        deque(self.layer_forward_parts(mb, layer), maxlen=0)

    def layer_forward_parts(self, mb: int, layer: int) -> Iterator[str]:
        """The forward, yielding each sub-module it ends (pre_dispatch, dispatch, mlp; combine last) for
        moe_overlap to interleave; a dense layer's dispatch and combine are empty."""
        h, a, g, d, n = self.h, self.a, self.g, self.d, self.n
        p = f"mb{mb}.L{layer}."
        act_bytes = self.act_bytes
        residual = self.local_tokens * h   # elements of the residual stream held here
        recomputing = self.part == "recompute"
        # under full recompute the forward keeps only the layer's input; the recompute keeps the rest
        self._layer_key, self._saving = (mb, layer), not (layer in self.recomputed and not recomputing)
        self._await_params(layer)
        norm1 = self.norm(p + "norm1")
        if recomputing:
            self._read(norm1, "x")
        else:
            self.ledger.save(norm1, (mb, layer, "x"), residual, act_bytes, output=False)
        qkv = self._gemm_with(p + "qkv", n, h, (a + 2 * g) * d, gather=True)
        self._keep(qkv, "qkv_in", residual, self.gemm_in, output=False)
        self._keep(qkv, "qkv", n * (a + 2 * g) * d, act_bytes)
        if self.job.shape.position == "rope":
            self.elementwise(p + "rope", n * (a + g) * d, 2 * n * (a + g) * d * self.act_bytes, 3)
        self._keep(self.attention(p + "attention", backward=False), "attn_out", n * a * d, act_bytes)
        proj = self._row_gemm(p + "proj", n, a * d, h)
        self.attention_output_bias(p, backward=False)
        if self.fp8:   # TE saves its own fp8 copy of the input beside the one FlashAttention keeps
            self._keep(proj, "proj_in", n * a * d, 1, output=False)
        residual1 = self.elementwise(p + "residual1", residual, residual * (3 * act_bytes + self.mask))
        self._keep(residual1, "mask1", residual * self.mask, 1)
        if self.job.shape.is_moe_layer(layer):   # its norm feeds the router and the dispatcher in bf16
            self._keep(self.norm(p + "norm2", feeds_fp8=False), "x2", residual, act_bytes, output=False)
            yield from self.moe_forward(p)
        else:
            yield "pre_dispatch"
            yield "dispatch"
            self._keep(self.norm(p + "norm2"), "x2", residual, act_bytes, output=False)
            self._mlp_forward(p, self.f)
        residual2 = self.elementwise(p + "residual2", residual, residual * (3 * act_bytes + self.mask))
        self._keep(residual2, "mask2", residual * self.mask, 1)
        if not self.job.shape.is_moe_layer(layer):
            yield "mlp"
        self._saving = True

    def _mlp_forward(self, p: str, ffn: int, cast: bool = False) -> None:
        """A TP MLP of hidden width `ffn` (the layer's, or its MoE block's shared experts: `cast` when
        its input is not already fp8 from a fused norm)."""
        h, n, act_bytes = self.h, self.n, self.act_bytes
        ffn_here = ffn // self.tp
        up = self.job.shape.up_projections() * ffn_here
        fc1 = self._gemm_with(p + "fc1", n, h, up, gather=True, cast=cast)
        self._keep(fc1, "fc1_in", self.local_tokens * h, self.gemm_in, output=False)
        self._keep(fc1, "fc1", n * up, act_bytes)
        activation = self.elementwise(p + "activation", n * ffn_here, (up + ffn_here) * n * act_bytes, 4)
        self._keep(activation, "act", n * ffn_here, self.gemm_in)
        self._row_gemm(p + "fc2", n, ffn_here, h)

    def _mlp_backward(self, p: str, ffn: int) -> None:
        h, n, act_bytes = self.h, self.n, self.act_bytes
        ffn_here = ffn // self.tp
        up = self.job.shape.up_projections() * ffn_here
        self._read(self._row_backward(p + "fc2", n, ffn_here, h)[1], "act")
        self._read(self.elementwise(p + "activation.bwd", n * ffn_here, (up + ffn_here + up) * n * act_bytes, 6),
                   "fc1")
        self._read(self._column_backward(p + "fc1", n, h, up)[1], "fc1_in")

    def layer_backward(self, mb: int, layer: int) -> None:
        deque(self.layer_backward_parts(mb, layer), maxlen=0)

    def layer_backward_parts(self, mb: int, layer: int) -> Iterator[str]:
        """The backward, yielding each sub-module it ends (combine, mlp, dispatch, pre_dispatch)."""
        h, f, a, g, d, n = self.h, self.f, self.a, self.g, self.d, self.n
        p = f"mb{mb}.L{layer}."
        act_bytes = self.act_bytes
        residual = self.local_tokens * h   # elements of the residual stream held here
        self._layer_key = (mb, layer)
        read = self._read
        moe = self.job.shape.is_moe_layer(layer)
        if not moe:
            yield "combine"
        read(self.elementwise(p + "residual2.bwd", residual, residual * (2 * act_bytes + self.mask)), "mask2")
        if moe:
            yield from self.moe_backward(p)
        else:
            self._mlp_backward(p, f)
        read(self.elementwise(p + "norm2.bwd", residual, 4 * residual * act_bytes, 2 * NORM_OPS), "x2", "mask1")
        if not moe:   # a dense layer's norm2 belongs to its mlp (TransformerLayer._forward_mlp)
            yield "mlp"
            yield "dispatch"
        self.attention_output_bias(p, backward=True)
        read(self._row_backward(p + "proj", n, a * d, h)[1], "attn_out", "proj_in")
        if self.job.training.recomputes("core_attn") and self.job.training.attention == "unfused":
            # selective recompute re-runs the core attention it did not keep (Korthikanti et al. 2022
            # sec. 5: QK^T, softmax, softmax dropout, attention over V); FlashAttention does it anyway
            part, self.part, self._saving = self.part, "recompute", False
            self._unfused_attention(p + "attention", backward=False)
            self.part, self._saving = part, True
        self.attention(p + "attention.bwd", backward=True)
        if self.job.shape.position == "rope":
            self.elementwise(p + "rope.bwd", n * (a + g) * d, 2 * n * (a + g) * d * act_bytes, 3)
        read(self._column_backward(p + "qkv", n, h, (a + 2 * g) * d)[1], "qkv_in")
        read(self.elementwise(p + "norm1.bwd", residual, 4 * residual * act_bytes, 2 * NORM_OPS), "x")
        yield "pre_dispatch"
        self._grad_ready(layer)

    # Embedding and output layer -------------------------------------------------------------------
    def embedding_forward(self, mb: int) -> None:
        self._await_params(-1)
        n, h = self.n, self.h
        node = self._kernel(f"mb{mb}.embedding", "embedding", n * h, 2 * n * h * self.act_bytes, "bf16")
        self._layer_key = (mb, "embedding")
        self._keep(node, "tokens", n, 8, output=False)              # int64 token ids
        self._keep(node, "mask", self.local_tokens * h * self.mask, 1)       # the embedding's dropout mask
        self.tp_reduce(f"mb{mb}.embedding")

    def embedding_backward(self, mb: int) -> None:
        self.stream.wait(self.tp_gather(f"mb{mb}.embedding.bwd", te=False))
        n, h = self.n, self.h
        node = self._kernel(f"mb{mb}.embedding.bwd", "embedding", n * h, n * h * (self.act_bytes + 2 * 4), "fp32")
        self._layer_key = (mb, "embedding")
        self._read(node, "tokens", "mask")
        self._grad_ready(-1)

    def head_forward(self, mb: int) -> None:
        self._await_params(-2)
        n, h, v = self.n, self.h, self.vocab
        p = f"mb{mb}."
        self._layer_key = (mb, "head")
        self.linear_fp8 = False   # Megatron's output layer is not a Transformer Engine module: bf16
        self._keep(self.norm(p + "final_norm", feeds_fp8=False), "norm_in", self.local_tokens * h, self.act_bytes,
                   output=False)
        head = self._gemm_with(p + "lm_head", n, h, v, gather=True, te=False)
        self._keep(head, "head_in", self.local_tokens * h, self.act_bytes, output=False)
        self._keep(head, "logits", n * v, self.act_bytes)
        self.linear_fp8 = True
        # vocab-parallel cross entropy in fp32: max, exponentials, sum, loss
        loss = self.elementwise(p + "cross_entropy", n * v, n * v * (self.act_bytes + 4), 5, dtype="fp32")
        self._read(loss, "logits")
        self._keep(loss, "softmax", n * v, 4)     # exp_logits, saved as fp32
        for what in ("max", "target", "sum_exp"):
            self.blocking(f"{p}cross_entropy.tp_all_reduce_{what}", "tp", pb.ALL_REDUCE, n * 4)

    def head_backward(self, mb: int) -> None:
        n, h, v = self.n, self.h, self.vocab
        p = f"mb{mb}."
        self._layer_key = (mb, "head")
        loss = self.elementwise(p + "cross_entropy.bwd", n * v, n * v * (4 + self.act_bytes), 2, dtype="fp32")
        self._read(loss, "softmax")
        self._keep(loss, "logits_grad", n * v, self.act_bytes)
        self.linear_fp8 = False
        dgrad, wgrad = self._column_backward(p + "lm_head", n, h, v, te=False)
        self._read(dgrad, "logits_grad")
        self._read(wgrad, "logits_grad", "head_in")
        self.linear_fp8 = True
        tokens = self.local_tokens
        self._read(self.elementwise(p + "final_norm.bwd", tokens * h, 4 * tokens * h * self.act_bytes, 2 * NORM_OPS),
                   "norm_in")
        self._grad_ready(-2)

    # Hooks the step fills in (program.RankProgram) ------------------------------------------------
    def _await_params(self, unit: int) -> None:
        """Before a unit's first forward: wait for its parameters (distributed optimizer)."""

    def _grad_ready(self, unit: int) -> None:
        """After a unit's backward: its gradients are complete."""
