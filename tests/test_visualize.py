"""`chakra-sim visualize`: DOT and GraphML dependency graphs of one rank."""

from __future__ import annotations

import re

import networkx as nx
import pytest
from click.testing import CliRunner

from chakra_core.schema import pb
from chakra_core.tools.visualize import NODE_COLORS, VisualizeError, parse_range, select, visualize
from tests.helpers import make_node

NODE_LINE = re.compile(r'^  n(\d+) \[label="((?:[^"\\]|\\.)*)", fillcolor="(#[0-9a-f]{6})"(?:, tooltip="((?:[^"\\]|\\.)*)")?\];$')
EDGE_LINE = re.compile(r"^  n(\d+) -> n(\d+) \[style=(solid|dashed|bold)\];$")


def small_trace() -> list[pb.Node]:
    """0 -> 1 -> 3, 0 -> 2 -> 3 (2 by control), 3 -> 4 (data and control); 5 alone."""
    return [
        make_node(0, pb.METADATA_NODE, name="groups"),
        make_node(1, pb.COMP_NODE, data_deps=[0], duration_micros=7, name='gemm "qkv"',
                  attrs={"num_ops": ("uint64_val", 100), "tensor_size": ("uint64_val", 50)}),
        make_node(2, pb.COMM_COLL_NODE, ctrl_deps=[0], name="all_reduce",
                  attrs={"comm_type": pb.ALL_REDUCE, "comm_size": 4096, "pg_name": "tp0"}),
        make_node(3, pb.COMM_SEND_NODE, data_deps=[1, 2], name="send",
                  attrs={"comm_dst": 1, "comm_size": 8}),
        make_node(4, pb.COMM_RECV_NODE, data_deps=[3], ctrl_deps=[3], name="recv"),
        make_node(5, pb.MEM_LOAD_NODE, data_deps=[99], name="orphan"),
    ]


def parse_dot(text: str):
    nodes, edges = {}, []
    assert text.startswith("digraph ") and text.rstrip().endswith("}")
    body = text.split("subgraph cluster_legend", 1)[0]
    for line in body.splitlines():
        if (m := NODE_LINE.match(line)) is not None:
            nodes[int(m.group(1))] = (m.group(2), m.group(3), m.group(4))
        elif (m := EDGE_LINE.match(line)) is not None:
            edges.append((int(m.group(1)), int(m.group(2)), m.group(3)))
        elif re.match(r"^  n\d", line):
            raise AssertionError(f"unparsed DOT line: {line!r}")
    return nodes, edges


def test_dot_colours_types_and_styles_edges(et_file, tmp_path):
    trace = et_file(small_trace())
    out = tmp_path / "g.dot"
    result = CliRunner().invoke(visualize, [str(trace), "--format", "dot", "--output", str(out)])
    assert result.exit_code == 0, result.output
    nodes, edges = parse_dot(out.read_text())
    assert sorted(nodes) == [0, 1, 2, 3, 4, 5]
    types = {0: "METADATA_NODE", 1: "COMP_NODE", 2: "COMM_COLL_NODE", 3: "COMM_SEND_NODE",
             4: "COMM_RECV_NODE", 5: "MEM_LOAD_NODE"}
    for node_id, type_name in types.items():
        assert nodes[node_id][1] == NODE_COLORS[type_name]
    assert len({NODE_COLORS[t] for t in types.values()}) == len(types)
    label, _, tooltip = nodes[1]
    assert label == '1: gemm \\"qkv\\"\\nCOMP 7 µs'            # quotes escaped, type and duration shown
    assert tooltip == "num_ops=100, tensor_size=50"
    assert "pg_name=tp0" in nodes[2][2]
    assert edges == [(0, 1, "solid"), (0, 2, "dashed"), (1, 3, "solid"), (2, 3, "solid"), (3, 4, "bold")]
    text = out.read_text()
    assert "1 dependencies on ids absent from the trace" in text
    assert "legend" in text and "control dep" in text


def test_graphml_round_trips_through_networkx(et_file, tmp_path):
    trace = et_file(small_trace())
    out = tmp_path / "g.graphml"
    result = CliRunner().invoke(visualize, [str(trace), "--output", str(out)])   # format from the suffix
    assert result.exit_code == 0, result.output
    graph = nx.read_graphml(out)
    assert sorted(graph.nodes, key=int) == ["0", "1", "2", "3", "4", "5"]
    assert graph.nodes["2"]["type"] == "COMM_COLL_NODE" and graph.nodes["2"]["comm_size"] == 4096
    assert graph.nodes["2"]["pg_name"] == "tp0" and graph.nodes["1"]["duration_micros"] == 7
    assert graph.nodes["3"]["color"] == NODE_COLORS["COMM_SEND_NODE"]
    kinds = {(u, v): d["kind"] for u, v, d in graph.edges(data=True)}
    assert kinds == {("0", "1"): "data", ("0", "2"): "ctrl", ("1", "3"): "data", ("2", "3"): "data",
                     ("3", "4"): "data+ctrl"}


def chain(n: int) -> list[pb.Node]:
    """0 <- 1 <- ... <- n-1, plus node i also depending on i-2 by control."""
    return [make_node(i, pb.COMP_NODE, data_deps=[i - 1] if i else [],
                      ctrl_deps=[i - 2] if i >= 2 else []) for i in range(n)]


def test_range_and_neighbourhood_selection(et_file):
    trace = et_file(chain(50))
    part = select(trace, (10, 15))
    assert [n.id for n in part.nodes] == [10, 11, 12, 13, 14]
    assert [(p, c) for p, c, _ in part.edges] == [(10, 11), (10, 12), (11, 12), (11, 13), (12, 13),
                                                 (12, 14), (13, 14)]
    # cut: 10<-9, 10<-8, 11<-9 into the range; 15<-14, 15<-13, 16<-14 out of it
    assert part.cut_edges == 6 and part.total_nodes == 50
    assert [n.id for n in select(trace, (None, 3)).nodes] == [0, 1, 2]
    assert [n.id for n in select(trace, (47, None)).nodes] == [47, 48, 49]
    around = select(trace, around=20, depth=1)
    assert [n.id for n in around.nodes] == [18, 19, 20, 21, 22]
    around = select(trace, around=20, depth=2)
    assert [n.id for n in around.nodes] == list(range(16, 25))
    assert [n.id for n in select(trace, around=0, depth=0).nodes] == [0]


def test_large_selections_are_refused_unless_allowed(et_file, tmp_path):
    trace = et_file(chain(300))
    out = tmp_path / "big.dot"
    result = CliRunner().invoke(visualize, [str(trace), "--output", str(out), "--max-nodes", "100"])
    assert result.exit_code == 2
    assert "more than --max-nodes 100 nodes" in result.output and "--range START:END" in result.output
    assert not out.exists() and "Traceback" not in result.output
    result = CliRunner().invoke(visualize, [str(trace), "--output", str(out), "--max-nodes", "100",
                                            "--around", "150", "--depth", "60"])
    assert result.exit_code == 2 and "lower --depth or raise --max-nodes" in result.output
    result = CliRunner().invoke(visualize, [str(trace), "--output", str(out), "--max-nodes", "100",
                                            "--range", "100:200"])
    assert result.exit_code == 0, result.output
    assert len(parse_dot(out.read_text())[0]) == 100
    result = CliRunner().invoke(visualize, [str(trace), "--output", str(out), "--max-nodes", "300"])
    assert result.exit_code == 0 and len(parse_dot(out.read_text())[0]) == 300


@pytest.mark.parametrize("args, message", [
    (["--range", "5"], "expected START:END"),
    (["--range", "9:3"], "END must be greater than START"),
    (["--range", "a:b"], "must be integers"),
    (["--around", "77"], "no node with id 77"),
    (["--around", "1", "--range", "0:2"], "either --range or --around"),
])
def test_selection_errors(et_file, tmp_path, args, message):
    trace = et_file(chain(5))
    result = CliRunner().invoke(visualize, [str(trace), "--output", str(tmp_path / "x.dot"), *args])
    assert result.exit_code == 2
    assert message in result.output


def test_missing_file_and_parse_range():
    result = CliRunner().invoke(visualize, ["/nonexistent/t.et", "--output", "x.dot"])
    assert result.exit_code == 2 and "no such file" in result.output
    assert parse_range("3:") == (3, None) and parse_range(":8") == (None, 8)
    with pytest.raises(VisualizeError):
        parse_range("8:8")


def test_output_is_deterministic_and_reads_gzip(et_file, tmp_path):
    plain = et_file(small_trace(), name="a.et")
    packed = et_file(small_trace(), name="b.et", compress=True)
    texts = []
    for trace, fmt in ((plain, "dot"), (packed, "dot"), (plain, "graphml"), (packed, "graphml")):
        out = tmp_path / f"{trace.stem}.{fmt}"
        assert CliRunner().invoke(visualize, [str(trace), "--format", fmt, "--output", str(out)]).exit_code == 0
        texts.append(out.read_text().replace(trace.name, "T"))
    assert texts[0] == texts[1] and texts[2] == texts[3]


@pytest.mark.parametrize("have_graphviz", [False, True])
def test_a_dot_file_comes_with_how_to_render_it(et_file, tmp_path, monkeypatch, have_graphviz):
    trace = et_file(small_trace())
    monkeypatch.setattr("chakra_core.tools.visualize.shutil.which", lambda name: "/usr/bin/dot" if have_graphviz else None)
    out = tmp_path / "g.dot"
    result = CliRunner().invoke(visualize, [str(trace), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert f"picture: dot -Tsvg {out} -o {tmp_path / 'g.svg'}" in result.output
    assert ("needs Graphviz, not installed here" in result.output) is not have_graphviz
    graphml = CliRunner().invoke(visualize, [str(trace), "--output", str(tmp_path / "g.graphml")])
    assert "picture:" not in graphml.output
