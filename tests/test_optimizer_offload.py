"""Optimizer offload (`training.optimizer_offload_fraction`, chakra_core.jobs.optimizer_offload):
the host steps its share and the copies move exactly its gradients and weights, the schedule is
Megatron's HybridDeviceOptimizer's with and without overlap, a step is never faster for offloading
more, memory falls by the share offloaded, the published microbenchmark is reproduced, and what
Megatron refuses or the profile cannot time is refused with the keys named."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chakra_core import run
from chakra_core.errors import ManifestError
from chakra_core.jobs.fsdp import rank_program
from chakra_core.jobs.optimizer import ADAM_OPS_PER_PARAM
from chakra_core.jobs.optimizer_offload import COPY_BYTES, HostOptimizer
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import JobSpec
from chakra_core.plan.memory import predict_memory
from chakra_core.schema import pb

MODEL = {"layers": 6, "hidden": 1024, "ffn_hidden": 2816, "heads": 8, "kv_heads": 4, "vocab": 8000}
HOST = HostOptimizer(1.35, 590)


def job(fraction: float, overlap: bool = False, gpus: int = 2, profile: str = "h100-hgx-ndr400",
        **training: Any) -> dict[str, Any]:
    return {"name": "optoff", "model": dict(MODEL), "parallel": training.pop("parallel", {}),
            "training": {"seq": 2048, "global_batch": 4, "optimizer_offload_fraction": fraction,
                         "overlap_cpu_optimizer_d2h_h2d": overlap, **training},
            "cluster": {"gpus": gpus, "profile": profile}}


def nodes(data: dict[str, Any], rank: int = 0) -> list[pb.Node]:
    spec = JobSpec.model_validate(data)
    return rank_program(spec, Placement(spec, 8, "hopper", HOST), rank).build()


def _uint(node: pb.Node, name: str) -> int:
    return next(a.uint64_val for a in node.attr if a.name == name)


def _named(trace: list[pb.Node], prefix: str) -> list[pb.Node]:
    return [n for n in trace if n.name.startswith(prefix)]


def _ancestors(trace: list[pb.Node], node: pb.Node) -> set[int]:
    seen: set[int] = set()
    todo = [*node.data_deps, *node.ctrl_deps]
    while todo:
        parent = todo.pop()
        if parent not in seen:
            seen.add(parent)
            todo += [*trace[parent].data_deps, *trace[parent].ctrl_deps]
    return seen


def _gpu_adam_elements(trace: list[pb.Node]) -> int:
    adam = _named(trace, "optimizer.adam")
    return sum(_uint(n, "num_ops") for n in adam) // ADAM_OPS_PER_PARAM


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("gpus", [1, 2])
def test_the_host_steps_its_share_and_the_copies_carry_it(fraction, overlap, gpus):
    """The GPU's Adam and the host's together step exactly the rank's shard; the host's share is
    round(f x shard); each offloaded element goes out (fp32 gradient) and comes back (fp32 weight)
    once; the rest of the trace is untouched."""
    whole = nodes(job(0.0, gpus=gpus))
    shard = _gpu_adam_elements(whole)
    trace = nodes(job(fraction, overlap, gpus=gpus))
    offloaded = round(fraction * shard)
    host = _named(trace, "optimizer.offload.cpu_adam")
    assert sum(_uint(n, "num_params") for n in host) == offloaded
    assert _gpu_adam_elements(trace) == shard - offloaded
    assert all(any(a.name == "is_cpu_op" and a.bool_val for a in n.attr) for n in host)
    out, back = _named(trace, "optimizer.offload.grads_d2h"), _named(trace, "optimizer.offload.params_h2d")
    assert {n.type for n in out} == {pb.MEM_STORE_NODE} and {n.type for n in back} == {pb.MEM_LOAD_NODE}
    assert sum(_uint(n, "tensor_size") for n in out) == sum(_uint(n, "tensor_size") for n in back) \
        == offloaded * COPY_BYTES
    assert len(out) == len(back) == len(host) == (len(host) if overlap else 1)
    assert [n.name for n in trace if not n.name.startswith("optimizer")] == \
        [n.name for n in whole if not n.name.startswith("optimizer")]


@settings(max_examples=25, deadline=None)
@given(fraction=st.floats(min_value=0.01, max_value=1.0), overlap=st.booleans(),
       layout=st.sampled_from([(1, 1, 2), (2, 1, 2), (1, 2, 4), (2, 2, 8), (1, 1, 4)]),
       precision=st.sampled_from(["bf16", "fp8"]))
def test_every_offloaded_element_is_stepped_once_and_crosses_the_link_twice(fraction, overlap, layout, precision):
    """On any layout, each rank's shard is stepped exactly once (GPU or host), and the bytes copied
    out equal the bytes copied back, 4 per host-stepped element."""
    tp, pp, gpus = layout
    data = job(fraction, overlap, gpus=gpus, parallel={"tp": tp, "pp": pp}, precision=precision,
               global_batch=8)
    for rank in {0, gpus - 1}:
        whole = _gpu_adam_elements(nodes(job(0.0, gpus=gpus, parallel={"tp": tp, "pp": pp}, precision=precision,
                                             global_batch=8), rank))
        trace = nodes(data, rank)
        host = sum(_uint(n, "num_params") for n in _named(trace, "optimizer.offload.cpu_adam"))
        assert host == round(fraction * whole) and _gpu_adam_elements(trace) + host == whole
        out = sum(_uint(n, "tensor_size") for n in _named(trace, "optimizer.offload.grads_d2h"))
        back = sum(_uint(n, "tensor_size") for n in _named(trace, "optimizer.offload.params_h2d"))
        assert out == back == host * COPY_BYTES


def test_without_overlap_the_copies_run_on_the_compute_stream():
    """D2H before the GPU's Adam (which waits for it), the CPU step after the D2H, the H2D after
    both, and whatever follows the optimizer after the H2D."""
    trace = nodes(job(0.5))
    (d2h,), (cpu,), (h2d,) = (_named(trace, p) for p in ("optimizer.offload.grads_d2h",
                                                         "optimizer.offload.cpu_adam", "optimizer.offload.params_h2d"))
    adam = _named(trace, "optimizer.adam")[0]
    assert d2h.id in _ancestors(trace, adam)
    assert d2h.id in _ancestors(trace, cpu) and adam.id not in _ancestors(trace, cpu)
    assert {cpu.id, adam.id} <= _ancestors(trace, h2d)
    assert all(h2d.id in _ancestors(trace, n) for n in trace[h2d.id + 1:] if n.type == pb.COMP_NODE)


def test_with_overlap_each_tensor_is_stepped_as_its_copy_arrives():
    """One piece per offloaded tensor: copy i out after copy i-1, step i after copy i and step i-1
    (one host), copy i back after step i, the GPU's Adam and copy i-1 back; the GPU's Adam does
    not wait for the copies."""
    trace = nodes(job(1.0, overlap=True))
    out, cpu, back = (_named(trace, p) for p in ("optimizer.offload.grads_d2h", "optimizer.offload.cpu_adam",
                                                 "optimizer.offload.params_h2d"))
    assert len(cpu) > 1
    for i in range(1, len(cpu)):
        assert out[i - 1].id in _ancestors(trace, out[i])
        assert {out[i].id, cpu[i - 1].id} <= _ancestors(trace, cpu[i])
        assert {cpu[i].id, back[i - 1].id} <= _ancestors(trace, back[i])
        assert back[i].id not in _ancestors(trace, cpu[i])
    assert _named(trace, "optimizer.adam") == []   # all of it on the host


def simulate(tmp_path: Path, data: dict[str, Any], fold: str = "auto") -> dict[str, Any]:
    manifest = {"job": copy.deepcopy(data), "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                "workload": {"fold": fold}, "output": {"dir": str(tmp_path)},
                "memory": {"plugin": "hbm", "track_tensors": False}}
    return run.simulate(run.load(manifest, base_dir=tmp_path)).document


def test_offloading_more_never_speeds_a_step_and_the_split_sums(tmp_path):
    steps = []
    for i, fraction in enumerate((0.0, 0.25, 0.5, 0.75, 1.0)):
        training = simulate(tmp_path / str(i), job(fraction, overlap=bool(i % 2)))["training"]
        assert sum(training["breakdown_s"].values()) == pytest.approx(training["step_time_s"], rel=1e-9)
        steps.append(training["step_time_s"])
        if fraction:
            assert training["breakdown_s"]["host_optimizer"] > 0
    assert steps == sorted(steps) and steps[-1] > steps[0]


def test_folded_equals_unfolded(tmp_path):
    data = job(0.5, overlap=True, gpus=4, global_batch=8)
    folded = simulate(tmp_path / "folded", data)
    unfolded = simulate(tmp_path / "unfolded", data, fold="off")
    assert folded["folding"]["simulated_ranks"] < 4
    assert folded["training"]["step_time_s"] == unfolded["training"]["step_time_s"]


def test_folded_in_time_equals_every_micro_batch_simulated(tmp_path):
    """The host's step and the copies come after the repeating micro-batches: a step folded in time
    is the whole step's, to the nanosecond, with the copies' bytes."""
    data = job(1.0, overlap=True, gpus=2, global_batch=64, parallel={"pp": 2})
    runs = {}
    for fold_time in ("auto", "off"):
        manifest = {"job": copy.deepcopy(data), "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                    "workload": {"fold_time": fold_time}, "output": {"dir": str(tmp_path / fold_time)},
                    "memory": {"plugin": "hbm", "track_tensors": False}}
        runs[fold_time] = run.simulate(run.load(manifest, base_dir=tmp_path)).document
    assert runs["auto"]["folding"]["time"]["folded"], runs["auto"]["folding"]["time"]
    assert runs["auto"]["training"] == runs["off"]["training"]
    assert runs["auto"]["layers"]["memory"]["summary"]["bytes_stored"] == \
        runs["off"]["layers"]["memory"]["summary"]["bytes_stored"] > 0


def test_the_published_microbenchmark_is_reproduced(tmp_path):
    """NVIDIA-NeMo/RL #3628, Qwen3-0.6B on one H100: the profile's two host rates come from its two
    half-offload runs (+0.435 s without overlap, +0.464 s with it); the full-offload run (+0.926 s)
    is a check of them (h100-sxm-hgx.yaml's note; benchmarks/optimizer_offload.py)."""
    model = {"layers": 28, "hidden": 1024, "ffn_hidden": 3072, "heads": 16, "kv_heads": 8, "kv_channels": 128,
             "vocab": 151936, "qk_layernorm": True, "tied_embeddings": True}
    steps = {}
    for fraction, overlap in ((0.0, False), (0.5, False), (0.5, True), (1.0, True)):
        data = job(fraction, overlap, gpus=1, profile="h100-sxm-hgx", seq=4096, global_batch=1)
        data["model"] = model
        steps[fraction, overlap] = simulate(tmp_path / f"{fraction}{overlap}", data)["training"]["step_time_s"]
    added = {key: step - steps[0.0, False] for key, step in steps.items()}
    assert added[0.5, False] == pytest.approx(0.435, rel=0.02)
    assert added[0.5, True] == pytest.approx(0.464, rel=0.02)
    assert added[1.0, True] == pytest.approx(0.926, rel=0.03)


def test_memory_falls_by_the_share_offloaded():
    estimates = [predict_memory(JobSpec.model_validate(job(f))) for f in (0.0, 0.5, 1.0)]
    whole = estimates[0].optimizer
    assert [e.optimizer for e in estimates] == [whole, whole - round(0.5 * whole), 0]
    assert all(e.total - e.optimizer == estimates[0].total - whole for e in estimates)


def test_with_tensors_listed_the_simulated_peak_is_the_prediction(tmp_path):
    """The optimizer shards the hbm layer sees are the GPU's share: its simulated peak is
    plan.memory's prediction, and falls as more is offloaded."""
    peaks = []
    for fraction in (0.0, 0.5, 1.0):
        data = {**job(fraction), "tensors": True}
        manifest = {"job": data, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                    "memory": {"plugin": "hbm"}, "output": {"dir": str(tmp_path / str(fraction))}}
        doc = run.simulate(run.load(manifest, base_dir=tmp_path)).document
        peaks.append(doc["layers"]["memory"]["summary"]["peak_memory_bytes"])
        assert peaks[-1] == predict_memory(JobSpec.model_validate(data)).total
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]


# Refused --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("training, words", [
    ({"distributed_optimizer": False}, "needs distributed_optimizer"),
    ({"use_megatron_fsdp": True}, "with use_megatron_fsdp is not modelled"),
    ({"precision": "fp8", "fp8_recipe": "current", "fp8_param_gather": True}, "needs fp8_recipe delayed"),
    ({"optimizer_offload_fraction": 1.5}, "less than or equal to 1"),
])
def test_what_megatron_refuses_is_refused(training, words):
    with pytest.raises(ValidationError, match=words):
        JobSpec.model_validate(job(0.5, **training))


def test_a_profile_without_host_rates_is_named(tmp_path):
    manifest = {"job": job(0.5, profile="a100-sxm-hgx"), "compute": {"plugin": "achievable"},
                "system": {"plugin": "nccl"}, "memory": {"plugin": "hbm", "track_tensors": False},
                "output": {"dir": str(tmp_path)}}
    with pytest.raises(ManifestError, match=r"optimizer_offload_fraction.*a100-sxm-hgx.*host_adam_ns_per_param"):
        run.load(manifest, base_dir=tmp_path)


def test_a_job_that_offloads_names_its_memory_layer(tmp_path):
    manifest = {"job": job(0.5), "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                "output": {"dir": str(tmp_path)}}
    with pytest.raises(ManifestError, match=r"memory: required: .*optimizer_offload_fraction.*64 GB/s host link"):
        run.load(manifest, base_dir=tmp_path)


# In the plan -----------------------------------------------------------------------------------------
def test_plan_keeps_the_jobs_offload_in_every_layout(tmp_path):
    """A job that offloads its optimizer is planned with it: every simulated layout's bound stays
    below its step (the host's steps are left out of the bound), memory is checked against the
    prediction with the GPU's share of the state, and each step includes the host's optimizer."""
    from chakra_core.plan.search import SIMULATED, PlanOptions, plan
    from chakra_core.sweep.run import Execution

    manifest = {"job": job(0.5, gpus=4, global_batch=8), "compute": {"plugin": "achievable"},
                "system": {"plugin": "nccl"}, "memory": {"plugin": "hbm"}}
    search = {"micro_batches": (1,), "recompute": ("none",), "distributed_optimizer": (True,), "max_cp": 1}
    found = plan(manifest, tmp_path, tmp_path / "out", PlanOptions(top=2, batch=2, search=search),
                 Execution(workers=1))
    simulated = [c for c in found.candidates if c.status == SIMULATED]
    assert simulated and found.memory_checked
    assert all(c.bound_s <= (c.step_s or 0) for c in simulated)
    assert all(c.memory_check == 0 for c in simulated)
    plain = {**manifest, "job": job(0.0, gpus=4, global_batch=8)}
    without = plan(plain, tmp_path, tmp_path / "without", PlanOptions(top=2, batch=2, search=search),
                   Execution(workers=1))
    by_layout = {c.layout: c.step_s for c in without.candidates if c.status == SIMULATED}
    assert all(c.step_s > by_layout[c.layout] for c in simulated if c.layout in by_layout)
    assert any(c.layout in by_layout for c in simulated)


def test_plan_refuses_a_profile_without_host_rates(tmp_path):
    from chakra_core.plan.search import PlanOptions, plan

    manifest = {"job": job(0.5, gpus=4, profile="a100-sxm-hgx"), "compute": {"plugin": "achievable"},
                "system": {"plugin": "nccl"}, "memory": {"plugin": "hbm"}}
    with pytest.raises(ManifestError, match=r"a100-sxm-hgx.*host_adam_ns_per_param"):
        plan(manifest, tmp_path, tmp_path / "out", PlanOptions(top=1))


def test_plan_offload_tries_the_smallest_quarter_of_the_optimizer_that_fits():
    """`plan --offload`: a layout with the distributed optimizer that does not fit comes back, right
    after it, with the smallest of 25/50/75/100% offloaded that makes it fit (the next smaller does
    not), pipeline stages and recomputation allowed; none on a profile without host rates."""
    import dataclasses

    from chakra_core.hardware.profiles import load_profile
    from chakra_core.plan.headroom import Headroom
    from chakra_core.plan.layouts import enumerate_layouts, job_with
    from chakra_core.plan.memory import overflow
    from chakra_core.plan.offload import OPTIMIZER_FRACTIONS, add_offload_variants

    data = {"name": "p", "model": "llama3-70b", "training": {"seq": 4096, "global_batch": 16},
            "cluster": {"gpus": 16, "profile": "h100-hgx-ndr400"}}
    profile = load_profile("h100-hgx-ndr400")
    headroom = Headroom.of(profile)

    def fits(layout: Any) -> bool:
        peak = predict_memory(job_with(data, layout))
        return overflow(peak, headroom.usable, headroom.reserve(layout, peak.total).total) is None

    enumeration = enumerate_layouts(data, 8, micro_batches=(1,), recompute=("full",), distributed_optimizer=(True,),
                                    max_cp=1)
    index = 0
    while index < len(enumeration.layouts):
        if not fits(enumeration.layouts[index]):
            add_offload_variants(enumeration, index, data, headroom, profile)
        index += 1
    variants = [layout for layout in enumeration.layouts if layout.optimizer_offload]
    assert variants and any(layout.pp > 1 for layout in variants)
    assert enumeration.layouts == sorted(enumeration.layouts)
    for variant in variants:
        assert fits(variant)
        original = dataclasses.replace(variant, optimizer_offload=0.0)
        assert original in enumeration.layouts and not fits(original)
        smaller = OPTIMIZER_FRACTIONS.index(variant.optimizer_offload) - 1
        if smaller >= 0:
            assert not fits(dataclasses.replace(variant, optimizer_offload=OPTIMIZER_FRACTIONS[smaller]))
        assert f"opt-offload{variant.optimizer_offload:g}" in variant.label()
    a100 = {**data, "cluster": {"gpus": 16, "profile": "a100-sxm-hgx"}}
    plain = enumerate_layouts(a100, 8, micro_batches=(1,), recompute=("full",), distributed_optimizer=(True,),
                              max_cp=1)
    before = list(plain.layouts)
    for index in range(len(before)):
        add_offload_variants(plain, index, a100, Headroom.of(load_profile("a100-sxm-hgx")), load_profile("a100-sxm-hgx"))
    assert not any(layout.optimizer_offload for layout in plain.layouts)
