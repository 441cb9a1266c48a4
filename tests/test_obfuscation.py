"""chakra-sim obfuscate and synthesize --obfuscate: nothing of the source's text survives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.et.attrs import attr_value
from chakra_core.et.io import read_trace
from chakra_core.et.jsonize import jsonize_file, trace_files
from chakra_core.schema import pb
from chakra_core.testing import collective, comp, make_node, manifest, simulate, uniform_network, write_ranks
from chakra_core.tools.obfuscation import perturbed_size

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT / "examples" / "pytorch" / "dlrm"
KINETO = {0: "worker0_step_12.1694128201545.pt.trace.json.gz", 1: "worker1_step_12.1694128201556.pt.trace.json.gz"}


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory) -> str:
    """The DLRM pair of the examples, converted (names, op schemas, shapes, string attributes)."""
    prefix = tmp_path_factory.mktemp("dlrm") / "dlrm"
    for rank in (0, 1):
        cli("convert", "pytorch", DLRM / f"dlrm_eg_{rank}.json.gz", "--kineto", DLRM / KINETO[rank],
            "--rank", rank, "--output", prefix)
    return str(prefix)


def secrets(prefix: str) -> set[str]:
    """Every name and string the source traces carry (collected independently of the code under test)."""
    found: set[str] = set()
    for _, path in trace_files(prefix):
        trace = read_trace(path)
        for message in [trace.metadata, *trace.nodes]:
            for attr in message.attr:
                value = attr_value(attr)
                found.update(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str))
        for node in trace.nodes:
            found.add(node.name)
            for info in (node.inputs, node.outputs):
                found.update((info.values, info.shapes, info.types))
    found.discard("")
    return found


def json_strings(value) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(json_strings(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(json_strings(v) for v in value)) if value else set()
    return set()


def assert_nothing_leaks(source: str, files: list[Path], tmp_path: Path) -> None:
    hidden = secrets(source)
    assert len(hidden) > 100        # the check has something to find
    # Substrings: every string long enough to be specific (pure numbers may reappear as values).
    specific = [s for s in hidden if len(s) >= 4 and not s.replace(".", "").replace("-", "").isdigit()]
    for path in files:
        raw = path.read_bytes()
        texts = [raw]
        strings: set[str] = set()
        if path.name.endswith(".et"):
            json_path = tmp_path / (path.name + ".json")
            jsonize_file(path, json_path)
            text = json_path.read_text()
            texts.append(text.encode())
            strings = json_strings(json.loads(text))
        else:
            strings = json_strings(json.loads(raw))
        for blob in texts:
            leaked = [s for s in specific if s.encode() in blob]
            assert not leaked, f"{path}: {leaked[:5]}"
        # Short strings: not as a whole string anywhere.
        assert not (strings & hidden), f"{path}: {sorted(strings & hidden)[:5]}"


def test_an_obfuscated_trace_keeps_no_string_of_the_source(dlrm, tmp_path):
    out = tmp_path / "hidden"
    cli("obfuscate", dlrm, "--out", out, "--seed", 7)
    files = [path for _, path in trace_files(out)]
    assert len(files) == 2
    assert_nothing_leaks(dlrm, files, tmp_path)
    for path in files:
        for node in read_trace(path).nodes:
            assert node.name == "" and not node.inputs.shapes and not node.outputs.values
            assert {a.name for a in node.attr} <= {"is_cpu_op", "comm_type", "comm_size", "pg_name",
                                                   "num_ops", "tensor_size", "comm_src", "comm_dst",
                                                   "comm_tag", "involved_dim"}


def test_an_obfuscated_trace_simulates_within_the_tolerance(dlrm, tmp_path):
    out = tmp_path / "hidden"
    cli("obfuscate", dlrm, "--out", out, "--tolerance", 0.05)
    before = simulate(manifest(dlrm, uniform_network(2)))
    after = simulate(manifest(str(out), uniform_network(2)))
    assert abs(after["finish_ns"] / before["finish_ns"] - 1) <= 0.05
    sent = lambda r: sum(row["bytes_sent"] for row in r["ranks"])  # noqa: E731
    assert abs(sent(after) / sent(before) - 1) <= 0.05
    source, hidden = read_trace(f"{dlrm}.0.et").nodes, read_trace(f"{out}.0.et").nodes
    assert [n.type for n in source] == [n.type for n in hidden]
    assert [n.id for n in hidden] == list(range(len(hidden)))          # renumbered
    renumber = {n.id: i for i, n in enumerate(source)}
    assert [sorted(renumber[p] for p in n.data_deps) for n in source] == [sorted(n.data_deps) for n in hidden]


def test_synthesize_obfuscate_keeps_no_string_in_the_model_or_the_traces(dlrm, tmp_path):
    model = tmp_path / "model.json"
    cli("synthesize", "--from", dlrm, "--obfuscate", "--model", model, "--out", tmp_path / "syn")
    assert_nothing_leaks(dlrm, [model, *(p for _, p in trace_files(tmp_path / "syn"))], tmp_path)
    # Without --obfuscate the model keeps names (a negative control for the check above).
    cli("synthesize", "--from", dlrm, "--model", tmp_path / "plain.json")
    assert secrets(dlrm) & json_strings(json.loads((tmp_path / "plain.json").read_text()))


def test_groups_are_renamed_alike_on_every_rank(tmp_path):
    groups = json.dumps([{"pg_name": "secret_tp", "ranks": [0, 1]}])

    def rank(r):
        meta = make_node(0, pb.METADATA_NODE, name="pg")
        meta.inputs.values = groups
        return [meta, comp(1, 5, [0], op_schema="aten::secret(Tensor x) -> Tensor"),
                collective(2, pb.ALL_REDUCE, 3000, [1], pg_name="secret_tp")]

    source = write_ranks(tmp_path, [rank(0), rank(1)], name="src")
    cli("obfuscate", source, "--out", tmp_path / "out", "--tolerance", 0.2, "--seed", 3)
    names, sizes = set(), set()
    for _, path in trace_files(tmp_path / "out"):
        nodes = read_trace(path).nodes
        assert "secret" not in nodes[0].inputs.values
        coll = nodes[2]
        names |= {a.string_val for a in coll.attr if a.name == "pg_name"}
        sizes |= {a.int64_val for a in coll.attr if a.name == "comm_size"}
    assert names == {"group0"} and sizes == {perturbed_size(3, 0.2, 3000)}
    assert simulate(manifest(str(tmp_path / "out"), uniform_network(2)))["finish_ns"] > 0


def test_a_comm_group_file_is_renamed_with_the_traces(tmp_path):
    source = write_ranks(tmp_path, [[collective(0, pb.ALL_REDUCE, 64, pg_name="7")]] * 2, name="src")
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"7": [0, 1]}))
    cli("obfuscate", source, "--out", tmp_path / "out", "--comm-group", groups)
    assert json.loads((tmp_path / "out.comm-groups.json").read_text()) == {"group0": [0, 1]}
    data = manifest(str(tmp_path / "out"), uniform_network(2), comm_groups=str(tmp_path / "out.comm-groups.json"))
    assert simulate(data)["finish_ns"] > 0


def test_obfuscate_refuses_to_overwrite_its_source(tmp_path):
    source = write_ranks(tmp_path, [[comp(0, 1)]], name="src")
    result = CliRunner().invoke(main, ["obfuscate", source, "--out", source])
    assert result.exit_code == 2 and "is a source file" in result.output
    assert read_trace(f"{source}.0.et").nodes[0].duration_micros == 1
    result = CliRunner().invoke(main, ["obfuscate", source, "--out", str(tmp_path / "x"), "--tolerance", "1.5"])
    assert result.exit_code == 2 and "--tolerance" in result.output
