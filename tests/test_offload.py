"""Activation offload (`training.cpu_offloading_num_layers`, chakra_core.jobs.offload): the copies
follow Transformer Engine's default schedule, bytes are conserved, the copies never make a step
faster and cost nothing on an unbounded link, memory falls by the layers offloaded, folding holds,
and what Megatron-Core refuses is refused."""

from __future__ import annotations

import copy
import csv
import io
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chakra_core import run
from chakra_core.errors import ManifestError
from chakra_core.jobs.fsdp import rank_program
from chakra_core.jobs.offload import OFFLOAD_MIN_ELEMENTS
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import JobSpec
from chakra_core.plan.memory import layer_activations, predict_memory
from chakra_core.schema import pb
from tests.test_moe_overlap import ancestors

MODEL = {"layers": 6, "hidden": 1024, "ffn_hidden": 2816, "heads": 8, "kv_heads": 4, "vocab": 8000}


def job(k: int, gpus: int = 2, model: dict[str, Any] | None = None, **training: Any) -> dict[str, Any]:
    parallel, profile = training.pop("parallel", {}), training.pop("profile", "h100-hgx-ndr400")
    return {"name": "offload", "model": model or dict(MODEL), "parallel": parallel,
            "training": {"seq": 2048, "global_batch": 4, "cpu_offloading_num_layers": k, **training},
            "cluster": {"gpus": gpus, "profile": profile}}


def nodes(data: dict[str, Any]) -> list[pb.Node]:
    spec = JobSpec.model_validate(data)
    return rank_program(spec, Placement(spec, 8), 0).build()


HBM = {"plugin": "hbm", "track_tensors": False}


def simulate(tmp_path: Path, data: dict[str, Any], memory: dict[str, Any] | None = None,
             fold: str = "auto") -> dict[str, Any]:
    manifest = {"job": copy.deepcopy(data), "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                "workload": {"fold": fold}, "output": {"dir": str(tmp_path)}, "memory": memory or HBM}
    return run.simulate(run.load(manifest, base_dir=tmp_path)).document


def _size(node: pb.Node) -> int:
    return next(a.uint64_val for a in node.attr if a.name == "tensor_size")


def _kernels(trace: list[pb.Node], prefix: str, part: str) -> list[pb.Node]:
    return [n for n in trace if n.name.startswith(prefix) and n.type == pb.COMP_NODE
            and any(a.name == "step_part" and a.string_val == part for a in n.attr)]


def _first(trace: list[pb.Node], prefix: str, part: str = "forward") -> pb.Node:
    return _kernels(trace, prefix, part)[0]


def _last(trace: list[pb.Node], prefix: str, part: str = "forward") -> pb.Node:
    return _kernels(trace, prefix, part)[-1]


# The schedule ---------------------------------------------------------------------------------------
def test_copies_follow_transformer_engines_default_schedule():
    """L = 6, k = 2, two micro-batches: each large tensor layers 0 and 1 save is copied out after the
    kernel that made it; the forward of layer L-k+i waits for layer i's last copy (not the layer
    before it); layer i's tensors come back, in the order they were saved, when the backward of layer
    L-1-k+i starts; a backward kernel that reads a reloaded tensor waits for its copy; one offload
    stream carries every copy in turn."""
    trace = nodes(job(2))
    copies = [n for n in trace if n.type in (pb.MEM_STORE_NODE, pb.MEM_LOAD_NODE)]
    for before, after in zip(copies, copies[1:]):      # one stream
        assert before.id in after.data_deps
    for n in copies:
        assert {a.name: a.string_val for a in n.attr if a.name == "mem_location"} == {"mem_location": "remote"}
    order = [re.sub(r"\.L(\d+)\..*\.(offload|reload)$", r".L\1.\2", n.name) for n in copies]
    runs = [name for i, name in enumerate(order) if i == 0 or name != order[i - 1]]
    assert runs == ["mb0.L0.offload", "mb0.L1.offload", "mb0.L1.reload", "mb0.L0.reload",
                    "mb1.L0.offload", "mb1.L1.offload", "mb1.L1.reload", "mb1.L0.reload"]
    by_id = {n.id: n for n in trace}
    for mb in range(2):
        for i in range(2):
            stores = [n for n in copies if n.name.startswith(f"mb{mb}.L{i}.") and n.name.endswith(".offload")]
            loads = [n for n in copies if n.name.startswith(f"mb{mb}.L{i}.") and n.name.endswith(".reload")]
            assert [n.name[:-len("offload")] for n in stores] == [n.name[:-len("reload")] for n in loads]
            for store in stores:   # after the forward kernel of layer i that made the tensor (and the last copy)
                made = [by_id[d] for d in store.data_deps if by_id[d].type == pb.COMP_NODE]
                assert len(made) == 1 and made[0].name.startswith(f"mb{mb}.L{i}.")
            forward = _first(trace, f"mb{mb}.L{6 - 2 + i}.")
            assert stores[-1].id in ancestors(trace, forward.id)                        # finish_offload_map
            assert stores[-1].id not in ancestors(trace, _first(trace, f"mb{mb}.L{6 - 2 + i - 1}.").id)
            started = _last(trace, f"mb{mb}.L{6 - 1 - 2 + i + 1}.", "backward")   # the backward before
            assert all(started.id in load.data_deps for load in loads)              # start_reload_map
            readers = [n for n in _kernels(trace, f"mb{mb}.L{i}.", "backward") if set(n.data_deps) & {x.id for x in loads}]
            assert {d for n in readers for d in n.data_deps} >= {x.id for x in loads}   # pop_tensor
            assert not set(_first(trace, f"mb{mb}.L{i}.", "backward").data_deps) & {x.id for x in loads[:-1]}


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 5), micro=st.integers(1, 3), tp=st.sampled_from([1, 2]), fp8=st.booleans(),
       fsdp=st.booleans())
def test_bytes_are_conserved(k, micro, tp, fp8, fsdp):
    """Every micro-batch copies each offloaded layer's large saved tensors out once and back once: the
    same bytes each way, the same for every layer of a dense model, and what the layer's backward reads."""
    data = job(k, gpus=2 * tp, global_batch=2 * micro, parallel={"tp": tp}, precision="fp8" if fp8 else "bf16",
               use_megatron_fsdp=fsdp)
    trace = nodes(data)
    per_layer: dict[str, list[int]] = {}
    for n in trace:
        if n.type in (pb.MEM_STORE_NODE, pb.MEM_LOAD_NODE):
            per_layer.setdefault(".".join(n.name.split(".")[:2]) + n.name[n.name.rindex("."):], []).append(_size(n))
    assert len(per_layer) == 2 * k * micro
    for name, sizes in per_layer.items():
        if name.endswith(".offload"):
            assert sizes == per_layer[name[:-len(".offload")] + ".reload"][::-1] or \
                sorted(sizes) == sorted(per_layer[name[:-len(".offload")] + ".reload"])
    # every saved tensor of this model is at least 256 Ki elements: the layer's whole activations
    spec = JobSpec.model_validate(data)
    assert 2048 * 1024 // (2 * tp) >= OFFLOAD_MIN_ELEMENTS
    assert {sum(sizes) for sizes in per_layer.values()} == {layer_activations(spec)}


# Time and memory ------------------------------------------------------------------------------------
def test_copies_never_speed_a_step_and_cost_nothing_on_an_unbounded_link(tmp_path):
    base = simulate(tmp_path / "none", job(0))["training"]["step_time_s"]
    free = {"plugin": "hbm", "memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-bw": 1e9, "track_tensors": False}
    assert simulate(tmp_path / "free", job(4), free)["training"]["step_time_s"] == base
    steps = [simulate(tmp_path / f"k{k}", job(k))["training"] for k in range(6)]
    assert all(s["step_time_s"] >= base for s in steps)
    slow = {**free, "remote-mem-bw": 8}
    slowed = simulate(tmp_path / "slow", job(4), slow)["training"]
    assert slowed["step_time_s"] > steps[4]["step_time_s"]
    assert slowed["breakdown_s"]["offload"] > 0
    assert sum(slowed["breakdown_s"].values()) == pytest.approx(slowed["step_time_s"], rel=1e-9)


def test_the_memory_layer_gets_the_profiles_host_link(tmp_path):
    """A memory layer that does not say where remote accesses go gets host memory per GPU at
    pcie_gbps (H100) or the NVLink-C2C host link (GB200); the copies' bytes are in its statistics.
    What the job says is kept."""
    for profile, gbps in (("h100-hgx-ndr400", 64.0), ("gb200-nvl72", 450.0)):
        doc = simulate(tmp_path / profile, job(2, profile=profile))
        summary = doc["layers"]["memory"]["summary"]
        assert summary["memory_type"] == "PER_NPU_MEMORY_EXPANSION"
        assert summary["bytes_stored"] == summary["bytes_loaded"] > 0
        assert doc["manifest"]["memory"]["remote_mem_bw"] == gbps
    own = {**HBM, "memory_type": "PER_NODE_MEMORY_EXPANSION", "num-npus-per-node": 2, "remote_mem_bw": 20}
    doc = simulate(tmp_path / "own", job(2), own, fold="off")   # a per-node expansion does not fold
    assert doc["manifest"]["memory"]["memory_type"] == "PER_NODE_MEMORY_EXPANSION"
    assert doc["manifest"]["memory"]["remote_mem_bw"] == 20


def test_a_job_that_offloads_names_its_memory_layer(tmp_path):
    manifest = {"job": job(2), "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                "output": {"dir": str(tmp_path)}}
    with pytest.raises(ManifestError, match=r"memory: required: .*cpu_offloading_num_layers.*64 GB/s host link"):
        run.load(manifest, base_dir=tmp_path)


def test_folded_equals_unfolded(tmp_path):
    data = job(3, gpus=4, global_batch=8, use_megatron_fsdp=True)
    folded = simulate(tmp_path / "folded", data)
    unfolded = simulate(tmp_path / "unfolded", data, fold="off")
    assert folded["folding"]["simulated_ranks"] < 4
    assert folded["training"]["step_time_s"] == unfolded["training"]["step_time_s"]
    assert folded["layers"]["memory"]["summary"]["bytes_stored"] == \
        unfolded["layers"]["memory"]["summary"]["bytes_stored"]


@pytest.mark.parametrize("fsdp", [False, True])
def test_memory_falls_by_one_layer_per_layer_offloaded(fsdp):
    """At most L-k layers' activations are on the GPU: with the distributed optimizer the predicted
    peak falls by a layer's activations for every layer offloaded, and nothing else changes; under
    Megatron-FSDP the peak (activations and transient buffers, wherever it falls) never rises and
    falls by at most a layer."""
    estimates = [predict_memory(JobSpec.model_validate(job(k, use_megatron_fsdp=fsdp))) for k in range(6)]
    layer = layer_activations(JobSpec.model_validate(job(0)))
    for before, after in zip(estimates, estimates[1:]):
        if fsdp:
            assert 0 <= before.total - after.total <= layer
        else:
            assert before.activations - after.activations == layer
            assert before.total - before.activations == after.total - after.activations
    assert estimates[-1].total < estimates[0].total


# Refused --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("training, words", [
    ({"cpu_offloading_num_layers": 6}, "must be less than the model's 6 layers"),
    ({"parallel": {"pp": 2}}, "needs pp 1"),
    ({"recompute": "selective"}, "needs recompute none"),
])
def test_what_megatron_refuses_is_refused(training, words):
    data = job(2, gpus=4, **{k: v for k, v in training.items() if k != "cpu_offloading_num_layers"})
    data["training"]["cpu_offloading_num_layers"] = training.get("cpu_offloading_num_layers", 2)
    with pytest.raises(ValidationError, match=words):
        JobSpec.model_validate(data)


OFFLOAD_MEMORY_CASES = {
    "dist-opt-k2": job(2),
    "dist-opt-k5-mbs2-fp8": job(5, micro_batch=2, global_batch=8, precision="fp8"),
    "dist-opt-k3-tp2": job(3, gpus=4, global_batch=8, parallel={"tp": 2}),
    "fsdp-k3-tp2": job(3, gpus=4, global_batch=4, parallel={"tp": 2}, use_megatron_fsdp=True),
    "fsdp-zero2-k4-dropout": job(4, use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads",
                                 dropout=0.1, suggested_communication_unit_size=3_000_000),
}


@pytest.mark.parametrize("case", sorted(OFFLOAD_MEMORY_CASES))
def test_the_simulated_peak_is_the_prediction(tmp_path, case):
    """With the traces' tensors listed, an offloaded tensor's GPU storage ends with its copy out (and
    the work queued before the layer L-k+i that frees it) and its copy back is a new storage: the hbm
    layer's peak is plan.memory's prediction, exactly, with the distributed optimizer. Under
    Megatron-FSDP the prediction counts a reload from the start of the backward that queues it, beside
    that layer's gathered and unsharded buffers; a reload that waits for the offload stream starts
    later, so the simulated peak may be lower, by less than a layer's activations. Each copy's bytes
    are those of the storages it lists."""
    data = {**OFFLOAD_MEMORY_CASES[case], "tensors": True}
    document = simulate(tmp_path, data, {"plugin": "hbm"})
    simulated = document["layers"]["memory"]["summary"]["peak_memory_bytes"]
    predicted = predict_memory(JobSpec.model_validate(data)).total
    if data["training"].get("use_megatron_fsdp"):
        assert 0 <= predicted - simulated < layer_activations(JobSpec.model_validate(data))
    else:
        assert simulated == predicted
    for node in nodes(data):
        if node.type in (pb.MEM_STORE_NODE, pb.MEM_LOAD_NODE):
            listed = (node.inputs if node.type == pb.MEM_STORE_NODE else node.outputs).values
            tensors = eval(listed)   # [[tensor, storage, offset, elements, element size, device], ...]
            assert sum(t[3] * t[4] for t in tensors) == _size(node) > 0


# In the plan -----------------------------------------------------------------------------------------
def test_plan_tries_a_layout_that_does_not_fit_with_the_fewest_layers_offloaded(tmp_path):
    """`plan --offload`: each pp 1 layout without recomputation that overflows comes back with the
    smallest k that makes it fit (k - 1 does not); the others get no variant; a variant is ranked and
    simulated like any layout, and its step is never below the same layout's bound."""
    from chakra_core.plan.layouts import job_with
    from chakra_core.plan.memory import overflow
    from chakra_core.plan.search import SIMULATED, TOO_BIG, PlanOptions, plan
    from chakra_core.sweep.run import Execution
    data = {"job": {"name": "p", "model": "llama3-8b", "training": {"seq": 16384, "global_batch": 8},
                    "cluster": {"gpus": 8, "profile": "h100-hgx-ndr400"}},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}, "memory": HBM}
    search = {"micro_batches": (1,), "recompute": ("none", "full"), "distributed_optimizer": (True,), "max_cp": 2,
              "offload": True}
    found = plan(data, tmp_path, tmp_path / "out", PlanOptions(top=2, batch=4, search=search), Execution(workers=1))
    variants = [c for c in found.candidates if c.layout.offload]
    assert variants and all(c.layout.pp == 1 and c.layout.recompute == "none" for c in variants)
    usable = found.usable_bytes
    for c in variants:
        assert c.status != TOO_BIG and c.memory.total + c.reserve.total <= usable
        fewer = dataclasses.replace(c.layout, offload=c.layout.offload - 1)
        spec = job_with(data["job"], fewer)
        estimate = predict_memory(spec)
        assert overflow(estimate, usable, found.headroom.reserve(fewer, estimate.total).total) is not None
        original = next(o for o in found.candidates if o.layout == dataclasses.replace(c.layout, offload=0))
        assert original.status == TOO_BIG
    assert not any(c.layout.offload for c in found.candidates
                   if dataclasses.replace(c.layout, offload=0) in {o.layout for o in found.candidates
                                                                    if o.status != TOO_BIG and not o.layout.offload})
    simulated = [c for c in variants if c.status == SIMULATED]
    assert all(c.step_s is not None and c.step_s >= c.bound_s * (1 - 1e-9) for c in simulated)
    from chakra_core.plan.report import plan_files
    table = list(csv.DictReader(io.StringIO(str(plan_files(found, {})["plan.csv"]))))   # each k in its column
    assert {(row["layout"], row["offload"]) for row in table if row["offload"]} == \
        {(c.layout.label(), str(c.layout.offload)) for c in variants}


def test_a_layer_that_names_a_key_by_its_field_name_keeps_its_value():
    """The cluster's defaults go where the layer's config takes them and the section says nothing,
    under the key's alias or its field name (both at once would be refused as an unknown key)."""
    from chakra_core.jobs.expand import with_cluster_defaults
    from chakra_sim_memory_hbm.config import HBMConfig
    from chakra_sim_system_nccl.layer import NcclSystemConfig
    filled = with_cluster_defaults(NcclSystemConfig, {"plugin": "nccl", "gpus_per_node": 4},
                                   {"profile": "h100-hgx-ndr400", "gpus-per-node": 8})
    assert filled == {"profile": "h100-hgx-ndr400", "plugin": "nccl", "gpus_per_node": 4}
    host = {"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-bw": 64.0}
    assert with_cluster_defaults(HBMConfig, {"plugin": "hbm", "memory_type": "MEMORY_POOL"}, host, any_key=True) == \
        {"remote-mem-bw": 64.0, "plugin": "hbm", "memory_type": "MEMORY_POOL"}
    assert with_cluster_defaults(HBMConfig, {"plugin": "hbm"}, host) == {"plugin": "hbm"}   # not required
