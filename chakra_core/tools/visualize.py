"""One rank's dependency graph as Graphviz DOT or GraphML (`chakra-sim visualize`).

Nodes are coloured by node type; data dependencies are solid edges, control
dependencies dashed (GraphML: the edge attribute `kind` is "data", "ctrl" or
"data+ctrl"). Large traces stay usable through a selection:

- `--range START:END`: nodes whose id is in [START, END) (either side may be
  left out: `1000:` or `:500`);
- `--around ID --depth K`: the node and everything within K dependency hops of
  it, following edges both ways (parents and children).

A selection above `--max-nodes` (default 2000) is refused with a message,
since Graphviz takes minutes on such graphs and nobody can read them. Edges
to nodes outside the selection are left out and counted in the graph label.
The trace is streamed, and only ids and dependencies are kept for the whole
graph, so multi-gigabyte traces work.

The DOT text is written directly (no pydot); GraphML goes through networkx.
Both are deterministic: nodes in id order, edges in (child, parent) order.
"""

from __future__ import annotations

import os
import shutil
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generator, cast

import click

from chakra_core._atomic import atomic_output, atomic_write_text
from chakra_core.errors import ChakraSimError
from chakra_core.et.attrs import attr_value
from chakra_core.et.io import iter_trace
from chakra_core.schema import pb
from chakra_core.cli.output import CliError, tool_errors

if TYPE_CHECKING:
    import networkx as nx  # no stubs (types-networkx is not a dependency): see [tool.mypy] in pyproject.toml

DEFAULT_MAX_NODES = 2000

NODE_COLORS = {
    "METADATA_NODE": "#d9d9d9",
    "MEM_LOAD_NODE": "#b3de69",
    "MEM_STORE_NODE": "#ccebc5",
    "COMP_NODE": "#80b1d3",
    "COMM_SEND_NODE": "#fdb462",
    "COMM_RECV_NODE": "#ffed6f",
    "COMM_COLL_NODE": "#fb8072",
    "STORAGE_NODE": "#bc80bd",
    "BATCH_NODE": "#bebada",
    "CHECKPOINT_NODE": "#8dd3c7",
    "INVALID_NODE": "#ffffff",
}
"""Fill colour per node type (ColorBrewer Set3)."""

SHOWN_ATTRS = ("comm_type", "comm_size", "pg_name", "comm_src", "comm_dst", "comm_tag", "num_ops",
               "tensor_size", "is_cpu_op", "root_rank")
"""Attributes copied to the drawing (DOT tooltip, GraphML node data) when present."""


class VisualizeError(ChakraSimError):
    """The selection is invalid or too large; the message says what to change."""


@dataclass
class GraphNode:
    id: int
    name: str
    type: str
    duration_micros: int
    attrs: dict[str, object] = field(default_factory=dict)


@dataclass
class Selection:
    nodes: list[GraphNode]
    edges: list[tuple[int, int, str]]      # (parent, child, "data" | "ctrl" | "data+ctrl")
    cut_edges: int                         # edges with one end outside the selection
    missing_parents: int                   # dependencies on ids absent from the trace
    total_nodes: int
    description: str


def parse_range(text: str) -> tuple[int | None, int | None]:
    """'START:END' -> (START, END); either may be empty."""
    if ":" not in text:
        raise VisualizeError(f"--range {text!r}: expected START:END (node ids, END excluded)")
    start_text, end_text = text.split(":", 1)
    try:
        start = int(start_text) if start_text.strip() else None
        end = int(end_text) if end_text.strip() else None
    except ValueError:
        raise VisualizeError(f"--range {text!r}: START and END must be integers") from None
    if start is not None and end is not None and end <= start:
        raise VisualizeError(f"--range {text!r}: END must be greater than START")
    return start, end


def _graph_node(node: pb.Node) -> GraphNode:
    attrs: dict[str, object] = {}
    for attr in node.attr:
        if attr.name in SHOWN_ATTRS:
            value = attr_value(attr)
            if isinstance(value, (bool, int, float, str)):
                attrs[attr.name] = value
    try:
        type_name = pb.NodeType.Name(node.type)
    except ValueError:
        type_name = f"TYPE_{node.type}"
    return GraphNode(node.id, node.name, type_name, node.duration_micros, attrs)


def select(path: str | os.PathLike[str], id_range: tuple[int | None, int | None] | None = None,
           around: int | None = None, depth: int = 1, max_nodes: int = DEFAULT_MAX_NODES) -> Selection:
    """Read a trace and pick the nodes to draw (see the module docstring)."""
    if around is not None and id_range is not None:
        raise VisualizeError("give either --range or --around, not both")
    if depth < 0:
        raise VisualizeError("--depth must be >= 0")
    meta, stream = iter_trace(path)
    deps: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    kept: dict[int, GraphNode] = {}
    start, end = id_range if id_range is not None else (None, None)
    total = 0
    for _, node in stream:
        total += 1
        deps[node.id] = (tuple(node.data_deps), tuple(node.ctrl_deps))
        if around is None and (start is None or node.id >= start) and (end is None or node.id < end):
            if len(kept) >= max_nodes:
                # iter_trace's iterator is a generator: closing it closes the file
                cast("Generator[tuple[int, pb.Node], None, None]", stream).close()
                raise _too_many(path, total, max_nodes, id_range)
            kept[node.id] = _graph_node(node)
    if around is not None:
        if around not in deps:
            raise VisualizeError(f"{path}: no node with id {around}")
        wanted = _neighbourhood(deps, around, depth)
        if len(wanted) > max_nodes:
            raise VisualizeError(
                f"{path}: {len(wanted)} nodes lie within {depth} hop(s) of node {around}, more than "
                f"--max-nodes {max_nodes}; lower --depth or raise --max-nodes")
        meta, stream = iter_trace(path)
        for _, node in stream:
            if node.id in wanted:
                kept[node.id] = _graph_node(node)
        description = f"node {around} and {depth} hop(s) around it"
    elif id_range is not None:
        description = f"ids {'' if start is None else start}:{'' if end is None else end}"
    else:
        description = "all nodes"
    edges, cut, missing = [], 0, 0
    for child in sorted(kept):
        data, ctrl = deps[child]
        kinds: dict[int, str] = {}
        for parent in data:
            kinds[parent] = "data"
        for parent in ctrl:
            kinds[parent] = "data+ctrl" if kinds.get(parent) == "data" else "ctrl"
        for parent in sorted(kinds):
            if parent not in deps:
                missing += 1
            elif parent in kept:
                edges.append((parent, child, kinds[parent]))
            else:
                cut += 1
    # children of kept nodes that were not kept
    for node_id, (data, ctrl) in deps.items():
        if node_id not in kept:
            cut += len({p for p in (*data, *ctrl) if p in kept})
    return Selection([kept[i] for i in sorted(kept)], edges, cut, missing, total, description)


def _too_many(path: str | os.PathLike[str], total: int, max_nodes: int,
              id_range: tuple[int | None, int | None] | None) -> VisualizeError:
    where = "the selected range" if id_range is not None else "the trace"
    return VisualizeError(
        f"{path}: {where} has more than --max-nodes {max_nodes} nodes (read {total:,} so far); "
        "pick a part with --range START:END or --around NODE_ID --depth K, or raise --max-nodes")


def _neighbourhood(deps: dict[int, tuple[tuple[int, ...], tuple[int, ...]]], center: int,
                   depth: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for node_id, (data, ctrl) in deps.items():
        for parent in (*data, *ctrl):
            children.setdefault(parent, []).append(node_id)
    seen = {center}
    frontier = deque([(center, 0)])
    while frontier:
        node_id, hops = frontier.popleft()
        if hops == depth:
            continue
        data, ctrl = deps.get(node_id, ((), ()))
        for other in (*data, *ctrl, *children.get(node_id, ())):
            if other in deps and other not in seen:
                seen.add(other)
                frontier.append((other, hops + 1))
    return seen


# Output --------------------------------------------------------------------------------------------------
def _dot_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(selection: Selection, title: str) -> str:
    lines = [f"digraph {_dot_string(title)} {{",
             "  graph [rankdir=TB, fontname=\"Helvetica\", labelloc=t, "
             f"label={_dot_string(_caption(selection, title))}];",
             "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];",
             "  edge [arrowsize=0.6];"]
    for node in selection.nodes:
        label = f"{node.id}: {node.name}\n{node.type.replace('_NODE', '')}"
        if node.duration_micros:
            label += f" {node.duration_micros} µs"
        tooltip = ", ".join(f"{k}={v}" for k, v in node.attrs.items())
        color = NODE_COLORS.get(node.type, "#ffffff")
        extra = f", tooltip={_dot_string(tooltip)}" if tooltip else ""
        lines.append(f"  n{node.id} [label={_dot_string(label)}, fillcolor=\"{color}\"{extra}];")
    for parent, child, kind in selection.edges:
        style = {"data": "solid", "ctrl": "dashed", "data+ctrl": "bold"}[kind]
        lines.append(f"  n{parent} -> n{child} [style={style}];")
    lines.append("  subgraph cluster_legend {")
    lines.append("    label=\"legend\"; fontsize=9; style=dashed;")
    legend_types = sorted({node.type for node in selection.nodes})
    for index, type_name in enumerate(legend_types):
        lines.append(f"    legend{index} [label=\"{type_name}\", fillcolor=\"{NODE_COLORS.get(type_name, '#ffffff')}\", "
                     "fontsize=8];")
    lines.append("    legend_data_a [label=\"data dep\", shape=plaintext, style=\"\"];"
                 " legend_data_b [label=\"\", shape=point];")
    lines.append("    legend_data_a -> legend_data_b [style=solid];")
    lines.append("    legend_ctrl_a [label=\"control dep\", shape=plaintext, style=\"\"];"
                 " legend_ctrl_b [label=\"\", shape=point];")
    lines.append("    legend_ctrl_a -> legend_ctrl_b [style=dashed];")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _caption(selection: Selection, title: str) -> str:
    text = (f"{title}: {selection.description}, {len(selection.nodes)} of {selection.total_nodes} nodes, "
            f"{len(selection.edges)} edges")
    if selection.cut_edges:
        text += f" ({selection.cut_edges} edges to unselected nodes not drawn)"
    if selection.missing_parents:
        text += f"; {selection.missing_parents} dependencies on ids absent from the trace"
    return text


def to_networkx(selection: Selection, title: str) -> nx.DiGraph:
    import networkx as nx

    graph = nx.DiGraph(name=title, description=_caption(selection, title))
    for node in selection.nodes:
        data = {"name": node.name, "type": node.type, "duration_micros": node.duration_micros,
                "color": NODE_COLORS.get(node.type, "#ffffff")}
        for key, value in node.attrs.items():
            # GraphML has no unsigned 64-bit type: huge integers go as text
            data[key] = str(value) if isinstance(value, int) and not isinstance(value, bool) \
                and not -2**63 <= value < 2**63 else value
        graph.add_node(node.id, **data)
    for parent, child, kind in selection.edges:
        graph.add_edge(parent, child, kind=kind)
    return graph


def write_graph(selection: Selection, fmt: str, output: str | os.PathLike[str], title: str) -> None:
    if fmt == "dot":
        atomic_write_text(output, to_dot(selection, title))
    elif fmt == "graphml":
        import networkx as nx

        graph = to_networkx(selection, title)
        with atomic_output(output, "wb") as handle:
            nx.write_graphml(graph, handle)
    else:
        raise VisualizeError(f"unknown format {fmt!r}; expected dot or graphml")


@click.command("visualize")
@click.argument("trace", metavar="TRACE.et", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["dot", "graphml"]), default=None,
              help="output format [default: from the --output suffix, else dot]")
@click.option("--output", required=True, type=click.Path(dir_okay=False), help="file to write")
@click.option("--range", "id_range", metavar="START:END", help="only node ids in [START, END)")
@click.option("--around", type=int, metavar="NODE_ID", help="only this node and its neighbourhood")
@click.option("--depth", default=2, show_default=True, type=click.IntRange(min=0),
              help="hops around --around (parents and children)")
@click.option("--max-nodes", default=DEFAULT_MAX_NODES, show_default=True, type=click.IntRange(min=1),
              help="refuse larger selections")
def visualize(trace: str, fmt: str | None, output: str, id_range: str | None, around: int | None, depth: int,
              max_nodes: int) -> None:
    """Draw one rank's dependency graph as Graphviz DOT or GraphML.

    Needs no Graphviz; rendering a DOT file to a picture does (`dot`, from the
    graphviz system package: apt, brew or conda, not pip).

    Nodes are coloured by type; data dependencies are solid edges, control
    dependencies dashed.

    \b
    Examples:
      chakra-sim visualize traces/llm.0.et --format dot --output llm0.dot
      dot -Tsvg llm0.dot -o llm0.svg
      chakra-sim visualize big.0.et --format graphml --output part.graphml --range 1000:1500
      chakra-sim visualize big.0.et --output around.dot --around 4242 --depth 3
    """
    if not Path(trace).is_file():
        raise CliError(f"{trace}: no such file")
    if fmt is None:
        fmt = "graphml" if str(output).lower().endswith(".graphml") else "dot"
    with tool_errors(str(output)):
        selection = select(trace, parse_range(id_range) if id_range else None, around, depth, max_nodes)
        write_graph(selection, fmt, output, Path(trace).name)
    click.echo(f"wrote {output} ({fmt}: {len(selection.nodes)} of {selection.total_nodes} nodes, "
               f"{len(selection.edges)} edges)")
    if fmt == "dot":
        click.echo(render_hint(str(output), shutil.which("dot") is not None))


def render_hint(output: str, have_graphviz: bool) -> str:
    """How to make a picture of a DOT file; Graphviz is not a Python package, so pip never installs it."""
    command = f"dot -Tsvg {output} -o {Path(output).with_suffix('.svg')}"
    if have_graphviz:
        return f"picture: {command}"
    return (f"picture: {command} needs Graphviz, not installed here (apt install graphviz, brew install "
            "graphviz or conda install graphviz); or write --format graphml for Gephi or yEd")
