"""Rates a profile inherits although what they depend on changed (issue 31): recorded at load,
shown by `chakra-sim profiles`, warned of by a run on the `achievable` model and by `validate`;
a profile that restates them (docs/hardware.md's B200-like what-if) and a network-only
extension warn of nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from chakra_sim_compute_achievable import AchievableSpec
from chakra_core.cli import main
from chakra_core.errors import ManifestError
from chakra_core.hardware.profiles import builtin_profiles, load_profile
from chakra_core.run import load, simulate, validate

ROOT = Path(__file__).resolve().parents[1]
# raises an H100 cluster's peaks, memory and bandwidth to a B200's and restates no rate
WHAT_IF = """\
extends: h100-hgx-ndr400
description: what-if, rates not restated
gpu:
  peak_tflops:
    bf16: {value: 2250, source: "NVIDIA DGX B200 datasheet"}
    fp16: {value: 2250, source: "NVIDIA DGX B200 datasheet"}
    fp8: {value: 4500, source: "NVIDIA DGX B200 datasheet"}
  memory_gib: {value: 180, source: "NVIDIA DGX B200 datasheet"}
  memory_bandwidth_gbps: {value: 8000, source: "NVIDIA DGX B200 datasheet"}
"""
INHERITED = {"gpu.achievable.matmul_tflops.bf16", "gpu.achievable.matmul_tflops.fp16",
             "gpu.achievable.matmul_tflops.fp8", "gpu.achievable.hbm_gbps", "gpu.usable_memory_gib", "gpu.power_w",
             *(f"gpu.achievable.attention.{d}.{p}" for d in ("bf16", "fp16") for p in ("forward", "forward_causal",
                                                                                       "backward")),
             "gpu.achievable.attention.fp8.forward",
             *(f"gpu.achievable.attention_kernels.{k}.{d}.{p}" for k in ("flash2", "cudnn") for d in ("bf16", "fp16")
               for p in ("forward", "forward_causal", "backward"))}
ACHIEVABLE = {key for key in INHERITED if key.startswith("gpu.achievable.")}
# raises the memory and its bandwidth only: the HBM rate and the usable memory are kept, loudly
MEMORY_ONLY = """\
extends: h100-hgx-ndr400
description: what-if, more and faster memory
gpu:
  memory_gib: {value: 180, source: "NVIDIA DGX B200 datasheet"}
  memory_bandwidth_gbps: {value: 8000, source: "NVIDIA DGX B200 datasheet"}
"""


def docs_what_if() -> str:
    """The B200-like override docs/hardware.md shows, restating every rate."""
    text = (ROOT / "docs" / "hardware.md").read_text()
    found = re.search(r"```yaml\n(# b200-whatif\.yaml\n.*?)```", text, re.S)
    assert found, "docs/hardware.md lost its b200-whatif.yaml example"
    return found.group(1)


def job(profile: str) -> dict[str, Any]:
    return {"job": {"name": "t", "model": {"layers": 2, "hidden": 1024, "ffn_hidden": 2816, "heads": 16,
                                          "kv_heads": 4, "vocab": 32000},
                    "training": {"seq": 2048, "global_batch": 8}, "cluster": {"gpus": 8, "profile": profile}},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}


def step_and_warnings(tmp_path: Path, profile: str) -> tuple[float, list[str]]:
    results = simulate(load(job(profile), base_dir=tmp_path, out_dir=tmp_path / "out")).document
    return results["training"]["step_time_s"], results["warnings"]


def test_the_what_if_records_every_rate_it_inherits(tmp_path):
    (tmp_path / "b200.yaml").write_text(WHAT_IF)
    profile = load_profile(tmp_path / "b200.yaml")
    assert {rate.key for rate in profile.inherited_rates} == INHERITED
    bf16 = next(r for r in profile.inherited_rates if r.key == "gpu.achievable.matmul_tflops.bf16")
    assert (bf16.value, bf16.parent, bf16.stated_in) == (794.5, "h100-hgx-ndr400", "h100-sxm-hgx")
    assert bf16.message() == ("gpu.achievable.matmul_tflops.bf16 = 794.5 inherited from h100-hgx-ndr400 (stated in "
                              "h100-sxm-hgx) although gpu.peak_tflops.bf16 changed 989.5 -> 2250: restate it with a "
                              "source")
    hbm = next(r for r in profile.inherited_rates if r.key == "gpu.achievable.hbm_gbps")
    assert "gpu.memory_bandwidth_gbps changed 3350 -> 8000" in hbm.message()
    usable = next(r for r in profile.inherited_rates if r.key == "gpu.usable_memory_gib")
    assert "gpu.memory_gib changed 80 -> 180" in usable.message()


def test_a_run_on_the_what_if_is_refused_naming_each_rate_measured_on_another_gpu(tmp_path):
    """Issue 35, item 5: raised peaks with the parent's matmul and attention rates would time a B200's
    kernels at the H100's rates (its step, a falling MFU); the run stops instead."""
    (tmp_path / "b200.yaml").write_text(WHAT_IF)
    with pytest.raises(ManifestError) as caught:   # its own folder: a refused job keeps its output lock
        load(job("b200.yaml"), base_dir=tmp_path, out_dir=tmp_path / "refused")
    text = str(caught.value)
    assert "profile 'b200' keeps 22 achievable rate(s) measured on another GPU" in text
    for key in ACHIEVABLE - {"gpu.achievable.hbm_gbps"}:   # the peak-bound ones; HBM only warns
        assert key in text, key
    assert ("gpu.achievable.matmul_tflops.bf16 (h100-sxm-hgx's, although gpu.peak_tflops.bf16 989.5 -> 2250) "
            "[the parent's fraction of its peak: 794.5 x 2.274 = 1806.6]") in text
    assert "this GPU's own measurement and its source, or derive it explicitly" in text
    # restated (the docs' example), the rates are the B200's: faster than the H100's step
    (tmp_path / "b200-whatif.yaml").write_text(docs_what_if())
    restated_step, restated_warnings = step_and_warnings(tmp_path, "b200-whatif.yaml")
    h100_step, h100_warnings = step_and_warnings(tmp_path, "h100-hgx-ndr400")
    assert restated_step < h100_step
    assert not any("inherited" in w for w in restated_warnings + h100_warnings)


def test_a_what_if_of_memory_alone_runs_and_warns_of_each_rate_it_keeps(tmp_path):
    """Issue 31: a rate kept although only the memory or its bandwidth changed is named loudly, not refused."""
    (tmp_path / "hbm.yaml").write_text(MEMORY_ONLY)
    step, warnings = step_and_warnings(tmp_path, "hbm.yaml")
    assert any("gpu.achievable.hbm_gbps = 2466 inherited from h100-hgx-ndr400 (stated in h100-sxm-hgx) although "
               "gpu.memory_bandwidth_gbps changed 3350 -> 8000" in w for w in warnings)
    assert not any("usable_memory_gib" in w for w in warnings)   # the compute model does not use it
    h100_step, _ = step_and_warnings(tmp_path, "h100-hgx-ndr400")
    assert step <= h100_step


def test_validate_refuses_the_what_if_and_shows_the_warnings_of_one_that_runs(tmp_path):
    (tmp_path / "b200.yaml").write_text(WHAT_IF)
    with pytest.raises(ManifestError, match=r"gpu\.achievable\.matmul_tflops\.bf16 \(h100-sxm-hgx's"):
        load(job("b200.yaml"), base_dir=tmp_path, out_dir=tmp_path / "refused")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job("b200.yaml")))
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "v")])
    assert result.exit_code != 0 and "measured on another GPU" in " ".join(result.output.split()), result.output
    (tmp_path / "hbm.yaml").write_text(MEMORY_ONLY)
    found = validate(load(job("hbm.yaml"), base_dir=tmp_path, out_dir=tmp_path / "out"))
    assert found.ok and sum("inherited from h100-hgx-ndr400" in w for w in found.warnings) == 1


def test_the_docs_example_restates_every_rate(tmp_path):
    text = docs_what_if()
    data = yaml.safe_load(text)
    assert data["extends"] == "h100-hgx-ndr400"
    (tmp_path / "b200-whatif.yaml").write_text(text)
    profile = load_profile(tmp_path / "b200-whatif.yaml")
    assert profile.inherited_rates == []
    achievable = profile.section("gpu.achievable", AchievableSpec)
    assert achievable is not None and achievable.matmul_tflops["bf16"].value == 1745.0
    # the same file without its rates keeps 28 achievable ones (12 of them other attention libraries'
    # curves), the usable memory and the H100's power
    del data["gpu"]["achievable"], data["gpu"]["usable_memory_gib"], data["gpu"]["power_w"]
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump(data))
    kept = load_profile(tmp_path / "bare.yaml")
    assert len(kept.inherited("gpu.achievable.")) == 28 and len(kept.inherited_rates) == 30
    power = next(r for r in kept.inherited_rates if r.key == "gpu.power_w")
    assert power.value == 700 and "gpu.model changed" in power.message()
    assert any(r.key == "gpu.achievable.sm_count" and "gpu.model changed" in r.message() for r in kept.inherited_rates)


@pytest.mark.parametrize("name", builtin_profiles())
def test_no_shipped_profile_inherits_a_rate_whose_basis_changed(name):
    """Network-only extensions (and OCI's A100 40GB, which restates what it changes) keep nothing."""
    assert load_profile(name).inherited_rates == []


def test_a_rate_restated_up_the_chain_or_a_change_undone_is_not_inherited(tmp_path):
    (tmp_path / "b200.yaml").write_text(WHAT_IF)
    # a network-only profile over the what-if inherits its records, through it
    (tmp_path / "cluster.yaml").write_text("extends: b200.yaml\nnetwork:\n  fabric: IB\n  nics_per_node: {value: 8, "
                                           "source: x}\n  nic_gbits: {value: 400, source: x}\n")
    chained = load_profile(tmp_path / "cluster.yaml")
    assert {r.key for r in chained.inherited_rates} == INHERITED
    assert {(r.parent, r.stated_in) for r in chained.inherited_rates} == {("b200", "h100-sxm-hgx")}
    # putting the bf16 peak back: the bf16 rates hold again
    (tmp_path / "back.yaml").write_text('extends: b200.yaml\ngpu:\n  peak_tflops:\n'
                                        '    bf16: {value: 989.5, source: "H100 datasheet"}\n')
    back = {r.key for r in load_profile(tmp_path / "back.yaml").inherited_rates}
    bf16 = {"gpu.achievable.matmul_tflops.bf16",
            *(f"gpu.achievable.{curves}.bf16.{p}" for p in ("forward", "forward_causal", "backward")
              for curves in ("attention", "attention_kernels.flash2", "attention_kernels.cudnn"))}
    assert back == INHERITED - bf16 - {"gpu.power_w"}     # the power follows the part's model and bf16 peak
    # restating a rate with the parent's number and a source of its own is a statement that it holds
    (tmp_path / "kept.yaml").write_text(WHAT_IF + '  usable_memory_gib: {value: 79.2, source: "kept knowingly"}\n')
    assert "gpu.usable_memory_gib" not in {r.key for r in load_profile(tmp_path / "kept.yaml").inherited_rates}


def test_a_flat_copy_keeps_its_record_until_the_rate_changes(tmp_path):
    (tmp_path / "b200.yaml").write_text(WHAT_IF)
    result = CliRunner().invoke(main, ["profiles", str(tmp_path / "b200.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    flat = json.loads(result.output)
    assert {r["key"] for r in flat["inherited_rates"]} == INHERITED
    (tmp_path / "flat.yaml").write_text(yaml.safe_dump(flat))
    assert load_profile(tmp_path / "flat.yaml").inherited_rates == load_profile(tmp_path / "b200.yaml").inherited_rates
    flat["gpu"]["achievable"]["hbm_gbps"] = {"value": 5888, "source": "restated"}
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump(flat))
    assert {r.key for r in load_profile(tmp_path / "edited.yaml").inherited_rates} == INHERITED - {
        "gpu.achievable.hbm_gbps"}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**flat, "inherited_rates": [{"key": "x"}]}))
    with pytest.raises(ManifestError, match=r"bad\.yaml: inherited_rates: not a record of inherited rates"):
        load_profile(tmp_path / "bad.yaml")


def test_profiles_shows_the_inherited_rates(tmp_path):
    (tmp_path / "b200.yaml").write_text(WHAT_IF)
    result = CliRunner().invoke(main, ["profiles", str(tmp_path / "b200.yaml")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"{len(INHERITED)} rate(s) inherited although what they depend on changed" in text
    assert all(key in text for key in INHERITED)
    assert "rate(s) inherited" not in CliRunner().invoke(main, ["profiles", "h100-hgx-ndr400"]).output


def test_usable_memory_may_not_exceed_the_memory(tmp_path):
    (tmp_path / "small.yaml").write_text('extends: h100-sxm-hgx\ngpu:\n  memory_gib: {value: 64, source: "x"}\n')
    with pytest.raises(ManifestError, match=r"usable_memory_gib \(79\.2\) must be above 0 and at most memory_gib "
                                            r"\(64\)"):
        load_profile(tmp_path / "small.yaml")
