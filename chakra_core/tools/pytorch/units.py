"""Which host scopes become Chakra nodes ("units"), so no work is counted twice.

The host trace is a call tree: profiler wrappers (`[pytorch|profiler|execution_trace|process]`
and `|thread]`), user annotations (`## forward ##`, `autograd::engine::evaluate_function: ...`)
and operators that call other operators (`aten::linear` -> `aten::t`, `aten::addmm`). Walking
down from the thread wrappers, a scope is

1. a *communication unit* if it is a communication operator (see comms.py); the
   `record_param_comms` / backend scopes and view/allocation operators under it are absorbed
   into it, anything else under it is visited as if it were its sibling;
2. a *unit* if it has no children; or if it has a FLOP formula and nothing under it has one
   (`aten::convolution_backward` over its allocations); or if everything under it only creates
   or re-views tensors (`aten::reshape` -> `aten::view`); its descendants are absorbed;
3. otherwise represented by its children (visited in id order).

`## process_group:init ##` scopes define process groups (a METADATA node), never work.

Backends that run a collective on their own thread record its scope (`gloo:all_reduce`) under
whatever scope was open on the host thread, possibly with unrelated children. Such a backend
scope outside any communication operator is a *shadow* of the most recent communication
operator of the same type still without one: it is taken out of the tree (its children move up
to its parent) and only lends its measured duration to that operator. A backend scope with no
operator to shadow is a communication unit itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from chakra_core.tools.pytorch.comms import comm_kind, is_backend_op
from chakra_core.tools.pytorch.flops import FLOP_OPS
from chakra_core.tools.pytorch.host import HostOp, HostTrace
from chakra_core.tools.pytorch.ops import is_trivial

WRAPPER = re.compile(r"^\[pytorch\|profiler\|execution_(trace|graph)\|(process|thread)\]$")
PG_INIT = "## process_group:init ##"


@dataclass(slots=True)
class Unit:
    op: HostOp
    thread: int
    comm: bool = False
    absorbed: list[int] = field(default_factory=list)
    shadow: int | None = None
    """Id of the backend scope that ran this communication on another thread."""


@dataclass
class Selection:
    units: list[Unit]
    """In host id order (program order)."""
    unit_of: dict[int, Unit]
    """Host id -> the unit that represents it (units, absorbed scopes and shadows)."""
    children: dict[int, list[int]]
    pg_inits: list[HostOp]
    process_ops: list[HostOp]
    warnings: list[str]

    def units_under(self, host_id: int) -> list[Unit]:
        """Units in the subtree of a scope that is represented by its children."""
        found, stack = [], [host_id]
        while stack:
            current = stack.pop()
            unit = self.unit_of.get(current)
            if unit is not None and unit.op.id == current:
                found.append(unit)
                continue
            stack.extend(self.children.get(current, ()))
        return sorted(found, key=lambda u: u.op.id)


def select_units(trace: HostTrace) -> Selection:
    ops = trace.ops
    children: dict[int, list[int]] = {}
    parent: dict[int, int | None] = {}
    roots: list[int] = []
    for op in ops.values():
        if op.parent is None or op.parent == op.id:
            parent[op.id] = None
            roots.append(op.id)
        else:
            parent[op.id] = op.parent
            children.setdefault(op.parent, []).append(op.id)
    warnings: list[str] = []
    shadows = _pair_shadows(ops, children)
    for backend_id in shadows:
        _splice_out(backend_id, children, parent, roots)
    flops_below, trivial_below = _subtree_facts(ops, children, roots)

    units: list[Unit] = []
    unit_of: dict[int, Unit] = {}
    pg_inits: list[HostOp] = []
    process_ops: list[HostOp] = []
    visited: set[int] = set()
    stack: list[tuple[int, int | None]] = [(root, None) for root in sorted(roots, reverse=True)]
    while stack:
        node_id, thread = stack.pop()
        visited.add(node_id)
        op = ops[node_id]
        kids = children.get(node_id, [])
        if WRAPPER.match(op.name):
            if op.name.endswith("process]"):
                process_ops.append(op)
            elif op.tid is not None:
                thread = op.tid
            stack.extend((kid, thread) for kid in reversed(kids))
            continue
        if op.name == PG_INIT:
            pg_inits.append(op)
            stack.extend((kid, thread) for kid in reversed(kids))
            continue
        where = op.tid if op.tid is not None else (thread or 0)
        if comm_kind(op) is not None:
            unit = Unit(op, where, comm=True)
            inner = _absorb_comm(node_id, ops, children, unit)
            stack.extend((kid, thread) for kid in reversed(inner))
        elif (not kids or (op.name in FLOP_OPS and not flops_below[node_id])
              or all(trivial_below[kid] for kid in kids)):
            unit = Unit(op, where)
            unit.absorbed = _descendants(node_id, children)
        else:
            stack.extend((kid, thread) for kid in reversed(kids))
            continue
        units.append(unit)
        unit_of[node_id] = unit
        for absorbed in unit.absorbed:
            unit_of[absorbed] = unit
    units.sort(key=lambda u: u.op.id)
    lost = [i for i in ops if i not in visited and i not in unit_of and i not in shadows]
    if lost:
        shown = ", ".join(ops[i].label() for i in lost[:5])
        warnings.append(f"{trace.path}: {len(lost)} node(s) are not reachable from a top-level node "
                        f"(their parent links form a cycle) and are skipped: {shown}"
                        + (" ..." if len(lost) > 5 else ""))
    for backend_id, owner_id in shadows.items():
        owner = unit_of.get(owner_id)
        if owner is not None:
            owner.shadow = backend_id
            unit_of[backend_id] = owner
    return Selection(units, unit_of, children, pg_inits, process_ops, warnings)


def _pair_shadows(ops: dict[int, HostOp], children: dict[int, list[int]]) -> dict[int, int]:
    """Backend scopes outside communication operators -> the operator each one shadows."""
    inside: set[int] = set()        # scopes a communication operator absorbs
    has_backend: set[int] = set()   # communication operators with a backend scope below them
    for op in ops.values():
        if comm_kind(op) is None or op.id in inside:
            continue
        probe = Unit(op, 0, comm=True)
        _absorb_comm(op.id, ops, children, probe)
        inside.update(probe.absorbed)
        if any(is_backend_op(ops[below].name) for below in probe.absorbed):
            has_backend.add(op.id)
    waiting: list[HostOp] = []
    shadows: dict[int, int] = {}
    for op in ops.values():
        if op.id in inside:
            continue
        if is_backend_op(op.name):
            kind = comm_kind(op)
            match = next((w for w in reversed(waiting) if comm_kind(w) == kind), None)
            if match is not None:
                waiting.remove(match)
                shadows[op.id] = match.id
        elif comm_kind(op) is not None and op.id not in has_backend:
            waiting.append(op)
    return shadows


def _splice_out(node_id: int, children: dict[int, list[int]], parent: dict[int, int | None],
                roots: list[int]) -> None:
    """Remove a scope from the tree; its children take its place under its parent."""
    up = parent.get(node_id)
    kids = children.pop(node_id, [])
    siblings = children.get(up, roots) if up is not None else roots
    if node_id in siblings:
        siblings.remove(node_id)
    siblings.extend(kids)
    siblings.sort()
    for kid in kids:
        parent[kid] = up
    parent[node_id] = None


def _subtree_facts(ops: dict[int, HostOp], children: dict[int, list[int]],
                   roots: list[int]) -> tuple[dict[int, bool], dict[int, bool]]:
    """Per scope: is there a FLOP-formula operator strictly below it; is its whole subtree
    made of view/allocation operators."""
    flops_below: dict[int, bool] = {}
    trivial: dict[int, bool] = {}
    order: list[int] = []
    stack = list(roots)
    seen: set[int] = set()
    while stack:
        node_id = stack.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        order.append(node_id)
        stack.extend(children.get(node_id, ()))
    for node_id in reversed(order):
        kids = children.get(node_id, ())
        flops_below[node_id] = any(flops_below[k] or ops[k].name in FLOP_OPS for k in kids)
        trivial[node_id] = is_trivial(ops[node_id].name) and all(trivial[k] for k in kids)
    for node_id in ops:  # scopes unreachable from a root (cycles in parent links)
        flops_below.setdefault(node_id, False)
        trivial.setdefault(node_id, False)
    return flops_below, trivial


def _descendants(node_id: int, children: dict[int, list[int]]) -> list[int]:
    found, stack = [], list(children.get(node_id, ()))
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(children.get(current, ()))
    return sorted(found)


def _absorb_comm(node_id: int, ops: dict[int, HostOp], children: dict[int, list[int]], unit: Unit) -> list[int]:
    """Absorb the communication scopes and view/allocation operators under a communication
    operator into its unit; return the other children (visited as ordinary scopes)."""
    rest, stack = [], list(children.get(node_id, ()))
    while stack:
        current = stack.pop()
        op = ops[current]
        if comm_kind(op) is not None or op.name == "record_param_comms" or is_trivial(op.name):
            unit.absorbed.append(current)
            stack.extend(children.get(current, ()))
        else:
            rest.append(current)
    unit.absorbed.sort()
    return sorted(rest)
