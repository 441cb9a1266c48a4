"""Member state machine of ASTRA-sim's double-binary-tree all-reduce, and its trees.

The class reproduces, behaviourally, the algorithm of ASTRA-sim's system layer
(astra-sim/system/astraccl/native_collectives, MIT licence): its step counts,
message sizes, which received messages are reduced, and its packet pipeline
(a received message costs the endpoint delay, plus the reduction delay when
it is reduced, before it can be forwarded). Matching those mechanics is what
lets ASTRA-sim's users get its numbers here; comments say where a rule comes
from. `binary_tree` builds ASTRA-sim's BinaryTree shape.

A member talks only to its `PhaseIO` (runner.py); `ctx` holds what all
members of a phase share (see machines.py).
"""

from __future__ import annotations

from chakra_core.contract.algorithm import PhaseContext


class DoubleBinaryTreeMember:
    """ASTRA-sim's double-binary-tree all-reduce: reduce up a binary tree, broadcast down.

    Chunks alternate between two trees (root = highest id, root = lowest id).
    Every message carries the whole chunk. ASTRA-sim runs this algorithm for
    any collective type (its all-reduce timing); so do we, for compatibility.
    """

    LEAF, INTERMEDIATE, ROOT = range(3)

    def __init__(self, ctx: PhaseContext, pos: int, data_size: int, parent: int,
                 left: int, right: int):
        self.ctx, self.io, self.pos = ctx, ctx.io, pos
        self.size = data_size
        self.parent, self.left, self.right = parent, left, right
        if parent < 0:
            self.kind = self.ROOT
        elif left < 0 and right < 0:
            self.kind = self.LEAF
        else:
            self.kind = self.INTERMEDIATE
        self.state = "begin"
        self.reductions = 0

    def _bundle(self, processed: bool) -> None:
        self.io.after(self.ctx.endpoint_delay, self._bundle_done, processed)

    def _bundle_done(self, processed: bool) -> None:
        if processed:
            self.io.after(self.ctx.reduce_delay(self.size), self.run, "general")
        else:
            self.run("general")

    def start(self) -> None:
        self.run("init")

    def _received(self, _arg: object = None) -> None:
        self.run("received")

    def run(self, event: str) -> None:
        io, kind, state = self.io, self.kind, self.state
        if kind == self.LEAF:
            if state == "begin":
                self._bundle(False)
                self.state = "sending_to_parent"
            elif state == "sending_to_parent":
                io.send(self.pos, self.parent, self.size)
                io.recv(self.pos, self.parent, self._received, None)
                self.state = "waiting_parent"
            elif state == "waiting_parent":
                self._bundle(False)
                self.state = "end"
            elif state == "end":
                io.finish(self.pos)
                self.state = "done"
        elif kind == self.INTERMEDIATE:
            if state == "begin":
                self.state = "waiting_two"
                io.recv(self.pos, self.left, self._received, None)
                io.recv(self.pos, self.right, self._received, None)
            elif state == "waiting_two" and event == "received":
                self._bundle(True)
                self.state = "waiting_one"
            elif state == "waiting_one" and event == "received":
                self._bundle(True)
                self.state = "sending_to_parent"
            elif self.reductions < 1 and event == "general":
                self.reductions += 1
            elif state == "sending_to_parent":
                self.state = "waiting_parent"
                io.send(self.pos, self.parent, self.size)
                io.recv(self.pos, self.parent, self._received, None)
            elif state == "waiting_parent" and event == "received":
                self._bundle(True)
                self.state = "sending_to_children"
            elif state == "sending_to_children":
                io.send(self.pos, self.left, self.size)
                io.send(self.pos, self.right, self.size)
                io.finish(self.pos)
                self.state = "done"
        else:  # root: one child
            child = self.left if self.left >= 0 else self.right
            if state == "begin":
                self.state = "waiting_one"
                io.recv(self.pos, child, self._received, None)
            elif state == "waiting_one":
                self._bundle(True)
                self.state = "sending_to_children"
            elif state == "sending_to_children":
                io.send(self.pos, child, self.size)
                io.finish(self.pos)
                self.state = "done"


def binary_tree(count: int, root_max: bool) -> dict[int, tuple[int, int, int]]:
    """ASTRA-sim's BinaryTree over positions 0..count-1: {pos: (parent, left, right)}, -1 = none.

    A full tree of depth d-1 hangs off a root that has one child; positions are
    assigned in-order, so the root gets the highest position (root_max) or the lowest.
    """
    depth, tmp = 1, count
    while tmp > 1:
        depth += 1
        tmp //= 2
    nodes: list[list[int]] = []   # [parent, left, right] by node index

    def make(parent: int, levels: int) -> int:
        index = len(nodes)
        nodes.append([parent, -1, -1])
        if levels > 1:
            nodes[index][1] = make(index, levels - 1)
            nodes[index][2] = make(index, levels - 1)
        return index

    root = len(nodes)
    nodes.append([-1, -1, -1])
    child = make(root, depth - 1)
    nodes[root][2 if not root_max else 1] = child
    position: dict[int, int] = {}
    counter = 0

    def in_order(index: int) -> None:
        nonlocal counter
        _, left, right = nodes[index]
        if left >= 0:
            in_order(left)
        position[index] = counter
        counter += 1
        if right >= 0:
            in_order(right)

    in_order(root)
    tree: dict[int, tuple[int, int, int]] = {}
    for index, (parent, left, right) in enumerate(nodes):
        tree[position[index]] = (position[parent] if parent >= 0 else -1,
                                 position[left] if left >= 0 else -1,
                                 position[right] if right >= 0 else -1)
    return tree
