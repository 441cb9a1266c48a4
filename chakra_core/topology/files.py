"""Topology files: an edge list (`src dst bandwidth_gbps latency_ns [uni]` per line) or GraphML
(edge attributes `bandwidth_gbps`, `latency_ns`), read into a Topology (integers name NPUs)."""

from __future__ import annotations

from pathlib import Path

from chakra_core.errors import InputFileError, ManifestError
from chakra_core.input_files import read_input_text
from chakra_core.topology.graph import Topology, gb_per_s_to_bpns


def from_file(path: Path) -> Topology:
    if not path.exists():
        raise ManifestError([(str(path), "topology file not found")])
    if path.suffix.lower() == ".graphml":
        return _from_graphml(path)
    return _from_edge_list(path)


def _node_index(names: dict[str, int], npu_ids: dict[str, int], token: str) -> None:
    if token not in names:
        names[token] = -1
        if token.isdigit():
            npu_ids[token] = int(token)


def _finish(path: Path, edges: list[tuple[str, str, float, float, bool, str]]) -> Topology:
    """Edges (src, dst, GB/s, ns, bidirectional, where) over named nodes; integers are NPUs."""
    tokens: dict[str, int] = {}
    npus: dict[str, int] = {}
    for src, dst, *_ in edges:
        _node_index(tokens, npus, src)
        _node_index(tokens, npus, dst)
    count = len(npus)
    ids = sorted(npus.values())
    if ids != list(range(count)):
        missing = sorted(set(range(max(ids) + 1 if ids else 0)) - set(ids))
        raise ManifestError([(str(path), f"NPUs must be numbered 0..N-1; missing: {missing[:10]}")])
    if count == 0:
        raise ManifestError([(str(path), "no NPU nodes (NPUs are the nodes named by integers)")])
    topo = Topology(npus=count, source=str(path))
    for npu in range(count):
        topo.add_device(f"npu{npu}")
        tokens[str(npu)] = npu
    for token in sorted(t for t in tokens if t not in npus):
        tokens[token] = topo.add_device(token)
    for src, dst, bw, lat, bidirectional, where in edges:
        a, b = tokens[src], tokens[dst]
        if a == b:
            raise ManifestError([(f"{path}: {where}", f"link from {src} to itself")])
        topo.connect(a, b, gb_per_s_to_bpns(bw), lat)
        if bidirectional:
            topo.connect(b, a, gb_per_s_to_bpns(bw), lat)
    return topo


def _from_edge_list(path: Path) -> Topology:
    edges = []
    problems = []
    try:
        text = read_input_text(path, "edge list")
    except InputFileError as exc:
        raise ManifestError([(exc.path, exc.reason)]) from None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        where = f"line {number}"
        if len(parts) not in (4, 5):
            problems.append((f"{path}: {where}", "expected 'src dst bandwidth_gbps latency_ns [uni]'"))
            continue
        src, dst = parts[0], parts[1]
        try:
            bw, lat = float(parts[2]), float(parts[3])
        except ValueError:
            problems.append((f"{path}: {where}", f"bandwidth and latency must be numbers: {line!r}"))
            continue
        if bw <= 0:
            problems.append((f"{path}: {where}", f"bandwidth must be positive, got {parts[2]}"))
        if lat < 0:
            problems.append((f"{path}: {where}", f"latency must be >= 0, got {parts[3]}"))
        if len(parts) == 5 and parts[4] not in ("uni", "bi"):
            problems.append((f"{path}: {where}", f"the fifth field must be 'uni' or 'bi', got {parts[4]!r}"))
        edges.append((src, dst, bw, lat, not (len(parts) == 5 and parts[4] == "uni"), where))
    if problems:
        raise ManifestError(problems)
    if not edges:
        raise ManifestError([(str(path), "no links")])
    return _finish(path, edges)


def _declared_graphml_nodes(path: Path) -> set[str | None]:
    import xml.etree.ElementTree as ET

    nodes: set[str | None] = set()   # None: a <node> without an id
    for element in ET.parse(path).getroot().iter():
        if element.tag.endswith("}node") or element.tag == "node":
            nodes.add(element.get("id"))
    return nodes


def _from_graphml(path: Path) -> Topology:
    import networkx as nx

    try:
        graph = nx.read_graphml(path)
        declared = _declared_graphml_nodes(path)
    except Exception as exc:  # networkx and ElementTree raise several parser exception types
        raise ManifestError([(str(path), f"not valid GraphML: {exc}")]) from None
    edges, problems = [], []
    for src, dst, data in graph.edges(data=True):
        where = f"edge {src} -> {dst}"
        unknown = [n for n in (src, dst) if str(n) not in declared]
        if unknown:
            problems.append((f"{path}: {where}", f"unknown node {unknown[0]!r} (not declared as a <node>)"))
            continue
        try:
            bw, lat = float(data["bandwidth_gbps"]), float(data.get("latency_ns", 0.0))
        except KeyError:
            problems.append((f"{path}: {where}", "needs a 'bandwidth_gbps' attribute"))
            continue
        except ValueError:
            problems.append((f"{path}: {where}", "bandwidth_gbps and latency_ns must be numbers"))
            continue
        if bw <= 0:
            problems.append((f"{path}: {where}", f"bandwidth must be positive, got {bw}"))
        if lat < 0:
            problems.append((f"{path}: {where}", f"latency must be >= 0, got {lat}"))
        edges.append((str(src), str(dst), bw, lat, not graph.is_directed(), where))
    if problems:
        raise ManifestError(problems)
    if not edges:
        raise ManifestError([(str(path), "no edges")])
    return _finish(path, edges)
