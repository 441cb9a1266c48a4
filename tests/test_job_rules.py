"""The generator's training-step rules as properties: every gradient bucket is reduced exactly
once, after its last contribution; a data-parallel group's collectives run one after another; a
stage's first parameter gather starts as the Megatron-Core release starts it;
changing DP alone moves a step by no more than its DP
communication; more bandwidth never slows a step; every collective a trace emits is counted once
in the run's bytes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chakra_core import run
from chakra_core.et.attrs import NodeView
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import DTYPE_BYTES, JobSpec
from chakra_core.schema import pb

SMALL = {"layers": 8, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}
PROFILE = "h100-hgx-ndr400"
COLL_NAMES = {value: name for name, value in pb.CollectiveCommType.items()}


def spec(tp: int = 1, pp: int = 1, vp: int | None = None, dp: int = 1, microbatches: int = 4,
         model: dict[str, Any] | None = None, **training: Any) -> JobSpec:
    parallel: dict[str, Any] = {"tp": tp, "pp": pp}
    if vp:
        parallel["vp"] = vp
    return JobSpec.model_validate({
        "name": "rules", "model": model or SMALL, "parallel": parallel,
        "training": {"seq": 512, "global_batch": microbatches * dp, "micro_batch": 1, **training},
        "cluster": {"gpus": tp * pp * dp, "profile": PROFILE}})


def ancestors(nodes: list[pb.Node], node_id: int) -> set[int]:
    seen: set[int] = set()
    todo = [node_id]
    while todo:
        current = todo.pop()
        for parent in (*nodes[current].data_deps, *nodes[current].ctrl_deps):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def _contributions(nodes: list[pb.Node], unit: int) -> list[int]:
    """The nodes that add to a unit's gradients: its weight-gradient GEMMs in every micro-batch
    (layers, output layer) or its backward kernel (embedding)."""
    if unit >= 0:
        marks = (f".L{unit}.",)
        return [n.id for n in nodes if n.type == pb.COMP_NODE and any(m in n.name for m in marks)
                and n.name.endswith(".wgrad")]
    suffix = ".embedding.bwd" if unit == -1 else ".lm_head.wgrad"
    return [n.id for n in nodes if n.type == pb.COMP_NODE and n.name.endswith(suffix)]


layouts = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2]), "pp": st.sampled_from([1, 2, 4]), "dp": st.sampled_from([1, 2, 4]),
    "interleave": st.booleans(), "distributed_optimizer": st.booleans(),
    "overlap_grad_reduce": st.booleans(), "overlap_param_gather": st.booleans(),
    "grad_reduce_dtype": st.sampled_from(["fp32", "bf16"]), "bucket_params": st.sampled_from([None, 1_500_000]),
})


def layout_job(layout: dict[str, Any]) -> JobSpec:
    vp = 2 if layout["interleave"] and layout["pp"] > 1 else None
    return spec(tp=layout["tp"], pp=layout["pp"], vp=vp, dp=layout["dp"], microbatches=4 if vp is None else 2 * layout["pp"],
                distributed_optimizer=layout["distributed_optimizer"],
                overlap_grad_reduce=layout["overlap_grad_reduce"], overlap_param_gather=layout["overlap_param_gather"],
                grad_reduce_dtype=layout["grad_reduce_dtype"], bucket_params=layout["bucket_params"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_every_gradient_bucket_is_reduced_once_after_its_last_contribution(layout):
    job = layout_job(layout)
    placement = Placement(job, 8)
    for rank in placement.representatives:
        program = RankProgram(job, placement, rank)
        nodes = program.build()
        reductions = [n for n in nodes if n.name.startswith("grads.dp_")]
        buckets = program.plan_buckets()
        if layout["dp"] == 1:
            assert not reductions
            continue
        assert len(reductions) == len(buckets), [n.name for n in reductions]
        width = DTYPE_BYTES[job.training.grad_reduce_dtype]
        sizes = sorted(NodeView(n).int("comm_size") for n in reductions)
        assert sizes == sorted(size * width for _, size in buckets)
        # each bucket has its own reduction, after every contribution to the bucket (buckets of
        # equal size in different chunks may reduce in either order: a perfect matching)
        graph = nx.Graph()
        for index, (units, size) in enumerate(buckets):
            for node in reductions:
                if NodeView(node).int("comm_size") != size * width:
                    continue
                before = ancestors(nodes, node.id)
                if all(c in before for unit in units for c in _contributions(nodes, unit)):
                    graph.add_edge(("bucket", index), ("reduction", node.id))
        matching = nx.bipartite.maximum_matching(graph, top_nodes=[("bucket", i) for i in range(len(buckets))]) \
            if graph.number_of_nodes() else {}
        matched = [i for i in range(len(buckets)) if ("bucket", i) in matching]
        assert len(matched) == len(buckets), f"rank {rank}: buckets {sorted(set(range(len(buckets))) - set(matched))} " \
                                             "have no reduction after all their gradients"


def _dp_group(name: str) -> str | None:
    """The data-parallel process group a collective runs on: dense buckets and parameters on one,
    expert buckets and parameters on the expert-data-parallel one."""
    if name.startswith(("grads.dp_", "params.dp_")):
        return "dp_cp"
    if name.startswith(("grads.edp_", "params.edp_")):
        return "edp"
    return None


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_a_data_parallel_groups_collectives_are_issued_one_after_another(layout):
    """One process group's collectives share one NCCL stream (PyTorch's ProcessGroupNCCL), so
    every gradient reduction and parameter all-gather of a group depends on the one before."""
    job = layout_job(layout)
    placement = Placement(job, 8)
    for rank in placement.representatives:
        nodes = RankProgram(job, placement, rank).build()
        by_group: dict[str, list[int]] = {}
        for node in nodes:
            group = _dp_group(node.name)
            if group is not None:
                by_group.setdefault(group, []).append(node.id)
        for group, ids in by_group.items():
            for earlier, later in zip(ids, ids[1:]):
                assert earlier in ancestors(nodes, later), (rank, group, nodes[earlier].name, nodes[later].name)


def test_a_ranks_data_parallel_collectives_never_overlap_in_time(tmp_path):
    """Simulated: with small buckets reduced during the backward pass and parameters gathered
    during the forward pass, no two data-parallel collectives of a rank's group are in flight at once."""
    job = spec(tp=1, pp=2, vp=2, dp=4, microbatches=4, distributed_optimizer=True, overlap_grad_reduce=True,
               overlap_param_gather=True, bucket_params=400_000).model_dump(mode="json")
    data = {"job": job, "workload": {"fold": "off"}, "output": {"dir": str(tmp_path / "out")},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    result = run.simulate(run.load(data, base_dir=tmp_path), timeline=True)
    assert result.intervals is not None
    spans: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for rank, _, name, _, _, start, end, _ in result.intervals:
        group = _dp_group(name)
        if group is not None:
            spans.setdefault((rank, group), []).append((start, end))
    assert spans and max(len(s) for s in spans.values()) > 4   # many buckets, so overlap was possible
    for key, intervals in spans.items():
        intervals.sort()
        for (_, end), (start, _) in zip(intervals, intervals[1:]):
            assert start >= end, key


def _dp_1_and_2(tmp_path: Path, **training: Any) -> tuple[dict[int, int], Counter[int], JobSpec]:
    """A TP 2 PP 4 job's step at DP 1 and 2 (unfolded, no chip-to-chip variation), and at DP 2 each
    rank's time in data-parallel collectives."""
    steps, per_rank = {}, Counter[int]()
    for dp in (1, 2):
        job = spec(tp=2, pp=4, dp=dp, microbatches=8, distributed_optimizer=True, **training)
        data = {"job": job.model_dump(mode="json"), "workload": {"fold": "off"},
                "output": {"dir": str(tmp_path / f"dp{dp}")}, "system": {"plugin": "nccl"},
                "compute": {"plugin": "achievable", "effects": {"gpu_variation": False}}}
        result = run.simulate(run.load(data, base_dir=tmp_path), timeline=True)
        steps[dp] = result.document["finish_ns"]
        assert result.intervals is not None
        for rank, _, name, _, _, start, end, _ in result.intervals if dp == 2 else ():
            if name.startswith(("grads.dp_", "params.dp_", "optimizer.grad_norm_all_reduce")):
                per_rank[rank] += end - start
    return steps, per_rank, job


@pytest.mark.parametrize("overlap", [True, False])
def test_changing_dp_alone_moves_a_step_by_no_more_than_its_dp_communication(tmp_path, overlap):
    """DP 1 -> 2 adds the DP reductions (and parameter gathers) of one replica, nothing more: the
    rise is bounded by the time the pipeline's stages spend in DP collectives, each stage's slowest
    rank once (timeline, unfolded): without interleaving Megatron-Core all-gathers a stage's first
    parameter bucket when its first forward starts, so those gathers line up along the pipeline's
    fill; everything else is at most the slowest rank's.
    Chip-to-chip variation is switched off: twice the GPUs are expected to hold a slower one,
    which slows the step on purpose (test_effects in the compute plugin checks that)."""
    steps, per_rank, job = _dp_1_and_2(tmp_path, overlap_grad_reduce=overlap, overlap_param_gather=overlap)
    stage = {r: Placement(job, 8).coord(r).pp for r in per_rank}
    dp_time = sum(max(t for r, t in per_rank.items() if stage[r] == s) for s in set(stage.values()))
    assert dp_time > 0
    assert steps[1] <= steps[2] <= steps[1] + dp_time, (steps, dp_time)


def _first_gathers(job: JobSpec) -> dict[int, tuple[pb.Node, bool]]:
    """Per pipeline stage (its first rank), its first parameter all-gather and whether a received
    activation is among its ancestors."""
    placement = Placement(job, 8)
    out = {}
    for rank in placement.representatives:
        stage = placement.coord(rank).pp
        if stage in out:
            continue
        nodes = RankProgram(job, placement, rank).build()
        gather = next(n for n in nodes if n.name.startswith("params.dp_all_gather"))
        out[stage] = gather, any(nodes[a].type == pb.COMM_RECV_NODE for a in ancestors(nodes, gather.id))
    return out


@pytest.mark.parametrize("start", ["first_forward", "step_start"])
def test_a_stages_first_parameter_gather_starts_as_its_megatron_release_starts_it(start):
    """Megatron-Core 0.9 and later launch a stage's first bucket at its first forward, after the
    stage has received its first activation; 0.6 to 0.8 launched it in zero_grad, at the step's
    start on every stage (param_gathers.py)."""
    job = spec(tp=1, pp=4, dp=2, microbatches=8, distributed_optimizer=True, overlap_grad_reduce=True,
               overlap_param_gather=True, param_gather_start=start)
    gathers = _first_gathers(job)
    assert sorted(gathers) == [0, 1, 2, 3]
    assert not gathers[0][1]   # the first stage receives nothing before its first forward
    for stage in (1, 2, 3):
        assert gathers[stage][1] == (start == "first_forward"), (stage, gathers[stage][0].name)


def test_gathers_at_the_steps_start_leave_dp_outside_the_pipelines_fill(tmp_path):
    """With the first buckets gathered at the step's start, the later stages' gathers run while
    they wait for their first activation: DP 1 -> 2 moves the step by no more than the slowest
    rank's time in DP collectives (with first_forward the gathers line up along the fill: the
    bound above sums the stages)."""
    steps, per_rank, _ = _dp_1_and_2(tmp_path, param_gather_start="step_start")
    dp_time = max(per_rank.values())
    assert dp_time > 0
    assert steps[1] <= steps[2] <= steps[1] + dp_time, (steps, dp_time)


def _scaled_profile(tmp_path: Path, name: str, section: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"extends": PROFILE, "description": f"test: {name} doubled", **section}))
    return str(path)


DOUBLED = {
    "nic": {"network": {"nic_gbits": {"value": 800, "source": "test: 2 x 400"}}},
    "nvlink": {"gpu": {"nvlink_gbps": {"value": 900, "source": "test: 2 x 450"}}},
    "hbm": {"gpu": {"memory_bandwidth_gbps": {"value": 6700, "source": "test: 2 x 3350"},
                    "achievable": {"hbm_gbps": {"value": 4932, "source": "test: 2 x 2466"}}}},
}


@pytest.mark.parametrize("what", sorted(DOUBLED))
def test_doubling_any_bandwidth_never_slows_a_step(tmp_path, what):
    profile = _scaled_profile(tmp_path, what, DOUBLED[what])
    for overlap in (True, False):
        job = spec(tp=2, pp=2, vp=2, dp=4, microbatches=4, overlap_grad_reduce=overlap,
                   overlap_param_gather=overlap).model_dump(mode="json")
        steps = []
        for name in (PROFILE, profile):
            data = {"job": {**job, "cluster": {**job["cluster"], "profile": name}},
                    "output": {"dir": str(tmp_path / f"{what}-{overlap}-{len(steps)}")},
                    "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
            steps.append(run.simulate(run.load(data, base_dir=tmp_path)).document["finish_ns"])
        assert steps[1] <= steps[0], (what, overlap, steps)


def test_every_collective_a_job_emits_is_counted_once_in_the_bytes(tmp_path):
    """Per rank, the run's bytes by collective type equal the comm_size of the trace's
    collectives and messages, each counted once (unfolded, so every rank is simulated)."""
    job = spec(tp=2, pp=2, vp=2, dp=2, microbatches=4, overlap_grad_reduce=False).model_dump(mode="json")
    data = {"job": job, "workload": {"fold": "off"}, "output": {"dir": str(tmp_path / "out")},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    config = run.load(data, base_dir=tmp_path)
    results = run.simulate(config).document
    placement = Placement(JobSpec.model_validate(job), 8)
    for row in results["ranks"]:
        expected: Counter[str] = Counter()
        for node in RankProgram(JobSpec.model_validate(job), placement, row["rank"]).build():
            view = NodeView(node)
            if node.type == pb.COMM_COLL_NODE:
                expected[COLL_NAMES[view.int("comm_type")]] += view.int("comm_size")
            elif node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                expected["SEND" if node.type == pb.COMM_SEND_NODE else "RECV"] += view.int("comm_size")
        assert row["comm_bytes_by_type"] == dict(expected), row["rank"]


def test_a_long_sequence_step_never_reports_a_rate_above_the_compute_models_own(tmp_path):
    """At long sequences attention dominates: counted as the full s x s matrix (NeMo's formula)
    the rate would pass the fastest rate any kernel runs at; the reported count is causal."""
    job = spec(tp=1, pp=1, dp=1, microbatches=1, model={**SMALL, "layers": 2}).model_dump(mode="json")
    job["training"]["seq"] = 65536
    data = {"job": job, "output": {"dir": str(tmp_path / "long")},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    training = run.simulate(run.load(data, base_dir=tmp_path)).document["training"]
    ceiling = training["rate_ceiling_tflops"]
    assert 0 < ceiling <= 794.5   # the H100's bf16 MAMF (profile h100-hgx-ndr400)
    assert training["tflops_per_gpu"] <= ceiling
    assert training["tflops_per_gpu"] == training["tflops_per_gpu_by_formula"]["megatron_bridge"]
    assert training["tflops_per_gpu_by_formula"]["nemo"] > 1.8 * training["tflops_per_gpu"]
    assert "causal" in training["flops_formula"]
