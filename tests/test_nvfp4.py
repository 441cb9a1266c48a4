"""The NVFP4 recipe (`precision: nvfp4`): per quantized tensor an amax and one cast writing both FP4
copies with their scales, TP amax all-reduces where sequence parallelism needs them, a scale kernel
per NVFP4 GEMM, weights quantized once per step, and refusals for what TE does not run."""

from __future__ import annotations

from typing import Any

import pytest

from chakra_core import run
from chakra_core.errors import ManifestError
from chakra_core.et.attrs import NodeView
from chakra_core.jobs.fp8 import FP4_BLOCK, quantized_bytes
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb

MODEL = {"layers": 2, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn_hidden": 8192, "vocab": 32000}


def job_data(precision: str, profile: str = "gb200-nvl72", tp: int = 2, microbatches: int = 2,
             **parallel: Any) -> dict[str, Any]:
    training: dict[str, Any] = {"seq": 4096, "global_batch": microbatches, "micro_batch": 1, "precision": precision}
    if precision == "fp8":
        training["fp8_recipe"] = "mxfp8"
    return {"name": "fp4", "model": MODEL, "parallel": {"tp": tp, **parallel}, "training": training,
            "cluster": {"gpus": tp, "profile": profile}}


def nodes(precision: str, **kwargs: Any) -> list[pb.Node]:
    spec = JobSpec.model_validate(job_data(precision, **kwargs))
    return RankProgram(spec, Placement(spec, 8), 0).build()


@pytest.mark.parametrize("elements", [1, 15, 16, 17, 4096, 4097])
def test_an_nvfp4_copy_is_half_a_byte_per_element_and_a_scale_per_16(elements):
    assert quantized_bytes(elements, "nvfp4") == -(-elements // 2) + -(-elements // FP4_BLOCK)


def test_nvfp4_kernels_around_the_gemms():
    built = nodes("nvfp4")
    kernels = {n.name: NodeView(n) for n in built if n.type == pb.COMP_NODE}
    names = [n.name for n in built]
    gemms = [name for name, node in kernels.items() if node.str("dtype") == "nvfp4"]
    # fprop, dgrad and wgrad of the four linear layers of two layers in two micro-batches, each with its
    # scale kernel
    assert len(gemms) == 2 * 2 * 4 * 3 and all(name + ".alpha" in kernels for name in gemms)
    casts = [name for name in kernels if name.endswith(".cast_fp4")]
    assert casts and not [name for name in kernels if name.endswith((".cast_fp8", ".scale"))]
    for cast in casts:    # every cast has its amax just before it (the norm's is not used) and writes both copies
        base = cast[:-len(".cast_fp4")]
        assert base + ".amax" in kernels and names.index(base + ".amax") < names.index(cast)
        elements = kernels[cast].int("num_ops")
        assert kernels[cast].int("tensor_size") == 2 * elements + 2 * quantized_bytes(elements, "nvfp4")
    # weights once per step: with two micro-batches still one cast per layer's weights
    assert sum(name.endswith("weights.cast_fp4") for name in kernels) == 2
    # under sequence parallelism the column-parallel inputs' and row-parallel output gradients' amaxes are
    # all-reduced over TP (both amaxes: 8 bytes); no delayed-scaling amax reduction
    reduces = [NodeView(n) for n in built if n.type == pb.COMM_COLL_NODE and "amax" in n.name]
    assert reduces and all(view.name.endswith("amax_tp_all_reduce") and view.int("comm_size") == 8
                           for view in reduces)


def test_nvfp4_and_mxfp8_take_no_delayed_amax_reduction():
    for precision in ("nvfp4", "fp8"):
        spec = JobSpec.model_validate({**job_data(precision, tp=1, pp=2), "cluster": {"gpus": 4, "profile": "gb200-nvl72"}})
        program = RankProgram(spec, Placement(spec, 8), 0).build()
        assert not [n.name for n in program if n.name.endswith("amax_all_reduce")], precision


@pytest.mark.parametrize("change, key", [
    ({"profile": "h100-hgx-ndr400"}, "job.training.precision"),
    ({"tp_comm_overlap": True}, "job.parallel.tp_comm_overlap"),
])
def test_what_transformer_engine_does_not_run_is_refused_at_its_key(tmp_path, change, key):
    data = job_data("nvfp4", **change)
    data = {"job": data, "output": {"dir": str(tmp_path)}, "compute": {"plugin": "achievable"},
            "system": {"plugin": "nccl"}}
    with pytest.raises(ManifestError) as caught:
        run.load(data, base_dir=tmp_path)
    assert key in str(caught.value) and "nvfp4" in str(caught.value)
    assert not list(tmp_path.rglob("*.et"))


def test_an_nvfp4_mixture_of_experts_is_refused():
    data = job_data("nvfp4", tp=1)
    data["model"] = {**MODEL, "num_experts": 4, "topk": 2, "moe_ffn_hidden": 1024}
    with pytest.raises(ManifestError, match="mixture of experts"):
        from chakra_core.jobs.expand import read_job
        read_job(data, "job.yaml")


def test_an_nvfp4_step_is_faster_than_mxfp8_and_counts_mfu_against_the_nvfp4_peak(tmp_path):
    steps = {}
    for precision in ("nvfp4", "fp8"):
        data = {"job": job_data(precision, microbatches=4), "output": {"dir": str(tmp_path / precision)},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
        step = run.simulate(run.load(data, base_dir=tmp_path)).results.training
        assert step is not None
        steps[precision] = step
    assert steps["nvfp4"].step_time_s < steps["fp8"].step_time_s
    # the same model FLOPs against twice the peak (GB200: nvfp4 10,000 and mxfp8 5,000 TFLOP/s)
    assert steps["nvfp4"].tflops_per_gpu / steps["nvfp4"].mfu == pytest.approx(
        2 * steps["fp8"].tflops_per_gpu / steps["fp8"].mfu, rel=1e-9)


def test_sequence_parallel_gathers_move_fp4_shards():
    """TE gathers NVFP4 shards (distributed.py _all_gather_nvfp4): a column-parallel input's rowwise
    copy, the saved input's columnwise copy, an output gradient's two copies; bf16 moves 2 bytes."""
    def gathers(precision: str) -> dict[str, int]:
        return {n.name: NodeView(n).int("comm_size") for n in nodes(precision)
                if n.type == pb.COMM_COLL_NODE and n.name.startswith("mb0.L0") and "all_gather" in n.name}
    fp4, bf16 = gathers("nvfp4"), gathers("bf16")
    assert fp4.keys() == bf16.keys() and fp4
    for name, size in fp4.items():
        elements = bf16[name] // 2
        copies = 2 if name.endswith(".dgrad.tp_all_gather") else 1
        assert size == copies * quantized_bytes(elements, "nvfp4"), name
