"""HybridEP, the flex dispatcher's other backend (`moe_flex_backend: hybridep`; Megatron-Core's
--moe-flex-dispatcher-backend hybridep), a mixin of flex_dispatcher.FlexDispatcher.

Read at NVIDIA/Megatron-LM d7288711 (the Megatron-Core of Megatron-Bridge v0.4.0, NeMo 26.04):
transformer/moe/token_dispatcher.py (_HybridEPManager) and fused_a2a.py (HybridEPDispatch,
HybridEPCombine); and deepseek-ai/DeepEP branch hybrid-ep at eb9cee7 (the commit Megatron-Core's CI
builds): deep_ep/hybrid_ep_buffer.py, csrc/hybrid_ep/executor/executor.cu,
csrc/hybrid_ep/backend/hybrid_ep_backend.cuh, docs/Hybrid-EP_Implementation.md.

A forward dispatch (dispatch_with_permute) runs:
1. the bool routing map [t, E] all-gathered over EP with NCCL (executor.cu allgather_routing_map);
2. a preprocessing kernel (which rank and domain needs each token, tokens per expert), then the
   permutation's own (two launches);
3. a host synchronization to read the token counts (executor.cu: cudaStreamSynchronize unless
   non_blocking; Megatron-Core passes non_blocking only with a static token count, drop-and-pad:
   fused_a2a.py), in every MoE layer's forward;
4. beyond one NVLink domain, the tokens [t, h] and their fp32 probabilities [t, E] copied into the
   registered buffer (executor.cu dispatch_preprocess);
5. one persistent kernel on `moe_hybridep_num_sms` blocks (Megatron-Core's default 16; Megatron-
   Bridge's runs set 32: scripts/performance/utils/overrides.py): a token is written over RDMA once
   per other domain holding one of its experts, to the rank of the same index there, with its row
   of probabilities for that domain's experts (L x R fp32), and pushed over NVLink (TMA) to each
   rank of the domain that needs it with the same row (hybrid_ep_backend.cuh);
6. a permutation copying the received tokens out of the buffer, grouped by local expert.
Combine (bf16): an unpermutation summing each token's local copies, then one kernel that pulls
the copies over NVLink and, for tokens of other domains, sums the domain's partials before one RDMA
write per token and home domain. Dispatch's backward is a combine carrying the probabilities'
gradients; combine's backward a dispatch on the cached handle (no routing map, no sync, no
probabilities).

Domains: R ranks share NVLink, Megatron-Bridge's NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN: 8 on
HGX nodes, the whole EP group on NVL72 racks (scripts/performance/perf_plugins.py at v0.4.0); here
the job's GPUs per NVLink domain, at most ep. The ranks of one index across domains are the RDMA
group (`ep_rdma`), a domain the NVLink group (`ep_nvl`), as for DeepEP.

Expressed, as DeepEP's kernels are, as ALL_TO_ALL collectives the system layer times as NCCL's of
those bytes (HybridEP's own bandwidth is not modelled): one over `ep` within a domain, else one over
`ep_rdma` beside one over `ep_nvl`, each holding half of the kernel's blocks (every block runs RDMA,
load and store warps at once). Not modelled: the per-chunk RDMA flags, fp8 dispatch (Megatron-Core
refuses it), the permutation fused into the dispatch and the static token budget of later releases,
and the registered buffers' memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core.jobs.primitives import EP_PART, KernelPrimitives
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec, Parallel

MAX_DOMAIN = 72   # csrc/hybrid_ep/config.cuh: at most 72 ranks per NVLink domain
PROB_BYTES = 4    # the probabilities travel in fp32 (Megatron-Core casts them: _HybridEPManager.dispatch)
DEFAULT_SMS = 16  # Megatron-Core's moe_hybridep_num_sms (transformer_config.py at d7288711)


def uses_hybridep(p: "Parallel") -> bool:
    """The job's tokens go through HybridEP's kernels."""
    return p.moe_token_dispatcher == "flex" and p.moe_flex_backend == "hybridep"


def hybridep_domain(ep: int, gpus_per_node: int) -> int:
    """Ranks of an EP group per NVLink domain."""
    return min(ep, gpus_per_node)


def hybridep_problem(job: "JobSpec", gpus_per_node: int) -> str | None:
    """Why HybridEP cannot lay the job's EP groups over its NVLink domains (None when it can)."""
    p = job.parallel
    if not uses_hybridep(p):
        return None
    domain = hybridep_domain(p.ep, gpus_per_node)
    if p.ep % domain:
        return (f"{p.ep} ranks do not split into HybridEP's NVLink domains of {domain} GPUs "
                "(NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN must divide the group)")
    if domain > MAX_DOMAIN:
        return f"HybridEP's NVLink domain holds at most {MAX_DOMAIN} ranks, not {domain}"
    return None


class HybridEP(KernelPrimitives):
    """HybridEP's bytes and the kernels around its dispatch (see the module docstring)."""

    @property
    def hybridep(self) -> bool:
        return uses_hybridep(self.job.parallel)

    @property
    def hybridep_sms(self) -> int:
        return self.job.parallel.moe_hybridep_num_sms or DEFAULT_SMS

    @property
    def flex_domain(self) -> int:
        """Ranks per NVLink domain of the flex backend (Placement.flex_domain)."""
        return self.place.flex_domain

    def hybridep_row(self, weights: bool) -> int:
        """Bytes a token carries besides its hidden state: its probabilities for a domain's experts."""
        if not weights:
            return 0
        m, ep = self.job.shape, self.job.parallel.ep
        return PROB_BYTES * (m.num_experts or 1) // ep * self.flex_domain

    def hybridep_prepare(self, name: str) -> None:
        """A forward dispatch's steps before its kernel: the routing map's all-gather, the
        preprocessing the host waits for, and beyond one domain the copy into the registered buffer."""
        m, t, ep = self.job.shape, self.local_tokens, self.job.parallel.ep
        experts = m.num_experts or 1
        self.blocking(name + ".map_all_gather", "ep", pb.ALL_GATHER, t * experts, EP_PART)
        gathered = ep * t * experts
        self.elementwise(name + ".preprocess", gathered, 2 * gathered, launches=2, host_sync=True)
        if ep > self.flex_domain:
            copied = t * (self.h * self.act_bytes + PROB_BYTES * experts)
            self.elementwise(name + ".buffer_copy", copied, 2 * copied)
