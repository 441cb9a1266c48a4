"""The allgather token dispatcher (issue 34; Megatron-Core's MoEAllGatherTokenDispatcher at d98e8a64): the
bytes its gathers and reduce-scatters over etp x ep move in closed form; tokens conserved through
dispatch, experts and combine; no communication on a
group of one; the experts compute what alltoall gives them; a folded run equals an unfolded one;
Megatron's refusals; its echo. What it keeps (the local experts' map) is checked against the memory
layer's peak in test_plan_moe."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from chakra_core.et.attrs import NodeView
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb
from tests.simhelpers import job_folded_and_unfolded
from tests.test_moe import _layout_job, layouts, moe_layers_here, nodes_of

MOE = {"layers": 2, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000,
       "num_experts": 32, "topk": 4, "moe_ffn_hidden": 256}
PROFILE = "h100-hgx-ndr400"


def job(gpus: int, dispatcher: str = "allgather", seq: int = 1024, model: dict[str, Any] | None = None,
        training: dict[str, Any] | None = None, **parallel: Any) -> JobSpec:
    return JobSpec.model_validate({
        "name": "ag", "model": model or MOE, "parallel": {"moe_token_dispatcher": dispatcher, **parallel},
        "training": {"seq": seq, "global_batch": 2 * gpus, "micro_batch": 1, **(training or {})},
        "cluster": {"gpus": gpus, "profile": PROFILE}})


def layer_nodes(spec: JobSpec, rank: int = 0) -> list[pb.Node]:
    """Micro-batch 0, layer 0's MoE block nodes, in order."""
    nodes = RankProgram(spec, Placement(spec, 8), rank).build()
    return [n for n in nodes if n.name.startswith("mb0.L0.moe")]


def comm_sizes(spec: JobSpec) -> dict[str, tuple[str, int, int]]:
    return {n.name.removeprefix("mb0.L0."): (NodeView(n).str("pg_name"), NodeView(n).int("comm_type"),
                                            NodeView(n).int("comm_size"))
            for n in layer_nodes(spec) if n.type == pb.COMM_COLL_NODE}


@pytest.mark.parametrize(("tp", "ep", "etp"), [(1, 8, 1), (2, 4, None), (2, 4, 1), (4, 2, None)])
def test_bytes_equal_the_closed_form(tp, ep, etp):
    """t tokens here (seq / tp with sequence parallelism), g = etp x ep ranks in tp_ep, T = t g: the map
    (t E bools), the probabilities (t E bf16) and the tokens (t h bf16) all-gathered; T h reduce-
    scattered back in the combine and the dispatch's backward, T E of the probabilities' gradients;
    the combine's backward gathers t h again. Nothing over ep or etp alone."""
    extra = {} if etp is None else {"etp": etp}
    spec = job(8, tp=tp, ep=ep, **extra)
    t, h, e, g = 1024 // tp, 512, 32, (etp or tp) * ep
    group = f"tp_ep{0}"
    ag, rs = pb.ALL_GATHER, pb.REDUCE_SCATTER
    assert comm_sizes(spec) == {
        "moe.dispatch.map_all_gather": (group, ag, t * e),
        "moe.dispatch.probs_all_gather": (group, ag, t * e * 2),
        "moe.dispatch.all_gather": (group, ag, t * h * 2),
        "moe.combine.reduce_scatter": (group, rs, t * g * h * 2),
        "moe.combine.bwd.all_gather": (group, ag, t * h * 2),
        "moe.dispatch.bwd.reduce_scatter": (group, rs, t * g * h * 2),
        "moe.dispatch.bwd.probs_reduce_scatter": (group, rs, t * g * e * 2),
    }
    assert Placement(spec, 8).groups(0)["tp_ep"] == tuple(range(g))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_tokens_are_conserved_through_dispatch_experts_and_combine(layout):
    """Over a pipeline stage the experts compute every routed copy once per expert-TP shard, as with
    alltoall; on every rank what the dispatch gathers (its t tokens from each of the g ranks of
    tp_ep) is what the combine reduce-scatters back (T = g t rows), and the backward mirrors both."""
    base = _layout_job(layout)
    if base is None:
        return
    spec = JobSpec.model_validate({**base.model_dump(mode="json"),
                                   "parallel": {**base.model_dump(mode="json")["parallel"],
                                                "moe_token_dispatcher": "allgather"}})
    p, h = spec.parallel, spec.shape.hidden
    g, t = p.expert_tp * p.ep, spec.training.seq // p.cp // (p.tp if spec.sp else 1)
    computed = 0
    for rank in range(spec.cluster.gpus):
        nodes = nodes_of(spec, rank)
        computed += sum(NodeView(n).int("gemm_m") * NodeView(n).int("gemm_batch") for n in nodes
                        if n.type == pb.COMP_NODE and n.name.endswith("moe.fc1"))
        sizes = {n.name.split(".moe.", 1)[1]: NodeView(n).int("comm_size") for n in nodes
                 if n.type == pb.COMM_COLL_NODE and ".moe." in n.name}
        if g == 1:
            assert not sizes
            continue
        assert sizes["dispatch.all_gather"] * g == sizes["combine.reduce_scatter"] == g * t * h * 2
        assert sizes["combine.bwd.all_gather"] * g == sizes["dispatch.bwd.reduce_scatter"] == g * t * h * 2
    stage_tokens = spec.dp * spec.training.seq * spec.microbatches
    assert computed == p.expert_tp * stage_tokens * spec.shape.router_topk * moe_layers_here(spec, 0)


def test_a_group_of_one_communicates_nothing():
    """etp = ep = 1: every expert is local, the dispatcher only permutes."""
    nodes = layer_nodes(job(1))
    assert not [n for n in nodes if n.type == pb.COMM_COLL_NODE]
    assert {"moe.permute", "moe.unpermute", "moe.permute.bwd", "moe.unpermute.bwd"} <= \
        {n.name.removeprefix("mb0.L0.") for n in nodes}


@pytest.mark.parametrize("routing", ["balanced", {"zipf": 1.0}])
def test_the_experts_compute_what_alltoall_gives_them(routing):
    """Each local expert computes the tokens of the whole tp_ep group routed to it, as alltoall's
    all-to-all and expert-TP gather bring them: the grouped GEMMs have the same attributes."""
    def gemms(dispatcher: str) -> dict[str, list[bytes]]:
        spec = job(8, dispatcher, tp=2, ep=4, training={"routing": routing})
        return {n.name: [a.SerializeToString() for a in n.attr] for n in layer_nodes(spec)
                if any(part in n.name for part in (".fc1", ".fc2"))}
    assert gemms("allgather") == gemms("alltoall")


@pytest.mark.parametrize("layout", [{"gpus": 16, "ep": 16}, {"gpus": 16, "tp": 2, "ep": 4, "pp": 2}])
def test_a_folded_run_equals_every_rank_simulated(tmp_path, layout):
    gpus = layout.pop("gpus")
    spec = job(gpus, model={**MOE, "layers": 4, "shared_expert_ffn": 512}, **layout).model_dump(mode="json")
    finish = job_folded_and_unfolded(spec, tmp_path)
    assert finish["auto"] == finish["off"]


@pytest.mark.parametrize(("parallel", "message"), [
    ({"ep": 2, "moe_shared_expert_overlap": True}, "moe_shared_expert_overlap needs parallel.moe_token_dispatcher"),
    ({"ep": 2, "overlap_moe_expert_parallel_comm": True}, "overlap_moe_expert_parallel_comm needs parallel.moe_token"),
])
def test_megatrons_refusals_name_the_key(parallel, message):
    with pytest.raises(ValueError, match=message):
        job(2, model={**MOE, "shared_expert_ffn": 512}, **parallel)


def test_a_dense_job_refuses_it():
    dense = {k: v for k, v in MOE.items() if k not in ("num_experts", "topk", "moe_ffn_hidden")}
    with pytest.raises(ValueError, match="parallel.moe_token_dispatcher allgather needs a mixture of experts"):
        job(2, model=dense)


def test_it_echoes_itself_without_the_flex_backend():
    echoed = job(8, ep=8).model_dump()["parallel"]
    assert echoed["moe_token_dispatcher"] == "allgather" and "moe_flex_backend" not in echoed
