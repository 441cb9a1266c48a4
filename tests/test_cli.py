"""End-to-end: the `chakra-sim` command line on the example and the reference traces."""

from __future__ import annotations

import csv
import gzip
import json
import os
import stat
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.contract.hookspecs import hookimpl
from chakra_core.contract.network import NetworkModel
from tests.helpers import SHARED_DIR
from tests.simhelpers import MICRO, REF_RESULTS, astra_cases

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "allreduce_8npu.yaml"


def command(name: str) -> click.Command:
    """A command of `chakra-sim` (they load when first used)."""
    return main.get_command(click.Context(main), name)


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_run_the_example_prints_the_table_and_writes_results(tmp_path):
    result = invoke("run", EXAMPLE, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert "64,440" in result.output   # the table's layout is report/summary.py's (tested there)
    data = json.loads((tmp_path / "results.json").read_text())
    # The keys scripts rely on:
    assert data["finish_ns"] == 64440
    assert [r["rank"] for r in data["ranks"]] == list(range(8))
    assert all({"finish_ns", "compute_ns", "exposed_comm_ns"} <= set(r) for r in data["ranks"])
    assert data["manifest"]["network"]["plugin"] == "analytical"
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(rows) == 8 and rows[0]["finish_ns"] == "64440" and rows[0]["bytes_ALL_REDUCE"] == "1048576"


def test_run_writes_to_the_manifest_output_dir_and_is_reproducible(tmp_path):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(EXAMPLE.read_text().replace("traces/", f"{EXAMPLE.parent}/traces/")
                        .replace("results/allreduce_8npu", "out"))
    assert invoke("run", manifest, "--quiet").exit_code == 0
    first = (tmp_path / "out" / "results.json").read_bytes()
    assert invoke("run", manifest, "--quiet").exit_code == 0
    assert (tmp_path / "out" / "results.json").read_bytes() == first


def test_run_with_astra_sim_files(tmp_path):
    configs = ROOT / "examples" / "configs"
    result = invoke("run", "--workload", MICRO / "all_reduce" / "8npus_1MB" / "all_reduce",
                    "--astra-system", configs / "Ring_4chunks.json", "--astra-network", configs / "Ring_8npus.yml",
                    "--out", tmp_path, "--quiet")
    assert result.exit_code == 0, result.output
    assert "finish: 64440 ns" in result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert any("boost-mode" in w for w in data["warnings"])


def test_run_argument_errors():
    result = CliRunner().invoke(main, ["run"])
    assert result.exit_code == 2 and "give a manifest" in result.output
    result = CliRunner().invoke(main, ["run", str(EXAMPLE), "--workload", "x"])
    assert result.exit_code == 2 and "workload.trace: no trace files" in result.output


def test_workload_flag_reuses_a_manifest_with_other_traces(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)     # the flag's path is relative to the cwd, not to the manifest
    (tmp_path / "traces").symlink_to(MICRO / "all_reduce" / "4npus_1MB")
    manifest = tmp_path / "sub" / "m.yaml"
    manifest.parent.mkdir()
    manifest.write_text("workload: {trace: nowhere, ranks: 8}\n"
                        "network: {plugin: analytical, topology: [Ring], npus_count: [4], bandwidth: [50], "
                        "latency: [500]}\n")
    result = CliRunner().invoke(main, ["run", str(manifest), "--workload", "traces/all_reduce",
                                                       "--out", "out", "--quiet"])
    assert result.exit_code == 0, result.stderr
    assert ("note: --workload traces/all_reduce replaces the manifest's workload.trace (was nowhere); "
            "its workload.ranks, which counted the old traces, is dropped") in result.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(data["ranks"]) == 4
    assert data["manifest"]["workload"]["trace"] == str(tmp_path / "traces" / "all_reduce")


def test_astra_flags_replace_a_manifests_sections(tmp_path):
    system = json.loads((ROOT / "examples" / "configs" / "Ring_4chunks.json").read_text())
    (tmp_path / "one_chunk.json").write_text(json.dumps({**system, "preferred-dataset-splits": 1}))
    result = CliRunner().invoke(main, [
        "run", str(EXAMPLE), "--astra-system", str(tmp_path / "one_chunk.json"), "--network", "congestion",
        "--out", str(tmp_path), "--quiet"])
    assert result.exit_code == 0, result.stderr
    assert "note: --astra-system" in result.stderr and "replaces the manifest's system section" in result.stderr
    assert "note: --network congestion replaces the manifest's network.plugin (was analytical)" in result.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["manifest"]["network"]["plugin"] == "congestion"
    assert data["manifest"]["system"]["preferred_dataset_splits"] == 1     # the file's, not the manifest's 4


def test_a_failed_run_leaves_previous_results_intact(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("previous")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"""
workload: {{trace: {MICRO / 'all_reduce' / '4npus_1MB' / 'all_reduce'}}}
network: {{plugin: analytical, topology: [Ring], npus_count: [8], bandwidth: [50], latency: [1]}}
output: {{dir: {out}}}
""")
    result = CliRunner().invoke(main, ["run", str(bad)])
    assert result.exit_code == 2
    assert "4 rank(s)" in result.output and "(plugin 'analytical') has 8 NPUs" in result.output
    assert "Traceback" not in result.output
    assert (out / "results.json").read_text() == "previous"
    assert [p.name for p in out.iterdir()] == ["results.json"]


def test_validate(tmp_path):
    ok = invoke("validate", EXAMPLE)
    assert ok.exit_code == 0 and "valid (8 rank(s)" in ok.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {trace: nowhere}\nnetwork: {plugin: analytical, topology: [Ring]}\n")
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert result.exit_code == 2
    assert "network.npus_count: Field required" in result.output
    assert "workload.trace: no trace files" in result.output


def test_plugins_listing():
    result = invoke("plugins", "--json", "--all")
    names = {(r["layer"], r["name"]) for r in json.loads(result.output)}
    assert {("system", "native"), ("compute", "replay"), ("network", "analytical"),
            ("compute", "roofline"), ("memory", "hbm")} <= names
    third_party_only = {r["name"] for r in json.loads(invoke("plugins", "--json").output)}
    assert "native" not in third_party_only and "analytical" in third_party_only
    table = invoke("plugins", "--layer", "network")
    assert "analytical" in table.output and "roofline" not in table.output


# The reference traces with ASTRA-sim's own numbers (needs ../shared) -------------------------------
# tests/test_reference_runs.py runs all 240 through the API; these go through the command line.
CLI_CASES = [case for case in astra_cases("congestion_unaware")
             if case["system"].endswith(("Ring_4chunks.json", "HGX-H100-validated.json"))]


@pytest.mark.parametrize("case", CLI_CASES, ids=lambda c: f"{Path(c['workload']).parent.name}-"
                         f"{Path(c['workload']).name}-{Path(c['network']).stem}")
def test_reference_microbenchmarks_agree_with_astra_sim(case, tmp_path):
    result = invoke("run", "--workload", SHARED_DIR / "ref-traces" / case["workload"],
                    "--astra-system", REF_RESULTS / case["system"],
                    "--astra-network", REF_RESULTS / case["network"], "--out", tmp_path, "--quiet")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["finish_ns"] for r in data["ranks"]] == case["finish_ns_per_rank"]
    assert [r["exposed_comm_ns"] for r in data["ranks"]] == case["exposed_comm_ns_per_rank"]


@pytest.mark.skipif(not REF_RESULTS.exists(), reason="../shared is not available")
def test_reference_cases_are_present_when_shared_is():
    assert len(CLI_CASES) == 16


def test_run_writes_a_timeline_when_the_manifest_asks(tmp_path):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(EXAMPLE.read_text().replace("traces/", f"{EXAMPLE.parent}/traces/")
                        .replace("dir: results/allreduce_8npu", f"dir: {tmp_path / 'out'}\n  timeline: true"))
    result = invoke("run", manifest, "--quiet")
    assert result.exit_code == 0, result.output
    timeline = json.loads((tmp_path / "out" / "timeline.json").read_text())
    slices = [e for e in timeline["traceEvents"] if e.get("ph") == "X"]
    assert len(slices) == 8 and {e["dur"] for e in slices} == {64.44}   # µs


def test_toolchain_commands_are_wired():
    for command in (["convert", "pytorch", "--help"], ["convert", "text", "--help"],
                    ["generate", "transformer", "--help"], ["visualize", "--help"], ["timeline", "--help"]):
        result = invoke(*command)
        assert result.exit_code == 0 and "Usage:" in result.output, command


# One run, two ways to describe it --------------------------------------------------------------
ROOFLINE_SYS = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
                "preferred-dataset-splits": 4, "all-reduce-implementation": ["ring"],
                "collective-optimization": "localBWAware", "local-mem-bw": 1600, "boost-mode": 0,
                "roofline-enabled": 1, "peak-perf": 100}


def roofline_trace(folder: Path) -> str:
    """4 ranks: kernels with num_ops/tensor_size (the roofline times them), then an all-reduce."""
    from chakra_core.schema import pb
    from tests.simhelpers import collective, comp, write_ranks

    nodes = [comp(1, 50, num_ops=4_000_000_000, tensor_size=1_000_000),
             comp(2, 50, deps=[1], num_ops=10_000_000, tensor_size=400_000_000),
             collective(3, pb.ALL_REDUCE, 1 << 20, deps=[2])]
    return write_ranks(folder, [nodes] * 4)


@pytest.fixture(params=["inline-copy", "shared"])
def roofline_system_file(request, tmp_path):
    if request.param == "shared":
        path = REF_RESULTS / "configs" / "sys_ring_roofline.json"
        if not path.exists():
            pytest.skip(f"{path} not found")
        return path
    path = tmp_path / "sys_ring_roofline.json"
    path.write_text(json.dumps(ROOFLINE_SYS))
    return path


def test_a_system_file_gives_the_same_run_from_a_manifest_and_from_flags(tmp_path, monkeypatch,
                                                                          roofline_system_file):
    from chakra_core.plugins import make_plugin_host
    from chakra_core.run import load, load_astra

    prefix = roofline_trace(tmp_path / "traces")
    network = tmp_path / "ring4.yml"
    network.write_text("topology: [Ring]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [500]\n")
    out = tmp_path / "out"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(f"workload: {{trace: {prefix}}}\n"
                        f"system: {{plugin: native, astra_file: {roofline_system_file}}}\n"
                        f"network: {{plugin: analytical, astra_file: {network}}}\n"
                        f"output: {{dir: {out}}}\n")
    flags = ["--workload", prefix, "--astra-system", roofline_system_file, "--astra-network", network]
    monkeypatch.chdir(tmp_path)   # the flags' base folder is the cwd, the manifest's its folder
    host = make_plugin_host()
    from_manifest = load(str(manifest), host).spec
    from_flags = load_astra(prefix, str(roofline_system_file), str(network), host=host, out_dir=str(out)).spec
    assert from_manifest == from_flags
    compute = from_manifest.layers["compute"]
    assert compute.impl.name == "roofline"
    assert (compute.config.peak_tflops, compute.config.memory_bandwidth_gbps) == (100, 1600)

    assert invoke("run", manifest, "--quiet").exit_code == 0
    by_manifest = (out / "results.json").read_text()
    assert invoke("run", *flags, "--out", out, "--quiet").exit_code == 0
    assert (out / "results.json").read_text() == by_manifest
    data = json.loads(by_manifest)
    # 4e9 FLOP at 100 TFLOP/s = 40 us; 1e7 FLOP over 4e8 B at 1600 GB/s = 250 us (traced: 50 us each)
    assert {r["compute_ns"] for r in data["ranks"]} == {40_000 + 250_000}


# The output folder ------------------------------------------------------------------------------
def example_manifest(tmp_path: Path, out: Path, timeline: bool = False, formats: str = "[json, csv]") -> Path:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(EXAMPLE.read_text().replace("traces/", f"{EXAMPLE.parent}/traces/")
                        .replace("dir: results/allreduce_8npu",
                                 f"dir: {out}\n  timeline: {str(timeline).lower()}\n  formats: {formats}"))
    return manifest


@pytest.fixture
def no_simulation(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("simulated although the output folder is unusable")
    monkeypatch.setattr("chakra_core.cli.simulate._simulate", refuse)


def test_the_output_folder_is_created_and_checked_before_simulating(tmp_path, monkeypatch):
    out = tmp_path / "new" / "out"
    from chakra_core.cli import simulate as cli_simulate

    real = cli_simulate._simulate

    def simulate(*args, **kwargs):
        assert out.is_dir()
        return real(*args, **kwargs)
    monkeypatch.setattr(cli_simulate, "_simulate", simulate)
    assert invoke("run", EXAMPLE, "--out", out, "--quiet").exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == [".chakra-sim-outputs.json", "results.csv", "results.json"]


def test_an_unusable_output_folder_stops_the_run_before_simulating(tmp_path, no_simulation):
    (tmp_path / "afile").write_text("mine")
    result = CliRunner().invoke(main, ["run", str(example_manifest(tmp_path, tmp_path / "afile"))])
    assert result.exit_code == 2
    assert f"output folder {tmp_path / 'afile'}: a file of that name exists" in result.stderr
    result = CliRunner().invoke(main, ["run", str(EXAMPLE), "--out", str(tmp_path / "afile" / "out")])
    assert result.exit_code == 2
    assert f"cannot create the output folder {tmp_path / 'afile' / 'out'}" in result.stderr
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_run_the_layers_reject_creates_no_output_folder(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"""
workload: {{trace: {MICRO / 'all_reduce' / '4npus_1MB' / 'all_reduce'}}}
network: {{plugin: analytical, topology: [Ring], npus_count: [8], bandwidth: [50], latency: [1]}}
output: {{dir: {tmp_path / 'out'}}}
""")
    result = CliRunner().invoke(main, ["run", str(bad)])
    assert result.exit_code == 2 and "(plugin 'analytical') has 8 NPUs" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_folder_that_refuses_new_files_stops_the_run_before_simulating(tmp_path, monkeypatch,
                                                                         no_simulation):
    def refuse(*args, **kwargs):   # what a read-only folder does, also when the tests run as root
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("chakra_core.report.writers.tempfile.mkstemp", refuse)
    result = CliRunner().invoke(main, ["run", str(EXAMPLE), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr == f"error: cannot write to the output folder {tmp_path}: Permission denied\n"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_a_read_only_output_folder_stops_the_run_before_simulating(tmp_path, no_simulation):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        result = CliRunner().invoke(main, ["run", str(EXAMPLE), "--out", str(out)])
    finally:
        out.chmod(0o700)
    assert result.exit_code == 2 and f"cannot write to the output folder {out}" in result.stderr


def test_output_files_get_the_users_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        assert invoke("run", example_manifest(tmp_path, tmp_path / "out", timeline=True), "-q").exit_code == 0
    finally:
        os.umask(previous)
    for name in ("results.json", "results.csv", "timeline.json"):
        assert stat.S_IMODE((tmp_path / "out" / name).stat().st_mode) == 0o640, name


def test_a_rerun_removes_what_the_previous_run_wrote_and_nothing_else(tmp_path):
    out = tmp_path / "out"
    assert invoke("run", example_manifest(tmp_path, out, timeline=True), "-q").exit_code == 0
    assert (out / "timeline.json").exists()
    (out / "notes.txt").write_text("mine")
    result = invoke("run", example_manifest(tmp_path, out, formats="[json]"), "-q")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [".chakra-sim-outputs.json", "notes.txt", "results.json"]
    assert json.loads((out / ".chakra-sim-outputs.json").read_text())["files"] == ["results.json"]
    assert result.stderr == ""


def test_a_rerun_keeps_a_file_changed_since_chakra_sim_wrote_it(tmp_path):
    out = tmp_path / "out"
    assert invoke("run", example_manifest(tmp_path, out, timeline=True), "-q").exit_code == 0
    timeline = out / "timeline.json"
    timeline.write_text("my own timeline")
    later = (out / ".chakra-sim-outputs.json").stat().st_mtime_ns + 10**9
    os.utime(timeline, ns=(later, later))
    result = invoke("run", example_manifest(tmp_path, out), "-q")
    assert result.exit_code == 0
    assert timeline.read_text() == "my own timeline"
    assert f"warning: left {timeline} from the previous run: it was modified since" in result.stderr
    assert json.loads((out / ".chakra-sim-outputs.json").read_text())["files"] == ["results.csv", "results.json"]


def test_a_damaged_record_deletes_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    (out / ".chakra-sim-outputs.json").write_text('{"files": ["keep.txt", "../m.yaml", "/etc/passwd"]')
    result = invoke("run", example_manifest(tmp_path, out), "-q")
    assert result.exit_code == 0
    assert (out / "keep.txt").exists() and (tmp_path / "m.yaml").exists()
    assert "not a chakra-sim record of written files" in result.stderr
    (out / ".chakra-sim-outputs.json").write_text('{"files": ["keep.txt", "../m.yaml", "/etc/passwd"]}')
    assert invoke("run", example_manifest(tmp_path, out), "-q").exit_code == 0
    assert not (out / "keep.txt").exists() and (tmp_path / "m.yaml").exists()   # listed: removed


# Ctrl-C, --quiet, --network, gzip traces -------------------------------------------------------
def test_ctrl_c_while_simulating_exits_130_and_keeps_previous_results(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("previous")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr("chakra_core.cli.simulate._simulate", interrupted)
    result = CliRunner().invoke(main, ["run", str(EXAMPLE), "--out", str(out)])
    assert result.exit_code == 130
    assert result.stderr == f"interrupted: no results written; earlier results in {out} are unchanged\n"
    assert [p.name for p in out.iterdir()] == ["results.json"]
    assert (out / "results.json").read_text() == "previous"


def test_ctrl_c_while_writing_leaves_every_previous_file(tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert invoke("run", EXAMPLE, "--out", out, "-q").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupted(results):
        raise KeyboardInterrupt
    monkeypatch.setattr("chakra_core.report.writers.results_csv", interrupted)
    (tmp_path / "m.yaml").write_text(EXAMPLE.read_text().replace("traces/", f"{EXAMPLE.parent}/traces/")
                                     .replace("bandwidth: [50]", "bandwidth: [25]"))
    result = CliRunner().invoke(main, ["run", str(tmp_path / "m.yaml"), "--out", str(out), "-q"])
    assert result.exit_code == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_ctrl_c_during_the_final_renames_is_held_until_they_are_done(tmp_path, monkeypatch):
    import signal

    out = tmp_path / "out"
    assert invoke("run", example_manifest(tmp_path, out, timeline=True), "-q").exit_code == 0
    real_replace = os.replace

    def replace(src, dst):
        real_replace(src, dst)
        if Path(dst).name == "results.csv":
            os.kill(os.getpid(), signal.SIGINT)   # arrives between two renames
    monkeypatch.setattr(os, "replace", replace)
    result = CliRunner().invoke(main, ["run", str(example_manifest(tmp_path, out)), "-q"])
    assert result.exit_code == 130
    assert result.stderr == f"interrupted: the results were already written to {out}\n"
    # every new file in place, the stale timeline removed, the record up to date
    assert sorted(p.name for p in out.iterdir()) == [".chakra-sim-outputs.json", "results.csv", "results.json"]
    assert json.loads((out / ".chakra-sim-outputs.json").read_text())["files"] == ["results.csv", "results.json"]


def test_quiet_still_prints_warnings_to_stderr(tmp_path):
    configs = ROOT / "examples" / "configs"
    result = invoke("run", "--workload", MICRO / "all_reduce" / "8npus_1MB" / "all_reduce",
                    "--astra-system", configs / "Ring_4chunks.json", "--astra-network", configs / "Ring_8npus.yml",
                    "--out", tmp_path, "-q")
    assert result.exit_code == 0
    assert result.stdout.startswith("finish: 64440 ns\n") and "warning" not in result.stdout
    assert ("warning: " + str(configs / "Ring_4chunks.json") + ": key 'boost-mode' is not implemented"
            in result.stderr)


class _WormholeNetwork:
    """An in-process plugin registering one more network implementation."""

    class Model(NetworkModel):
        name, fidelity = "wormhole", "test"

    @staticmethod
    @hookimpl
    def chakra_sim_register_network(registry):
        registry.add(_WormholeNetwork.Model)


def test_network_choices_are_the_installed_network_plugins(monkeypatch):
    from chakra_core.cli.simulate import PluginChoice
    from chakra_core.plugins import make_plugin_host

    run_option, validate_option = (next(p for p in command(c).params if p.name == "backend")
                                   for c in ("run", "validate"))
    assert isinstance(run_option.type, PluginChoice) and run_option.type.layer == "network"
    assert isinstance(validate_option.type, PluginChoice)
    assert run_option.type.choices == tuple(i.name for i in make_plugin_host().implementations("network"))
    monkeypatch.setattr("chakra_core.plugins.make_plugin_host",
                        lambda: make_plugin_host(extra_plugins=[("wormhole", _WormholeNetwork)]))
    assert "wormhole" in PluginChoice("network").choices
    result = CliRunner().invoke(main, ["run", "--workload", "x", "--network", "nope"])
    assert result.exit_code == 2 and "'nope' is not one of" in result.output


def test_override_flags_do_not_apply_to_a_training_job():
    result = CliRunner().invoke(main, ["run", str(ROOT / "examples" / "llama3-70b-64gpu.yaml"), "--workload", "x"])
    assert result.exit_code == 2 and "is a training job" in result.output


def test_gzip_rank_files_are_found_by_run_and_jsonize(tmp_path):
    source = MICRO / "all_reduce" / "8npus_1MB" / "all_reduce"
    for rank in range(8):
        data = Path(f"{source}.{rank}.et").read_bytes()
        (tmp_path / f"ar.{rank}.et.gz").write_bytes(gzip.compress(data, mtime=0))
    configs = ROOT / "examples" / "configs"
    result = invoke("run", "--workload", tmp_path / "ar", "--astra-system", configs / "Ring_4chunks.json",
                    "--astra-network", configs / "Ring_8npus.yml", "--out", tmp_path / "out", "-q")
    assert result.exit_code == 0 and "finish: 64440 ns" in result.stdout
    result = invoke("jsonize", tmp_path / "ar", "--out", tmp_path / "json")
    assert result.exit_code == 0
    assert sorted(p.name for p in (tmp_path / "json").iterdir()) == [f"ar.{r}.json" for r in range(8)]
