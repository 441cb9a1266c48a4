"""One rank of the generated GPT and the operations its program is built from.

`RankBuilder` holds a rank's place in the parallelism (stage, replica, tensor-parallel index)
and its communicator groups, creates its tensors (the model state, activations, stage
boundaries) and emits its nodes: roofline-timed compute kernels, collectives, batched
point-to-point exchanges, and the tensor-parallel (optionally sequence-parallel) communication
around the linear layers. `transformer._TransformerRank` uses them to write the program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from chakra_core.schema import pb
from chakra_core.et.build import Stream, bool_attr, read_collective, p2p_attrs, str_attr, uint_attr
from chakra_core.tools.generate.transformer_config import (ADAM_STATES, DEVICE, DTYPE_BYTES, TENSOR_TYPES,
                                                           TransformerConfig)


@dataclass
class _Groups:
    tp: tuple[str, list[int]] | None = None
    dp: tuple[str, list[int]] | None = None
    emb: tuple[str, list[int]] | None = None

    def defined(self) -> list[tuple[str, list[int]]]:
        return [g for g in (self.tp, self.dp, self.emb) if g is not None]


@dataclass(frozen=True)
class _Tensor:
    """A tensor as Chakra's PyTorch converter writes it: `prod(shape)` elements of `elem` bytes
    from element `offset` of storage `storage`, on the rank's accelerator."""

    tensor_id: int
    storage: int
    offset: int
    shape: tuple[int, ...]
    elem: int
    type: str

    def value(self) -> list[int | str]:
        return [self.tensor_id, self.storage, self.offset, math.prod(self.shape), self.elem, DEVICE]


P2POps = list[tuple[str, int, int, _Tensor]]
"""(send / recv, peer rank, tag, tensor) operations posted together (`RankBuilder.p2p`)."""


class RankBuilder:
    """A rank's groups, tensors and node helpers (see the module docstring).

    Nodes list the tensors they read (inputs) and write (outputs) the way the PyTorch converter
    does, so a memory model can follow storages: the model state (weights, gradient buffer, Adam
    state) is output by a 0 ns `model_state` node first and read by the optimizer step last;
    activations live from the kernel that writes them to the last backward kernel that reads them.
    """

    def __init__(self, cfg: TransformerConfig, rank: int):
        self.cfg = cfg
        self.rank = rank
        dt = cfg.dp * cfg.tp
        self.stage, rest = divmod(rank, dt)
        self.dp_index, self.tp_index = divmod(rest, cfg.tp)
        self.first = self.stage == 0
        self.last = self.stage == cfg.pp - 1
        self.groups = self._groups()
        self.split = cfg.sp and self.groups.tp is not None   # SP collectives exist (tp > 1)
        self.s = Stream()
        self.s.define_groups(self.groups.defined())
        self.peak = cfg.peak_tflops * 1e12
        self.bw = cfg.mem_bw_gbps * 1e9
        self._ids = 0
        self.saved: dict[tuple[int, int | str], dict[str, _Tensor]] = {}   # (mb, layer) -> for backward
        self.boundary: dict[tuple[str, int], _Tensor] = {}   # (act_in / act_out / grad_in / grad_out, mb)
        self._model_state()

    def _groups(self) -> _Groups:
        cfg, groups = self.cfg, _Groups()
        dt = cfg.dp * cfg.tp
        base = self.stage * dt
        if cfg.tp > 1:
            start = base + self.dp_index * cfg.tp
            groups.tp = (f"tp{self.stage * cfg.dp + self.dp_index}", list(range(start, start + cfg.tp)))
        if cfg.dp > 1:
            groups.dp = (f"dp{self.stage * cfg.tp + self.tp_index}",
                         [base + j * cfg.tp + self.tp_index for j in range(cfg.dp)])
        if cfg.pp > 1 and (self.first or self.last):
            offset = self.dp_index * cfg.tp + self.tp_index
            groups.emb = (f"emb{offset}", [offset, (cfg.pp - 1) * dt + offset])
        return groups

    # Tensors ------------------------------------------------------------------------------------
    def tensor(self, shape: Sequence[int], dtype: str | None = None) -> _Tensor:
        """A new storage holding one tensor (default type: the activations')."""
        dtype = dtype or self.cfg.dtype
        self._ids += 1
        return _Tensor(self._ids, self._ids, 0, tuple(shape), DTYPE_BYTES[dtype], TENSOR_TYPES[dtype])

    def view(self, base: _Tensor, offset: int, shape: Sequence[int]) -> _Tensor:
        """A tensor over `base`'s storage from element `offset`."""
        self._ids += 1
        return _Tensor(self._ids, base.storage, base.offset + offset, tuple(shape), base.elem, base.type)

    def act(self, *shape: int) -> _Tensor:
        return self.tensor(shape)

    def _io(self, node_id: int | None, inputs: Sequence[_Tensor], outputs: Sequence[_Tensor]) -> None:
        """Write operands as the PyTorch converter does: Python-literal values, shapes and types."""
        if node_id is None:
            return
        node = self.s.nodes[node_id]
        for io, tensors in ((node.inputs, inputs), (node.outputs, outputs)):
            if tensors:
                io.values = repr([t.value() for t in tensors])
                io.shapes = repr([list(t.shape) for t in tensors])
                io.types = repr([t.type for t in tensors])

    def _model_state(self) -> None:
        """Weights and gradients (one contiguous buffer each, as Megatron's DDP keeps them; padded
        to a multiple of dp with the distributed optimizer) and Adam's fp32 master weights and
        moments (for this rank's shard with the distributed optimizer), output by a 0 ns node
        before the first operation: they exist before the iteration starts."""
        cfg = self.cfg
        h, f, t, v = cfg.hidden, cfg.f, cfg.tp, cfg.vocab // cfg.tp
        shapes: list[tuple[str, tuple[int, ...]]] = []
        for layer in self._layers():
            p = f"L{layer}."
            shapes += [(p + "ln1.weight", (h,)), (p + "ln1.bias", (h,)),
                       (p + "qkv.weight", (3 * h // t, h)), (p + "qkv.bias", (3 * h // t,)),
                       (p + "proj.weight", (h, h // t)), (p + "proj.bias", (h,)),
                       (p + "ln2.weight", (h,)), (p + "ln2.bias", (h,)),
                       (p + "fc1.weight", (f // t, h)), (p + "fc1.bias", (f // t,)),
                       (p + "fc2.weight", (h, f // t)), (p + "fc2.bias", (h,))]
        if self.first:
            shapes.append(("embedding.weight", (v, h)))
        if self.last:
            shapes += [("final_ln.weight", (h,)), ("final_ln.bias", (h,))]
            if cfg.pp > 1:
                shapes.append(("lm_head.weight", (v, h)))
        params = cfg.stage_params_per_rank(self.stage)
        assert sum(math.prod(shape) for _, shape in shapes) == params
        self.distributed = cfg.dp > 1 and cfg.dp_reduce == "rs-ag"
        self.shard = -(-params // cfg.dp) if self.distributed else params
        padded = self.shard * cfg.dp if self.distributed else params
        self.weight_buffer = self.tensor((padded,))
        self.grad_buffer = self.tensor((padded,), dtype=cfg.grad_dtype or cfg.dtype)
        self.weights: dict[str, _Tensor] = {}
        self.grads: dict[str, _Tensor] = {}
        offset = 0
        for name, shape in shapes:
            self.weights[name] = self.view(self.weight_buffer, offset, shape)
            self.grads[name] = self.view(self.grad_buffer, offset, shape)
            offset += math.prod(shape)
        if "lm_head.weight" not in self.weights and self.last:   # one stage: tied to the embedding
            self.weights["lm_head.weight"] = self.weights["embedding.weight"]
            self.grads["lm_head.weight"] = self.grads["embedding.weight"]
        self.adam = [self.tensor((self.shard,), dtype="fp32") for _ in ADAM_STATES]
        node = self.s.step(pb.COMP_NODE, "model_state", attrs=[bool_attr("is_cpu_op", False),
                                                               uint_attr("duration_ns", 0)])
        self._io(node, (), [self.weight_buffer, self.grad_buffer, *self.adam])

    def params(self, layer: int | None, *names: str) -> list[_Tensor]:
        prefix = f"L{layer}." if layer is not None else ""
        return [self.weights[prefix + name] for name in names]

    def param_grads(self, layer: int | None, *names: str) -> list[_Tensor]:
        prefix = f"L{layer}." if layer is not None else ""
        return [self.grads[prefix + name] for name in names]

    def _boundary(self, kind: str, mb: int) -> _Tensor:
        """A stage's input or output activation (or its gradient) for micro-batch `mb`."""
        key = (kind, mb)
        if key not in self.boundary:
            self.boundary[key] = self.act(self.local_seq, self.cfg.micro_batch, self.cfg.hidden)
        return self.boundary[key]

    # Node helpers -------------------------------------------------------------------------------
    def kernel(self, name: str, kind: str, ops: int, nbytes: int, inputs: Sequence[_Tensor] = (),
               outputs: Sequence[_Tensor] = ()) -> int:
        """A GPU compute node; duration_micros is its roofline time on the nominal device, rounded up."""
        perf = min(self.peak, self.bw * ops / nbytes) if nbytes else self.peak
        ns = ops / perf * 1e9 if perf > 0 else 0.0
        micros = max(1, math.ceil(ns / 1000 - 1e-9))
        node = self.s.step(pb.COMP_NODE, name, duration_micros=micros, attrs=[
            bool_attr("is_cpu_op", False), uint_attr("num_ops", ops), uint_attr("tensor_size", nbytes),
            str_attr("kernel", kind)])
        self._io(node, inputs, outputs)
        return node

    def elementwise(self, name: str, elements: int, touches: int, inputs: Sequence[_Tensor] = (),
                    outputs: Sequence[_Tensor] = ()) -> int:
        """An elementwise kernel: one op per element, `touches` tensors of `elements` read or written."""
        return self.kernel(name, "elementwise", elements, touches * elements * self.cfg.e, inputs, outputs)

    def gemm(self, name: str, m: int, k: int, n: int, batch: int = 1, kind: str = "gemm",
             inputs: Sequence[_Tensor] = (), outputs: Sequence[_Tensor] = ()) -> int:
        """[m,k] x [k,n] (`batch` times): 2mkn FLOPs, reads both operands and writes the result."""
        return self.kernel(name, kind, 2 * batch * m * k * n, batch * (m * k + k * n + m * n) * self.cfg.e,
                           inputs, outputs)

    def collective(self, name: str, comm_type: int, size: int, group: tuple[str, list[int]] | None,
                   after: Sequence[int] | None = None, inputs: Sequence[_Tensor] = (),
                   outputs: Sequence[_Tensor] = ()) -> int | None:
        """Launch a collective after the frontier (or `after`); None when the group is one rank."""
        if group is None:
            return None
        node = self.s.launch(pb.COMM_COLL_NODE, name, after=after,
                             attrs=read_collective(comm_type, size, group[0]))
        self._io(node, inputs, outputs)
        return node

    def blocking(self, name: str, comm_type: int, size: int, group: tuple[str, list[int]] | None,
                 inputs: Sequence[_Tensor] = (), outputs: Sequence[_Tensor] = ()) -> None:
        self.s.wait(self.collective(name, comm_type, size, group, inputs=inputs, outputs=outputs))

    def p2p(self, ops: P2POps, size: int) -> None:
        """Post sends/receives together (Megatron's batched isend/irecv) and wait for all of them."""
        posted = []
        for kind, peer, tag, tensor in ops:
            if kind == "send":
                src, dst, node_type, name = self.rank, peer, pb.COMM_SEND_NODE, f"send.{tag}.to{peer}"
            else:
                src, dst, node_type, name = peer, self.rank, pb.COMM_RECV_NODE, f"recv.{tag}.from{peer}"
            node = self.s.launch(node_type, name, attrs=p2p_attrs(src, dst, tag, size))
            self._io(node, [tensor] if kind == "send" else [], [tensor] if kind == "recv" else [])
            posted.append(node)
        self.s.wait(*posted)

    # Sizes ----------------------------------------------------------------------------------------------
    @property
    def local_tokens(self) -> int:
        """Tokens of the residual stream held by this rank: n, or n / tp with SP."""
        cfg = self.cfg
        return cfg.tokens // cfg.tp if cfg.sp else cfg.tokens

    @property
    def local_seq(self) -> int:
        """Sequence positions of the residual stream held by this rank: s, or s / tp with SP."""
        return self.cfg.seq // self.cfg.tp if self.cfg.sp else self.cfg.seq

    def act_bytes(self) -> int:
        return self.cfg.tokens * self.cfg.hidden * self.cfg.e

    def shard_bytes(self) -> int:
        return self.act_bytes() // self.cfg.tp

    def tp_out(self, name: str, x: _Tensor) -> _Tensor:
        """After a row-parallel layer: all-reduce (or reduce-scatter with SP) of the n x h output;
        returns the tensor that holds the result."""
        if self.groups.tp is None:
            return x
        if self.cfg.sp:
            out = self.act(x.shape[0] // self.cfg.tp, *x.shape[1:])
            self.blocking(name + ".tp_reduce_scatter", pb.REDUCE_SCATTER, self.act_bytes(), self.groups.tp,
                          [x], [out])
            return out
        self.blocking(name + ".tp_all_reduce", pb.ALL_REDUCE, self.act_bytes(), self.groups.tp, [x], [x])
        return x

    def tp_in(self, name: str, x: _Tensor) -> _Tensor:
        """Before a column-parallel layer with SP: all-gather of the sequence shards; returns the
        gathered tensor (`x` itself without SP)."""
        if not self.split:
            return x
        out = self.act(x.shape[0] * self.cfg.tp, *x.shape[1:])
        self.blocking(name + ".tp_all_gather", pb.ALL_GATHER, self.shard_bytes(), self.groups.tp, [x], [out])
        return out

    def column_bwd(self, name: str, m: int, k: int, n: int, grad: _Tensor, x_local: _Tensor,
                   x_used: _Tensor, weights: list[_Tensor], grads: list[_Tensor]) -> _Tensor:
        """Backward of a column-parallel linear y = x W ([m,k] x [k,n]): dgrad, then the input-gradient
        all-reduce (reduce-scatter with SP) overlapping the wgrad; with SP the input is gathered again
        for the wgrad, overlapping the dgrad. `x_local` is the saved input (a sequence shard with SP),
        `x_used` what the forward multiplied; returns the input gradient this rank keeps."""
        regather, x_wgrad = None, x_used
        if self.split:
            x_wgrad = self.act(x_local.shape[0] * self.cfg.tp, *x_local.shape[1:])
            regather = self.collective(name + ".tp_all_gather_input", pb.ALL_GATHER, self.shard_bytes(),
                                       self.groups.tp, inputs=[x_local], outputs=[x_wgrad])
        dx = self.act(x_used.shape[0], x_used.shape[1], k)
        dgrad = self.gemm(name + ".dgrad", m, n, k, inputs=[grad, *weights], outputs=[dx])
        kind = pb.REDUCE_SCATTER if self.cfg.sp else pb.ALL_REDUCE
        suffix = ".tp_reduce_scatter" if self.cfg.sp else ".tp_all_reduce"
        after = [dgrad] + ([regather] if regather is not None else [])
        kept = self.act(x_local.shape[0], x_local.shape[1], k) if self.split else dx
        reduce = self.collective(name + suffix, kind, self.act_bytes(), self.groups.tp, after=after,
                                 inputs=[dx], outputs=[kept])
        self.s.wait(regather)
        self.gemm(name + ".wgrad", k, m, n, inputs=[grad, x_wgrad], outputs=grads)
        self.s.wait(reduce)
        return kept

    def row_bwd(self, name: str, m: int, k: int, n: int, grad: _Tensor, x_saved: _Tensor,
                weights: list[_Tensor], grads: list[_Tensor]) -> _Tensor:
        """Backward of a row-parallel linear ([m,k] x [k,n]); with SP its output gradient is gathered.
        Returns the input gradient."""
        grad = self.tp_in(name + ".grad_output", grad)
        dx = self.act(grad.shape[0], grad.shape[1], k)
        self.gemm(name + ".dgrad", m, n, k, inputs=[grad, *weights], outputs=[dx])
        self.gemm(name + ".wgrad", k, m, n, inputs=[grad, x_saved], outputs=grads)
        return dx


    def _layers(self) -> list[int]:
        per = self.cfg.layers_per_stage
        return list(range(self.stage * per, (self.stage + 1) * per))
