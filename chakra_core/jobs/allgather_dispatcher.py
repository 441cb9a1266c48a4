"""Megatron-Core's allgather token dispatcher (`--moe-token-dispatcher-type allgather`, Megatron-Core's
own default), a mixin of moe.MixtureOfExperts.

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/: transformer/moe/
token_dispatcher.py (MoEAllGatherTokenDispatcher), moe_utils.py (permute, unpermute),
tensor_parallel/mappings.py (gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_
region and their autograd), parallel_state.py (the expert 'tp-ep' groups).

Its group is tp_ep: the etp x ep consecutive ranks of a pipeline stage in the expert rank order
(tp-ep-dp); with one rank there is no communication. Forward, for t tokens on a rank (the
sequence-parallel share) and T = t x etp x ep on its group:
- token_dispatch all-gathers the routing map (t x E bools, under no_grad), the probabilities
  (t x E) and the tokens (t x h): every rank then holds its group's T tokens;
- dispatch_postprocess copies the map's and the probabilities' columns of the local experts
  (`.contiguous()`), counts each local expert's tokens and permutes the tokens routed to them
  (`received` copies, as many as alltoall gives an expert: T x topk / E each);
- the grouped expert GEMMs as with alltoall: no expert-TP gather or chunk sort of their own;
- combine_preprocess unpermutes the copies into T rows, weighted by their probabilities;
- token_combine reduce-scatters the T rows over tp_ep back to t.
Backward (the mappings' autograd): the output gradient all-gathered over tp_ep, gathered to the
copies, the experts' backward, scattered back to T rows, reduce-scattered over tp_ep beside the
probabilities' gradients (T x E).

The dispatcher keeps the local experts' map (T x E / ep bools) from dispatch to combine instead of
alltoall's t x E map (`moe_map`). Not modelled, as with alltoall: the host's wait for the token
counts (`tokens_per_expert ... .cpu()`), the permuted probabilities it keeps (one per copy).
Megatron refuses it beside --moe-shared-expert-overlap and --overlap-moe-expert-parallel-comm
(transformer_config.py at d98e8a64, lines 1820 and 3019).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core.jobs.primitives import EP_PART, KernelPrimitives
from chakra_core.jobs.routing import MAP_BYTES
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

GROUP = "tp_ep"
"""The dispatcher's process group (placement.expert_groups)."""


def allgather_problems(job: "JobSpec") -> list[str]:
    """What Megatron-Core refuses of the allgather dispatcher."""
    p = job.parallel
    if p.moe_token_dispatcher != "allgather" or not job.shape.moe:
        return []
    return [f"parallel.{key} needs parallel.moe_token_dispatcher alltoall or flex (Megatron-Core: {why})"
            for key, why in (("moe_shared_expert_overlap", "moe_shared_expert_overlap only works with alltoall "
                                                           "or flex token dispatcher"),
                             ("overlap_moe_expert_parallel_comm", "supported with alltoall/flex token dispatcher"))
            if getattr(p, key)]


class AllGatherDispatcher(KernelPrimitives):
    """The allgather dispatcher's communication and permutations (see the module docstring)."""

    @property
    def allgather(self) -> bool:
        return self.job.parallel.moe_token_dispatcher == "allgather"

    @property
    def group_tokens(self) -> int:
        """T: the tokens of the whole tp_ep group, which every rank of it holds after the gather."""
        p = self.job.parallel
        return self.local_tokens * p.expert_tp * p.ep

    def _gather(self, name: str, width: int, nbytes: int) -> None:
        """t rows of `width` elements of `nbytes` each, all-gathered over tp_ep (comm_size: this rank's input)."""
        self.blocking(name, GROUP, pb.ALL_GATHER, self.local_tokens * width * nbytes, EP_PART)

    def _scatter(self, name: str, width: int) -> None:
        """T rows of `width` activations reduce-scattered over tp_ep (comm_size: the whole input)."""
        self.blocking(name, GROUP, pb.REDUCE_SCATTER, self.group_tokens * width * self.act_bytes, EP_PART)

    def allgather_dispatch(self, p: str, received: int, local: int) -> None:
        """token_dispatch and dispatch_postprocess: the gathers, the local columns, the permutation."""
        experts, h, b, tokens = self.job.shape.num_experts or 1, self.h, self.act_bytes, self.group_tokens
        self._gather(p + "moe.dispatch.map_all_gather", experts, MAP_BYTES)
        self._gather(p + "moe.dispatch.probs_all_gather", experts, b)
        self._gather(p + "moe.dispatch.all_gather", h, b)
        columns = tokens * local
        # tokens_per_expert = local_map.sum(0).cpu(): the host waits for the counts (token_dispatcher.py)
        kept = self.elementwise(p + "moe.local_map", columns, 2 * columns * MAP_BYTES, host_sync=True)
        self._keep(kept, "moe_map", columns, MAP_BYTES)
        self.elementwise(p + "moe.local_probs", columns, 2 * columns * b)
        # the tokens routed to the local experts, read once each, written once per copy
        self.elementwise(p + "moe.permute", received * h, (min(tokens, received) + received) * h * b
                         + columns * MAP_BYTES)

    def allgather_combine(self, p: str, received: int) -> None:
        """combine_preprocess and token_combine: the copies summed back into T rows, reduce-scattered."""
        h, b, tokens = self.h, self.act_bytes, self.group_tokens
        self.elementwise(p + "moe.unpermute", received * h, (received + tokens) * h * b + received * b, 2)
        self._scatter(p + "moe.combine.reduce_scatter", h)

    def allgather_combine_backward(self, p: str, received: int) -> int:
        """The output gradient gathered over tp_ep and to the copies (the unpermutation's backward,
        with the probabilities' gradients); returns the gather's kernel."""
        h, b, tokens = self.h, self.act_bytes, self.group_tokens
        self._gather(p + "moe.combine.bwd.all_gather", h, b)
        return self.elementwise(p + "moe.unpermute.bwd", received * h,
                                (min(tokens, received) + received) * h * b + received * b, 2)

    def allgather_dispatch_backward(self, p: str, received: int, local: int) -> int:
        """The copies' gradients scattered back to T rows, the probabilities' into T x E, both
        reduce-scattered over tp_ep; returns the scatter's kernel."""
        experts, h, b, tokens = self.job.shape.num_experts or 1, self.h, self.act_bytes, self.group_tokens
        scattered = self.elementwise(p + "moe.permute.bwd", received * h, (received + tokens) * h * b)
        self.elementwise(p + "moe.local_probs.bwd", tokens * local, tokens * experts * b + received * b)
        self._scatter(p + "moe.dispatch.bwd.reduce_scatter", h)
        self._scatter(p + "moe.dispatch.bwd.probs_reduce_scatter", experts)
        return scattered
