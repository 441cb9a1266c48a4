"""Skewed routing (issue 34, chakra_core/jobs/routing.py): balanced routing writes the traces it
wrote before the setting existed, equal shares are balanced, tokens are conserved, more skew never
makes a step faster (where the model says it cannot), the results show the imbalance's cost, the
histogram files and the validation errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from chakra_core import run
from chakra_core.errors import ManifestError
from chakra_core.et.attrs import NodeView
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.routing import expert_load
from chakra_core.jobs.spec import JobSpec
from chakra_core.jobs.step import TrainingStep
from tests.simhelpers import job_folded_and_unfolded

DENSE = {"layers": 4, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}
MOE = {**DENSE, "num_experts": 8, "topk": 2, "moe_ffn_hidden": 512}
PROFILE = "h100-hgx-ndr400"


def job_data(model: dict[str, Any] | None = None, routing: Any = None, tp: int = 1, pp: int = 1, dp: int = 1,
             ep: int = 1, etp: int | None = None, seq: int = 1024, microbatches: int = 2,
             **training: Any) -> dict[str, Any]:
    parallel: dict[str, Any] = {"tp": tp, "pp": pp, "ep": ep}
    if etp is not None:
        parallel["etp"] = etp
    if routing is not None:
        training["routing"] = routing
    return {"name": "moe", "model": model or MOE, "parallel": parallel,
            "training": {"seq": seq, "global_batch": microbatches * dp, "micro_batch": 1, **training},
            "cluster": {"gpus": tp * pp * dp, "profile": PROFILE}}


def job(*args: Any, **kwargs: Any) -> JobSpec:
    return JobSpec.model_validate(job_data(*args, **kwargs))


def trace_bytes(spec: JobSpec, rank: int = 0) -> list[bytes]:
    return [node.SerializeToString() for node in RankProgram(spec, Placement(spec, 8), rank).build()]


def step_of(data: dict[str, Any], tmp_path: Path, name: str) -> TrainingStep:
    manifest = {"job": data, "output": {"dir": str(tmp_path / name)},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    step = run.simulate(run.load(manifest, base_dir=tmp_path)).results.training
    assert step is not None
    return step


@pytest.mark.parametrize("layout", [dict(dp=2, ep=2), dict(tp=2, dp=2, ep=2, etp=1), dict(tp=2, dp=2, ep=2),
                                    dict(pp=2, dp=4, ep=4, precision="fp8", tensors=True)])
def test_balanced_routing_writes_the_traces_it_wrote_before(layout):
    """`balanced`, equal shares (a histogram of equal values, Zipf exponent 0) and no setting at
    all write the same bytes; a balanced job echoes no routing key."""
    settings = {k: v for k, v in layout.items() if k != "tensors"}
    tensors = layout.get("tensors", False)
    before = trace_bytes(JobSpec.model_validate({**job_data(**settings), "tensors": tensors}))
    for routing in ("balanced", {"zipf": 0}, {"histogram": [7] * 8}):
        spec = JobSpec.model_validate({**job_data(routing=routing, **settings), "tensors": tensors})
        assert trace_bytes(spec) == before, routing
    assert "routing" not in job(routing="balanced").model_dump(mode="json")["training"]


layouts = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2]), "dp": st.sampled_from([1, 2, 4]), "ep": st.sampled_from([1, 2, 4]),
    "etp": st.sampled_from([None, 1]), "experts": st.sampled_from([4, 8, 16]), "topk": st.sampled_from([1, 2, 4]),
    "capacity": st.sampled_from([None, 0.5, 1.0, 1.5]),
})
routings = st.one_of(st.builds(lambda s: {"zipf": s}, st.floats(0, 6)),
                     st.builds(lambda v: {"histogram": v}, st.lists(st.integers(0, 50), min_size=16, max_size=16)))


def _spec(layout: dict[str, Any], routing: dict[str, Any]) -> JobSpec | None:
    tp, dp, ep, etp, experts = layout["tp"], layout["dp"], layout["ep"], layout["etp"], layout["experts"]
    if layout["topk"] > experts or experts % ep or (tp * dp) % (ep * (etp or tp)):
        return None
    if "histogram" in routing:
        routing = {"histogram": routing["histogram"][:experts]}
    model = {**MOE, "num_experts": experts, "topk": layout["topk"], "capacity_factor": layout["capacity"]}
    try:
        return job({k: v for k, v in model.items() if v is not None}, routing, tp=tp, dp=dp, ep=ep, etp=etp)
    except ValueError:   # an all-zero histogram, or one expert above 1 / topk
        return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(layouts, routings)
def test_tokens_are_conserved(layout, routing):
    """Each rank sends every routed token copy (t x topk) to some expert, or drops it at an expert's
    capacity; the hottest EP rank receives the most; its experts' GEMMs, the all-to-alls and the
    expert-TP gathers carry exactly its tokens; every rank writes the same sizes."""
    spec = _spec(layout, routing)
    assume(spec is not None)
    assert spec is not None
    p, m = spec.parallel, spec.shape
    tokens = spec.training.seq // p.tp
    load = expert_load(spec, tokens)
    if load is None:   # equal shares: balanced routing
        return
    experts, local = m.num_experts or 1, (m.num_experts or 1) // p.ep
    assert load.routed == tokens * m.router_topk
    if m.capacity_factor is None:
        assert load.kept == load.routed and sum(load.sent) == tokens * m.router_topk
    else:
        capacity = -(-load.routed * m.capacity_factor // experts)
        assert all(c <= capacity for c in load.sent) and load.kept <= load.routed
    assert all(c <= tokens for c in load.sent)   # a token reaches an expert once
    per_rank = [sum(load.sent[r * local:(r + 1) * local]) for r in range(p.ep)]
    assert per_rank[load.hottest] == max(per_rank) and load.arrived == p.ep * max(per_rank)
    assert load.tokens == tuple(p.ep * p.expert_tp * c for c in load.sent[load.hottest * local:][:local])
    nodes = {n.name: NodeView(n) for n in RankProgram(spec, Placement(spec, 8), 0).build()}
    fc1 = nodes["mb0.L0.moe.fc1"]
    ms = fc1.raw("gemm_m_list") or [fc1.int("gemm_m")] * fc1.int("gemm_batch")
    assert sum(ms) == sum(load.tokens)
    h = m.hidden
    if p.ep > 1:
        assert nodes["mb0.L0.moe.dispatch.ep_all_to_all"].int("comm_size") == load.arrived * h * 2
        assert nodes["mb0.L0.moe.combine.ep_all_to_all"].int("comm_size") == load.arrived * h * 2
    if p.expert_tp > 1:
        assert nodes["mb0.L0.moe.dispatch.etp_all_gather"].int("comm_size") == load.arrived * h * 2
    assert nodes["mb0.L0.moe.permute"].int("tensor_size") == (tokens + load.kept) * h * 2
    if spec.cluster.gpus > 1:   # every rank the hottest's sizes: the ranks of a stage stay alike
        assert sizes(spec, spec.cluster.gpus - 1) == sizes(spec, 0)


def sizes(spec: JobSpec, rank: int) -> list[tuple[Any, ...]]:
    """Each node's name and sizes (its groups' names aside)."""
    keys = ("num_ops", "tensor_size", "comm_size", "gemm_m_list", "gemm_k_list")
    return [(node.name, *(NodeView(node).raw(key) for key in keys))
            for node in RankProgram(spec, Placement(spec, 8), rank).build()]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([(8, 1), (8, 2), (8, 4), (16, 4), (64, 8), (128, 8)]), st.sampled_from([1, 2, 4, 8]),
       st.floats(0, 8), st.floats(0, 8), st.sampled_from([256, 1000, 4096]))
def test_zipf_never_gives_the_hottest_rank_fewer_tokens(layout, topk, s1, s2, tokens):
    """Dropless: a larger exponent never gives the hottest EP rank fewer tokens (cumulative
    rounding keeps each rank's total monotone in its cumulative share)."""
    experts, ep = layout
    assume(topk <= experts)
    low, high = sorted((s1, s2))
    spec = {s: job({**MOE, "num_experts": experts, "topk": topk}, {"zipf": s}, dp=ep, ep=ep) for s in (low, high)}
    loads = {s: expert_load(spec[s], tokens) for s in (low, high)}
    arrived = {s: tokens * topk if load is None else load.arrived for s, load in loads.items()}
    assert arrived[low] <= arrived[high]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([dict(dp=2, ep=2), dict(dp=4, ep=4), dict(tp=2, dp=2, ep=2, etp=1), dict(tp=2, dp=2, ep=2),
                        dict(pp=2, dp=4, ep=4), dict(pp=2, dp=2, ep=2, tp=2, etp=1)]),
       st.sampled_from([1, 2]), st.floats(0, 4), st.floats(0, 4), st.sampled_from([512, 2048]))
def test_more_skew_never_makes_a_step_faster(tmp_path_factory, layout, topk, s1, s2, seq):
    """Zipf over one expert per EP rank (num_experts = ep, as Mixtral 8x7B on EP 8), dropless: the
    step with the larger exponent (and any exponent against balanced routing) is never faster."""
    tmp = tmp_path_factory.mktemp("skew")
    model = {**MOE, "num_experts": layout["ep"], "topk": min(topk, layout["ep"])}
    low, high = sorted((s1, s2))
    steps = [step_of(job_data(model, routing, seq=seq, **layout), tmp, str(i)).step_time_s
             for i, routing in enumerate(("balanced", {"zipf": low}, {"zipf": high}))]
    assert steps[0] <= steps[1] <= steps[2]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([dict(dp=2, ep=2), dict(dp=4, ep=4), dict(tp=2, dp=2, ep=2, etp=1), dict(pp=2, dp=2, ep=2)]),
       st.lists(st.integers(10, 40), min_size=8, max_size=8), st.lists(st.integers(0, 400), min_size=8, max_size=8))
def test_more_tokens_on_the_hottest_rank_never_make_a_step_faster(tmp_path_factory, layout, base, more):
    """Several experts per EP rank: tokens moved from other ranks' experts to the hottest rank's
    (each of its experts gains, none loses) never make a step faster. The histograms count every
    token (they sum to t x topk), so the experts get exactly them."""
    tmp = tmp_path_factory.mktemp("hist")
    ep, topk, seq = layout["ep"], 2, 1024
    routed = seq // layout.get("tp", 1) * topk
    local = 8 // ep
    weights = base   # none above a third: below the 1 / topk cap
    counts = [routed * w // sum(weights) for w in weights]
    counts[-1] += routed - sum(counts)
    per_rank = [sum(counts[r * local:(r + 1) * local]) for r in range(ep)]
    hot = max(range(ep), key=lambda r: (per_rank[r], -r))
    skewed = list(counts)
    for e in range(8):   # each hot expert takes up to `more` tokens from the coldest expert with some left
        if e // local != hot:
            continue
        for _ in range(more[e]):
            donors = [d for d in range(8) if d // local != hot and skewed[d] > 0]
            if not donors or skewed[e] >= routed // topk:
                break
            skewed[min(donors, key=lambda d: (skewed[d] == 0, -skewed[d]))] -= 1
            skewed[e] += 1
    steps = [step_of(job_data(routing={"histogram": h}, **layout), tmp, str(i)).step_time_s
             for i, h in enumerate((counts, skewed))]
    assert steps[0] <= steps[1]


def test_the_results_show_the_imbalance_cost(tmp_path):
    """The training section's `routing`: the hottest EP rank, its experts' tokens against the
    balanced count, the step's expert GEMMs skewed and balanced; read back as written. Balanced
    routing writes no such key."""
    balanced = step_of(job_data(dp=2, ep=2), tmp_path, "balanced")
    skewed = step_of(job_data(routing={"zipf": 1.2}, dp=2, ep=2), tmp_path, "skewed")
    assert balanced.routing is None and "routing" not in balanced.to_json()
    cost = skewed.routing
    assert cost is not None and cost.routing == "zipf s=1.2" and cost.hottest_ep_rank == 0
    assert cost.balanced_tokens == 2 * 1024 * 2 // 8 and cost.imbalance > 1.3 and cost.dropped == 0
    assert cost.imbalance == pytest.approx(sum(cost.expert_tokens) / (4 * cost.balanced_tokens))
    assert cost.expert_gemm_s is not None and cost.expert_gemm_balanced_s is not None
    assert cost.expert_gemm_s > cost.expert_gemm_balanced_s
    assert skewed.step_time_s > balanced.step_time_s
    assert TrainingStep.from_json(json.loads(json.dumps(skewed.to_json()))) == skewed
    from chakra_core.report.summary import training_notes
    assert any("EP rank 0's experts compute" in line for line in training_notes(skewed))


def test_a_folded_skewed_run_equals_every_rank_simulated(tmp_path):
    data = job_data({**MOE, "shared_expert_ffn": 1024}, {"zipf": 1.5}, tp=2, pp=2, dp=2, ep=2, etp=1, microbatches=4)
    finish = job_folded_and_unfolded(data, tmp_path)
    assert finish["auto"] == finish["off"]


def test_saved_activations_grow_with_the_hottest_ranks_tokens():
    """With tensors: true, the dispatched tokens (fc1's input) are the hottest rank's."""
    from chakra_sim_memory_hbm.tensors import parse_tensors
    spec = JobSpec.model_validate({**job_data(routing={"zipf": 2}, dp=2, ep=2), "tensors": True})
    load = expert_load(spec, 1024)
    assert load is not None
    fc1 = next(n for n in RankProgram(spec, Placement(spec, 8), 0).build() if n.name.endswith("L0.moe.fc1"))
    sizes = [elements * width for _, _, _, elements, width, _ in parse_tensors(fc1.inputs.values)]
    assert sum(load.tokens) * MOE["hidden"] * 2 in sizes and sum(load.tokens) > 2 * 1024


@pytest.mark.parametrize(("name", "text"), [
    ("h.json", "[5, 1, 1, 1, 1, 1, 1, 1]"), ("h.yaml", "- 5\n- 1\n- 1\n- 1\n- 1\n- 1\n- 1\n- 1\n"),
    ("h.csv", "expert,tokens\n0,5\n1,1\n2,1\n3,1\n4,1\n5,1\n6,1\n7,1\n"), ("h.txt", "# tokens\n5\n1\n1\n1\n1\n1\n1\n1\n"),
    ("h.csv", "5, 1, 1, 1, 1, 1, 1, 1\n"),
])
def test_a_histogram_file_is_read_relative_to_the_manifest(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    config = run.load({"job": job_data(routing={"histogram": name}, dp=2, ep=2), "output": {"dir": str(tmp_path / "o")},
                       "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}, base_dir=tmp_path)
    echoed = config.spec.manifest["job"]["training"]["routing"]
    assert echoed == {"histogram": [5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], "source": name}
    assert JobSpec.model_validate(config.spec.manifest["job"]).training.routing == \
        job(routing={"histogram": [5, 1, 1, 1, 1, 1, 1, 1]}, dp=2, ep=2).training.routing.model_copy(
            update={"source": name})


@pytest.mark.parametrize(("routing", "model", "message"), [
    ({"zipf": 1}, DENSE, "training.routing needs a mixture of experts"),
    ({"histogram": [1, 2, 3]}, MOE, r"training.routing.histogram gives 3 values, one per expert, but "
                                    r"model.num_experts is 8"),
    ({"histogram": [1, -2, 1, 1, 1, 1, 1, 1]}, MOE, "histogram: expert 1's value -2.0 is not a non-negative number"),
    ({"histogram": [0] * 8}, MOE, "every expert's value is 0"),
    ({"histogram": [9, 1, 1, 1, 1, 1, 1, 1]}, MOE, r"expert 0 gets 56.2% of the routed tokens, but with topk 2 an "
                                                   r"expert receives each token at most once \(at most 50.0%\)"),
    ({"zipf": 1, "histogram": [1] * 8}, MOE, "give one of zipf"),
    ({}, MOE, "give one of zipf"),
    ({"zipf": -1}, MOE, "greater than or equal to 0"),
    ("skewed", MOE, "'balanced'"),
    ({"histogram": "missing.csv"}, MOE, "histogram missing.csv: cannot read"),
])
def test_validation_names_the_key_and_the_file(routing, model, message):
    with pytest.raises(ValueError, match=message):
        job(model, routing, dp=2, ep=2 if model is MOE else 1)


def test_a_bad_histogram_file_is_reported_with_its_key_and_name(tmp_path):
    (tmp_path / "bad.json").write_text('{"tokens": [1, 2]}')
    (tmp_path / "bad.csv").write_text("1\nlots\n")
    for name, why in (("bad.json", "a list of numbers"), ("bad.csv", "expert 1's value 'lots' is not a number")):
        with pytest.raises(ManifestError) as caught:
            run.load({"job": job_data(routing={"histogram": name}, dp=2, ep=2), "compute": {"plugin": "achievable"},
                      "system": {"plugin": "nccl"}, "output": {"dir": str(tmp_path / "o")}}, base_dir=tmp_path)
        assert "job.training.routing" in str(caught.value) and f"histogram {name}" in str(caught.value)
        assert why in str(caught.value)
