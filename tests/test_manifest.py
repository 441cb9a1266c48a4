"""Manifest loading and validation: every problem, with file, key path and reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chakra_core.errors import ManifestError
from chakra_core.config.manifest import format_loc
from chakra_core.config.build import load_manifest
from chakra_core.plugins import make_plugin_host
from tests.simhelpers import MICRO

MICRO4 = MICRO / "all_reduce" / "4npus_1MB" / "all_reduce"


@pytest.fixture(scope="module")
def host():
    return make_plugin_host()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def problems(excinfo) -> list[str]:
    return [f"{loc}: {why}" for loc, why in excinfo.value.problems]


def test_format_loc():
    assert format_loc(("network", "bandwidth", 1)) == "network.bandwidth[1]"
    assert format_loc(()) == "(top level)"


def test_relative_paths_resolve_against_the_manifest_folder(tmp_path, host):
    traces = tmp_path / "exp" / "traces"
    traces.mkdir(parents=True)
    for rank in range(4):
        (traces / f"ar.{rank}.et").write_bytes((MICRO4.parent / f"all_reduce.{rank}.et").read_bytes())
    path = write(tmp_path / "exp" / "m.yaml", """
workload: {trace: traces/ar}
network: {plugin: analytical, topology: [Ring], npus_count: [4], bandwidth: [50], latency: [500]}
output: {dir: out}
""")
    loaded = load_manifest(path, host)
    assert loaded.spec.trace_files[0] == traces / "ar.0.et"
    assert loaded.output_dir == tmp_path / "exp" / "out"
    echo = loaded.spec.manifest
    assert echo["workload"]["ranks"] == 4 and echo["system"]["plugin"] == "native"
    assert echo["compute"] == {"plugin": "replay"}


def test_every_problem_is_reported_with_its_key_path(tmp_path, host):
    path = write(tmp_path / "bad.yaml", f"""
workload: {{trace: {MICRO4}, feeder: turbo}}
system: {{plugin: native, endpoint-delay: -1}}
network:
  plugin: analytical
  topology: [Ring, Torus]
  npus_count: [4, 1]
  bandwidth: [50, 0]
  latency: [500, 1]
  colour: blue
memory: {{plugin: nvme}}
""")
    with pytest.raises(ManifestError) as info:
        load_manifest(path, host)
    found = problems(info)
    expected = [
        "workload.feeder: Input should be 'streaming' or 'memory'",
        "system.endpoint-delay: Input should be greater than or equal to 0",
        "network.topology[1]: Input should be 'Ring', 'FullyConnected' or 'Switch'",
        "network.bandwidth[1]: Input should be greater than 0",
        "network.colour: unknown key",
        "memory.plugin: no memory plugin named 'nvme'",
    ]
    for fragment in expected:
        assert any(fragment in line for line in found), (fragment, found)
    assert all(line.startswith(str(path)) for line in found)


def test_yaml_syntax_error_names_the_line(tmp_path, host):
    path = write(tmp_path / "broken.yaml", "workload:\n  trace: [unclosed\nnetwork: {}\n")
    with pytest.raises(ManifestError, match=r"broken.yaml.*not valid YAML.*line \d+"):
        load_manifest(path, host)


def test_manifest_must_be_a_mapping(tmp_path, host):
    with pytest.raises(ManifestError, match="expected a mapping"):
        load_manifest(write(tmp_path / "list.yaml", "- a\n- b\n"), host)


def test_missing_manifest_file(tmp_path, host):
    with pytest.raises(ManifestError, match="file not found"):
        load_manifest(tmp_path / "nope.yaml", host)


def test_astra_files_fill_sections_inline_keys_override_and_unknown_keys_warn(tmp_path, host):
    sys_json = write(tmp_path / "sys.json", json.dumps({
        "scheduling-policy": "FIFO", "endpoint-delay": 10, "preferred-dataset-splits": 4,
        "boost-mode": 0, "roofline-enabled": 0, "peak-perf": 900}))
    net = write(tmp_path / "net.yml", "topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n")
    path = write(tmp_path / "m.yaml", f"""
workload: {{trace: {MICRO4}}}
system: {{plugin: native, astra_file: sys.json, endpoint-delay: 20}}
network: {{plugin: analytical, astra_file: {net.name}}}
""")
    loaded = load_manifest(path, host)
    config = loaded.spec.layers["system"].config
    assert config.scheduling_policy == "FIFO" and config.endpoint_delay == 20
    assert config.preferred_dataset_splits == 4
    assert loaded.spec.layers["network"].config.npus_count == [4]
    assert loaded.spec.warnings == [
        f"{sys_json}: key 'peak-perf' not used: roofline-enabled is 0, so compute nodes replay "
        "their traced durations",
        f"{sys_json}: key 'boost-mode' is not implemented by system plugin 'native'; ignored"]
    assert loaded.spec.layers["compute"].impl.name == "replay"


def test_errors_inside_an_astra_file_point_at_the_file(tmp_path, host):
    net = write(tmp_path / "net.yml", "topology: [Ring]\nnpus_count: [4]\nbandwidth: [-5]\nlatency: [500]\n")
    path = write(tmp_path / "m.yaml", f"""
workload: {{trace: {MICRO4}}}
network: {{plugin: analytical, astra_file: net.yml}}
""")
    with pytest.raises(ManifestError) as info:
        load_manifest(path, host)
    assert problems(info) == [f"{net}: bandwidth[0]: Input should be greater than 0"]


def test_missing_astra_file(tmp_path, host):
    path = write(tmp_path / "m.yaml", f"""
workload: {{trace: {MICRO4}}}
network: {{plugin: analytical, astra_file: nowhere.yml}}
""")
    with pytest.raises(ManifestError, match=r"network.astra_file: .*nowhere.yml: file not found"):
        load_manifest(path, host)


def test_trace_file_problems(tmp_path, host):
    traces = tmp_path / "t"
    traces.mkdir()
    for rank in (0, 1, 3):
        (traces / f"x.{rank}.et").write_bytes((MICRO4.parent / "all_reduce.0.et").read_bytes())
    network = "network: {plugin: analytical, topology: [Ring], npus_count: [4], bandwidth: [50], latency: [1]}"
    path = write(tmp_path / "gap.yaml", f"workload: {{trace: t/x}}\n{network}\n")
    with pytest.raises(ManifestError, match=r"missing trace file\(s\) for rank\(s\) 2"):
        load_manifest(path, host)
    path = write(tmp_path / "none.yaml", f"workload: {{trace: t/y}}\n{network}\n")
    with pytest.raises(ManifestError, match="no trace files"):
        load_manifest(path, host)
    path = write(tmp_path / "ranks.yaml", f"workload: {{trace: t/x, ranks: 2}}\n{network}\n")
    with pytest.raises(ManifestError, match="workload.ranks: is 2 but trace files exist"):
        load_manifest(path, host)


def test_bad_comm_group_file(tmp_path, host):
    write(tmp_path / "groups.json", json.dumps({"1": [0, "x"]}))
    path = write(tmp_path / "m.yaml", f"""
workload: {{trace: {MICRO4}, comm_groups: groups.json}}
network: {{plugin: analytical, topology: [Ring], npus_count: [4], bandwidth: [50], latency: [1]}}
""")
    with pytest.raises(ManifestError, match="groups.json: 1: must be a list of non-negative rank numbers"):
        load_manifest(path, host)


def test_unknown_algorithm_is_caught_by_validation(tmp_path, host):
    path = write(tmp_path / "m.yaml", f"""
workload: {{trace: {MICRO4}}}
system: {{plugin: native, all-reduce-implementation: [ring, magic]}}
network: {{plugin: analytical, topology: [Ring], npus_count: [4], bandwidth: [50], latency: [1]}}
""")
    with pytest.raises(ManifestError) as info:
        load_manifest(path, host)
    assert problems(info) == [f"{path}: system.all-reduce-implementation[1]: unknown collective "
                              "algorithm 'magic'; available for ALL_REDUCE: direct, doubleBinaryTree, "
                              "halvingDoubling, oneDirect, oneHalvingDoubling, oneRing, ring"]


# What the system layer's ASTRA-sim file says about compute and memory ----------------------------
ROOFLINE_SYS = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "preferred-dataset-splits": 4,
                "local-mem-bw": 1600, "roofline-enabled": 1, "peak-perf": 100}
RING4 = "network: {plugin: analytical, topology: [Ring], npus_count: [4], bandwidth: [50], latency: [1]}"


def system_file_manifest(tmp_path: Path, sys_data: dict, extra: str = "") -> Path:
    write(tmp_path / "sys.json", json.dumps(sys_data))
    return write(tmp_path / "m.yaml", f"workload: {{trace: {MICRO4}}}\n"
                                      f"system: {{plugin: native, astra_file: sys.json}}\n{RING4}\n{extra}")


def test_roofline_enabled_in_the_system_file_selects_the_roofline_compute_model(tmp_path, host):
    loaded = load_manifest(system_file_manifest(tmp_path, ROOFLINE_SYS), host)
    compute = loaded.spec.layers["compute"]
    assert compute.impl.name == "roofline"
    assert (compute.config.peak_tflops, compute.config.memory_bandwidth_gbps) == (100, 1600)
    assert loaded.spec.layers["system"].config.local_mem_bw == 1600   # the system layer reads it too
    assert loaded.spec.manifest["compute"] == {"plugin": "roofline", "peak_tflops": 100.0,
                                               "memory_bandwidth_gbps": 1600.0}
    assert loaded.spec.warnings == []


def test_an_explicit_compute_section_wins_and_the_unused_roofline_keys_warn(tmp_path, host):
    sys_json = tmp_path / "sys.json"
    loaded = load_manifest(system_file_manifest(tmp_path, ROOFLINE_SYS, "compute: {plugin: replay}\n"), host)
    assert loaded.spec.layers["compute"].impl.name == "replay"
    assert loaded.spec.warnings == [f"{sys_json}: keys 'roofline-enabled', 'peak-perf' not used: the "
                                    "manifest's compute section selects plugin 'replay'"]


def test_peak_perf_without_roofline_enabled_warns(tmp_path, host):
    sys_data = {k: v for k, v in ROOFLINE_SYS.items() if k != "roofline-enabled"}
    loaded = load_manifest(system_file_manifest(tmp_path, sys_data), host)
    assert loaded.spec.layers["compute"].impl.name == "replay"
    assert loaded.spec.warnings == [f"{tmp_path / 'sys.json'}: key 'peak-perf' not used: "
                                    "roofline-enabled is not set, so compute nodes replay their "
                                    "traced durations"]


def test_roofline_problems_in_the_system_file_point_at_the_file(tmp_path, host):
    sys_json = tmp_path / "sys.json"
    cases = [({"roofline-enabled": 1}, f"{sys_json}: peak-perf: required with roofline-enabled: 1"),
             ({"roofline-enabled": 1, "peak-perf": -5},
              f"{sys_json}: peak-perf: Input should be greater than 0"),
             ({"roofline-enabled": "yes"}, f"{sys_json}: roofline-enabled: must be 0 or 1")]
    for sys_data, expected in cases:
        with pytest.raises(ManifestError) as info:
            load_manifest(system_file_manifest(tmp_path, sys_data), host)
        assert any(line.startswith(expected) for line in problems(info)), (expected, problems(info))


def test_a_bad_local_mem_bw_is_reported_once(tmp_path, host):
    with pytest.raises(ManifestError) as info:
        load_manifest(system_file_manifest(tmp_path, {**ROOFLINE_SYS, "local-mem-bw": 0}), host)
    assert problems(info) == [f"{tmp_path / 'sys.json'}: local-mem-bw: Input should be greater than 0"]


def test_local_mem_bw_gives_the_hbm_bandwidth_unless_the_memory_section_sets_it(tmp_path, host):
    sys_data = {**ROOFLINE_SYS, "roofline-enabled": 0}
    sys_data.pop("peak-perf")
    loaded = load_manifest(system_file_manifest(tmp_path, sys_data, "memory: {plugin: hbm}\n"), host)
    assert loaded.spec.layers["memory"].config.bandwidth_gbps == 1600
    assert loaded.spec.warnings == []
    loaded = load_manifest(system_file_manifest(tmp_path, sys_data,
                                                "memory: {plugin: hbm, bandwidth_gbps: 3000}\n"), host)
    assert loaded.spec.layers["memory"].config.bandwidth_gbps == 3000
    assert loaded.spec.warnings == [f"{tmp_path / 'sys.json'}: local-mem-bw (1600) not used for "
                                    f"memory.bandwidth_gbps: {tmp_path / 'm.yaml'}: "
                                    "memory.bandwidth_gbps sets it to 3000"]


def test_gzip_rank_files_are_found(tmp_path, host):
    from tests.helpers import make_node, write_et

    for rank in range(4):
        write_et(tmp_path / f"g.{rank}.et.gz", [make_node(1, duration_micros=rank)], compress=True)
    path = write(tmp_path / "m.yaml", f"workload: {{trace: g}}\n{RING4}\n")
    assert [p.name for p in load_manifest(path, host).spec.trace_files] == [f"g.{r}.et.gz" for r in range(4)]
    write_et(tmp_path / "g.2.et", [make_node(1)])
    with pytest.raises(ManifestError, match=r"rank 2 has two trace files .*g\.2\.et.*g\.2\.et\.gz"):
        load_manifest(path, host)


def test_a_yaml_error_gives_pyyamls_reason_and_where_the_construct_started(tmp_path, host):
    path = write(tmp_path / "bad.yaml", "workload:\n  trace: x\nnetwork: {plugin: analytical, topology: [Ring}\n")
    with pytest.raises(ManifestError, match=r"not valid YAML: expected ',' or '\]', but got '\}' \(line 3, column 46\); "
                                            r"while parsing a flow sequence started at line 3, column 41"):
        load_manifest(path, host)
