"""Megatron-Core's flex token dispatcher with the DeepEP backend (`--moe-token-dispatcher-type flex
--moe-flex-dispatcher-backend deepep`), a mixin of moe.MixtureOfExperts.

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553: transformer/moe/token_dispatcher.py
(MoEFlexTokenDispatcher, _DeepepManager) and fused_a2a.py (FusedDispatch, FusedCombine); and
deepseek-ai/DeepEP at 567632d (the `Buffer` Megatron imports; its kernels live on as csrc/kernels/legacy
at dd758caf): deep_ep/buffer.py, csrc/deep_ep.cpp, csrc/kernels/{intranode,internode,layout}.cu.

- Dispatch is one kernel that reads each token once and sends it once to every EP rank holding one
  of its top-k experts (is_token_in_rank), with its top-k indices (int64) and weights (fp32) and its
  source index; there is no permutation before it and no probability all-to-all. Combine sends back
  each rank's sum over its local experts and adds the ranks' sums in the kernel; its backward is a
  dispatch on the cached handle, dispatch's backward a combine carrying the weights' gradients.
- Up to 8 ranks (NUM_MAX_NVL_PEERS) the intranode kernels write over NVLink; a larger group must be a
  multiple of 8, ranks r with the same r // 8 one NVLink domain, and the internode kernels send a
  token over RDMA once per destination domain (to the rank of the same r % 8 there), which forwards
  it over NVLink to each rank of its domain that needs it. Both run at once (sender, forwarder and
  receiver warps of one kernel).
- The kernels run on Buffer.num_sms thread blocks (Megatron sets 20: _DeepepManager), which they take
  from the compute beside them as NCCL's channels do (`comm_ctas`).
- On the expert side (dispatch_postprocess / combine_preprocess) a permutation spreads the received
  tokens over their local experts' copies (grouped by expert, so no chunk sort) and an unpermutation
  sums them back.

Expressed as ALL_TO_ALL collectives the system layer times as NCCL's of those bytes (an
approximation: DeepEP's own bandwidth is not NCCL's): within one NVLink domain one over `ep`; beyond,
one over `ep_rdma` (the ranks of the same r % 8) beside one over `ep_nvl` (the domain), each on half
of the SMs (internode.cu: even blocks forward, odd ones send and receive). Routing is balanced as
Megatron forces it for benchmarks (router.py, moe_utils.apply_random_logits: normal logits, so a
token's top-k is a uniformly random k-subset): a rank holding L of E experts receives a given token
with probability 1 - C(E-L, k) / C(E, k), a domain of D ranks with 1 - C(E-D*L, k) / C(E, k); each
rank sends that share of its t tokens to every peer, rounded up.

The host waits for the received counts in a non-cached dispatch (fused_a2a.py: "the CPU will wait
for GPU's signal"): a host sync at the layout kernel's end (`deepep_layout`). Not modelled: the ranks'
exchange of those counts (the notify kernels' few bytes and their latency, which the host's wait
also covers), flex with etp > 1 (the TPxEP group), a capacity factor and the fp8 dispatch Megatron
does not use with DeepEP. The HybridEP backend: hybrid_ep.py.
"""

from __future__ import annotations

from fractions import Fraction
from math import ceil, comb
from typing import TYPE_CHECKING, NamedTuple

from chakra_core.jobs.hybrid_ep import HybridEP, uses_hybridep
from chakra_core.jobs.primitives import EP_PART, KernelPrimitives
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

NVL_PEERS = 8    # csrc/kernels/configs.cuh NUM_MAX_NVL_PEERS
RDMA_PEERS = 20  # NUM_MAX_RDMA_PEERS: deep_ep.cpp asserts num_ranks <= 8 x 20
DEEPEP_SMS = 20  # token_dispatcher.py _DeepepManager: moe_flex_dispatcher_num_sms or 20


def flex_problems(job: "JobSpec") -> list[str]:
    """What Megatron and DeepEP refuse of the flex dispatcher, and what is not modelled."""
    p, m = job.parallel, job.shape
    out = []
    if p.moe_hybridep_num_sms is not None and not uses_hybridep(p):
        out.append("parallel.moe_hybridep_num_sms sizes HybridEP's kernels: it needs parallel.moe_token_dispatcher "
                   "flex with parallel.moe_flex_backend hybridep")
    if p.moe_token_dispatcher != "flex" or not m.moe:
        return out
    if p.ep * p.expert_tp == 1:   # token_dispatcher.py: "DeepEP dispatcher requires TPxEP > 1"
        out.append("parallel.moe_token_dispatcher flex (deepep) needs parallel.ep x parallel.etp > 1")
    if p.expert_tp > 1:
        out.append(f"parallel.moe_token_dispatcher flex with parallel.etp {p.expert_tp} is not modelled "
                   "(DeepEP over the TPxEP group); use etp 1")
    hybridep = uses_hybridep(p)   # its domains: hybrid_ep.hybridep_problem, with the profile's
    if not hybridep and p.ep > NVL_PEERS and (p.ep % NVL_PEERS or p.ep > NVL_PEERS * RDMA_PEERS):
        # deep_ep.cpp Buffer: num_ranks < NUM_MAX_NVL_PEERS or num_ranks % NUM_MAX_NVL_PEERS == 0
        out.append(f"parallel.ep {p.ep}: DeepEP needs at most 8 ranks or a multiple of 8 up to 160")
    if m.capacity_factor is not None:
        out.append("model.capacity_factor with parallel.moe_token_dispatcher flex is not modelled")
    if job.training.routing != "balanced":   # its bytes follow from a uniform top-k subset (hit_share)
        out.append("training.routing other than balanced with parallel.moe_token_dispatcher flex is not modelled")
    gpn = job.cluster.gpus_per_node
    if not hybridep and gpn is not None and gpn % min(p.ep, NVL_PEERS):
        out.append(f"parallel.ep {p.ep}: DeepEP's NVLink domains of {min(p.ep, NVL_PEERS)} ranks must each lie "
                   f"in a node of cluster.gpus_per_node {gpn}")
    return out


class DeepepBytes(NamedTuple):
    """A dispatch's or combine's whole send buffers (ALL_TO_ALL comm_size) on each fabric."""

    nvl: int    # over `ep` (one domain) or `ep_nvl`
    rdma: int   # over `ep_rdma` (0 within one domain)


def hit_share(experts: int, topk: int, held: int) -> Fraction:
    """Probability that a uniformly random top-k of `experts` picks one of `held` given experts."""
    return 1 - Fraction(comb(experts - held, topk), comb(experts, topk))


def _ceil(x: Fraction) -> int:
    return ceil(x)


def deepep_bytes(tokens: int, hidden_bytes: int, experts: int, topk: int, ep: int, dispatch: bool,
                 weights: bool) -> DeepepBytes:
    """Bytes a rank of t tokens sends per DeepEP dispatch (`dispatch`) or combine, `weights`: the top-k
    weights (dispatch) or their gradients (combine) travel with the tokens."""
    local = experts // ep
    per_rank = _ceil(tokens * hit_share(experts, topk, local))   # tokens to each peer
    extra = (8 + 4) * topk if dispatch else 4 * topk   # top-k idx (int64 intranode, int32 beyond) + weights
    if ep <= NVL_PEERS:   # intranode.cu: x, a dispatch's src_idx (int), the top-k if given
        token = hidden_bytes + (4 if dispatch else 0) + (extra if weights else 0)
        return DeepepBytes(ep * per_rank * token, 0)
    # internode.cu get_num_bytes_per_token: x, SourceMeta (8), top-k idx (int32) and weights, 16-aligned
    token = hidden_bytes + 8 + ((8 * topk if dispatch else 4 * topk) if weights else 0)
    token = -(-token // 16) * 16
    domains = ep // NVL_PEERS
    per_domain = _ceil(tokens * hit_share(experts, topk, NVL_PEERS * local))
    return DeepepBytes(NVL_PEERS * domains * per_rank * token, domains * per_domain * token)


def hybridep_bytes(tokens: int, hidden_bytes: int, experts: int, topk: int, ep: int, domain: int,
                   row: int) -> DeepepBytes:
    """Bytes a rank of t tokens sends per HybridEP dispatch or combine (hybrid_ep.py): each token,
    with `row` bytes of probabilities, once over RDMA per domain holding one of its experts and over
    NVLink to each rank that holds one; no alignment, no metadata per token."""
    local, token = experts // ep, hidden_bytes + row
    nvl = ep * _ceil(tokens * hit_share(experts, topk, local)) * token
    if ep <= domain:
        return DeepepBytes(nvl, 0)
    per_domain = _ceil(tokens * hit_share(experts, topk, domain * local))
    return DeepepBytes(nvl, ep // domain * per_domain * token)


class FlexDispatcher(HybridEP, KernelPrimitives):
    """The flex dispatcher's kernels (DeepEP's, or HybridEP's: hybrid_ep.py) and the expert side's
    permutations (see the module docstring)."""

    names: dict[str, str]

    @property
    def flex(self) -> bool:
        return self.job.parallel.moe_token_dispatcher == "flex"

    def deepep_received(self) -> int:
        """Distinct tokens the EP peers send this rank (balanced: as many as it sends)."""
        m = self.job.shape
        experts, ep = m.num_experts or 1, self.job.parallel.ep
        share = hit_share(experts, m.router_topk, experts // ep)
        return ep * _ceil(self.local_tokens * share)

    def deepep_bytes(self, dispatch: bool, weights: bool) -> DeepepBytes:
        m, ep = self.job.shape, self.job.parallel.ep
        if self.hybridep:
            return hybridep_bytes(self.local_tokens, self.h * self.act_bytes, m.num_experts or 1, m.router_topk, ep,
                                  self.flex_domain, self.hybridep_row(weights))
        return deepep_bytes(self.local_tokens, self.h * self.act_bytes, m.num_experts or 1, m.router_topk,
                            ep, dispatch, weights)

    def deepep(self, name: str, dispatch: bool, weights: bool) -> None:
        """The backend's kernel: the stream waits for it (FusedDispatch/FusedCombine end with
        current_stream_wait, HybridEPDispatch/HybridEPCombine return on the stream)."""
        sent, a2a = self.deepep_bytes(dispatch, weights), pb.ALL_TO_ALL
        kind, sms = ("hybridep", self.hybridep_sms) if self.hybridep else ("deepep", DEEPEP_SMS)
        if not sent.rdma:
            self.stream.wait(self.collective(f"{name}.{kind}", "ep", a2a, sent.nvl, EP_PART, ctas=sms))
            return
        rdma = self.collective(f"{name}.{kind}_rdma", "ep_rdma", a2a, sent.rdma, EP_PART, ctas=sms // 2)
        nvl = self.collective(f"{name}.{kind}_nvl", "ep_nvl", a2a, sent.nvl, EP_PART, ctas=sms - sms // 2)
        self.stream.wait(rdma, nvl)

    def deepep_layout(self, name: str) -> None:
        """layout.cu get_dispatch_layout: the top-k indices read, per-rank and per-expert counts and
        is_token_in_rank written (before a non-cached dispatch). The host then waits for the counts
        to size the receive buffers (DeepEP's dispatch returns num_recv_tokens_per_expert_list to the
        host; Megatron-Core fused_a2a.py): a host sync, here at the layout's end, the ranks'
        exchange of counts (notify_dispatch) not included."""
        if self.hybridep:
            return self.hybridep_prepare(name)
        t, k, ep = self.local_tokens, self.job.shape.router_topk, self.job.parallel.ep
        self.elementwise(name + ".layout", t * k, t * k * 8 + t * ep, host_sync=True)

    def flex_permute(self, name: str, received: int, probs: bool) -> int:
        """The received tokens spread over their local experts' copies (_DeepepManager.
        get_permuted_hidden_states_by_experts: fused permute, with the fp32 probabilities)."""
        h, b, unique = self.h, self.act_bytes, self.deepep_received()
        return self.elementwise(name, received * h, (unique + received) * h * b + (received * 4 if probs else 0))

    def flex_unpermute(self, name: str, received: int, probs: bool) -> int:
        """The local experts' copies summed back per received token (combine_preprocess: unpermute)."""
        h, b, unique = self.h, self.act_bytes, self.deepep_received()
        return self.elementwise(name, received * h, (unique + received) * h * b + (received * 4 if probs else 0))

