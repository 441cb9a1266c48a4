"""chakra-sim calibrate: the fit recovers the physical parameters that made the times, never
changes NCCL's choice, carries to other collectives and scales, says when a parameter leaves the
range its sources allow, and the CLI writes a profile a run can use."""

from __future__ import annotations


import pytest
import yaml
from click.testing import CliRunner

from chakra_sim_system_nccl.section import Calibration, NcclSpec
from chakra_core.cli import main
from chakra_sim_system_nccl import calibrate as cal
from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.nccl_tests import busbw_factor
from chakra_core.hardware.profiles import load_profile
from nccl_logs import result_line

H100 = "h100-sxm-hgx"
SIZES = [2**k for k in range(10, 34)]
TRUE = Calibration(source="test", step_overhead_us=1.2, hop_latency_scale=1.5, nvlink_efficiency=0.9)


def measured(profile=H100, calibration=TRUE, collective="all_reduce", ranks=8, nodes=1, sizes=SIZES):
    truth = load_profile(profile).with_section("calibration", calibration)
    model = nccl.NcclModel(truth)
    name = cal.COLLECTIVE_OF_TEST[collective]
    return [cal.Observation(name, size, ranks, nodes, model.time_us(name, size, ranks, nodes).time_us, "truth")
            for size in sizes]


def test_fit_recovers_the_parameters_that_made_the_times():
    points = measured()
    fitted = cal.fit(load_profile(H100), points, "test")
    assert cal.geomean_error(cal.log_errors(fitted, points)) < 5e-3
    assert fitted.section("calibration", Calibration).step_overhead_us == pytest.approx(1.2, rel=0.05)
    assert fitted.section("calibration", Calibration).hop_latency_scale == pytest.approx(1.5, rel=0.05)
    assert fitted.section("calibration", Calibration).nvlink_efficiency == pytest.approx(0.9, rel=0.02)


def test_fit_never_changes_nccls_choice():
    points = measured()
    spec = load_profile(H100)
    fitted = cal.fit(spec, points, "test")
    assert [(c.algorithm, c.protocol) for c in cal.predict(fitted, points)] == \
        [(c.algorithm, c.protocol) for c in cal.predict(spec, points)]


def test_only_the_parameters_the_sizes_exercise_are_fitted():
    points = measured()   # one node: nothing about the network or the launch
    fitted = cal.fit(load_profile(H100), points, "test")
    calibration = fitted.section("calibration", Calibration)
    assert calibration.network_latency_us is None and calibration.launch_us is None
    assert fitted.section("calibration", Calibration).nic_efficiency == 1.0


def test_a_fit_on_one_collective_carries_to_another_and_to_more_nodes():
    # the machine's parameters made every time; fit on the all-gather of one node
    truth = Calibration(source="test", step_overhead_us=1.5, hop_latency_scale=1.4, nvlink_efficiency=0.88)
    fit_on = measured(calibration=truth, collective="all_gather")
    fitted = cal.fit(load_profile(H100), fit_on, "test")
    for target, collective, ranks, nodes in ((H100, "all_reduce", 8, 1), (H100, "reduce_scatter", 8, 1),
                                             ("h100-hgx-ndr400", "all_reduce", 16, 2)):
        judged = measured(target, truth, collective, ranks, nodes)
        spec_error = cal.geomean_error(cal.log_errors(load_profile(target), judged))
        moved = cal.transfer(fitted.section("calibration", Calibration), load_profile(target))
        assert cal.geomean_error(cal.log_errors(moved, judged)) < spec_error, (collective, nodes)


def test_a_fit_outside_the_sources_range_is_reported():
    far = Calibration(source="test", step_overhead_us=8.0)   # more than a whole Simple hop
    points = measured(calibration=far)
    spec = load_profile(H100)
    fitted = cal.fit(spec, points, "test")
    moved = {m.name: m for m in cal.movements(spec, fitted)}
    assert moved["step_overhead_us"].outside and moved["step_overhead_us"].spec == pytest.approx(0.6)
    assert not moved["nvlink_efficiency"].outside


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
    assert data["name"] == "mine" and data["calibration"]["step_overhead_us"] == pytest.approx(1.2, rel=0.15)
    assert "fitted parameters" in result.output and "step_overhead_us" in result.output
    assert "warning" not in result.output   # the true values are within their sources' range
    profile = load_profile(out)
    assert profile.section("calibration", Calibration) is not None and profile.gpus_per_node == 8

    from chakra_core.schema import pb
    from chakra_core.testing import collective, simulate, write_ranks

    prefix = write_ranks(tmp_path / "t", [[collective(0, pb.ALL_REDUCE, 2**26)]] * 8)
    finish = simulate({"workload": {"trace": prefix}, "system": {"plugin": "nccl", "profile": str(out)}})["finish_ns"]
    truth = next(p for p in measured() if p.nbytes == 2**26)
    assert finish / 1000 == pytest.approx(truth.time_us, rel=0.02)


def test_cli_warns_when_a_fit_leaves_the_range_its_sources_allow(tmp_path):
    far = Calibration(source="test", step_overhead_us=8.0)
    log = write_log(tmp_path / "all_reduce.log", measured(calibration=far))
    result = CliRunner().invoke(main, ["calibrate", str(log), "--profile", H100])
    assert result.exit_code == 0, result.output
    assert "warning: step_overhead_us" in result.output and "outside 0–3.4" in result.output


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
