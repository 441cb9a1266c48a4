"""The job interface as a user meets it (issue 38): layouts a user is right about are accepted,
errors name the key and its accepted values, every job key is reachable from `generate job`,
reused traces are said, and the MLP kinds published models use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from chakra_core import run
from chakra_core.cli import main as cli
from chakra_core.errors import ManifestError
from chakra_core.jobs.models import ModelSpec, preset
from chakra_core.jobs.spec import JobSpec

SMALL = {"layers": 4, "hidden": 512, "ffn_hidden": 2048, "heads": 8, "vocab": 1000}
PROFILE = "h100-hgx-ndr400"


def job(model: Any = None, parallel: dict[str, Any] | None = None, gpus: int = 8, **training: Any) -> dict[str, Any]:
    return {"name": "t", "model": model if model is not None else dict(SMALL), "parallel": parallel or {},
            "training": {"seq": 1024, "global_batch": 8, **training}, "cluster": {"gpus": gpus, "profile": PROFILE}}


def problems(data: dict[str, Any], tmp_path: Path) -> str:
    manifest = {"job": data, "output": {"dir": str(tmp_path / "out")}, "compute": {"plugin": "achievable"},
                "system": {"plugin": "nccl"}}
    with pytest.raises(ManifestError) as info:
        run.load(manifest, base_dir=tmp_path, name="job.yaml")
    return str(info.value)


# Layouts ---------------------------------------------------------------------------------------------
def test_vp_1_without_pipelining_means_no_interleaving():
    plain = JobSpec.model_validate(job())
    one = JobSpec.model_validate(job(parallel={"pp": 1, "vp": 1}))
    assert one.vp == plain.vp == 1
    assert [one.chunk_layers(0, 0)] == [plain.chunk_layers(0, 0)]


def test_vp_above_1_without_pipelining_is_refused_and_says_why(tmp_path):
    message = problems(job(parallel={"pp": 1, "vp": 2}), tmp_path)
    assert "parallel.vp 2 needs pp > 1" in message and "vp 1 means no interleaving" in message
    assert "Value error" not in message


def test_a_split_that_needs_the_embedding_and_loss_counted_points_to_the_setting(tmp_path):
    data = job(model={**SMALL, "layers": 126}, parallel={"pp": 16, "vp": 4}, gpus=64, global_batch=64)
    message = problems(data, tmp_path)
    assert "layers 126 are not divisible by pp x vp = 64" in message
    assert "account_for_embedding_and_loss: true" in message and "126 + 2 = 128" in message
    data["parallel"]["account_for_embedding_and_loss"] = True
    spec = JobSpec.model_validate(data)
    assert sum(len(spec.chunk_layers(s, c)) for s in range(16) for c in range(4)) == 126


def test_no_hint_when_counting_the_embedding_and_loss_would_not_help(tmp_path):
    message = problems(job(model={**SMALL, "layers": 5}, parallel={"pp": 2}), tmp_path)
    assert "layers 5 are not divisible by pp x vp = 2" in message
    assert "account_for_embedding_and_loss" not in message


# Errors name the key --------------------------------------------------------------------------------
def test_an_unknown_key_of_an_inline_model_is_named_with_the_accepted_keys(tmp_path):
    message = problems(job(model={**SMALL, "activation": "relu"}), tmp_path)
    assert "job.yaml: job.model.activation: unknown key; accepted: " in message
    assert "mlp" in message and "ffn_hidden" in message
    assert "job.model.str" not in message and "function-after" not in message and "ModelSpec" not in message


def test_an_unknown_mlp_lists_the_accepted_values(tmp_path):
    message = problems(job(model={**SMALL, "mlp": "swish"}), tmp_path)
    assert "job.model.mlp: Input should be 'swiglu', 'geglu', 'gelu', 'squared-relu' or 'clamped-swiglu'" in message
    assert "problem)" in message   # one problem, not one per branch of a union


def test_a_misspelt_key_gets_the_closest_one(tmp_path):
    message = problems(job(overlap_grad=False), tmp_path)
    assert "job.training.overlap_grad: unknown key (did you mean 'overlap_grad_reduce'?)" in message


def test_an_unknown_preset_lists_the_presets(tmp_path):
    message = problems(job(model="llama9"), tmp_path)
    assert "no model preset 'llama9'; presets: " in message and "llama3-70b" in message


# MLP kinds -------------------------------------------------------------------------------------------
def test_gated_mlps_have_two_up_projections_and_the_others_one():
    shapes = {mlp: ModelSpec.model_validate({**SMALL, "mlp": mlp}) for mlp in ("swiglu", "geglu", "gelu", "squared-relu")}
    assert [shapes[m].gated for m in ("swiglu", "geglu", "gelu", "squared-relu")] == [True, True, False, False]
    h, f = SMALL["hidden"], SMALL["ffn_hidden"]
    assert shapes["swiglu"].layer_params() - shapes["gelu"].layer_params() == h * f
    assert shapes["geglu"].layer_params() == shapes["swiglu"].layer_params()
    assert shapes["squared-relu"].layer_params() == shapes["gelu"].layer_params()


def test_nemotron_presets_use_squared_relu_as_their_sources_say():
    for name in ("nemotron3-8b", "nemotron3-22b", "nemotron4-15b", "nemotron4-340b"):
        assert preset(name).mlp == "squared-relu", name


def test_a_squared_relu_step_costs_what_a_gelu_step_with_the_same_gemms_costs(tmp_path):
    # Both activations are one fused element-wise kernel over the same tensors (Megatron-Core's
    # squared_relu is jit-fused); only the GEMMs' shapes could tell them apart, and they are equal.
    def step(mlp: str) -> float:
        manifest = {"job": job(model={**SMALL, "mlp": mlp}, parallel={"tp": 2}),
                    "output": {"dir": str(tmp_path / mlp)}, "compute": {"plugin": "achievable"},
                    "system": {"plugin": "nccl"}}
        return float(run.simulate(run.load(manifest, base_dir=tmp_path)).document["training"]["step_time_s"])
    assert step("squared-relu") == step("gelu") < step("swiglu")


# generate job ---------------------------------------------------------------------------------------
def _generate(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / "job.yaml"
    result = CliRunner().invoke(cli, ["generate", "job", "--model", "llama3-8b", "--gpus", "8", "--profile", PROFILE,
                                      "--seq", "4096", "--global-batch", "8", "--save-job", str(out), *args])
    saved = yaml.safe_load(out.read_text())["job"] if out.exists() else {}
    return result.exit_code, result.output, saved


def test_generate_job_reaches_the_settings_the_issue_names(tmp_path):
    code, output, saved = _generate(tmp_path, "--tp", "2", "--no-sp", "--tp-comm-overlap", "--attention", "unfused",
                                    "--no-distributed-optimizer", "--precision", "fp8", "--fp8-recipe", "current")
    assert code == 0, output
    assert saved["parallel"] == {"tp": 2, "sp": False, "tp_comm_overlap": True}
    assert saved["training"]["attention"] == "unfused" and saved["training"]["distributed_optimizer"] is False
    assert saved["training"]["fp8_recipe"] == "current"
    spec = JobSpec.model_validate(saved)
    assert not spec.sp and spec.parallel.tp_comm_overlap


def test_generate_job_sets_any_key_by_its_path(tmp_path):
    code, output, saved = _generate(tmp_path, "--set", "training.overlap_grad_reduce=false",
                                    "--set", "job.effects.step_overheads=false", "--set", "model.mlp=squared-relu")
    assert code == 0, output
    assert saved["training"]["overlap_grad_reduce"] is False and saved["effects"] == {"step_overheads": False}
    assert saved["model"]["mlp"] == "squared-relu" and saved["model"]["hidden"] == preset("llama3-8b").hidden


@pytest.mark.parametrize("setting, message", [
    ("training", "expected KEY=VALUE"),
    ("training.seq.x=1", "training.seq is an int (4096), not a mapping"),
    ("training.overlap_grad=1", "did you mean 'overlap_grad_reduce'"),
])
def test_generate_job_refuses_a_bad_setting_and_writes_nothing(tmp_path, setting, message):
    code, output, saved = _generate(tmp_path, "--set", setting)
    assert code != 0 and message in output and "Traceback" not in output
    assert saved == {}


def test_generate_job_takes_an_inline_model_from_a_file(tmp_path):
    shape = tmp_path / "shape.yaml"
    shape.write_text(yaml.safe_dump({"model": {**SMALL, "mlp": "geglu"}}))
    out = tmp_path / "traces" / "x"
    result = CliRunner().invoke(cli, ["generate", "job", "--model-file", str(shape), "--gpus", "2", "--profile", PROFILE,
                                      "--seq", "1024", "--global-batch", "2", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.parent.iterdir()) == ["x.0.et", "x.1.et"]
    both = CliRunner().invoke(cli, ["generate", "job", "--model", "llama3-8b", "--model-file", str(shape), "--gpus", "2",
                                    "--profile", PROFILE, "--seq", "1024", "--global-batch", "2", "--output", str(out)])
    assert both.exit_code != 0 and "not both" in both.output


# Reused traces --------------------------------------------------------------------------------------
def test_a_rerun_says_it_reuses_the_traces_and_a_changed_job_regenerates_them(tmp_path):
    manifest = tmp_path / "m.yaml"
    data = {"job": job(), "output": {"dir": "out"}, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    manifest.write_text(yaml.safe_dump(data))
    first = CliRunner().invoke(cli, ["run", str(manifest), "--quiet"])
    assert first.exit_code == 0, first.output
    assert "reusing" not in first.output
    results = (tmp_path / "out" / "results.json").read_bytes()
    second = CliRunner().invoke(cli, ["run", str(manifest), "--quiet"])
    assert "note: reusing the job's traces in" in second.output
    assert (tmp_path / "out" / "results.json").read_bytes() == results   # the note is not in the results
    data["job"]["training"]["global_batch"] = 16
    manifest.write_text(yaml.safe_dump(data))
    third = CliRunner().invoke(cli, ["run", str(manifest), "--quiet"])
    assert third.exit_code == 0 and "reusing" not in third.output


# Selective recomputation ------------------------------------------------------------------------------
def test_selective_recompute_reruns_unfused_core_attention_and_costs_less_than_full(tmp_path):
    # Megatron's selective recompute re-runs core attention (QK^T, softmax, dropout, attention
    # over V) before its backward; flash attention recomputes inside its own backward kernel.
    def recompute(attention: str, mode: str) -> float:
        manifest = {"job": job(parallel={"tp": 2}, attention=attention, recompute=mode, dropout=0.1),
                    "output": {"dir": str(tmp_path / f"{attention}-{mode}")}, "compute": {"plugin": "achievable"},
                    "system": {"plugin": "nccl"}}
        results = run.simulate(run.load(manifest, base_dir=tmp_path)).document
        return float(results["training"]["breakdown_s"]["compute_recompute"])
    assert recompute("unfused", "none") == 0
    assert 0 < recompute("unfused", "selective") < recompute("unfused", "full")
    assert recompute("flash", "selective") == 0 < recompute("flash", "full")


# A precision the GPU does not run ---------------------------------------------------------------------
def test_fp8_on_a_gpu_without_fp8_is_a_clear_error_everywhere(tmp_path):
    data = job(precision="fp8")
    data["cluster"]["profile"] = "a100-hgx-hdr200"
    message = problems(data, tmp_path)
    assert "job.yaml: job.training.precision: fp8 on profile 'a100-hgx-hdr200'" in message
    assert "use bf16 or fp16" in message and "KeyError" not in message
    prefix = tmp_path / "traces" / "x"
    generated = CliRunner().invoke(cli, ["generate", "job", "--model", "llama3-8b", "--gpus", "8",
                                         "--profile", "a100-hgx-hdr200", "--seq", "2048", "--global-batch", "8",
                                         "--precision", "fp8", "--output", str(prefix)])
    assert generated.exit_code == 2 and "job.training.precision" in generated.output
    assert not prefix.parent.exists()   # nothing written
    from chakra_core.plan.search import plan
    manifest = {"job": data, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    with pytest.raises(ManifestError, match="job.training.precision: fp8 on profile"):
        plan(manifest, tmp_path, tmp_path / "plan")
