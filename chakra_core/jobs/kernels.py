"""The kernels and tensor/context parallel communication of one rank's transformer layers.

`LayerKernels` writes nodes: GEMMs, attention, elementwise kernels (each with the attributes a
compute model times it by: num_ops, tensor_size, kernel, dtype, GEMM or attention shapes,
step_part) and the collectives of tensor parallelism (with sequence parallelism: all-gather
before and reduce-scatter after each parallel block, as Megatron-LM does) and of context
parallelism (ring attention). `program.RankProgram` strings them into a training step.
docs/training.md lists the kernels and their FLOP and byte formulas.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Sequence

from chakra_core.et.build import Stream, bool_attr, read_collective, str_attr, uint_attr
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import DTYPE_BYTES, JobSpec
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


class LayerKernels:
    """A rank's place in the job and the nodes of its layers (see the module docstring)."""

    def __init__(self, job: JobSpec, placement: Placement, rank: int):
        self.job, self.place, self.rank = job, placement, rank
        m, p, t = job.shape, job.parallel, job.training
        c = placement.coord(rank)
        self.stage, self.pp, self.vp = c.pp, p.pp, job.vp
        self.tp, self.cp = p.tp, p.cp
        self.sp = job.sp
        self.e = 2                                        # activations are bf16
        self.ge = DTYPE_BYTES[t.grad_reduce_dtype]
        self.fp8 = t.precision == "fp8"
        self.gemm_dtype = t.precision
        self.act_dtype = "fp16" if t.precision == "fp16" else "bf16"
        self.dropout = t.dropout > 0
        self.mask = 1 if self.dropout else 0              # bytes per element of a dropout mask
        self.linear_fp8 = True   # off around the output layer
        self.b, self.s = t.micro_batch, t.seq
        self.sq = t.seq // p.cp                           # this rank's share of the sequence
        self.n = self.b * self.sq                         # tokens a GEMM sees
        self.nl = self.n // p.tp if self.sp else self.n   # tokens of the residual stream held here
        self.h, self.f, self.d = m.hidden, m.ffn_hidden, m.head_dim
        self.a, self.g = m.heads // p.tp, m.groups // p.tp   # local query heads and query groups
        self.vocab = m.padded_vocab(p.tp) // p.tp
        self.groups = placement.groups(rank)
        self.names = {role: Placement.group_name(role, members) for role, members in self.groups.items()}
        self.stream = Stream()
        self.stream.define_groups([(self.names[r], list(members)) for r, members in self.groups.items()])
        self.part = "forward"
        self.dp_group = "dp_cp" if "dp_cp" in self.groups else None

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
        return self._kernel(name, "bmm", 2 * batch * m * k * n, batch * (m * k + k * n + m * n) * self.e,
                            self.act_dtype, shape)

    def gemm(self, name: str, m: int, k: int, n: int, cast: bool = False) -> int:
        """[m,k] x [k,n]. In fp8 (Transformer Engine) a `cast` kernel first converts the [m,k]
        operand and its transpose (cast_transpose), unless a fused norm already wrote it
        (LayerNormLinear) or, in the backward, the dgrad's cast serves the wgrad too."""
        fp8 = self.fp8 and self.linear_fp8
        if fp8 and cast:
            self.elementwise(name + ".cast_fp8", m * k, m * k * (self.e + 2), dtype="bf16")
        shape = [_attr("uint", "gemm_m", m), _attr("uint", "gemm_n", n), _attr("uint", "gemm_k", k),
                 _attr("uint", "gemm_batch", 1)]
        opnd = 1 if fp8 else self.e
        return self._kernel(name, "gemm", 2 * m * k * n, (m * k + k * n) * opnd + m * n * self.e,
                            self.gemm_dtype if fp8 else self.act_dtype, shape)

    def collective(self, name: str, role: str, comm_type: int, size: int, part: str | None = None,
                   after: Sequence[int] | None = None) -> int | None:
        if role not in self.groups or size <= 0:
            return None
        attrs = [*read_collective(comm_type, size, self.names[role]), str_attr("step_part", part or role)]
        return self.stream.launch(pb.COMM_COLL_NODE, name, attrs=attrs, after=after)

    def blocking(self, name: str, role: str, comm_type: int, size: int, part: str | None = None) -> None:
        self.stream.wait(self.collective(name, role, comm_type, size, part))

    # Tensor parallel communication ---------------------------------------------------------------
    def tp_gather(self, name: str) -> int | None:
        """Sequence parallel: all-gather the residual stream before a column-parallel GEMM;
        with TP comm overlap the gather is returned for the GEMM to run beside it."""
        if not self.sp:
            return None
        coll = self.collective(name + ".tp_all_gather", "tp", pb.ALL_GATHER, self.nl * self.h * self.e)
        if not self.job.parallel.tp_comm_overlap:
            self.stream.wait(coll)
            return None
        return coll

    def tp_reduce(self, name: str) -> None:
        """After a row-parallel GEMM: reduce-scatter (SP) or all-reduce its output."""
        if "tp" not in self.groups:
            return
        kind = pb.REDUCE_SCATTER if self.sp else pb.ALL_REDUCE
        suffix = ".tp_reduce_scatter" if self.sp else ".tp_all_reduce"
        self.blocking(name + suffix, "tp", kind, self.n * self.h * self.e)

    def _row_gemm(self, name: str, m: int, k: int, n: int) -> None:
        """A row-parallel GEMM and the reduction of its output; with TP comm overlap the
        reduce-scatter is pipelined with the GEMM chunk by chunk (TE userbuffers), so the pair
        takes as long as the longer of the two."""
        if self.job.parallel.tp_comm_overlap and self.sp and "tp" in self.groups:
            reduce = self.collective(name + ".tp_reduce_scatter", "tp", pb.REDUCE_SCATTER, self.n * self.h * self.e)
            self.gemm(name, m, k, n, cast=True)
            self.stream.wait(reduce)
            return
        self.gemm(name, m, k, n, cast=True)
        self.tp_reduce(name)

    def _gemm_with(self, name: str, m: int, k: int, n: int, gather: bool, cast: bool = False) -> int:
        """A column-parallel GEMM whose input is all-gathered first (or alongside, with TP comm
        overlap: the GEMM then waits for both)."""
        pending = self.tp_gather(name) if gather else None
        node = self.gemm(name, m, k, n, cast)
        self.stream.wait(pending)
        return node

    # A transformer layer ----------------------------------------------------------------------------
    def norm(self, name: str) -> None:
        """RMSNorm/LayerNorm; in fp8 fused with the cast of its output (TE's LayerNormLinear)."""
        out = self.e + (1 if self.fp8 and self.linear_fp8 else 0)
        self.elementwise(name, self.nl * self.h, self.nl * self.h * (self.e + out) + self.h * self.e, NORM_OPS)

    def attention(self, name: str, backward: bool) -> None:
        if self.job.training.attention == "unfused":
            self._unfused_attention(name, backward)
            return
        b, a, g, d, s, sq = self.b, self.a, self.g, self.d, self.s, self.sq
        # causal attention over the whole sequence, split evenly over CP ranks (load-balanced chunks)
        flops = 4 * b * a * s * s * d // 2 // self.cp
        qkvo = (self.n * (2 * a + 2 * g) * d) * self.e
        ring = None
        kv = 2 * self.n * g * d * self.e
        if self.cp > 1:   # ring attention: K/V blocks circulate while blocks already here are used
            ring = self.collective(name + ".cp_kv_all_gather", "cp", pb.ALL_GATHER, kv)
        attrs = [uint_attr("attn_batch", b * a), uint_attr("attn_seq_q", sq), uint_attr("attn_seq_kv", s),
                 uint_attr("attn_head_dim", d), bool_attr("attn_causal", True),
                 str_attr("attn_pass", "backward" if backward else "forward"), uint_attr("attn_kv_heads", g)]
        # FlashAttention's backward: 5 matmuls to the forward's 2 (it recomputes the scores)
        ops, nbytes = (flops * 5 // 2, 2 * qkvo) if backward else (flops, qkvo)
        self._kernel(name, "attention", ops, nbytes, self.act_dtype, attrs)
        self.stream.wait(ring)
        if backward and self.cp > 1:
            self.blocking(name + ".cp_dkv_reduce_scatter", "cp", pb.REDUCE_SCATTER, kv * self.cp)

    def _unfused_attention(self, name: str, backward: bool) -> None:
        """Attention as Megatron-LM ran it before FlashAttention: batched GEMMs around a fused
        scale-mask-softmax over the whole s x s score matrix (and its dropout), written to memory."""
        b, a, d, s = self.b, self.a, self.d, self.s
        scores = b * a * s * s
        mask = self.mask
        if not backward:
            self.bmm(name + ".scores", b * a, s, d, s)
            self.elementwise(name + ".softmax", scores, 2 * scores * self.e, 4)
            if self.dropout:
                self.elementwise(name + ".dropout", scores, scores * (2 * self.e + mask), 2)
            self.bmm(name + ".context", b * a, s, s, d)
            return
        self.bmm(name + ".context.dgrad", b * a, s, d, s)
        self.bmm(name + ".context.wgrad", b * a, s, s, d)
        if self.dropout:
            self.elementwise(name + ".dropout", scores, scores * (2 * self.e + mask), 1)
        self.elementwise(name + ".softmax", scores, 3 * scores * self.e, 3)
        self.bmm(name + ".scores.dgrad", b * a, s, s, d)
        self.bmm(name + ".scores.wgrad", b * a, s, s, d)

    def layer_forward(self, mb: int, layer: int) -> None:
        h, f, a, g, d, n = self.h, self.f, self.a, self.g, self.d, self.n
        p = f"mb{mb}.L{layer}."
        self._await_params(layer)
        self.norm(p + "norm1")
        self._gemm_with(p + "qkv", n, h, (a + 2 * g) * d, gather=True)
        if self.job.shape.position == "rope":
            self.elementwise(p + "rope", n * (a + g) * d, 2 * n * (a + g) * d * self.e, 3)
        self.attention(p + "attention", backward=False)
        self._row_gemm(p + "proj", n, a * d, h)
        self.elementwise(p + "residual1", self.nl * h, self.nl * h * (3 * self.e + self.mask))
        self.norm(p + "norm2")
        up = 2 * self.f // self.tp if self.job.shape.mlp == "swiglu" else self.f // self.tp
        self._gemm_with(p + "fc1", n, h, up, gather=True)
        fl = f // self.tp
        self.elementwise(p + "activation", n * fl, (up + fl) * n * self.e, 4)
        self._row_gemm(p + "fc2", n, fl, h)
        self.elementwise(p + "residual2", self.nl * h, self.nl * h * (3 * self.e + self.mask))

    def _column_backward(self, name: str, m: int, k: int, n: int) -> None:
        """Backward of a column-parallel GEMM [m,k]x[k,n]: dgrad, then the input gradient's
        reduce-scatter (all-reduce without SP) beside the wgrad; with SP the saved input shard is
        all-gathered again for the wgrad, beside the dgrad (as Megatron does)."""
        regather = self.collective(name + ".tp_all_gather_input", "tp", pb.ALL_GATHER,
                                   self.nl * self.h * self.e) if self.sp else None
        dgrad = self.gemm(name + ".dgrad", m, n, k, cast=True)
        reduce = None
        if "tp" in self.groups:
            kind, suffix = (pb.REDUCE_SCATTER, ".tp_reduce_scatter") if self.sp else (pb.ALL_REDUCE, ".tp_all_reduce")
            reduce = self.collective(name + suffix, "tp", kind, self.n * self.h * self.e, after=[dgrad])
        self.stream.wait(regather)
        self.gemm(name + ".wgrad", n, m, k)
        self.stream.wait(reduce)

    def _row_backward(self, name: str, m: int, k: int, n: int) -> None:
        """Backward of a row-parallel GEMM: with SP its output gradient is all-gathered first."""
        self._gemm_with(name + ".dgrad", m, n, k, gather=True, cast=True)
        self.gemm(name + ".wgrad", k, m, n)

    def layer_backward(self, mb: int, layer: int) -> None:
        h, f, a, g, d, n = self.h, self.f, self.a, self.g, self.d, self.n
        p = f"mb{mb}.L{layer}."
        fl = f // self.tp
        up = 2 * fl if self.job.shape.mlp == "swiglu" else fl
        self.elementwise(p + "residual2.bwd", self.nl * h, self.nl * h * (2 * self.e + self.mask))
        self._row_backward(p + "fc2", n, fl, h)
        self.elementwise(p + "activation.bwd", n * fl, (up + fl + up) * n * self.e, 6)
        self._column_backward(p + "fc1", n, h, up)
        self.elementwise(p + "norm2.bwd", self.nl * h, 4 * self.nl * h * self.e, 2 * NORM_OPS)
        self._row_backward(p + "proj", n, a * d, h)
        self.attention(p + "attention.bwd", backward=True)
        if self.job.shape.position == "rope":
            self.elementwise(p + "rope.bwd", n * (a + g) * d, 2 * n * (a + g) * d * self.e, 3)
        self._column_backward(p + "qkv", n, h, (a + 2 * g) * d)
        self.elementwise(p + "norm1.bwd", self.nl * h, 4 * self.nl * h * self.e, 2 * NORM_OPS)
        self._grad_ready(layer)

    # Embedding and output layer -------------------------------------------------------------------
    def embedding_forward(self, mb: int) -> None:
        self._await_params(-1)
        n, h = self.n, self.h
        self._kernel(f"mb{mb}.embedding", "embedding", n * h, 2 * n * h * self.e, "bf16")
        self.tp_reduce(f"mb{mb}.embedding")

    def embedding_backward(self, mb: int) -> None:
        self.tp_gather(f"mb{mb}.embedding.bwd")
        n, h = self.n, self.h
        self._kernel(f"mb{mb}.embedding.bwd", "embedding", n * h, n * h * (self.e + 2 * 4), "fp32")
        self._grad_ready(-1)

    def head_forward(self, mb: int) -> None:
        self._await_params(-2)
        n, h, v = self.n, self.h, self.vocab
        p = f"mb{mb}."
        self.linear_fp8 = False   # Megatron's output layer is not a Transformer Engine module: bf16
        self.norm(p + "final_norm")
        self._gemm_with(p + "lm_head", n, h, v, gather=True)
        self.linear_fp8 = True
        # vocab-parallel cross entropy in fp32: max, exponentials, sum, loss
        self.elementwise(p + "cross_entropy", n * v, n * v * (self.e + 4), 5, dtype="fp32")
        for what in ("max", "target", "sum_exp"):
            self.blocking(f"{p}cross_entropy.tp_all_reduce_{what}", "tp", pb.ALL_REDUCE, n * 4)

    def head_backward(self, mb: int) -> None:
        n, h, v = self.n, self.h, self.vocab
        p = f"mb{mb}."
        self.elementwise(p + "cross_entropy.bwd", n * v, n * v * (4 + self.e), 2, dtype="fp32")
        self.linear_fp8 = False
        self._column_backward(p + "lm_head", n, h, v)
        self.linear_fp8 = True
        self.elementwise(p + "final_norm.bwd", self.nl * h, 4 * self.nl * h * self.e, 2 * NORM_OPS)
        self._grad_ready(-2)

    # Hooks the step fills in (program.RankProgram) ------------------------------------------------
    def _await_params(self, unit: int) -> None:
        """Before a unit's first forward: wait for its parameters (distributed optimizer)."""

    def _grad_ready(self, unit: int) -> None:
        """After a unit's backward: its gradients are complete."""
