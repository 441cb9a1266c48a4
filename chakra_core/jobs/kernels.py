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
from typing import Callable, Iterable, Iterator, Sequence

from chakra_core.et.build import (Stream, attributes_blob, bool_attr, read_collective, str_attr, uint_attr,
                                  uint_list_attr)
from chakra_core.jobs.attention import NORM_OPS, SelfAttention
from chakra_core.jobs.attention_variants import AttentionVariants
from chakra_core.jobs.context_parallel import ContextParallel
from chakra_core.jobs.expert_activation import ExpertActivation
from chakra_core.jobs.fp8 import QUANTIZED, Fp8Quantization, fp8_transposes, gemm_dtype, quantized_bytes
from chakra_core.jobs.linear_biases import LinearBiases
from chakra_core.jobs.mla import LatentAttention
from chakra_core.jobs.moe import MixtureOfExperts
from chakra_core.jobs.mtp import MultiTokenPrediction
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.primitives import Attr
from chakra_core.jobs.tensor_parallel import TensorParallel
from chakra_core.jobs.spec import DTYPE_BYTES, JobSpec
from chakra_core.jobs.tensors import TensorLedger
from chakra_core.schema import pb

@lru_cache(maxsize=None)
def _attr(kind: str, name: str, value: int | str | bool | tuple[int, ...]) -> pb.AttributeProto:
    """One attribute message per distinct (kind, name, value), for the blobs below."""
    if kind == "uints":
        assert isinstance(value, tuple), (name, value)
        return uint_list_attr(name, value)
    assert not isinstance(value, tuple), (kind, name, value)
    if kind == "uint":
        return uint_attr(name, int(value))
    if kind == "bool":
        return bool_attr(name, bool(value))
    return str_attr(name, str(value))


@lru_cache(maxsize=1 << 16)
def kernel_blob(ops: int, nbytes: int, kind: str, dtype: str, part: str, extra: tuple[Attr, ...] = ()) -> bytes:
    """A kernel node's attributes as Stream.add's `attr_blob`, once per distinct kernel: a step
    repeats the same few thousands (measured under cProfile: DeepSeek-V3's generation spent 7.9 of
    its 47 s copying attribute messages into its 0.71 million nodes)."""
    return attributes_blob([_attr("bool", "is_cpu_op", False), _attr("uint", "num_ops", ops),
                            _attr("uint", "tensor_size", nbytes), _attr("str", "kernel", kind),
                            _attr("str", "dtype", dtype), _attr("str", "step_part", part),
                            *(_attr(*attr) for attr in extra)])


@lru_cache(maxsize=1 << 16)
def collective_blob(comm_type: int, size: int, group: str, part: str, ctas: int) -> bytes:
    """A collective node's attributes as Stream.add's `attr_blob` (see kernel_blob)."""
    attrs = [*read_collective(comm_type, size, group), str_attr("step_part", part)]
    if ctas:
        attrs.append(_attr("uint", "comm_ctas", ctas))
    return attributes_blob(attrs)


class LayerKernels(SelfAttention, LatentAttention, MultiTokenPrediction, TensorParallel, ContextParallel,
                   Fp8Quantization, MixtureOfExperts, ExpertActivation, LinearBiases, AttentionVariants):
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
        self.fp8 = t.precision in QUANTIZED    # linear layers quantized by Transformer Engine (fp8, nvfp4)
        self.gemm_dtype = gemm_dtype(t)
        self.fp8_transposed = fp8_transposes(placement.architecture)   # TE's transposed fp8 copies
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
        self.dqk, self.dv = m.qk_dim, m.v_dim             # head sizes of q.k and of v (latent attention)
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
        self.zero_bubble = p.schedule == "zb-h1"   # weight gradients run in the schedule's W steps

    # Nodes ----------------------------------------------------------------------------------------
    def _kernel(self, name: str, kind: str, ops: int, nbytes: int, dtype: str, extra: Iterable[Attr] = ()) -> int:
        return self.stream.step(pb.COMP_NODE, name,
                                attr_blob=kernel_blob(ops, nbytes, kind, dtype, self.part, tuple(extra)))

    def elementwise(self, name: str, elements: int, nbytes: int, ops_per: int = 1, dtype: str = "bf16",
                    launches: int = 1, host_sync: bool = False) -> int:
        """`launches`: kernels the host launches for the node (one per expert); `host_sync`: the host
        waits for its end (the compute layer's host_launch effect)."""
        extra: tuple[Attr, ...] = ()
        if launches > 1:
            extra += (("uint", "launches", launches),)
        if host_sync:
            extra += (("bool", "host_sync", True),)
        return self._kernel(name, "elementwise", ops_per * elements, nbytes, dtype, extra)

    def bmm(self, name: str, batch: int, m: int, k: int, n: int) -> int:
        """`batch` independent [m,k] x [k,n] products (attention without FlashAttention), in the
        activations' type (Transformer Engine's fp8 covers the linear layers only)."""
        shape = [("uint", "gemm_m", m), ("uint", "gemm_n", n), ("uint", "gemm_k", k), ("uint", "gemm_batch", batch)]
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
        if self.fp4 and self.fp8_on:
            self.elementwise(name + ".alpha", 1, 8, dtype="fp32")   # the GEMM's scale from the two amaxes
        shape: list[Attr] = [("uint", "gemm_m", m), ("uint", "gemm_n", n), ("uint", "gemm_k", k),
                             ("uint", "gemm_batch", 1)]
        if sm_margin:
            shape.append(("uint", "sm_margin", sm_margin))
        if chunks > 1:
            shape.append(("uint", "gemm_chunks", chunks))
        out = 2 * self.grad_bytes if accumulate else self.act_bytes
        if accumulate:
            shape.append(("uint", "gemm_c_bytes", out))
        operands = (quantized_bytes(m * k, self.gemm_dtype) + quantized_bytes(k * n, self.gemm_dtype) if fp8
                    else (m * k + k * n) * self.act_bytes)
        return self._kernel(name, "gemm", 2 * m * k * n, operands + m * n * out,
                            self.gemm_dtype if fp8 else self.act_dtype, shape)

    def collective(self, name: str, role: str, comm_type: int, size: int, part: str | None = None,
                   after: Sequence[int] | None = None, ctas: int = 0) -> int | None:
        """A collective of `role`'s group; `ctas`: run by Transformer Engine's userbuffers on that
        many thread blocks (`comm_ctas`) rather than by NCCL."""
        if role not in self.groups or size <= 0:
            return None
        return self.stream.launch(pb.COMM_COLL_NODE, name, after=after,
                                  attr_blob=collective_blob(comm_type, size, self.names[role], part or role, ctas))

    def blocking(self, name: str, role: str, comm_type: int, size: int, part: str | None = None) -> None:
        self.stream.wait(self.collective(name, role, comm_type, size, part))

    def linear_weights(self, layer: int) -> int:
        """Elements of a layer's linear weights on this rank (what fp8 quantizes); an MTP layer's
        (layer >= layers) with its eh_proj."""
        m = self.job.shape
        gated = 2 if m.gated else 1
        attention = self.latent_linear_weights() if m.mla else self.attention_linear_weights()
        mtp = 2 * self.h * self.h // self.tp if layer >= m.layers else 0
        if m.is_moe_layer(layer):
            return attention + self.moe_linear_weights() + mtp
        return attention + (gated + 1) * self.h * (self.f // self.tp) + mtp

    # Saved tensors (tensors.TensorLedger) ------------------------------------------------------------
    @property
    def gemm_in(self) -> int:
        """Bytes per element of the input a GEMM saves: fp8 under Transformer Engine, else bf16."""
        return 1 if self.fp8 and self.linear_fp8 else self.act_bytes

    def _keep(self, node: int | None, what: str, elements: int, size: int, output: bool = True) -> None:
        if self._saving and what not in self._dropped:
            self.ledger.save(node, (*self._layer_key, what), elements, size, output)
            self.tensor_saved(node, (*self._layer_key, what), elements, size)

    def tensor_saved(self, node: int | None, key: tuple[int, int | str, str], elements: int, element_size: int) -> None:
        """`node` made a tensor a layer saves for its backward (what jobs/offload.py copies to host memory)."""

    def tensor_read(self, node: int | None, keys: list[tuple[int, int | str, str]]) -> None:
        """`node` reads saved tensors (jobs/offload.py makes it wait for their copies back)."""

    def _read(self, node: int | None, *what: str) -> None:
        keys = [(*self._layer_key, w) for w in what]
        self.tensor_read(node, keys)
        self.ledger.use(node, *keys)

    # A transformer layer ----------------------------------------------------------------------------
    def norm(self, name: str, feeds_fp8: bool = True, width: int | None = None) -> int:
        """RMSNorm/LayerNorm over this rank's tokens of the residual stream (or of a latent `width`)
        before a GEMM; in fp8 its output is quantized as TE's LayerNormLinear does (fused under
        delayed scaling, after it under current scaling)."""
        out = self.norm_output_bytes() if feeds_fp8 else self.act_bytes
        size = width or self.h
        elements = self.local_tokens * size
        node = self.elementwise(name, elements, elements * (self.act_bytes + out) + size * self.act_bytes, NORM_OPS)
        if feeds_fp8 and self.quantized_after_norm:
            self.quantize(name, elements, tp_amax=self.sp, amax_done=True)
        return node

    def layer_prefix(self, mb: int, layer: int) -> str:
        """Node names of a layer: mb<i>.L<layer>., an MTP layer's mb<i>.mtp<k>.layer."""
        layers = self.job.shape.layers
        return f"mb{mb}.L{layer}." if layer < layers else f"mb{mb}.mtp{layer - layers}.layer."

    def layer_forward(self, mb: int, layer: int) -> None:
        deque(self.layer_forward_parts(mb, layer), maxlen=0)

    def layer_forward_parts(self, mb: int, layer: int) -> Iterator[str]:
        """The forward, yielding each sub-module it ends (pre_dispatch, dispatch, mlp; combine last) for
        moe_overlap to interleave; a dense layer's dispatch and combine are empty."""
        h = self.h
        p = self.layer_prefix(mb, layer)
        act_bytes = self.act_bytes
        residual = self.local_tokens * h   # elements of the residual stream held here
        recomputing = self.part == "recompute"
        # under full recompute the forward keeps only the layer's input; the recompute keeps the rest
        self._layer_key, self._saving = (mb, layer), not (layer in self.recomputed and not recomputing)
        self._await_params(layer)
        latent = self.job.shape.mla   # MLA's input norm is a TENorm of its own (bf16 out), not fused
        norm1 = self.norm(p + "norm1", feeds_fp8=not latent)
        if recomputing:
            self._read(norm1, "x")
        else:
            self.ledger.save(norm1, (mb, layer, "x"), residual, act_bytes, output=False)
            self.tensor_saved(norm1, (mb, layer, "x"), residual, act_bytes)
        if latent:
            self.latent_attention_forward(p)
        else:
            self.self_attention_forward(p)
        residual1 = self.elementwise(p + "residual1", residual, residual * (3 * act_bytes + self.mask))
        self._keep(residual1, "mask1", residual * self.mask, 1)
        if self.job.shape.is_moe_layer(layer):   # its norm feeds the router and the dispatcher in bf16
            self._keep(self.norm(p + "norm2", feeds_fp8=False), "x2", residual, act_bytes, output=False)
            yield from self.moe_forward(p)
            self._expert_bias_counts(p)
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

    def _expert_bias_counts(self, p: str) -> None:
        """With the router's expert bias, the routing map's column sums (router.py _apply_expert_bias:
        local_tokens_per_expert += routing_map.sum(0)); Megatron counts right after the top-k, written
        here after the block (a kernel of microseconds)."""
        if self.job.shape.router_expert_bias:
            t, experts = self.local_tokens, self.job.shape.num_experts or 0
            self.elementwise(p + "moe.tokens_per_expert", t * experts, t * experts + 4 * experts)

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

    def layer_backward(self, mb: int, layer: int, ready: bool = True) -> None:
        """A layer's backward; `ready`: its gradients are complete after it (an MTP layer's are not)."""
        deque(self.layer_backward_parts(mb, layer, ready), maxlen=0)

    def layer_backward_parts(self, mb: int, layer: int, ready: bool = True) -> Iterator[str]:
        """The backward, yielding each sub-module it ends (combine, mlp, dispatch, pre_dispatch)."""
        h, f = self.h, self.f
        p = self.layer_prefix(mb, layer)
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
        if self.job.shape.mla:
            self.latent_attention_backward(p)
        else:
            self.self_attention_backward(p)
        read(self.elementwise(p + "norm1.bwd", residual, 4 * residual * act_bytes, 2 * NORM_OPS), "x")
        yield "pre_dispatch"
        if ready:
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
        """The final norm, the MTP layers when this chunk runs them (between the decoder's final norm
        and the output layer, gpt_model.py _postprocess), the output layer and the loss."""
        self._await_params(-2)
        p = f"mb{mb}."
        self._layer_key = (mb, "head")
        self._keep(self.norm(p + "final_norm", feeds_fp8=False), "norm_in", self.local_tokens * self.h,
                   self.act_bytes, output=False)
        if self.mtp_here:
            self.mtp_forward(mb)
            self._layer_key = (mb, "head")
        self.output_layer(p)

    def output_layer(self, p: str) -> None:
        """The output layer (not a Transformer Engine module: bf16) and the vocabulary-parallel cross
        entropy of the hidden state the current layer key names."""
        n, h, v = self.n, self.h, self.vocab
        self.linear_fp8 = False
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

    def output_layer_backward(self, p: str) -> None:
        n, h, v = self.n, self.h, self.vocab
        loss = self.elementwise(p + "cross_entropy.bwd", n * v, n * v * (4 + self.act_bytes), 2, dtype="fp32")
        self._read(loss, "softmax")
        self._keep(loss, "logits_grad", n * v, self.act_bytes)
        self.linear_fp8 = False
        dgrad, wgrad = self._column_backward(p + "lm_head", n, h, v, te=False, grad_kept=True)
        self._read(dgrad, "logits_grad")
        self._read(wgrad, "logits_grad", "head_in")
        self.linear_fp8 = True

    def head_backward(self, mb: int) -> None:
        h, p = self.h, f"mb{mb}."
        self._layer_key = (mb, "head")
        self.output_layer_backward(p)
        if self.mtp_here:
            self.mtp_backward(mb)
            self._layer_key = (mb, "head")
        tokens = self.local_tokens
        self._read(self.elementwise(p + "final_norm.bwd", tokens * h, 4 * tokens * h * self.act_bytes, 2 * NORM_OPS),
                   "norm_in")
        self._grad_ready(-2)

    # Hooks the step fills in (program.RankProgram) ------------------------------------------------
    def _await_params(self, unit: int) -> None:
        """Before a unit's first forward: wait for its parameters (distributed optimizer)."""

    def _grad_ready(self, unit: int) -> None:
        """After a unit's backward: its gradients are complete."""

    def _fp8_weights(self, layer: int) -> None:
        """fp8: a layer's linear weights quantized once per step."""

    def weight_gradient(self, name: str, dgrad: int, grad_elements: int, make: Callable[[], int]) -> int:
        """A linear layer's weight gradient, written by `make` (after its `dgrad`, whose output
        gradient of `grad_elements` it reads); the zero-bubble schedule defers it (zero_bubble.py)."""
        return make()
