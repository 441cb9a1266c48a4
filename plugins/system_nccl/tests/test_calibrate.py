"""chakra-sim calibrate: the fit recovers known factors, never changes NCCL's choice, and the CLI
writes a profile a run can use."""

from __future__ import annotations


import pytest
import yaml
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_sim_system_nccl import calibrate as cal
from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.nccl_tests import busbw_factor
from chakra_core.hardware.profiles import Calibration, load_profile
from nccl_logs import result_line

H100 = "h100-sxm-hgx"
SIZES = [2**k for k in range(10, 34)]
TRUE = Calibration(source="test", latency_scale={"LL": 1.3, "Simple": 1.6},
                   bandwidth_scale={"ring": 0.8}, nvls_chunk_scale={16384: 0.5, 32768: 0.6, 65536: 0.8,
                                                                        131072: 0.95})


def measured(profile=H100, calibration=TRUE, collective="all_reduce", ranks=8):
    truth = load_profile(profile).model_copy(update={"calibration": calibration})
    model = nccl.NcclModel(truth)
    name = cal.COLLECTIVE_OF_TEST[collective]
    return [cal.Observation(name, size, ranks, 1, model.time_us(name, size, ranks, 1).time_us, "truth")
            for size in SIZES]


def test_fit_recovers_the_factors_that_made_the_times():
    points = measured()
    fitted = cal.fit(load_profile(H100), points, "test")
    assert cal.geomean_error(cal.log_errors(fitted, points)) < 1e-3
    assert fitted.calibration.latency_scale["Simple"] == pytest.approx(1.6, rel=1e-2)
    assert fitted.calibration.nvls_chunk_scale[16384] == pytest.approx(0.5, rel=1e-2)
    assert fitted.calibration.nvls_chunk_scale[131072] == pytest.approx(0.95, rel=1e-2)


def test_fit_never_changes_nccls_choice():
    points = measured()
    spec = load_profile(H100)
    fitted = cal.fit(spec, points, "test")
    assert [(c.algorithm, c.protocol) for c in cal.predict(fitted, points)] == \
        [(c.algorithm, c.protocol) for c in cal.predict(spec, points)]


def test_factors_no_size_uses_stay_unset():
    points = [p for p in measured() if p.nbytes >= 2**30]    # NVLS with 128 KiB chunks only
    fitted = cal.fit(load_profile(H100), points, "test")
    assert set(fitted.calibration.nvls_chunk_scale) == {131072}
    assert "ring" not in fitted.calibration.bandwidth_scale


def write_log(path, points, collective="all_reduce", ranks=8):
    factor = busbw_factor(collective, ranks)
    per_rank = ranks if collective in ("all_gather", "reduce_scatter", "alltoall") else 1
    lines = [f"# Collective test starting: {collective}_perf", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {100 + r:6d} on host device {r:2d} [0000:{r:02x}:00] NVIDIA H100 80GB HBM3"
              for r in range(ranks)]
    lines += ["#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"]
    for p in points:
        lines.append(result_line(p.nbytes, p.nbytes // 4 // per_rank, "float", "sum", -1, factor,
                                 [p.time_us, p.time_us]))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_writes_a_profile_a_run_can_use(tmp_path):
    log = write_log(tmp_path / "all_reduce.log", measured())
    out = tmp_path / "mine.yaml"
    result = CliRunner().invoke(main, ["calibrate", str(log), "--profile", H100, "--out", str(out),
                                       "--holdout", "odd-powers"])
    assert result.exit_code == 0, result.output
    assert "held-out sizes: geomean error" in result.output
    data = yaml.safe_load(out.read_text())
    assert data["name"] == "mine" and data["calibration"]["latency_scale"]["Simple"] == pytest.approx(1.6, rel=2e-2)
    profile = load_profile(out)
    assert profile.calibration is not None and profile.gpus_per_node == 8

    from chakra_core.schema import pb
    from chakra_core.testing import collective, simulate, write_ranks

    prefix = write_ranks(tmp_path / "t", [[collective(0, pb.ALL_REDUCE, 2**26)]] * 8)
    finish = simulate({"workload": {"trace": prefix}, "system": {"plugin": "nccl", "profile": str(out)}})["finish_ns"]
    truth = next(p for p in measured() if p.nbytes == 2**26)
    assert finish / 1000 == pytest.approx(truth.time_us, rel=0.02)


def test_cli_rejects_a_broken_log(tmp_path):
    bad = tmp_path / "bad.log"
    bad.write_text("# Collective test starting: all_reduce_perf\n  1024  256 float sum -1 12.0\n")
    result = CliRunner().invoke(main, ["calibrate", str(bad), "--profile", H100])
    assert result.exit_code == 2
    assert "bad.log:2" in result.output


def test_cli_unknown_profile(tmp_path):
    log = write_log(tmp_path / "all_reduce.log", measured()[:4])
    result = CliRunner().invoke(main, ["calibrate", str(log), "--profile", "nope"])
    assert result.exit_code == 2 and "no such profile" in result.output
