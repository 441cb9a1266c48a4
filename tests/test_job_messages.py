"""A job's mistakes said where they are, all at once, before anything is written; what it accepts
but a user should hear about said as warnings."""

from __future__ import annotations

import yaml
from click.testing import CliRunner

from chakra_core.cli import main

LAYERS = {"compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}


def _run(tmp_path, job, command="validate"):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"job": job, **LAYERS, "output": {"dir": str(tmp_path / "out")}}))
    return CliRunner().invoke(main, [command, str(path)])


def test_an_unknown_model_and_an_unknown_profile_are_both_reported(tmp_path):
    result = _run(tmp_path, {"model": "llama3-70bx", "cluster": {"gpus": 8, "profile": "h100-hgxx"},
                             "training": {"seq": 4096, "global_batch": 8}})
    assert result.exit_code == 2
    assert "2 problems" in result.output
    assert "job.model: no model preset 'llama3-70bx'" in result.output
    assert "job.cluster.profile: h100-hgxx: no such profile" in result.output


def test_more_gpus_than_a_single_node_profile_is_refused_before_any_trace(tmp_path):
    result = _run(tmp_path, {"model": "llama3-8b", "cluster": {"gpus": 64, "profile": "h100-sxm-hgx"},
                             "training": {"seq": 4096, "global_batch": 64}}, "run")
    assert result.exit_code == 2
    assert "job.cluster.gpus: 64 GPUs, but profile 'h100-sxm-hgx' describes one node of 8 GPUs" in result.output
    assert not (tmp_path / "out").exists()


def test_settings_past_the_models_context_or_a_chunks_layers_are_warned_of(tmp_path):
    result = _run(tmp_path, {"model": "llama2-7b", "cluster": {"gpus": 8, "profile": "h100-hgx-ndr400"},
                             "parallel": {"tp": 8},
                             "training": {"seq": 8192, "global_batch": 8, "recompute": "full", "recompute_layers": 999}})
    assert result.exit_code == 0, result.output
    assert "job.training.seq 8192 is longer than model.max_seq 4096" in result.output
    assert "job.training.recompute_layers 999 is more than the 32 layers of a stage's chunk" in result.output


def test_a_learned_position_model_cannot_run_past_its_positions(tmp_path):
    result = _run(tmp_path, {"model": "gpt3-5b", "cluster": {"gpus": 8, "profile": "h100-hgx-ndr400"},
                             "training": {"seq": 8192, "global_batch": 8}})
    assert result.exit_code == 2
    assert "learned position embeddings have a row per position up to max_seq" in result.output


def test_loading_a_job_reports_each_rank_it_writes(tmp_path):
    from chakra_core import run

    heard = []
    data = {"job": {"model": "llama3-8b", "cluster": {"gpus": 16, "profile": "h100-hgx-ndr400"},
                    "parallel": {"tp": 4, "pp": 2}, "training": {"seq": 4096, "global_batch": 16}},
            **LAYERS, "output": {"dir": str(tmp_path / "out")}}
    config = run.load(data, base_dir=tmp_path, progress=lambda done, total: heard.append((done, total)))
    assert heard == [(1, 2), (2, 2)]   # folded: a rank per pipeline stage
    assert config.traces_written == tmp_path / "out" / "traces"
    heard.clear()
    del config
    again = run.load(data, base_dir=tmp_path, progress=lambda done, total: heard.append((done, total)))
    assert heard == [] and again.traces_written is None   # reused
