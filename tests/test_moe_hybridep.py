"""The flex token dispatcher with HybridEP (issue 34): its bytes in closed form for balanced routing
within one NVLink domain and beyond it (once per domain over RDMA with the domain's probability row,
then over NVLink), a rack-sized domain without RDMA, the routing map's all-gather and the host's
wait in each forward dispatch only, its thread blocks, a folded run equal to an unfolded one, the
domain rule, and the echo of its keys."""

from __future__ import annotations

from math import ceil, comb
from typing import Any

import pytest
from pydantic import ValidationError

from chakra_core.et.attrs import NodeView
from chakra_core.jobs.hybrid_ep import hybridep_problem
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb
from tests.simhelpers import job_folded_and_unfolded

MOE = {"layers": 2, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000,
       "num_experts": 32, "topk": 4, "moe_ffn_hidden": 256}
H, K, E, T = 512, 4, 32, 1024


def job(gpus: int, ep: int, model: dict[str, Any] | None = None, **parallel: Any) -> JobSpec:
    return JobSpec.model_validate({
        "name": "hybridep", "model": model or MOE,
        "parallel": {"ep": ep, "moe_token_dispatcher": "flex", "moe_flex_backend": "hybridep", **parallel},
        "training": {"seq": T, "global_batch": 2 * gpus, "micro_batch": 1},
        "cluster": {"gpus": gpus, "profile": "h100-hgx-ndr400"}})


def layer_nodes(spec: JobSpec, rank: int = 0, gpus_per_node: int = 8) -> dict[str, NodeView]:
    nodes = RankProgram(spec, Placement(spec, gpus_per_node), rank).build()
    return {n.name.split(".", 2)[2]: NodeView(n) for n in nodes if n.name.startswith("mb0.L0.")}


def share(held: int) -> float:
    """P(a token's uniformly random top-k picks one of `held` experts)."""
    return 1 - comb(E - held, K) / comb(E, K)


def test_one_domain_sends_each_token_once_per_rank_with_the_domains_probability_row():
    """EP 8 in one node: ceil(t x P(hit)) tokens to each rank, each its bf16 hidden state and, in a
    dispatch and in the dispatch's backward, the fp32 probabilities of the domain's 8 x 4 experts."""
    nodes = layer_nodes(job(8, 8))
    per_rank, row = ceil(T * share(E // 8) - 1e-9), 4 * (E // 8) * 8
    sizes = {name: v.int("comm_size") for name, v in nodes.items() if ".hybridep" in name}
    assert sizes == {"moe.dispatch.hybridep": 8 * per_rank * (2 * H + row),
                     "moe.combine.hybridep": 8 * per_rank * 2 * H,
                     "moe.combine.bwd.hybridep": 8 * per_rank * 2 * H,
                     "moe.dispatch.bwd.hybridep": 8 * per_rank * (2 * H + row)}
    assert {nodes[n].int("comm_ctas") for n in sizes} == {16}   # Megatron-Core's moe_hybridep_num_sms
    assert "moe.dispatch.buffer_copy" not in nodes   # the kernel reads the tokens in place


def test_two_domains_send_once_per_domain_over_rdma_then_over_nvlink():
    """EP 16 over two 8-GPU nodes: the same local rank of the other node is the RDMA peer; a token
    crosses once per domain holding one of its experts; the kernel's 32 blocks split between them."""
    spec = job(16, 16, moe_hybridep_num_sms=32)
    nodes = layer_nodes(spec, 3)
    per_rank, per_domain = ceil(T * share(E // 16) - 1e-9), ceil(T * share(8 * E // 16) - 1e-9)
    token = 2 * H + 4 * (E // 16) * 8
    assert nodes["moe.dispatch.hybridep_rdma"].int("comm_size") == 2 * per_domain * token
    assert nodes["moe.dispatch.hybridep_nvl"].int("comm_size") == 16 * per_rank * token
    assert nodes["moe.combine.hybridep_rdma"].int("comm_size") == 2 * per_domain * 2 * H
    assert Placement(spec, 8).groups(3)["ep_rdma"] == (3, 11)
    assert {v.int("comm_ctas") for n, v in nodes.items() if ".hybridep" in n} == {16}
    copy = nodes["moe.dispatch.buffer_copy"]   # tokens and fp32 probabilities into the registered buffer
    assert copy.int("tensor_size") == 2 * T * (2 * H + 4 * E)


def test_a_rack_sized_domain_needs_no_rdma():
    """On an NVL72-like domain (72 GPUs per node) EP 16 is one domain: NVLink only."""
    spec = job(16, 16)
    groups = Placement(spec, 72).groups(3)
    assert "ep_rdma" not in groups
    nodes = layer_nodes(spec, 3, gpus_per_node=72)
    assert "moe.dispatch.hybridep" in nodes and not any("rdma" in n for n in nodes)


def test_only_the_forward_dispatch_gathers_the_routing_map_and_waits_on_the_host():
    nodes = layer_nodes(job(16, 16))
    gather = nodes["moe.dispatch.map_all_gather"]
    assert gather.int("comm_type") == pb.ALL_GATHER and gather.int("comm_size") == T * E   # bools
    preprocess = nodes["moe.dispatch.preprocess"]
    assert preprocess.bool("host_sync") and preprocess.int("launches") == 2
    assert [n for n in nodes if n.endswith((".map_all_gather", ".preprocess", ".buffer_copy"))] == \
        ["moe.dispatch.map_all_gather", "moe.dispatch.preprocess", "moe.dispatch.buffer_copy"]


@pytest.mark.parametrize("layout", [{"gpus": 16, "ep": 16}, {"gpus": 16, "ep": 8, "pp": 2, "vp": 2}])
def test_a_folded_run_equals_every_rank_simulated(tmp_path, layout):
    spec = job(model={**MOE, "layers": 4}, **layout).model_dump(mode="json")
    finish = job_folded_and_unfolded(spec, tmp_path)
    assert finish["auto"] == finish["off"]


def test_domains_must_split_the_ep_group():
    assert hybridep_problem(job(24, 12, model={**MOE, "num_experts": 48}), 8) == \
        ("12 ranks do not split into HybridEP's NVLink domains of 8 GPUs (NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN "
         "must divide the group)")
    assert hybridep_problem(job(24, 12, model={**MOE, "num_experts": 48}), 72) is None


def test_the_thread_blocks_echo_only_when_given():
    assert job(8, 8, moe_hybridep_num_sms=32).model_dump()["parallel"]["moe_hybridep_num_sms"] == 32
    assert "moe_hybridep_num_sms" not in job(8, 8).model_dump()["parallel"]


def test_thread_blocks_without_hybridep_are_refused():
    with pytest.raises(ValidationError, match="moe_hybridep_num_sms sizes HybridEP's kernels"):
        job(8, 8, moe_flex_backend="deepep", moe_hybridep_num_sms=32)
