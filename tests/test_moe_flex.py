"""The flex token dispatcher with DeepEP (issue 34): the bytes DeepEP's dispatch and combine move in
closed form for balanced routing, within one NVLink domain and beyond it (once per domain over RDMA,
forwarded over NVLink); EP inside a node touches no network; the kernels' SMs; the expert side's
permutations replacing the source side's; a folded run equal to an unfolded one; the validation
rules; an alltoall job's echo unchanged."""

from __future__ import annotations

from math import ceil, comb
from typing import Any

import pytest

from chakra_core.et.attrs import NodeView
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb
from tests.simhelpers import changed_job, job_folded_and_unfolded

MOE = {"layers": 2, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000,
       "num_experts": 32, "topk": 4, "moe_ffn_hidden": 256}
PROFILE = "h100-hgx-ndr400"


def job(gpus: int, ep: int, dispatcher: str = "flex", pp: int = 1, seq: int = 1024, model: dict[str, Any] | None = None,
        **parallel: Any) -> JobSpec:
    return JobSpec.model_validate({
        "name": "flex", "model": model or MOE,
        "parallel": {"pp": pp, "ep": ep, "moe_token_dispatcher": dispatcher, **parallel},
        "training": {"seq": seq, "global_batch": 2 * gpus // pp, "micro_batch": 1},
        "cluster": {"gpus": gpus, "profile": PROFILE}})


def deepep_nodes(spec: JobSpec, rank: int = 0) -> dict[str, NodeView]:
    nodes = RankProgram(spec, Placement(spec, 8), rank).build()
    return {n.name: NodeView(n) for n in nodes if n.type == pb.COMM_COLL_NODE and ".deepep" in n.name}


def received_share(experts: int, topk: int, held: int) -> float:
    """P(a token's random top-k touches one of `held` experts), as an exact ratio's complement."""
    return 1 - comb(experts - held, topk) / comb(experts, topk)


@pytest.mark.parametrize("seq", [1024, 3000])
def test_intranode_bytes_equal_the_closed_form(seq):
    """EP 8 in one node: each rank sends each token once to every rank holding one of its experts:
    ceil(t x P(hit)) tokens per peer, each its hidden state (bf16) with, in a dispatch, its source
    index (4) and top-k indices (8 each) and weights (4 each); a combine carries the weights'
    gradients only in the backward."""
    spec = job(8, 8, seq=seq)
    t, h, k, ep = seq, 512, 4, 8
    per_peer = ceil(t * received_share(32, k, 32 // ep) - 1e-9)
    sizes = {name.split(".", 2)[2]: v.int("comm_size") for name, v in deepep_nodes(spec).items()
             if name.startswith("mb0.L0.")}
    assert sizes == {
        "moe.dispatch.deepep": ep * per_peer * (2 * h + 4 + 12 * k),
        "moe.combine.deepep": ep * per_peer * 2 * h,
        "moe.combine.bwd.deepep": ep * per_peer * (2 * h + 4),
        "moe.dispatch.bwd.deepep": ep * per_peer * (2 * h + 4 * k),
    }
    # fewer bytes than the alltoall dispatcher's t x topk copies whenever a token's experts share a rank
    alltoall = t * k * 2 * h
    assert sizes["moe.combine.deepep"] < alltoall


def test_internode_bytes_go_once_per_node_then_over_nvlink():
    """EP 16 over two nodes: over RDMA (peers: the same local index in the other node) a token goes
    once to each node holding one of its experts; over NVLink the forwarder passes each token on
    to every rank of its node that needs it; 16-byte aligned tokens with an 8-byte SourceMeta."""
    spec = job(16, 16)
    t, h, k = 1024, 512, 4
    per_rank = ceil(t * received_share(32, k, 2) - 1e-9)
    per_node = ceil(t * received_share(32, k, 16) - 1e-9)
    nodes = deepep_nodes(spec, 3)
    dispatch_token = ceil((2 * h + 8 + 8 * k) / 16) * 16
    combine_token = ceil((2 * h + 8) / 16) * 16
    assert nodes["mb0.L0.moe.dispatch.deepep_rdma"].int("comm_size") == 2 * per_node * dispatch_token
    assert nodes["mb0.L0.moe.dispatch.deepep_nvl"].int("comm_size") == 8 * 2 * per_rank * dispatch_token
    assert nodes["mb0.L0.moe.combine.deepep_rdma"].int("comm_size") == 2 * per_node * combine_token
    assert nodes["mb0.L0.moe.combine.deepep_nvl"].int("comm_size") == 8 * 2 * per_rank * combine_token
    groups = Placement(spec, 8).groups(3)
    assert groups["ep_rdma"] == (3, 11) and groups["ep_nvl"] == tuple(range(8))
    assert {v.int("comm_ctas") for v in nodes.values()} == {10}   # 20 SMs, half forwarding


def test_ep_inside_a_node_touches_no_network():
    """EP 8 on 16 GPUs (dp 2): every DeepEP kernel's group lies in one node, on all 20 SMs; no
    RDMA group exists; placement shows the ep group on NVLink."""
    spec = job(16, 8)
    placement = Placement(spec, 8)
    for rank in (0, 9, 15):
        groups = placement.groups(rank)
        assert "ep_rdma" not in groups and "ep_nvl" not in groups
        nodes = deepep_nodes(spec, rank)
        assert nodes and {v.str("pg_name") for v in nodes.values()} == {f"ep{8 * (rank // 8)}"}
        assert {v.int("comm_ctas") for v in nodes.values()} == {20}
        assert {rank // 8 for rank in groups["ep"]} == {rank // 8}
    assert {row.group: row.fabric for row in placement.where()}["ep"] == "NVLink"


def test_flex_drops_the_source_side_permutations_and_the_probability_all_to_all():
    """alltoall: permute, all-to-all of tokens and of probabilities, unpermute on the source rank;
    flex: the layout kernel, DeepEP's kernels, the permutations on the expert side (no chunk sort)."""
    flex, alltoall = (RankProgram(s, Placement(s, 8), 0).build() for s in (job(8, 8), job(8, 8, "alltoall")))
    names = {n.name.split(".", 2)[2] for n in flex if n.name.startswith("mb0.L0.moe")}
    assert {"moe.dispatch.layout", "moe.permute", "moe.unpermute", "moe.permute.bwd", "moe.unpermute.bwd"} <= names
    assert not {n for n in names if "all_to_all" in n or "sort_chunks" in n}
    old = {n.name.split(".", 2)[2] for n in alltoall if n.name.startswith("mb0.L0.moe")}
    assert "moe.dispatch.ep_all_to_all_probs" in old and "moe.sort_chunks" in old
    flex_comm = [n for n in flex if n.type == pb.COMM_COLL_NODE and n.name.startswith("mb0.L0.moe")]
    assert len(flex_comm) == 4


@pytest.mark.parametrize("layout", [
    {"gpus": 16, "ep": 16},
    {"gpus": 16, "ep": 4, "pp": 2, "vp": 2, "overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True},
])
def test_a_folded_run_equals_every_rank_simulated(tmp_path, layout):
    model = {**MOE, "layers": 4, "shared_expert_ffn": 512}
    spec = job(model=model, **layout).model_dump(mode="json")
    finish = job_folded_and_unfolded(spec, tmp_path)
    assert finish["auto"] == finish["off"]


@pytest.mark.parametrize(("changes", "message"), [
    ({"model": {**MOE, "num_experts": None, "topk": None}, "parallel": {"moe_token_dispatcher": "flex"}},
     "parallel.moe_token_dispatcher flex needs a mixture of experts"),
    ({"parallel": {"moe_token_dispatcher": "flex"}, "cluster": {"gpus": 1}}, r"needs parallel.ep x parallel.etp > 1"),
    ({"parallel": {"moe_token_dispatcher": "flex", "ep": 2, "tp": 2}, "cluster": {"gpus": 4}},
     "flex with parallel.etp 2 is not modelled"),
    ({"parallel": {"moe_token_dispatcher": "flex", "ep": 12}, "cluster": {"gpus": 12},
      "training": {"seq": 1024, "global_batch": 12}, "model": {**MOE, "num_experts": 48}},
     "DeepEP needs at most 8 ranks or a multiple of 8"),
    ({"parallel": {"moe_token_dispatcher": "flex", "ep": 8}, "cluster": {"gpus": 8, "gpus_per_node": 4}},
     "NVLink domains of 8 ranks must each lie in a node"),
    ({"parallel": {"moe_token_dispatcher": "flex", "ep": 2}, "model": {**MOE, "capacity_factor": 1.0}},
     "capacity_factor with parallel.moe_token_dispatcher flex is not modelled"),
    ({"parallel": {"moe_token_dispatcher": "flex", "ep": 2, "moe_flex_backend": "nccl_ep"}}, "moe_flex_backend"),
])
def test_validation_names_the_key(changes, message):
    data = changed_job({"name": "flex", "model": MOE, "parallel": {},
                        "training": {"seq": 1024, "global_batch": 8}, "cluster": {"gpus": 2, "profile": PROFILE}}, changes)
    if data["model"].get("num_experts") is None:
        data["model"] = {k: v for k, v in data["model"].items() if k not in ("num_experts", "topk", "moe_ffn_hidden")}
    with pytest.raises(ValueError, match=message):
        JobSpec.model_validate(data)


def test_an_alltoall_job_echoes_no_dispatcher_keys():
    """The default dispatcher echoes as before flex existed; flex echoes itself and its backend."""
    assert not {"moe_token_dispatcher", "moe_flex_backend"} & set(job(8, 8, "alltoall").model_dump()["parallel"])
    assert job(8, 8).model_dump()["parallel"]["moe_flex_backend"] == "deepep"
