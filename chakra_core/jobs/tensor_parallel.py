"""The tensor-parallel communication around a layer's GEMMs (a mixin of `kernels.LayerKernels`).

With sequence parallelism the residual stream is all-gathered before each column-parallel GEMM
and the output of each row-parallel GEMM reduce-scattered (all-reduced without SP); in the
backward the saved input shard is all-gathered again beside the dgrad and the input gradient
reduce-scattered beside the wgrad, as Megatron-LM does (NCCL, whose kernels take SMs from the
GEMMs beside them: `SystemLayer.gpu_load`).

With `parallel.tp_comm_overlap`, Transformer Engine's userbuffers run them instead, with TE's
defaults (transformer_engine/pytorch/module/base.py initialize_ub, NVIDIA/TransformerEngine at
d0067d0da6cb01811b8072a7d304f0e00344ce2b; comm_gemm_overlap.cpp):
- "ring_exchange" for the all-gathers before a GEMM (qkv_fprop, fc1_fprop, proj_dgrad,
  fc2_dgrad): the GEMM runs in tp chunks as the pieces arrive, copied by the copy engine with
  one signalling thread block (the last chunk waits for the gather);
- "pipeline" for the reduce-scatters after the row-parallel forward GEMMs (proj_fprop,
  fc2_fprop): the GEMM in num_splits = 4 chunks on the SMs left by an SM margin of num_sm = 16,
  each chunk's reduce-scatter on those 16 beside the next chunk; the last one is exposed;
- "bulk" for the backward's all-gather and reduce-scatter (qkv/fc1 dgrad and wgrad): one
  collective on num_sm = 16 thread blocks, no margin, beside the GEMM.
The output layer is not a Transformer Engine module and keeps NCCL.

Under NVFP4 (no userbuffers: TE's have no NVFP4 path) the shards are quantized before they are
gathered and the gathers move FP4 with its scales (transformer_engine/pytorch/distributed.py
_all_gather_nvfp4): a column-parallel input's rowwise copy, the saved input's columnwise copy for
the wgrad, and a row-parallel output gradient's two copies. (fp8's gathers still move bf16 here.)
"""

from __future__ import annotations

from chakra_core.jobs.fp8 import quantized_bytes
from chakra_core.jobs.primitives import KernelPrimitives
from chakra_core.schema import pb


UB_RING_CTAS = 0
"""ring_exchange: the copies run on the copy engine (use_ce, TE's default) and num_sm's one block
only signals each step (userbuffers.cu: signalonly with use_ce, one block of one thread): no SM
is held while the pieces travel."""
UB_PIPELINE_CTAS = 16
"""pipeline: num_sm 16 with set_sm_margin (the GEMM launched on sm_count - num_sm SMs)."""
UB_PIPELINE_SPLITS = 4
"""pipeline: num_splits 4."""
UB_BULK_CTAS = 16
"""bulk: num_sm 16, no margin."""


class TensorParallel(KernelPrimitives):
    """TP/SP collectives and the GEMMs they feed or follow (see the module docstring)."""

    sp: bool
    zero_bubble: bool      # weight gradients deferred to the schedule's W steps (zero_bubble.py)

    def _userbuffers(self, te: bool) -> bool:
        return te and self.job.parallel.tp_comm_overlap and self.sp and "tp" in self.groups

    def _fp4_gather(self, te: bool) -> bool:
        """A TE module's gather under NVFP4: of quantized shards (see the module docstring)."""
        return te and self.fp4 and self.fp8_on

    def _gathered(self, elements: int, te: bool, copies: int = 1) -> int:
        """Bytes each rank contributes to a TP all-gather of `elements` (this rank's shard)."""
        if self._fp4_gather(te):
            return copies * quantized_bytes(elements, "nvfp4")
        return elements * self.act_bytes

    def tp_gather(self, name: str, te: bool = True, width: int | None = None, copies: int = 1) -> int | None:
        """Sequence parallel: the all-gather of the residual stream (or of a `width` wide input such
        as a latent) before a column-parallel GEMM; returned for the GEMM to run beside it with
        userbuffers, else waited for."""
        if not self.sp:
            return None
        overlap = self._userbuffers(te)
        coll = self.collective(name + ".tp_all_gather", "tp", pb.ALL_GATHER,
                               self._gathered(self.local_tokens * (width or self.h), te, copies),
                               ctas=UB_RING_CTAS if overlap else 0)
        if not overlap:
            self.stream.wait(coll)
            return None
        return coll

    def tp_reduce(self, name: str) -> None:
        """After a row-parallel GEMM: reduce-scatter (SP) or all-reduce its output."""
        if "tp" not in self.groups:
            return
        kind = pb.REDUCE_SCATTER if self.sp else pb.ALL_REDUCE
        suffix = ".tp_reduce_scatter" if self.sp else ".tp_all_reduce"
        self.blocking(name + suffix, "tp", kind, self.n * self.h * self.act_bytes)

    def _row_gemm(self, name: str, m: int, k: int, n: int) -> int:
        """A row-parallel GEMM and the reduction of its output; with userbuffers, TE's pipeline:
        num_splits chunks on the SMs its margin leaves, each chunk's reduce-scatter beside the next
        (one GEMM node of `gemm_chunks`, the first chunks' reduce-scatter beside it), the last
        chunk's reduce-scatter after it."""
        if not self._userbuffers(True):
            node = self.gemm(name, m, k, n, cast=True)
            self.tp_reduce(name)
            return node
        splits = UB_PIPELINE_SPLITS if m % UB_PIPELINE_SPLITS == 0 else 1
        size = self.n * self.h * self.act_bytes
        self.quantize(name, m * k)   # the whole input, before the first chunk
        early = self.collective(name + ".tp_reduce_scatter", "tp", pb.REDUCE_SCATTER, size - size // splits,
                                ctas=UB_PIPELINE_CTAS) if splits > 1 else None
        node = self.gemm(name, m, k, n, sm_margin=UB_PIPELINE_CTAS, chunks=splits)
        last = self.collective(name + ".tp_reduce_scatter_last", "tp", pb.REDUCE_SCATTER, size // splits,
                               after=[node], ctas=UB_PIPELINE_CTAS)
        self.stream.wait(early, last)
        return node

    def _gemm_with(self, name: str, m: int, k: int, n: int, gather: bool, cast: bool = False,
                   tp_amax: bool = False, te: bool = True, width: int | None = None) -> int:
        """A column-parallel GEMM whose input (`width` wide, default h) is all-gathered first; with
        userbuffers, TE's ring exchange: the GEMM in tp chunks beside the gather (one node of
        `gemm_chunks`), the last chunk after it."""
        pending = self.tp_gather(name, te, width) if gather else None
        if pending is None or m % self.tp:
            node = self.gemm(name, m, k, n, cast, tp_amax)
            self.stream.wait(pending)
            return node
        chunk = m // self.tp   # the local shard is quantized and its fp8 copy exchanged
        self.gemm(name + ".chunks", m - chunk, k, n, cast, tp_amax, chunks=self.tp - 1)
        self.stream.wait(pending)
        return self.gemm(name, chunk, k, n)

    def _column_backward(self, name: str, m: int, k: int, n: int, te: bool = True,
                         width: int | None = None, grad_kept: bool = False) -> tuple[int, int]:
        """Backward of a column-parallel GEMM [m,k]x[k,n] (its input `width` wide, default h): dgrad,
        then the input gradient's reduce-scatter (all-reduce without SP) beside the wgrad; with SP
        the saved input shard is all-gathered again for the wgrad, beside the dgrad (as Megatron
        does; userbuffers' bulk). `grad_kept`: the output gradient is a kept tensor already (the logits')."""
        ctas = UB_BULK_CTAS if self._userbuffers(te) else 0
        wide = width or self.h
        gathered = self._gathered(self.local_tokens * wide, te)
        # a deferred weight gradient gathers the input itself, when it runs (zero_bubble.py)
        regather = self.collective(name + ".tp_all_gather_input", "tp", pb.ALL_GATHER, gathered,
                                   ctas=ctas) if self.sp and not self.zero_bubble else None
        dgrad = self.gemm(name + ".dgrad", m, n, k, cast=True)
        reduce = None
        if "tp" in self.groups:
            kind, suffix = (pb.REDUCE_SCATTER, ".tp_reduce_scatter") if self.sp else (pb.ALL_REDUCE, ".tp_all_reduce")
            reduce = self.collective(name + suffix, "tp", kind, self.n * wide * self.act_bytes, after=[dgrad],
                                     ctas=ctas)
        self.stream.wait(regather)

        def wgrad() -> int:
            if self.sp and self.zero_bubble:
                self.blocking(name + ".tp_all_gather_input", "tp", pb.ALL_GATHER, gathered)
            return self.gemm(name + ".wgrad", n, m, k, accumulate=True)
        node = self.weight_gradient(name + ".wgrad", dgrad, 0 if grad_kept else m * n, wgrad)
        self.stream.wait(reduce)
        return dgrad, node

    def _row_backward(self, name: str, m: int, k: int, n: int) -> tuple[int, int]:
        """Backward of a row-parallel GEMM: with SP its output gradient is all-gathered first."""
        if self.sp and "tp" in self.groups and self._fp4_gather(True):
            # NVFP4: the local shard of the output gradient quantized, then both copies gathered
            self.quantize(name + ".dgrad", m // self.tp * n, tp_amax=True)
            self.tp_gather(name + ".dgrad", copies=2)
            dgrad = self.gemm(name + ".dgrad", m, n, k)
        else:
            dgrad = self._gemm_with(name + ".dgrad", m, n, k, gather=True, cast=True, tp_amax=self.sp)
        return dgrad, self.weight_gradient(name + ".wgrad", dgrad, m * n,
                                           lambda: self.gemm(name + ".wgrad", k, m, n, accumulate=True))
