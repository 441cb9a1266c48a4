"""MoE communication overlaps (issue 34): the combined 1F1B schedule that runs one micro-batch's forward
beside another's backward (--overlap-moe-expert-parallel-comm, --delay-wgrad-compute) and shared
experts beside the dispatcher (--moe-shared-expert-overlap). The same kernels and collectives as the
blocking step, in Megatron's order, on their streams; a step no slower, its exposed all-to-alls
smaller; every collective matched; a folded run equal to an unfolded one; Megatron's refusals."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest

from chakra_core import run
from chakra_core.et.attrs import NodeView
from chakra_core.jobs.moe_overlap import combined_phases
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.schedule import stage_schedule
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb
from tests.simhelpers import job_folded_and_unfolded
from tests.test_moe import MOE, PROFILE, nodes_of

A2A = {"overlap_moe_expert_parallel_comm": True}
A2A_DELAYED = {**A2A, "delay_wgrad_compute": True}
SHARED = {"moe_shared_expert_overlap": True}


def spec_of(overlap: dict[str, bool], model: dict[str, Any] | None = None, tp: int = 1, pp: int = 1,
            vp: int | None = None, dp: int = 4, ep: int = 4, microbatches: int = 4, **training: Any) -> JobSpec:
    parallel: dict[str, Any] = {"tp": tp, "pp": pp, "ep": ep, "etp": 1, **overlap}
    if vp is not None:
        parallel["vp"] = vp
    return JobSpec.model_validate({
        "name": "moe", "model": model or MOE, "parallel": parallel,
        "training": {"seq": 1024, "global_batch": microbatches * dp, "micro_batch": 1, **training},
        "cluster": {"gpus": tp * pp * dp, "profile": PROFILE}})


def simulate(spec: JobSpec, tmp_path: Any, name: str) -> Any:
    data = {"job": spec.model_dump(mode="json"), "output": {"dir": str(tmp_path / name)},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    step = run.simulate(run.load(data, base_dir=tmp_path)).results.training
    assert step is not None
    return step


def comm_signature(nodes: list[pb.Node]) -> Counter[tuple[str, int, int]]:
    """What a rank's communication moves: (group or peer, type, bytes) of every collective and message."""
    out: Counter[tuple[str, int, int]] = Counter()
    for node in nodes:
        view = NodeView(node)
        if node.type == pb.COMM_COLL_NODE:
            out[view.str("pg_name"), view.int("comm_type"), view.int("comm_size")] += 1
        elif node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            out[f"{view.int('comm_src')}->{view.int('comm_dst')}", node.type, view.int("comm_size")] += 1
    return out


def kernels(nodes: list[pb.Node]) -> Counter[tuple[str, tuple[bytes, ...]]]:
    return Counter((n.name, tuple(a.SerializeToString() for a in n.attr)) for n in nodes if n.type == pb.COMP_NODE)


def ancestors(nodes: list[pb.Node], node_id: int) -> set[int]:
    seen: set[int] = set()
    todo = [node_id]
    while todo:
        for parent in nodes[todo.pop()].data_deps:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def index(nodes: list[pb.Node]) -> dict[str, int]:
    return {node.name: node.id for node in nodes}


# The schedule ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("stage", "pp", "vp", "m"), [(0, 1, 1, 4), (0, 2, 2, 4), (1, 2, 2, 4), (0, 4, 2, 8),
                                                      (3, 4, 2, 8), (1, 2, 24, 32)])
def test_steady_state_merges_each_forward_with_the_backward_after_it(stage, pp, vp, m):
    """Warm-up forwards alone (one more than without the overlap), then (forward, backward) pairs in
    1F1B's order, then the cool-down backwards; every pass once, and the two passes of a pair are
    different micro-batches or chunks (get_pp_rank_microbatches' extra warm-up step)."""
    phases = combined_phases(stage, pp, vp, m)
    flat = [("F", *f) for f, _ in phases if f] + [("B", *b) for _, b in phases if b]
    assert sorted(flat) == sorted(stage_schedule(stage, pp, vp, m))
    merged = [(f, b) for f, b in phases if f and b]
    assert all(f != b for f, b in merged)
    alone = [f for f, b in phases if not b]
    assert len(alone) == (min(1, m) if pp == 1 else min(2 * (pp - stage - 1) + (vp - 1) * pp + 1, m * vp))
    kinds = "".join("M" if f and b else "F" if f else "B" for f, b in phases)
    assert kinds == "F" * len(alone) + "M" * len(merged) + "B" * len(alone)


def test_without_pipelining_the_first_forward_and_the_last_backward_run_alone():
    """combined_1f1b_schedule_for_no_pipelining: F0, (F1, B0), (F2, B1), (F3, B2), B3."""
    assert combined_phases(0, 1, 1, 4) == [((0, 0), None), ((1, 0), (0, 0)), ((2, 0), (1, 0)), ((3, 0), (2, 0)),
                                           (None, (3, 0))]


# The same work, moved ---------------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [A2A, A2A_DELAYED, SHARED])
@pytest.mark.parametrize("layout", [{"pp": 1}, {"pp": 2, "vp": 2, "dp": 2, "ep": 2}, {"tp": 2, "dp": 2, "ep": 4}])
def test_the_overlap_moves_work_but_keeps_every_kernel_and_every_byte(overlap, layout):
    """Each rank writes the same kernels (names and attributes) and moves the same bytes over the
    same groups with and without the overlap, except that shared experts overlapped with TP keep
    their gathered input and skip the backward's all-gather of it (a plain linear's input)."""
    model = {**MOE, "shared_expert_ffn": 1024, "dense_layers_first": 1}
    plain, overlapped = spec_of({}, model, **layout), spec_of(overlap, model, **layout)
    for rank in range(plain.cluster.gpus):
        before, after = nodes_of(plain, rank), nodes_of(overlapped, rank)
        assert kernels(before) == kernels(after)
        moved, moved_after = comm_signature(before), comm_signature(after)
        if overlap is SHARED and layout.get("tp", 1) > 1:
            regathers = sum(1 for n in before if n.name.endswith("shared.fc1.tp_all_gather_input"))
            assert regathers == plain.microbatches * 3   # one per MoE layer and micro-batch
            gather = next(k for k in moved if k[1] == pb.ALL_GATHER and k[0].startswith("tp"))
            moved[gather] -= regathers
        assert moved == moved_after


@pytest.mark.parametrize("overlap", [A2A_DELAYED, SHARED])
def test_every_collective_meets_the_same_collective_on_every_member(overlap):
    spec = spec_of(overlap, {**MOE, "shared_expert_ffn": 1024}, tp=2, pp=2, vp=2, dp=2, ep=2)
    placement = Placement(spec, 8)
    seen: dict[tuple[int, ...], set[tuple[tuple[int, int], ...]]] = defaultdict(set)
    for rank in range(spec.cluster.gpus):
        names = {Placement.group_name(role, members): members for role, members in placement.groups(rank).items()}
        calls: dict[tuple[int, ...], list[tuple[int, int]]] = defaultdict(list)
        for node in nodes_of(spec, rank):
            if node.type == pb.COMM_COLL_NODE:
                view = NodeView(node)
                calls[names[view.str("pg_name")]].append((view.int("comm_type"), view.int("comm_size")))
        for members, sequence in calls.items():
            seen[members].add(tuple(sequence))
    assert seen and all(len(sequences) == 1 for sequences in seen.values())


# Megatron's order and streams ---------------------------------------------------------------------------
def test_a_merged_layer_pair_runs_in_megatrons_order_on_its_streams():
    """Without pipelining, micro-batch 1's forward of layer 0 beside micro-batch 0's backward of
    layer 3 (TransformerLayerSchedulePlan.run): combine.bwd | pre_dispatch.fwd | mlp.bwd | dispatch.fwd |
    mlp.bwd_dw | dispatch.bwd | mlp.fwd | combine.fwd | pre_dispatch.bwd | pre_dispatch.bwd_dw; each
    all-to-all depends on nothing of the other micro-batch's compute it runs beside."""
    nodes = nodes_of(spec_of(A2A_DELAYED), 0)
    at = index(nodes)
    order = ["mb0.L3.moe.combine.bwd.ep_all_to_all", "mb1.L0.norm1", "mb0.L3.moe.fc2.dgrad",
             "mb1.L0.moe.dispatch.ep_all_to_all", "mb0.L3.moe.fc2.wgrad", "mb0.L3.moe.fc1.wgrad",
             "mb0.L3.moe.dispatch.bwd.ep_all_to_all", "mb1.L0.moe.fc1", "mb1.L0.moe.combine.ep_all_to_all",
             "mb0.L3.norm1.bwd", "mb0.L3.qkv.wgrad", "mb0.L3.proj.wgrad"]
    assert [at[name] for name in order] == sorted(at[name] for name in order)
    dispatch_bwd = ancestors(nodes, at["mb0.L3.moe.dispatch.bwd.ep_all_to_all"])
    assert at["mb0.L3.moe.fc1.dgrad"] in dispatch_bwd and at["mb0.L3.moe.fc1.wgrad"] not in dispatch_bwd
    assert at["mb1.L0.moe.fc1"] not in dispatch_bwd                  # the forward's experts run beside it
    assert at["mb0.L3.moe.fc2.dgrad"] not in ancestors(nodes, at["mb1.L0.moe.dispatch.ep_all_to_all"])
    assert at["mb1.L0.attention"] not in ancestors(nodes, at["mb0.L3.moe.combine.bwd.ep_all_to_all"])


def test_delayed_weight_gradients_keep_their_tensors_alive():
    """A delayed wgrad GEMM reads what the backward saved for it (the ledger lists it there)."""
    data = spec_of(A2A_DELAYED).model_dump(mode="json")
    nodes = nodes_of(JobSpec.model_validate({**data, "tensors": True}), 0)
    wgrad = next(n for n in nodes if n.name == "mb0.L3.moe.fc1.wgrad")
    assert wgrad.inputs.values and "mb0.L3.moe.fc1.wgrad" not in [n.name for n in nodes[:wgrad.id]]


def test_shared_experts_run_beside_the_all_to_alls():
    """The shared fc1 waits for the permutation, not for the dispatch all-to-all it runs beside; fc2
    waits for the routed experts, not for the combine all-to-all; the block's output waits for it."""
    nodes = nodes_of(spec_of(SHARED, {**MOE, "shared_expert_ffn": 1024}, tp=2, dp=2), 0)
    at = index(nodes)
    fc1 = ancestors(nodes, at["mb0.L0.shared.fc1"])
    assert at["mb0.L0.moe.permute"] in fc1 and at["mb0.L0.moe.dispatch.ep_all_to_all"] not in fc1
    fc2 = ancestors(nodes, at["mb0.L0.shared.fc2"])
    assert at["mb0.L0.moe.fc2"] in fc2 and at["mb0.L0.moe.combine.ep_all_to_all"] not in fc2
    assert at["mb0.L0.shared.fc2.tp_reduce_scatter"] in ancestors(nodes, at["mb0.L0.moe.add_shared"])
    fc1_bwd = ancestors(nodes, at["mb0.L0.shared.fc1.dgrad"])
    assert at["mb0.L0.moe.fc1.wgrad"] in fc1_bwd and at["mb0.L0.moe.dispatch.bwd.ep_all_to_all"] not in fc1_bwd


# The step ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("overlap", "layout"), [(A2A_DELAYED, {}), (A2A, {}),
                                                 (A2A_DELAYED, {"pp": 2, "vp": 2, "dp": 2, "ep": 2}),
                                                 (SHARED, {"tp": 2, "dp": 2})])
def test_the_overlapped_step_is_no_slower_and_hides_the_all_to_alls(tmp_path, overlap, layout):
    model = {**MOE, "shared_expert_ffn": 1024} if overlap is SHARED else MOE
    blocking = simulate(spec_of({}, model, **layout), tmp_path, "blocking")
    overlapped = simulate(spec_of(overlap, model, **layout), tmp_path, "overlapped")
    assert overlapped.step_time_s <= blocking.step_time_s
    if overlap is not SHARED:
        share = {name: step.breakdown_s["exposed_ep"] / step.step_time_s
                 for name, step in (("blocking", blocking), ("overlapped", overlapped))}
        assert share["overlapped"] < share["blocking"]
    assert sum(overlapped.breakdown_s.values()) == pytest.approx(overlapped.step_time_s, rel=1e-9)


@pytest.mark.parametrize("overlap", [A2A_DELAYED, SHARED])
def test_a_folded_run_equals_every_rank_simulated(tmp_path, overlap):
    model = {**MOE, "shared_expert_ffn": 1024, "dense_layers_first": 1}
    spec = spec_of(overlap, model, tp=2, pp=2, vp=2, dp=2, ep=2).model_dump(mode="json")
    finish = job_folded_and_unfolded(spec, tmp_path)
    assert finish["auto"] == finish["off"]


# Settings ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("parallel", "training", "message"), [
    ({"pp": 2, **A2A}, {}, "with pp > 1 needs parallel.vp > 1"),
    ({"ep": 1, **A2A}, {}, "overlap_moe_expert_parallel_comm needs parallel.ep > 1"),
    (A2A, {"recompute": "full"}, "needs training.recompute other than full"),
    ({**A2A, **SHARED}, {}, "exclude each other"),
    ({"delay_wgrad_compute": True}, {}, "delay_wgrad_compute needs parallel.overlap_moe_expert_parallel_comm"),
    ({"tp": 2, "tp_comm_overlap": True, **A2A_DELAYED}, {}, "does not delay weight gradients with userbuffers"),
])
def test_validation_refuses_what_megatron_refuses(parallel, training, message):
    data: dict[str, Any] = {"name": "moe", "model": MOE, "parallel": {"ep": 2, **parallel},
                            "training": {"seq": 1024, "global_batch": 8, **training},
                            "cluster": {"gpus": 4, "profile": PROFILE}}
    with pytest.raises(ValueError, match=message):
        JobSpec.model_validate(data)


def test_a_dense_model_has_no_overlaps_to_set_and_defaults_echo_nothing():
    dense = {key: MOE[key] for key in ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab")}
    with pytest.raises(ValueError, match="parallel.moe_shared_expert_overlap needs a mixture of experts"):
        JobSpec.model_validate({"model": dense, "parallel": SHARED, "training": {"seq": 1024, "global_batch": 1},
                                "cluster": {"gpus": 1, "profile": PROFILE}})
    dumped = spec_of({}).model_dump(mode="json")["parallel"]
    assert not set(A2A_DELAYED) & set(dumped) and "moe_shared_expert_overlap" not in dumped
    assert spec_of(A2A_DELAYED).model_dump(mode="json")["parallel"]["delay_wgrad_compute"] is True
