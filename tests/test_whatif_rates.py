"""What-if without silent answers (issue 35, item 5): a profile that extends another and changes the GPU's
architecture, or the peak an achievable rate is a fraction of, may not time kernels with its parent's
measurements. The `achievable` compute model refuses it, naming the profile, each key and what to give
instead; a restated or explicitly derived rate runs and is listed in the results. Layers that do not
read the achievable section (roofline) are unaffected, and `chakra-sim profiles` still shows the records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.errors import ManifestError
from chakra_core.hardware.profiles import load_profile
from chakra_core.run import load, simulate

# an H100 cluster relabelled Blackwell, and nothing else
NEW_ARCHITECTURE = "extends: h100-hgx-ndr400\ngpu:\n  architecture: blackwell\n"
EVERY_RATE = {f"gpu.achievable.matmul_tflops.{d}" for d in ("bf16", "fp16", "fp8", "tf32", "fp32")} | {
    f"gpu.achievable.{k}" for k in ("hbm_gbps", "sm_count", "kernel_gap_us", "host_launch_us", "sustained_fraction",
                                    "speed_spread")} | {
    f"gpu.achievable.attention.{d}.{p}" for d in ("bf16", "fp16") for p in ("forward", "forward_causal", "backward")} | {
    "gpu.achievable.attention.fp8.forward"} | {
    f"gpu.achievable.attention_kernels.{k}.{d}.{p}" for k in ("flash2", "cudnn") for d in ("bf16", "fp16")
    for p in ("forward", "forward_causal", "backward")}
# a faster-clocked B200: only its fp8 peak changes
FASTER_FP8 = 'extends: b200-hgx-ndr400\ngpu:\n  peak_tflops:\n    fp8: {value: 5000, source: "what-if"}\n'
FP8_RATE = ('  achievable:\n    matmul_tflops:\n      fp8: {value: 3814, source: "b200-sxm-hgx MAMF", '
            'derived: "the B200 FP8 MAMF fraction 0.7628 x 5000"}\n    attention:\n      fp8:\n        forward: '
            '{seq_len: [512, 16384], tflops: [879, 2547], head_dim: 128, source: "b200-sxm-hgx", '
            'derived: "the B200 FP8 curve x 5000 / 4500, its ends"}\n')


def job(profile: str, compute: str = "achievable") -> dict[str, Any]:
    return {"job": {"name": "t", "model": {"layers": 2, "hidden": 1024, "ffn_hidden": 2816, "heads": 16,
                                          "kv_heads": 4, "vocab": 32000},
                    "training": {"seq": 2048, "global_batch": 8, "precision": "fp8"},
                    "cluster": {"gpus": 8, "profile": profile}},
            "compute": {"plugin": compute, **({"profile": profile} if compute == "roofline" else {})},
            "system": {"plugin": "nccl"}}


def refusal(tmp_path: Path, profile: str) -> str:
    with pytest.raises(ManifestError) as caught:   # its own folder: a refused job keeps its output lock
        load(job(profile), base_dir=tmp_path, out_dir=tmp_path / f"refused-{profile}")
    return " ".join(str(caught.value).split())


def test_a_new_architecture_without_its_own_rates_is_refused_naming_every_key(tmp_path):
    (tmp_path / "arch.yaml").write_text(NEW_ARCHITECTURE)
    text = refusal(tmp_path, "arch.yaml")
    assert f"profile 'arch' keeps {len(EVERY_RATE)} achievable rate(s) measured on another GPU" in text
    for key in EVERY_RATE:
        assert f"{key} (h100-sxm-hgx's, although gpu.architecture 'hopper' -> 'blackwell')" in text, key
    assert "Give each in the profile's gpu.achievable with this GPU's own measurement and its source" in text
    assert "[the parent's fraction" not in text   # another architecture: no fraction of a peak to carry over


def test_a_changed_peak_refuses_only_its_rates_and_suggests_the_parents_fraction(tmp_path):
    (tmp_path / "fast.yaml").write_text(FASTER_FP8)
    text = refusal(tmp_path, "fast.yaml")
    assert "profile 'fast' keeps 2 achievable rate(s)" in text
    assert ("gpu.achievable.matmul_tflops.fp8 (b200-sxm-hgx's, although gpu.peak_tflops.fp8 4500 -> 5000) "
            "[the parent's fraction of its peak: 3432.5 x 1.111 = 3813.9]") in text
    assert "gpu.achievable.attention.fp8.forward" in text and "mxfp8" not in text


def test_explicitly_derived_rates_run_and_are_listed_in_the_results(tmp_path):
    (tmp_path / "fast.yaml").write_text(FASTER_FP8 + FP8_RATE)
    assert load_profile(tmp_path / "fast.yaml").inherited_rates == []
    document = simulate(load(job("fast.yaml"), base_dir=tmp_path, out_dir=tmp_path / "out")).document
    derived = document["layers"]["compute"]["summary"]["derived_rates"]
    assert derived["gpu.achievable.matmul_tflops.fp8"] == "the B200 FP8 MAMF fraction 0.7628 x 5000"
    assert "gpu.achievable.attention.fp8.forward" in derived and "gpu.achievable.hbm_gbps" in derived


def test_layers_that_do_not_read_the_rates_are_unaffected_and_the_records_stay_visible(tmp_path):
    (tmp_path / "arch.yaml").write_text(NEW_ARCHITECTURE)
    profile = load_profile(tmp_path / "arch.yaml")
    assert {rate.key for rate in profile.inherited("gpu.achievable.")} == EVERY_RATE
    document = simulate(load(job("arch.yaml", "roofline"), base_dir=tmp_path, out_dir=tmp_path / "roof")).document
    assert document["training"]["step_time_s"] > 0
    shown = CliRunner().invoke(main, ["profiles", str(tmp_path / "arch.yaml")])
    assert shown.exit_code == 0 and "gpu.architecture changed 'hopper' -> 'blackwell'" in " ".join(shown.output.split())


def test_validate_exits_with_the_refusal(tmp_path):
    (tmp_path / "arch.yaml").write_text(NEW_ARCHITECTURE)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job("arch.yaml")))
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "v")])
    assert result.exit_code != 0
    assert f"keeps {len(EVERY_RATE)} achievable rate(s) measured on another GPU" in " ".join(result.output.split())
