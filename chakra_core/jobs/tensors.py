"""The tensors a generated training step keeps alive, written as Chakra IOInfo operand lists.

With `tensors: true` in a job, every node lists the storages it saves or reads in
`inputs.values` / `outputs.values`, in the 6-list form the Chakra PyTorch converter writes:
`[tensor_id, storage_id, offset, num_elements, element_size, device]`. A memory layer that follows
storage lifetimes (the `hbm` plugin: live from the first node that lists a storage to the
completion of the last) then finds the step's peak memory from the trace itself.

What is listed, so that the figure can be set against `chakra_core.plan.memory`:
- model state: each gradient bucket's bf16 weights, main gradients and optimizer shard (fp32
  master weight and Adam moments, plus an fp32 gradient copy when gradients are reduced in
  16 bits), and in fp8 each layer's two fp8 weight copies. They exist before the step starts
  (Megatron allocates them with the model), so the rank's first node lists them; the optimizer
  step is their last reader;
- activations: each tensor a kernel saves for the backward pass, listed by the forward kernel
  that makes it and by the backward kernels that read it (docs/training.md, "Tensors").
Gradients of activations, workspaces and communication buffers are not listed.
"""

from __future__ import annotations

from typing import Hashable

from chakra_core.schema import pb

DEVICE = "cuda:0"
"""Each rank's own GPU, numbered as a process that sees one GPU does, so that equivalent ranks'
traces stay identical (folding)."""


class TensorLedger:
    """Storages of one rank's step and the nodes that list them (a no-op when not `enabled`)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._next = 1
        self._shape: dict[int, tuple[int, int]] = {}        # storage -> (elements, element size)
        self._saved: dict[Hashable, int] = {}               # activation key -> storage
        self._listed: dict[int, tuple[list[int], list[int]]] = {}   # node -> (inputs, outputs)

    def new(self, elements: int, element_size: int) -> int:
        storage = self._next
        self._next += 1
        self._shape[storage] = (elements, element_size)
        return storage

    def refer(self, node: int | None, storage: int, output: bool) -> None:
        """`node` lists `storage` among its outputs or inputs."""
        if node is None:
            return
        inputs, outputs = self._listed.setdefault(node, ([], []))
        (outputs if output else inputs).append(storage)

    def save(self, node: int | None, key: Hashable, elements: int, element_size: int,
             output: bool = True) -> None:
        """A tensor `node` keeps for the backward pass: its output, or (output=False) an input it saves."""
        if not self.enabled or node is None or elements <= 0:
            return
        storage = self._saved[key] = self.new(elements, element_size)
        self.refer(node, storage, output)

    def move_out(self, node: int, key: Hashable) -> None:
        """Activation offload: `node` copies a saved tensor to host memory; its GPU storage ends
        with it (and with the nodes `hold` adds)."""
        storage = self._saved.get(key) if self.enabled else None
        if storage is not None:
            self.refer(node, storage, False)

    def hold(self, nodes: list[int], keys: list[Hashable]) -> None:
        """`nodes` list those saved tensors' storages too (they live until the last of them ends)."""
        for key in keys:
            storage = self._saved.get(key) if self.enabled else None
            if storage is not None:
                for node in nodes:
                    self.refer(node, storage, False)

    def move_in(self, node: int, key: Hashable) -> None:
        """`node` copies a tensor back into a new GPU storage, which the backward then reads."""
        storage = self._saved.get(key) if self.enabled else None
        if storage is not None:
            self._saved[key] = fresh = self.new(*self._shape[storage])
            self.refer(node, fresh, True)

    def use(self, node: int | None, *keys: Hashable) -> None:
        """`node` reads saved tensors (keys never saved are skipped: the tensor was not kept)."""
        if not self.enabled:
            return
        for key in keys:
            storage = self._saved.get(key)
            if storage is not None:
                self.refer(node, storage, False)

    def write(self, nodes: list[pb.Node]) -> None:
        """Fill the listed nodes' IOInfo `values` (the process-group node's inputs are never listed)."""
        for node_id, (inputs, outputs) in self._listed.items():
            node = nodes[node_id]
            for io, storages in ((node.inputs, inputs), (node.outputs, outputs)):
                if storages:
                    assert not io.values, f"node {node_id} already lists operands"
                    io.values = "[" + ", ".join(self._tensor(s) for s in storages) + "]"

    def _tensor(self, storage: int) -> str:
        elements, size = self._shape[storage]
        return f"[{storage}, {storage}, 0, {elements}, {size}, '{DEVICE}']"

