"""A mixture-of-experts layer's block as Megatron-Core trains it (a mixin of `kernels.LayerKernels`).

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/transformer/moe/:
moe_layer.py (MoELayer.forward: shared experts, route, dispatch, experts, combine), router.py
(TopKRouter: a gating GEMM of h x num_experts, replicated over TP, then softmax and top-k),
token_dispatcher.py (MoEAlltoAllTokenDispatcher, `--moe-token-dispatcher-type alltoall`: permute
the tokens by expert, all-to-all over EP, all-gather over expert TP, sort the chunks by local
expert; combine in reverse: sort back, reduce-scatter over expert TP, all-to-all, unpermute),
experts.py (TEGroupedMLP, `--moe-grouped-gemm`: one grouped GEMM per linear layer over the local
experts, fc1 column- and fc2 row-parallel over expert TP, the routing probabilities applied in
the activation), shared_experts.py (SharedExpertMLP: a dense TP MLP beside the routed experts).

Routing is balanced by default, as published benchmarks force it (--moe-router-force-load-balancing):
each rank routes its t tokens to topk experts and sends t x topk / ep of them to every EP rank, so
it receives as many as it sends and each of its num_experts / ep local experts gets
etp x ep x t x topk / num_experts tokens (one grouped GEMM of that M per expert: `gemm_batch`
local experts). With a capacity factor an expert takes at most ceil(t x topk / num_experts x
capacity_factor) tokens from each rank (moe_utils.get_capacity); balanced routing drops none
unless the factor is below 1. Skewed routing (`training.routing`, routing.py) gives every rank the
hottest EP rank's expert tokens and all-to-all buffers.

The dispatcher's all-to-alls block the block's compute; moe_overlap runs them beside another
micro-batch's compute (--overlap-moe-expert-parallel-comm), shared_expert_overlap the shared
experts beside them (--moe-shared-expert-overlap). With `moe_token_dispatcher: flex` DeepEP's or
HybridEP's fused kernels replace the all-to-alls and the source-side permutations (flex_dispatcher); with
`allgather` (Megatron-Core's default) gathers and reduce-scatters over etp x ep do
(allgather_dispatcher).

Dropless routing makes the host wait for the GPU in every MoE layer's forward: it needs the token
counts to size the all-to-all (`token_counts`), the allgather dispatcher's experts (`.cpu()`) or
DeepEP's and HybridEP's receive buffers (`host_sync`: the host loses its lead over the GPU there).
Not modelled: the auxiliary load-balancing loss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, NamedTuple

from chakra_core.jobs.allgather_dispatcher import AllGatherDispatcher
from chakra_core.jobs.flex_dispatcher import FlexDispatcher
from chakra_core.jobs.fp8 import quantized_bytes
from chakra_core.jobs.primitives import EP_PART, Attr, KernelPrimitives
from chakra_core.jobs.routing import MAP_BYTES, ExpertLoad, expert_load
from chakra_core.jobs.shared_expert_overlap import SharedExpertOverlap
from chakra_core.schema import pb

Tokens = int | tuple[int, ...]
"""Tokens of every local expert (balanced), or of each (skewed routing)."""


class _BlockSizes(NamedTuple):
    """A MoE block's sizes on this rank."""

    experts: int
    routed: int        # token copies this rank sends to the experts
    per_expert: Tokens  # tokens each local expert computes
    local: int         # local experts
    received: int      # tokens the local experts compute in all
    up: int            # fc1's output width per token (gated: twice the expert FFN), expert TP share
    ffn: int           # the expert FFN's width, expert TP share


class MixtureOfExperts(SharedExpertOverlap, FlexDispatcher, AllGatherDispatcher, KernelPrimitives):
    """The MoE block of a layer (see the module docstring)."""

    grad_bytes: int
    gemm_dtype: str
    act_dtype: str
    _dropped: tuple[str, ...] = ()   # saved tensors a forward does not keep (output-discarding recompute)

    if TYPE_CHECKING:   # provided by kernels.LayerKernels and its mixins
        def _mlp_forward(self, p: str, ffn: int, cast: bool = False) -> None:
            raise NotImplementedError

        def _mlp_backward(self, p: str, ffn: int) -> None:
            raise NotImplementedError

        def expert_activation(self, p: str, received: int, up: int, ffn: int, recompute: bool = False) -> None:
            raise NotImplementedError

        def expert_activation_recompute(self, p: str, received: int, up: int, ffn: int) -> None:
            raise NotImplementedError

        def expert_activation_backward(self, p: str, received: int, up: int, ffn: int) -> None:
            raise NotImplementedError

        def expert_bias_forward(self, p: str, received: int, local: int) -> None:
            raise NotImplementedError

        def expert_bias_backward(self, p: str, received: int, local: int) -> None:
            raise NotImplementedError

        def router_bias_backward(self, p: str, experts: int) -> None:
            raise NotImplementedError

    # Sizes ------------------------------------------------------------------------------------------
    @property
    def experts_here(self) -> int:
        """Local experts: num_experts / ep."""
        return (self.job.shape.num_experts or 1) // self.job.parallel.ep

    @property
    def etp(self) -> int:
        return self.job.parallel.expert_tp

    @property
    def alltoall(self) -> bool:
        """The alltoall dispatcher (beside flex_dispatcher's `flex` and allgather_dispatcher's `allgather`)."""
        return self.job.parallel.moe_token_dispatcher == "alltoall"

    def expert_load(self) -> ExpertLoad | None:
        """Skewed routing's token counts (routing.py); None when balanced."""
        return expert_load(self.job, self.local_tokens)

    def routed_tokens(self) -> int:
        """Token copies this rank sends to the experts (t x topk, capped by the capacity)."""
        load = self.expert_load()
        if load is not None:
            return load.kept
        m = self.job.shape
        experts, routed = m.num_experts or 1, self.local_tokens * m.router_topk
        if m.capacity_factor is not None:
            capacity = -(-routed * m.capacity_factor // experts)   # moe_utils.get_capacity: ceil
            routed = min(routed, experts * int(capacity))
        return routed

    def expert_tokens(self) -> Tokens:
        """Tokens each local expert computes: what the EP ranks sent here (balanced: as many as
        this rank sent), all-gathered over expert TP, split over the local experts; skewed: each
        of the hottest EP rank's experts' own."""
        load = self.expert_load()
        if load is not None:
            return load.tokens
        return -(-self.routed_tokens() * self.etp // self.experts_here)

    def arrived_tokens(self) -> int:
        """Token copies an EP all-to-all's buffer holds: what this rank sends (balanced: as many as
        it receives), or what the hottest EP rank receives (skewed; routing.py says why)."""
        load = self.expert_load()
        return self.routed_tokens() if load is None else load.arrived

    def expert_params_here(self) -> int:
        """Parameters of one MoE layer's routed experts on this rank."""
        m = self.job.shape
        weights = self.experts_here * (m.up_projections() + 1) * self.h * (m.expert_ffn // self.etp)
        return weights + self.experts_here * m.mlp_biases(m.expert_ffn)   # biases need etp 1 (spec)

    def moe_dense_params_here(self) -> int:
        """A MoE layer's router (replicated over TP) and shared experts (split over TP) here, and
        their biases (a few thousand: counted whole on every TP rank)."""
        m = self.job.shape
        weights = self.h * (m.num_experts or 0) + (m.up_projections() + 1) * self.h * m.shared_ffn // self.tp
        biases = (m.num_experts or 0) + (m.mlp_biases(m.shared_ffn) if m.shared_ffn else 0) if m.bias else 0
        return weights + biases

    def moe_linear_weights(self) -> int:
        """Elements of a MoE block's fp8 linear weights here: shared and routed experts (the router
        is not a Transformer Engine module)."""
        m = self.job.shape
        biases = self.experts_here * m.mlp_biases(m.expert_ffn)
        return (m.up_projections() + 1) * self.h * m.shared_ffn // self.tp + self.expert_params_here() - biases

    # Kernels ----------------------------------------------------------------------------------------
    def grouped_gemm(self, name: str, m: Tokens, k: Tokens, n: int, cast: bool = False,
                     accumulate: bool = False) -> int:
        """TE's GroupedLinear over the local experts: one [m,k] x [k,n] product per expert (its own
        weight and tokens), timed by the compute layer as `gemm_batch` products of the expert's own
        shape (a batch of 1 is exactly the dense `gemm`), launched by the host as one cuBLAS call per
        expert (`launches`; cublaslt_gemm.cu multi_stream_cublas_gemm at TransformerEngine 5671fd36).
        Skewed routing gives each expert its own m (or k, weight gradients): `gemm_m_list` /
        `gemm_k_list`, gemm_m / gemm_k the largest."""
        experts = self.experts_here
        ms = m if isinstance(m, tuple) else (m,) * experts
        ks = k if isinstance(k, tuple) else (k,) * experts
        if experts == 1:
            return self.gemm(name, ms[0], ks[0], n, cast=cast, accumulate=accumulate)
        fp8 = self.fp8 and self.linear_fp8
        if fp8 and cast:
            self.quantize(name, sum(a * b for a, b in zip(ms, ks)), splits=experts)
        shape: list[Attr] = [("uint", "gemm_m", max(ms)), ("uint", "gemm_n", n), ("uint", "gemm_k", max(ks)),
                             ("uint", "gemm_batch", experts), ("uint", "launches", experts)]
        for what, sizes in (("gemm_m_list", ms), ("gemm_k_list", ks)):
            if len(set(sizes)) > 1:
                shape.append(("uints", what, tuple(sizes)))
        out = 2 * self.grad_bytes if accumulate else self.act_bytes
        if accumulate:
            shape.append(("uint", "gemm_c_bytes", out))
        if fp8:
            operands = sum(quantized_bytes(a * b, self.gemm_dtype) + quantized_bytes(b * n, self.gemm_dtype)
                           for a, b in zip(ms, ks))
        else:
            operands = sum(a * b + b * n for a, b in zip(ms, ks)) * self.act_bytes
        return self._kernel(name, "gemm", 2 * n * sum(a * b for a, b in zip(ms, ks)),
                            operands + sum(a * n * out for a, b in zip(ms, ks)),
                            self.gemm_dtype if fp8 else self.act_dtype, shape)

    def token_counts(self, name: str) -> None:
        """The all-to-all dispatcher's preprocess: the tokens per expert counted (with this rank's
        send splits), gathered over expert TP x EP, summed into the splits and copied to the host,
        which waits for them before the all-to-all in every forward (token_dispatcher.py preprocess,
        _maybe_dtoh_and_synchronize at d98e8a64: cuda_sync_point before_ep_alltoall, or before_finish
        without EP; no sync only with drop-and-pad, which is not modelled)."""
        t, experts, ep = self.local_tokens, self.job.shape.num_experts or 1, self.job.parallel.ep
        counts = t * experts
        self.elementwise(name + ".counts", counts, counts * MAP_BYTES + 2 * experts * 8, dtype="fp32", launches=2)
        self.blocking(name + ".counts_all_gather", "tp_ep" if "tp_ep" in self.groups else "ep", pb.ALL_GATHER,
                      experts * 8, EP_PART)
        gathered = self.etp * ep * experts   # sliced to the local experts, summed three ways
        self.elementwise(name + ".splits", gathered, 2 * gathered * 8, dtype="fp32", launches=4, host_sync=True)

    def _ep_all_to_all(self, name: str, probs: bool, tokens: bool = True) -> None:
        """The tokens' (and the probabilities') all-to-all over EP: each rank's whole send buffer,
        the tokens arriving at the hottest EP rank x h (docs/collectives.md; routing.py)."""
        routed, h, b = self.arrived_tokens(), self.h, self.act_bytes
        if tokens:
            self.blocking(name + ".ep_all_to_all", "ep", pb.ALL_TO_ALL, routed * h * b, EP_PART)
        if probs:   # the routing probabilities travel with the tokens (bf16: type_as(logits))
            self.blocking(name + ".ep_all_to_all_probs", "ep", pb.ALL_TO_ALL, routed * b, EP_PART)

    def _etp_all_gather(self, name: str, probs: bool) -> None:
        """Toward the experts after the all-to-all: the tokens all-gathered over expert TP."""
        routed, h, b = self.arrived_tokens(), self.h, self.act_bytes
        self.blocking(name + ".etp_all_gather", "etp", pb.ALL_GATHER, routed * h * b, EP_PART)
        if probs:
            self.blocking(name + ".etp_all_gather_probs", "etp", pb.ALL_GATHER, routed * b, EP_PART)

    def _etp_reduce_scatter(self, name: str, probs: bool) -> None:
        """Back from the experts before the all-to-all: reduce-scatter over expert TP (the whole buffer)."""
        routed, h, b = self.arrived_tokens(), self.h, self.act_bytes
        self.blocking(name + ".etp_reduce_scatter", "etp", pb.REDUCE_SCATTER, routed * self.etp * h * b, EP_PART)
        if probs:
            self.blocking(name + ".etp_reduce_scatter_probs", "etp", pb.REDUCE_SCATTER, routed * self.etp * b,
                          EP_PART)

    def _block_sizes(self) -> "_BlockSizes":
        m = self.job.shape
        per_expert, local = self.expert_tokens(), self.experts_here
        ffn = m.expert_ffn // self.etp
        received = sum(per_expert) if isinstance(per_expert, tuple) else per_expert * local
        return _BlockSizes(m.num_experts or 1, self.routed_tokens(), per_expert, local, received,
                           m.up_projections() * ffn, ffn)

    def moe_forward(self, p: str) -> Iterator[str]:
        """The block after the second norm: shared experts, router, dispatch, grouped expert GEMMs,
        combine (MoELayer.forward's order). Yields the end of each sub-module as Megatron-Core's
        fine-grained callables split it (models/gpt/fine_grained_callables.py): pre_dispatch (to the
        permutation), dispatch (the all-to-alls), mlp (expert TP gather, experts, expert TP scatter);
        combine is the rest. With --moe-shared-expert-overlap the shared experts run on a stream of
        their own beside the all-to-alls (shared_expert_overlap)."""
        m = self.job.shape
        h, t, b = self.h, self.local_tokens, self.act_bytes
        experts, routed, per_expert, local, received, up, ffn = self._block_sizes()
        side, a2a = self.shared_overlap, self.alltoall
        if self.job.training.recomputes("layernorm"):   # the pre-MLP norm's output: router's and shared experts' input
            self._dropped = ("moe_x", "fc1_in")
        if not side:
            self._shared_forward(p)
        self.linear_fp8 = False   # the router's GEMM is a plain linear (router_gating_linear), bf16
        router = self.gemm(p + "moe.router", t, h, experts)
        self.linear_fp8 = True
        self._keep(router, "moe_x", t * h, b, output=False)
        scores = self.elementwise(p + "moe.topk", t * experts, t * experts * (2 * b + 1), 4)
        self._keep(scores, "moe_probs", t * experts, b)
        if not self.allgather:   # which keeps its local experts' columns instead
            self._keep(scores, "moe_map", t * experts, MAP_BYTES)
        if a2a:
            self.token_counts(p + "moe")
        if side:
            self.shared_gather(p)
        if a2a:   # flex: DeepEP's dispatch reads the tokens where they are; allgather permutes after
            self.elementwise(p + "moe.permute", routed * h, (t + routed) * h * b)
        yield "pre_dispatch"
        permuted = list(self.stream.frontier)
        if self.flex:
            self.deepep_layout(p + "moe.dispatch")
            self.deepep(p + "moe.dispatch", dispatch=True, weights=True)
        elif self.allgather:
            self.allgather_dispatch(p, received, local)
        else:
            self._ep_all_to_all(p + "moe.dispatch", probs=not side)
        if side:   # token_dispatch: tokens all-to-all, shared fc1, probabilities all-to-all
            self.shared_fc1(p, permuted)
            if a2a:
                self._ep_all_to_all(p + "moe.dispatch", probs=True, tokens=False)
        yield "dispatch"
        if self.flex:
            self.flex_permute(p + "moe.permute", received, probs=True)
        elif a2a:
            self._etp_all_gather(p + "moe.dispatch", True)
        if local > 1 and a2a:   # sort_chunks_by_idxs: the received chunks grouped by local expert
            self.elementwise(p + "moe.sort_chunks", received * h, 2 * received * h * b)
        fc1 = self.grouped_gemm(p + "moe.fc1", per_expert, h, up, cast=True)
        self._keep(fc1, "moe_in", received * h, 1 if self.fp8 else b, output=False)
        self._keep(fc1, "moe_fc1", received * up, b)
        self.expert_activation(p, received, up, ffn)
        self.grouped_gemm(p + "moe.fc2", per_expert, ffn, h, cast=True)
        self.expert_bias_forward(p, received, local)
        if self.flex:
            self.flex_unpermute(p + "moe.unpermute", received, probs=False)
        elif local > 1 and a2a:
            self.elementwise(p + "moe.unsort_chunks", received * h, 2 * received * h * b)
        if a2a:
            self._etp_reduce_scatter(p + "moe.combine", False)
        yield "mlp"
        computed = list(self.stream.frontier)
        if self.flex:   # DeepEP's combine adds the ranks' sums in the kernel
            self.deepep(p + "moe.combine", dispatch=False, weights=False)
        elif self.allgather:
            self.allgather_combine(p, received)
        else:
            self._ep_all_to_all(p + "moe.combine", False)
        if side:   # token_combine: the shared fc2 and its reduce-scatter beside the all-to-all
            self.shared_fc2(p, computed)
        if a2a:
            self.elementwise(p + "moe.unpermute", routed * h, (routed + t) * h * b + routed * b, 2)
        if m.shared_ffn:
            if side:
                self.shared_join()
            self.elementwise(p + "moe.add_shared", t * h, 3 * t * h * b)
        self._dropped = ()

    def moe_backward(self, p: str) -> Iterator[str]:
        """The block's backward, in reverse: combine's backward (the tokens' gradient dispatched
        again), the experts' dgrad and wgrad, dispatch's backward, the router's, the shared experts'.
        Yields the end of combine, mlp and dispatch (see moe_forward)."""
        h, t, b = self.h, self.local_tokens, self.act_bytes
        experts, routed, per_expert, local, received, up, ffn = self._block_sizes()
        side, a2a = self.shared_overlap, self.alltoall
        self._recompute_pre_mlp_norm(p)
        if side:
            self.shared_fc2_backward(p)
        if self.flex:   # FusedCombine.backward: a dispatch on the cached handle, tokens only
            self.deepep(p + "moe.combine.bwd", dispatch=True, weights=False)
        elif self.allgather:
            self.allgather_combine_backward(p, received)
        else:
            self._read(self.elementwise(p + "moe.unpermute.bwd", routed * h, (routed + t) * h * b + routed * b, 2),
                       "moe_probs", "moe_map")
            self._ep_all_to_all(p + "moe.combine.bwd", False)
        yield "combine"
        if self.flex:
            self._read(self.flex_unpermute(p + "moe.unpermute.bwd", received, probs=False), "moe_map")
        elif a2a:
            self._etp_all_gather(p + "moe.combine.bwd", False)
        if local > 1 and a2a:
            self.elementwise(p + "moe.unsort_chunks.bwd", received * h, 2 * received * h * b)
        self.expert_bias_backward(p, received, local)
        self.expert_activation_recompute(p, received, up, ffn)
        self.grouped_gemm(p + "moe.fc2.dgrad", per_expert, h, ffn, cast=True)
        self._read(self.grouped_gemm(p + "moe.fc2.wgrad", ffn, per_expert, h, accumulate=True), "moe_act")
        self.expert_activation_backward(p, received, up, ffn)
        self.grouped_gemm(p + "moe.fc1.dgrad", per_expert, up, h, cast=True)
        self._read(self.grouped_gemm(p + "moe.fc1.wgrad", up, per_expert, h, accumulate=True), "moe_in")
        if self.flex:   # the probabilities' gradients gathered beside the tokens'
            self.flex_permute(p + "moe.permute.bwd", received, probs=True)
        elif a2a:
            if local > 1:
                self.elementwise(p + "moe.sort_chunks.bwd", received * h, 2 * received * h * b)
            self._etp_reduce_scatter(p + "moe.dispatch.bwd", True)
        yield "mlp"
        routed_fc1 = list(self.stream.frontier)
        if self.flex:   # FusedDispatch.backward: a combine carrying the top-k weights' gradients
            self.deepep(p + "moe.dispatch.bwd", dispatch=False, weights=True)
        elif self.allgather:
            self._read(self.allgather_dispatch_backward(p, received, local), "moe_map")
        else:
            self._ep_all_to_all(p + "moe.dispatch.bwd", True)
        if side:   # launched after the routed experts' fc1 backward (shared_experts.py _BackwardStreamWait)
            self.shared_fc1_backward(p, routed_fc1)
        yield "dispatch"
        if a2a:
            self.elementwise(p + "moe.permute.bwd", routed * h, (t + routed) * h * b, 1)
        self._read(self.elementwise(p + "moe.topk.bwd", t * experts, t * experts * (3 * b + 1), 4), "moe_probs")
        self.linear_fp8 = False
        self.gemm(p + "moe.router.dgrad", t, experts, h)
        self._read(self.gemm(p + "moe.router.wgrad", experts, t, h, accumulate=True), "moe_x")
        self.linear_fp8 = True
        self.router_bias_backward(p, experts)
        if side:
            self.shared_join()
        else:
            self._shared_backward(p)

    def _recompute_pre_mlp_norm(self, p: str) -> None:
        """--recompute-modules layernorm: the pre-MLP norm (a TENorm of its own in MoE layers; the
        input norm is fused into the QKV GEMM) again as the block's output gradient arrives
        (transformer_layer.py at d98e8a64: recompute_pre_mlp_layernorm, output-discarding)."""
        if not self.job.training.recomputes("layernorm"):
            return
        part, self.part = self.part, "recompute"
        norm = self.norm(p + "norm2", feeds_fp8=False)
        self._read(norm, "x2")
        self._keep(norm, "moe_x", self.local_tokens * self.h, self.act_bytes, output=False)
        if self.job.shape.shared_ffn:
            self._keep(norm, "fc1_in", self.local_tokens * self.h, self.act_bytes, output=False)
        self.part = part

    def _shared_forward(self, p: str) -> None:
        """Shared experts: a dense TP MLP of shared_expert_ffn on the same input (SharedExpertMLP,
        sequence-parallel like the layer's dense MLP; a plain TE Linear, so its input is cast)."""
        if self.job.shape.shared_ffn:
            self._mlp_forward(p + "shared.", self.job.shape.shared_ffn, cast=True)

    def _shared_backward(self, p: str) -> None:
        if self.job.shape.shared_ffn:
            self._mlp_backward(p + "shared.", self.job.shape.shared_ffn)
