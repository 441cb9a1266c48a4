"""Training jobs (chakra_core.jobs): description, placement, schedule, generation, the step's
breakdown, and the physics a predicted step must respect."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core import run
from chakra_core.errors import ManifestError, SimulationError
from chakra_core.jobs.flops import model_flops
from chakra_core.jobs.models import preset, presets
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.schedule import bubble_fraction, stage_schedule
from chakra_core.jobs.spec import JobSpec

SMALL_MODEL = {"layers": 8, "hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4, "vocab": 32000}
PROFILE = "h100-hgx-ndr400"


def job(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "t", "model": dict(SMALL_MODEL), "parallel": {"tp": 2, "pp": 2, "vp": 2, "cp": 2},
                            "training": {"seq": 2048, "global_batch": 16},
                            "cluster": {"gpus": 16, "profile": PROFILE}}
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    return data


def manifest(tmp_path: Path, job_data: dict[str, Any], fold: str = "auto", compute: dict[str, Any] | None = None,
             profile: str | None = None) -> dict[str, Any]:
    system: dict[str, Any] = {"plugin": "nccl"}
    if profile is not None:
        system["profile"] = profile
    return {"job": job_data, "workload": {"fold": fold}, "output": {"dir": str(tmp_path / f"out-{fold}")},
            "compute": compute or {"plugin": "achievable"}, "system": system}


def simulate(tmp_path: Path, job_data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return run.simulate(run.load(manifest(tmp_path, job_data, **kwargs), base_dir=tmp_path)).document


# Description ----------------------------------------------------------------------------------------
def test_presets_name_their_source_and_count_known_parameters():
    for name, spec in presets().items():
        assert spec.source, name
    assert preset("llama3-70b").params(1) == pytest.approx(70.55e9, rel=0.01)
    assert preset("llama3.1-405b").params(1) == pytest.approx(405.8e9, rel=0.01)
    assert preset("gpt3-175b").params(1) == pytest.approx(174.6e9, rel=0.01)


@pytest.mark.parametrize("change, message", [
    ({"parallel": {"tp": 3}}, "not divisible by tp x pp x cp"),
    ({"parallel": {"tp": 8}}, "must divide the attention heads"),
    ({"parallel": {"pp": 3}}, "not divisible by pp x vp"),
    ({"training__global_batch": 3}, "not divisible by dp"),
    ({"model": "llama9"}, "no model preset 'llama9'"),
    ({"training__attention": "unfused"}, "context parallelism needs"),
    ({"training__param_gather_start": "step_start"}, "step_start is modelled without interleaving"),
    ({"training": {"seq": 2048, "global_batch": 16, "param_gather_start": "step_start",
                   "overlap_param_gather": False}}, "step_start needs the distributed optimizer"),
])
def test_invalid_jobs_say_what_and_where(tmp_path, change, message):
    data = job(**change)
    with pytest.raises(ManifestError) as info:
        run.load(manifest(tmp_path, data), base_dir=tmp_path, name="job.yaml")
    assert message in str(info.value)
    assert "job.yaml: job" in str(info.value)


def test_a_job_names_its_layers_and_unknown_sections_are_errors(tmp_path):
    data = manifest(tmp_path, job())
    del data["system"]
    with pytest.raises(ManifestError, match="system: required"):
        run.load(data, base_dir=tmp_path)
    with pytest.raises(ManifestError, match="unknown section"):
        run.load({**manifest(tmp_path, job()), "netwrok": {}}, base_dir=tmp_path)
    bad = manifest(tmp_path, job())
    bad["system"] = {"plugin": "ncc"}
    with pytest.raises(Exception, match="installed"):
        run.load(bad, base_dir=tmp_path)


def test_flops_formulas_reproduce_the_published_rates():
    """NeMo's formula times the published tokens/s/GPU gives the published TFLOP/s (Llama 2 7B,
    NeMo 24.07: 16,934 tokens/s/GPU, 780 TFLOP/s); SC'21 eq. 3 gives Table 1's 1T run."""
    llama = JobSpec.model_validate(job(model="llama2-7b", parallel={"tp": 1},
                                       training={"seq": 4096, "global_batch": 128},
                                       cluster={"gpus": 8, "profile": PROFILE}))
    per_token = model_flops(llama, "nemo") / (128 * 4096)
    assert per_token * 16934 / 1e12 == pytest.approx(780, abs=1)
    one_t = JobSpec.model_validate(job(model="gpt-sc21-1t", parallel={"tp": 8, "pp": 64},
                                       training={"seq": 2048, "global_batch": 3072},
                                       cluster={"gpus": 3072, "profile": "a100-hgx-hdr200"}))
    assert model_flops(one_t, "megatron_sc21") / 102.63 / 3072 / 1e12 == pytest.approx(163, rel=0.01)


# Placement and schedule -------------------------------------------------------------------------------
def test_megatron_rank_order_keeps_tp_and_cp_in_a_node():
    spec = JobSpec.model_validate(job(parallel={"tp": 4, "pp": 2, "cp": 2}, cluster={"gpus": 64, "profile": PROFILE},
                                      training={"seq": 2048, "global_batch": 32}))
    place = Placement(spec, 8)
    rows = {row.group: row for row in place.where()}
    assert rows["tp"].nodes == 1 and rows["cp"].nodes == 1 and rows["tp"].fabric == "NVLink"
    assert rows["dp_cp"].nodes == 4 and rows["dp_cp"].gpus_per_node == 2
    assert rows["pp"].fabric == "network"
    for rank in range(64):
        assert place.rank(place.coord(rank)) == rank
        assert place.representative(rank) in place.representatives


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 6), vp=st.integers(1, 3), rounds=st.integers(1, 4), stage=st.integers(0, 5))
def test_schedules_run_every_microbatch_once_forward_before_backward(pp, vp, rounds, stage):
    stage %= pp
    m = pp * rounds if vp > 1 else rounds
    steps = stage_schedule(stage, pp, vp, m)
    assert sorted(steps) == sorted([(k, mb, c) for k in "FB" for mb in range(m) for c in range(vp)])
    seen = set()
    for kind, mb, chunk in steps:
        if kind == "B":
            assert ("F", mb, chunk) in seen
        seen.add((kind, mb, chunk))


def test_interleaved_warmup_is_mcores_even_when_microbatches_equal_pp():
    # get_pp_rank_microbatches: warm-up 2 (pp - stage - 1) + (vp - 1) pp, capped at the total; the
    # last stage of pp 4, vp 2, 4 micro-batches warms up with 4 forwards, then alternates
    kinds = "".join(kind for kind, _, _ in stage_schedule(3, 4, 2, 4))
    assert kinds == "FFFF" + "FB" * 4 + "BBBB"
    assert "".join(kind for kind, _, _ in stage_schedule(0, 4, 2, 4)) == "F" * 8 + "B" * 8


def test_the_pipeline_split_may_count_embedding_and_loss():
    spec = JobSpec.model_validate(job(model="llama3.1-405b",
                                      parallel={"tp": 8, "pp": 8, "vp": 8, "cp": 2,
                                                "account_for_embedding_and_loss": True},
                                      training={"seq": 8192, "global_batch": 512},
                                      cluster={"gpus": 1024, "profile": PROFILE}))
    layers = [layer for stage in range(8) for chunk in range(8) for layer in spec.chunk_layers(stage, chunk)]
    assert sorted(layers) == list(range(126))
    assert len(spec.chunk_layers(0, 0)) == 1 and len(spec.chunk_layers(7, 7)) == 1


# Runs ----------------------------------------------------------------------------------------------------
def test_a_job_runs_and_its_step_splits_exactly(tmp_path):
    results = simulate(tmp_path, job())
    training = results["training"]
    assert training["step_time_s"] * 1e9 == results["finish_ns"]
    assert sum(training["breakdown_s"].values()) == pytest.approx(training["step_time_s"], rel=1e-12)
    assert training["breakdown_s"]["compute_forward"] > 0 and training["breakdown_s"]["compute_backward"] > 0
    # one rank per pipeline stage: every ring attention exchange stays within a node
    assert results["folding"]["folded"] and results["folding"]["simulated_ranks"] == 2
    assert {row["group"] for row in training["placement"]} == {"tp", "cp", "dp_cp", "pp"}


FOLD_CASES = [
    job(),
    job(model={**SMALL_MODEL, "mlp": "gelu", "norm": "layernorm", "position": "learned", "tied_embeddings": True,
               "bias": True, "kv_heads": None, "ffn_hidden": 4096},
        parallel={"tp": 2, "pp": 4}, training={"seq": 1024, "global_batch": 16, "precision": "fp8",
                                               "recompute": "full", "distributed_optimizer": False},
        cluster={"gpus": 32, "profile": PROFILE}),
    job(parallel={"tp": 2, "pp": 2, "tp_comm_overlap": True}, training={"seq": 1024, "global_batch": 32,
                                                                         "attention": "unfused", "dropout": 0.1,
                                                                         "overlap_grad_reduce": False},
        cluster={"gpus": 16, "profile": PROFILE}),
    job(parallel={"tp": 2, "pp": 4}, training={"seq": 1024, "global_batch": 16, "param_gather_start": "step_start"},
        cluster={"gpus": 32, "profile": PROFILE}),
    # ring attention folded: four CP ranks within a node (one class); two CP ranks a node apart
    # (each ring crosses twice: one class); four CP ranks over two nodes (within, across, within,
    # across: ranks 0 and 2 stand for each other, 1 and 3)
    job(parallel={"tp": 2, "pp": 2, "cp": 4}, training={"seq": 4096, "global_batch": 8},
        cluster={"gpus": 32, "profile": PROFILE}),
    job(parallel={"tp": 4, "pp": 2, "cp": 2}, training={"seq": 4096, "global_batch": 8},
        cluster={"gpus": 32, "gpus_per_node": 4, "profile": PROFILE}),
    job(parallel={"tp": 4, "pp": 1, "cp": 4}, training={"seq": 4096, "global_batch": 8},
        cluster={"gpus": 32, "profile": PROFILE}),
]


@pytest.mark.parametrize("case", range(len(FOLD_CASES)))
def test_folded_and_unfolded_jobs_give_identical_results(tmp_path, case):
    folded = simulate(tmp_path, FOLD_CASES[case])
    unfolded = simulate(tmp_path, FOLD_CASES[case], fold="off")
    assert folded["folding"]["folded"] and not unfolded["folding"]["folded"]
    assert folded["ranks"] == unfolded["ranks"]
    assert folded["training"] == unfolded["training"]
    assert folded["layers"]["system"]["summary"] == unfolded["layers"]["system"]["summary"]


def test_achieved_flops_never_exceed_the_peak(tmp_path):
    for case in FOLD_CASES[:2]:
        results = simulate(tmp_path, case)
        compute = results["layers"]["compute"]["summary"]
        assert compute["achieved_within_peak"]
        precision = case["training"].get("precision", "bf16")
        peak = {"bf16": 989.5, "fp8": 1979}[precision]
        for kind in compute["kinds"].values():
            assert kind["achieved_tflops"] <= peak
        assert results["training"]["tflops_per_gpu"] <= peak


def _faster_network(tmp_path: Path) -> Path:
    """The cluster's profile with twice the NIC and NVLink bandwidth."""
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump({
        "extends": PROFILE, "description": "test: twice the bandwidth",
        "gpu": {"nvlink_gbps": {"value": 900, "source": "test: 2 x 450"}},
        "network": {"nic_gbits": {"value": 800, "source": "test: 2 x 400"}}}))
    return path


def test_doubling_network_bandwidth_never_slows_a_step(tmp_path):
    fast = _faster_network(tmp_path)
    for case in FOLD_CASES:
        slow_step = simulate(tmp_path, case)["training"]["step_time_s"]
        fast_step = simulate(tmp_path, case, profile=str(fast))["training"]["step_time_s"]
        assert fast_step <= slow_step


@pytest.mark.parametrize("pp, m", [(4, 8), (8, 8), (4, 32)])
def test_1f1b_bubble_of_a_compute_only_job_is_the_closed_form(tmp_path, pp, m):
    """Equal stages (no embedding or head to speak of), communication free next to compute: the
    bubble share of the step is (p - 1) / (m + p - 1) within 1%."""
    model = {"layers": 2 * pp, "hidden": 8192, "ffn_hidden": 32768, "heads": 64, "vocab": 128}
    data = job(model=model, parallel={"tp": 1, "pp": pp}, cluster={"gpus": pp, "profile": PROFILE},
               training={"seq": 4096, "global_batch": m, "distributed_optimizer": False})
    training = simulate(tmp_path, data, compute={"plugin": "roofline", "peak_tflops": 1.0,
                                                 "memory_bandwidth_gbps": 1e9})["training"]
    b = training["breakdown_s"]
    busy = training["step_time_s"] - b["compute_optimizer"] - b["exposed_dp"]
    expected = bubble_fraction(pp, 1, m)
    assert expected == (pp - 1) / (m + pp - 1)
    assert (b["bubble"] + b["exposed_pp"]) / busy == pytest.approx(expected, rel=0.01)


def test_a_folded_job_that_cannot_fold_writes_every_rank_and_runs_unfolded(tmp_path):
    """Traces generated for a folded run (representatives only) and a run that cannot fold (here:
    a timeline records every rank): the job writes every rank's traces and runs them, saying why,
    with fold: off's results; traces that are not a job's stay an error that says what to do."""
    config = run.load(manifest(tmp_path, job()), base_dir=tmp_path)
    results = run.prepare(config, timeline=True).simulate().document
    assert not results["folding"]["folded"] and results["folding"]["reason"] == "a timeline records every rank"
    assert results["ranks"] == simulate(tmp_path, job(), fold="off")["ranks"]
    bare = tmp_path / "bare"
    config = run.load(manifest(bare, job()), base_dir=tmp_path)
    config.spec.unfolded_traces = None    # as if the traces came without their job
    with pytest.raises(SimulationError, match="fold: off"):
        run.prepare(config, timeline=True).simulate()


def test_validate_checks_a_job_and_shows_its_placement(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(tmp_path, job())))
    found = run.validate(run.load(path))
    assert found.ok, found.problems


def test_cli_runs_and_generates_jobs(tmp_path):
    from click.testing import CliRunner

    from chakra_core.cli import main

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(tmp_path, job())))
    result = CliRunner().invoke(main, ["run", str(path)])
    assert result.exit_code == 0, result.output
    assert "training step" in result.output and "bubble" in result.output
    assert "training" in json.loads((tmp_path / "out-auto" / "results.json").read_text())
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0 and "where each group lands" in result.output
    prefix = tmp_path / "gen" / "job"
    result = CliRunner().invoke(main, ["generate", "job", str(path), "--gpus", "8", "--output", str(prefix)])
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "gen").glob("job.*.et"))) == 8
    bad = copy.deepcopy(manifest(tmp_path, job()))
    bad["job"]["parallel"]["tp"] = 3
    path.write_text(yaml.safe_dump(bad))
    result = CliRunner().invoke(main, ["run", str(path)])
    assert result.exit_code == 2 and "tp x pp x cp" in result.output


def test_docs_name_every_job_key():
    from chakra_core.jobs.spec import Cluster, Parallel, Training

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    for section, cls in (("parallel", Parallel), ("training", Training), ("cluster", Cluster)):
        for name in cls.model_fields:
            assert f"`job.{section}.{name}`" in text, f"docs/training.md does not describe job.{section}.{name}"


def test_replaying_another_devices_durations_is_said(tmp_path):
    """Durations estimated for a 312 TFLOP/s device (A100; the trace's metadata `peak_tflops`),
    replayed under an H100 profile, warn; under an A100 profile they do not."""
    from chakra_core.et.build import metadata, write_rank_files
    from chakra_core.schema import pb
    from chakra_core.testing import collective, comp

    ranks = [[comp(1, 10), collective(2, pb.ALL_REDUCE, 1 << 20, deps=[1])] for _ in range(2)]
    write_rank_files(tmp_path / "gpt", ranks, metadata({"peak_tflops": "312"}))

    def warnings(profile: str) -> list[str]:
        data = {"workload": {"trace": str(tmp_path / "gpt")}, "system": {"plugin": "nccl", "profile": profile},
                "output": {"dir": str(tmp_path / profile)}}
        return run.simulate(run.load(data, base_dir=tmp_path)).document["warnings"]

    assert any("312 TFLOP/s device" in w and "H100" in w for w in warnings("h100-hgx-ndr400"))
    assert not any("TFLOP/s device" in w for w in warnings("a100-hgx-hdr200"))


def test_an_unwritable_output_folder_is_a_manifest_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    data = manifest(tmp_path, job())
    data["output"] = {"dir": str(blocker / "out")}
    with pytest.raises(ManifestError, match="output.dir: cannot write the job's traces"):
        run.load(data, base_dir=tmp_path)


def test_an_unquoted_yaml_off_turns_folding_off(tmp_path):
    path = tmp_path / "job.yaml"
    text = yaml.safe_dump(manifest(tmp_path, job())).replace("fold: auto", "fold: off")
    assert "fold: off" in text
    path.write_text(text)
    config = run.load(path)
    assert config.spec.fold == "off" and config.spec.folding is None
