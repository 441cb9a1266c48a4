"""chakra-sim accuracy: simulate the runs an nccl-tests log describes and compare with its measurements;
the table, the JSON, the plot, the launch the header states, and one-line errors naming file and line."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_sim_system_nccl import accuracy as acc
from chakra_sim_system_nccl.nccl_tests import load
from nccl_logs import synthetic_log

DATA = Path(__file__).resolve().parent / "data" / "nccl-tests"
DGX = DATA / "h100_dgx_1node_8gpu_allreduce_nvidia-dgxc.txt"
H100 = "h100-sxm-hgx"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(*args: str):
    return CliRunner().invoke(main, ["accuracy", *args])


def one_process_eight_gpus(tmp_path: Path) -> Path:
    """The DGX log's header and rows as `all_reduce_perf -g 8` prints them: one process drives the 8 GPUs."""
    lines = DGX.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# nThread"))
    body = []
    for line in lines[start:]:
        if line.startswith("# nThread"):
            line = line.replace("nGpus 1", "nGpus 8")
        line = re.sub(r"Pid\s+\d+", "Pid 4242", line)
        body.append(line)
    path = tmp_path / "h100_1proc_8gpu_allreduce.txt"   # the collective from the file name
    path.write_text("\n".join(body) + "\n")
    return path


def assert_clean_error(result, *texts: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is not None
    message = result.output.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1, message
    for text in texts:
        assert text in message, message


# ----------------------------------------------------------------------------- the report

def test_table_and_geomean_on_the_dgx_log():
    result = run(str(DGX), "--profile", H100)
    assert result.exit_code == 0, result.output
    out = result.output
    for column in ("measured µs", "predicted µs", "error", "algorithm", "protocol", "channels"):
        assert column in out
    assert "16 GiB" in out and "1 KiB" in out and "512 B" not in out   # --min-bytes 1024 by default
    assert "nvls" in out and "Simple" in out
    match = re.search(r"geomean error (\d+\.\d)% over 25 sizes", out)
    assert match and float(match.group(1)) < 50
    assert "1 KiB-1 MiB" in out and "1 MiB-256 MiB" in out and "from 256 MiB" in out


def test_json_has_one_entry_per_size_from_1_kib():
    result = run(str(DGX), "--profile", H100, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)   # stdout is the JSON only
    log = load(DGX)
    measured = {size: t for size, t in log.times(in_place=False).items() if size >= 1024}
    assert set(report) >= {"logs", "geomean_error", "sizes"}
    [entry] = report["logs"]
    assert {"log", "collective", "ranks", "nodes", "profile", "launch", "geomean_error", "bands",
            "sizes"} <= set(entry)
    assert (entry["collective"], entry["ranks"], entry["nodes"], entry["profile"]) == ("all_reduce", 8, 1, H100)
    assert entry["launch"]["gpus_per_thread"] == 1 and entry["launch"]["processes"] == 8
    assert entry["system"] == {"plugin": "nccl", "profile": H100, "gpus-per-node": 8,
                               "launch": {"gpus_per_thread": 1, "cuda_graph": False}}
    sizes = report["sizes"]
    assert sizes == entry["sizes"]
    assert [s["bytes"] for s in sizes] == sorted(measured)
    for s in sizes:
        assert {"bytes", "measured_us", "predicted_us", "algorithm", "protocol", "channels"} <= set(s)
        assert s["measured_us"] == measured[s["bytes"]] and s["predicted_us"] > 0 and s["channels"] >= 1
    errors = [math.log(s["predicted_us"] / s["measured_us"]) for s in sizes]
    assert report["geomean_error"] == pytest.approx(math.exp(sum(map(abs, errors)) / len(errors)) - 1)
    assert set(entry["bands"]) == {"1 KiB-1 MiB", "1 MiB-256 MiB", "from 256 MiB"}
    assert sum(band["sizes"] for band in entry["bands"].values()) == len(sizes)


def test_json_of_several_logs_and_size_limits():
    logs = [str(DATA / "h100_xxrjun_1node_8gpu_allgather.txt"), str(DATA / "h100_xxrjun_1node_8gpu_alltoall.txt")]
    result = run(*logs, "--profile", H100, "--json", "--max-bytes", str(1 << 27), "--in-place")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert "sizes" not in report and [e["collective"] for e in report["logs"]] == ["all_gather", "alltoall"]
    for entry in report["logs"]:
        assert entry["placement"] == "in-place"
        assert [s["bytes"] for s in entry["sizes"]] == [1 << 25, 1 << 26, 1 << 27]
    every = [math.log(s["predicted_us"] / s["measured_us"]) for e in report["logs"] for s in e["sizes"]]
    assert report["geomean_error"] == pytest.approx(acc.geomean_error(every))


def test_plot_writes_a_png(tmp_path: Path):
    out = tmp_path / "plots" / "accuracy.png"
    result = run(str(DGX), str(DATA / "h100_xxrjun_1node_8gpu_reducescatter.txt"), "--profile", H100,
                 "--plot", str(out), "--max-bytes", str(1 << 26))
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG_SIGNATURE)
    assert f"wrote {out}" in result.output
    assert not [p for p in out.parent.iterdir() if p.name != out.name]   # no temporary file left


def test_one_process_driving_eight_gpus_is_simulated_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = one_process_eight_gpus(tmp_path)
    launch = load(path).launch
    assert launch is not None
    assert (launch.threads_per_process, launch.gpus_per_thread, launch.processes) == (1, 8, 1)

    import chakra_core

    systems = []
    loading = chakra_core.load

    def recording(data, *args, **kwargs):
        systems.append(data["system"])
        return loading(data, *args, **kwargs)

    monkeypatch.setattr(chakra_core, "load", recording)
    result = run(str(path), "--profile", H100, "--json", "--max-bytes", str(1 << 20))
    assert result.exit_code == 0, result.output
    [entry] = json.loads(result.stdout)["logs"]
    assert entry["launch"]["gpus_per_thread"] == 8 and entry["launch"]["processes"] == 1
    assert len(systems) == len(entry["sizes"]) == 11   # 1 KiB .. 1 MiB
    assert all(system["launch"] == {"gpus_per_thread": 8, "cuda_graph": False} for system in systems)
    assert all(system["gpus-per-node"] == 8 for system in systems)


def test_plan_nodes_from_hosts_and_from_the_profile():
    from chakra_core.hardware.profiles import load_profile

    profile = load_profile("h100-aws-p5-efa")
    efa = acc.plan_log(load(DATA / "h100_aws-p5_2node_16gpu_allreduce_efa.txt"), profile, "h100-aws-p5-efa")
    assert (efa.launch, efa.ranks, efa.nodes, efa.gpus_per_node) == (None, 16, 2, 8)   # no header: 16 / 8
    assert efa.system()["launch"] == {"gpus_per_thread": 1, "cuda_graph": False}
    dgx = acc.plan_log(load(DGX), profile, "h100-aws-p5-efa", min_bytes=1 << 30)
    assert (dgx.nodes, dgx.gpus_per_node) == (1, 8) and [s.nbytes for s in dgx.sizes][0] == 1 << 30
    gather = acc.plan_log(load(DATA / "h100_xxrjun_1node_8gpu_allgather.txt"), profile, "p")
    assert gather.comm_size(gather.sizes[0]) == gather.sizes[0].nbytes // 8   # per-rank share


def test_the_hosts_of_a_rack_scale_nvlink_domain_are_one_node(tmp_path: Path):
    """An NVL72 rack's trays are hosts of 4 GPUs in one NVLink domain (node.gpus_per_host): the 18
    hosts of a 72-rank log are the profile's one node, 144 ranks on 36 hosts its two; hosts of
    another size than the profile's trays keep the host rule."""
    from chakra_core.hardware.profiles import load_profile

    def log(ranks: int, per_host: int) -> Path:
        text = synthetic_log(ranks, "all_reduce")
        text = re.sub(r"on   testhost device (\s*\d+)", lambda m: f"on tray{int(m.group(1)) // per_host:03d} device "
                      f"{int(m.group(1)) % per_host}", text)
        path = tmp_path / f"nvl72_{ranks}_{per_host}_allreduce.txt"
        path.write_text(text)
        return path
    profile = load_profile("gb200-nvl72-ndr400")
    rack = acc.plan_log(load(log(72, 4)), profile, "gb200-nvl72-ndr400")
    assert (rack.ranks, rack.nodes, rack.gpus_per_node) == (72, 1, 72)
    two = acc.plan_log(load(log(144, 4)), profile, "gb200-nvl72-ndr400")
    assert (two.nodes, two.gpus_per_node) == (2, 72)
    hosts = acc.plan_log(load(log(16, 8)), profile, "gb200-nvl72-ndr400")   # 8-GPU hosts: not trays
    assert (hosts.nodes, hosts.gpus_per_node) == (2, 8)


# ----------------------------------------------------------------------------- errors

def test_garbled_line_names_file_and_line(tmp_path: Path):
    lines = DGX.read_text().splitlines()
    cut = 30   # line 31, the 4 KiB row, cut short
    path = tmp_path / "cut.txt"
    path.write_text("\n".join(lines[:cut] + [lines[cut][:60]] + lines[cut + 1:]) + "\n")
    assert_clean_error(run(str(path), "--profile", H100), f"{path}:{cut + 1}:", "columns")


def test_log_without_header(tmp_path: Path):
    rows = [line for line in synthetic_log(4, "all_reduce").splitlines()
            if line.strip() and line.split()[0].isdigit()]
    path = tmp_path / "allreduce_rows_only.txt"
    path.write_text("\n".join(rows) + "\n")
    # line 1 is the 0-byte row, which the parser skips; line 2 is the first result
    assert_clean_error(run(str(path), "--profile", H100), f"{path}:2:", "no nccl-tests header",
                       "# nThread", "nccl-tests program")


@pytest.mark.parametrize("collective", ["sendrecv", "gather"])
def test_collective_the_model_lacks(tmp_path: Path, collective: str):
    text = synthetic_log(4, "sendrecv" if collective == "sendrecv" else "all_reduce")
    text = text.replace("all_reduce_perf", f"{collective}_perf")
    path = tmp_path / f"{collective}.log"
    path.write_text(text)
    assert load(path).collective == collective
    assert_clean_error(run(str(path), "--profile", H100), f"{path}:", f"{collective}_perf",
                       "cannot simulate", "all_reduce_perf")


def test_more_gpus_per_node_than_the_profile(tmp_path: Path):
    path = tmp_path / "all_reduce_16gpu_one_host.log"
    path.write_text(synthetic_log(16, "all_reduce"))   # 16 ranks, all on one host
    assert_clean_error(run(str(path), "--profile", H100), f"{path}:3:", "16 GPUs per node",
                       "has 8")


def test_unknown_profile():
    assert_clean_error(run(str(DGX), "--profile", "no-such-machine"), "--profile no-such-machine",
                       "no such profile")


def test_no_size_left(tmp_path: Path):
    assert_clean_error(run(str(DGX), "--profile", H100, "--min-bytes", str(1 << 40)), str(DGX),
                       "--min-bytes")
