"""`chakra-sim plan --sharding` (issue 36): Megatron-FSDP's strategies searched beside Megatron's
data parallelism, their memory predicted, their bounds never above the simulated step, and one
table ranking both."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chakra_core import run
from chakra_core.cli import main
from chakra_core.hardware.profiles import load_profile
from chakra_core.plan.compute_bound import ComputeBound
from chakra_core.plan.layouts import FSDP_PIPELINE, MEGATRON, enumerate_layouts, job_with, lower_bound_s
from chakra_core.plan.marks import parse_mark
from chakra_core.plan.memory import predict_memory
from chakra_core.plan.search import SIMULATED
from chakra_core.plugins import make_plugin_host
from tests.test_plan_layouts import achievable

PROFILE = "h100-hgx-ndr400"
MODEL = {"layers": 4, "hidden": 1024, "ffn_hidden": 2816, "heads": 8, "kv_heads": 4, "vocab": 8000}
ZERO = ("optim", "optim_grads", "optim_grads_params")


def job(gpus: int = 16, **training: Any) -> dict[str, Any]:
    return {"name": "fsdp", "model": dict(MODEL), "parallel": {},
            "training": {"seq": 1024, "global_batch": 32, **training}, "cluster": {"gpus": gpus, "profile": PROFILE}}


def manifest(data: dict[str, Any]) -> dict[str, Any]:
    return {"job": data, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}


def test_fsdp_layouts_are_one_stage_with_the_distributed_optimizer_beside_megatrons():
    found = enumerate_layouts(job(), 8, micro_batches=(1,), recompute=("none",), sharding=(MEGATRON, *ZERO))
    megatron = [lay for lay in found.layouts if lay.sharding == MEGATRON]
    sharded = [lay for lay in found.layouts if lay.fsdp]
    assert megatron and sharded and found.rejected[FSDP_PIPELINE] > 0
    assert all(lay.pp == 1 and lay.distributed_optimizer for lay in sharded)
    assert {lay.sharding for lay in sharded} == set(ZERO)
    assert {lay.distributed_optimizer for lay in megatron} == {True, False}
    one = next(lay for lay in sharded if lay.sharding == "optim_grads_params")
    spec = found.specs[one]
    assert spec.training.use_megatron_fsdp and spec.training.data_parallel_sharding_strategy == "optim_grads_params"
    assert one.label().endswith("fsdp-optim_grads_params")
    # Megatron's layouts of an FSDP job switch FSDP off
    found = enumerate_layouts(job(use_megatron_fsdp=True), 8, micro_batches=(1,), recompute=("none",),
                              sharding=(MEGATRON,))
    assert found.layouts and not any(spec.training.use_megatron_fsdp for spec in found.specs.values())


def test_without_sharding_the_enumeration_is_as_before():
    data = job()
    before = enumerate_layouts(data, 8, micro_batches=(1, 2))
    assert all(lay.sharding is None for lay in before.layouts)
    assert all("use_megatron_fsdp" not in lay.overrides() and "job.training.use_megatron_fsdp" not in lay.overrides()
               for lay in before.layouts)
    with pytest.raises(ValueError, match="sharding 'zero3'"):
        enumerate_layouts(data, 8, sharding=("zero3",))


def test_sharding_more_never_predicts_more_optimizer_state():
    """Each strategy shards what the one before it holds whole: the optimizer's fp32 state does not grow."""
    found = enumerate_layouts(job(), 8, micro_batches=(1,), recompute=("none",), sharding=(MEGATRON, *ZERO))
    by = {lay.sharding: predict_memory(found.specs[lay]) for lay in found.layouts
          if (lay.tp, lay.pp, lay.cp) == (1, 1, 1) and lay.distributed_optimizer}
    assert by["optim_grads_params"].weights < by["optim"].weights
    assert by["optim_grads"].gradients < by["optim"].gradients


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 10_000), precision=st.sampled_from(["bf16", "fp8"]))
def test_the_bounds_of_fsdp_layouts_are_never_above_their_simulated_step(tmp_path, index, precision):
    data = job(precision=precision)
    found = enumerate_layouts(data, 8, micro_batches=(1, 2), recompute=("none", "full"), sharding=ZERO)
    layout = found.layouts[index % len(found.layouts)]
    spec = found.specs[layout]
    tight = ComputeBound(manifest(data), tmp_path, make_plugin_host(), PROFILE, 8, 16, "hopper")
    document = run.simulate(run.load({**manifest(job_with(data, layout).model_dump(mode="json")),
                                      "output": {"dir": str(tmp_path / layout.label().replace(" ", "_"))}},
                                     base_dir=tmp_path)).document
    step = float(document["training"]["step_time_s"])
    loose, close = lower_bound_s(spec, load_profile(PROFILE), achievable()), tight.bound_s(spec)
    assert 0 < loose <= step and 0 < close <= step, (layout.label(), loose, close, step)


def test_plan_ranks_fsdp_and_megatron_layouts_in_one_table(tmp_path):
    data = job(use_megatron_fsdp=True)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(data)))
    out = tmp_path / "plan"
    result = CliRunner().invoke(main, ["plan", str(path), "--top", "2", "--micro-batches", "1", "--sharding",
                                       "megatron,optim_grads_params", "--mark", "job", "--out", str(out), "-j", "1"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "plan.csv").open()))
    assert list(rows[0])[list(rows[0]).index("distributed_optimizer") + 1] == "sharding"
    assert {row["sharding"] for row in rows} == {MEGATRON, "optim_grads_params"}
    simulated = [row for row in rows if row["status"] == SIMULATED]
    assert simulated and all(float(row["bound_s"]) <= float(row["step_s"]) for row in simulated)
    summary = json.loads((out / "plan.json").read_text())
    assert summary["settings"]["sharding"] == [MEGATRON, "optim_grads_params"]
    # the job's own layout: its FSDP strategy, ranked
    assert summary["marked"][0]["layout"] == parse_mark("job", data).label()
    assert summary["marked"][0]["status"] == SIMULATED


def test_an_unknown_strategy_is_refused_naming_the_option(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(job())))
    result = CliRunner().invoke(main, ["plan", str(path), "--sharding", "megatron,zero3", "--out", str(tmp_path / "p")])
    assert result.exit_code != 0 and "--sharding" in result.output and "zero3" in result.output


def test_a_planned_fsdp_layout_names_its_memory_parts(tmp_path: Path):
    found = enumerate_layouts(job(), 8, micro_batches=(1,), recompute=("none",), sharding=("optim_grads_params",))
    estimate = predict_memory(found.specs[found.layouts[0]])
    assert estimate.total == sum(estimate.parts().values()) and estimate.weights > 0
