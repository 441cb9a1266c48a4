"""Synthetic Chakra traces (`chakra-sim generate ...`).

`generate microbenchmark` writes ASTRA-sim's collective microbenchmarks (one
COMM_COLL node per rank and iteration; for one iteration the files are byte
for byte ASTRA-sim's `examples/workload/microbenchmarks`) and point-to-point
patterns.

`generate transformer` writes model-based pre-execution traces of a
Megatron-style GPT training iteration under data (DP), tensor (TP, optionally
with sequence parallelism, SP) and pipeline (PP) parallelism. Compute nodes
carry `num_ops` (FLOPs) and `tensor_size` (bytes moved) for a roofline model;
collectives carry `comm_type`, `comm_size` and the communicator group
(`pg_name`, groups defined by a METADATA node per rank); pipeline stages
exchange activations and gradients with COMM_SEND/COMM_RECV. Nodes list the
tensors they read and write (weights, gradients, Adam state, activations) as
the PyTorch converter does, so a memory model can follow their lifetimes.
docs/tools.md lists every kernel with its FLOP and byte formulas and what the
tensors model; `comm_size` follows docs/collectives.md.

Both are deterministic: the same arguments give byte-identical files.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import click

from chakra_core.errors import ChakraSimError
from chakra_core.schema import pb
from chakra_core.cli.output import tool_errors
from chakra_core.tools._build import (Stream, bool_attr, read_collective, int_attr, metadata, p2p_attrs,
                                      str_attr, uint_attr, write_rank_files)


class GeneratorError(ChakraSimError):
    """Invalid generator arguments (the message says which and why)."""


# Microbenchmarks -----------------------------------------------------------------------------------
COLLECTIVES = {
    "all_reduce": pb.ALL_REDUCE,
    "all_gather": pb.ALL_GATHER,
    "reduce_scatter": pb.REDUCE_SCATTER,
    "all_to_all": pb.ALL_TO_ALL,
    "broadcast": pb.BROADCAST,
    "reduce": pb.REDUCE,
    "gather": pb.GATHER,
    "scatter": pb.SCATTER,
    "barrier": pb.BARRIER,
}
ROOTED = ("broadcast", "reduce", "gather", "scatter")
P2P_PATTERNS = ("ring", "pairwise", "all-pairs")


def size_label(size: int) -> str:
    """ASTRA-sim's naming: 1048576 -> '1MB', 65536 -> '64KB', 100 -> '100B'."""
    if size and size % (1 << 20) == 0:
        return f"{size >> 20}MB"
    if size and size % (1 << 10) == 0:
        return f"{size >> 10}KB"
    return f"{size}B"


def p2p_rounds(pattern: str, npus: int, shift: int = 1) -> list[list[tuple[int, int]]]:
    """Per round, the (src, dst) messages of a point-to-point pattern.

    ring: every rank sends to rank + shift (mod N) and receives from rank - shift, one round;
    pairwise: ranks 2i and 2i+1 exchange, one round (N even);
    all-pairs: N-1 rounds, in round k every rank sends to rank + k and receives from rank - k
    (the pairwise-exchange all-to-all).
    """
    if pattern == "ring":
        return [[(r, (r + shift) % npus) for r in range(npus)]]
    if pattern == "pairwise":
        return [[(r, r ^ 1) for r in range(npus)]]
    if pattern == "all-pairs":
        return [[(r, (r + k) % npus) for r in range(npus)] for k in range(1, npus)]
    raise GeneratorError(f"unknown pattern {pattern!r}; expected one of {', '.join(P2P_PATTERNS)}")


def microbenchmark_traces(collective: str, size: int | None, npus: int, iterations: int = 1,
                          root: int = 0, pattern: str = "ring", shift: int = 1) -> list[list[pb.Node]]:
    """One node list per rank. Iteration i waits for iteration i-1 on the same rank."""
    if npus < 1:
        raise GeneratorError("--npus must be at least 1")
    if iterations < 1:
        raise GeneratorError("--iterations must be at least 1")
    if collective == "send_recv":
        return _send_recv_traces(size, npus, iterations, pattern, shift)
    if collective not in COLLECTIVES:
        raise GeneratorError(f"unknown collective {collective!r}; expected one of "
                             f"{', '.join([*COLLECTIVES, 'send_recv'])}")
    if collective == "barrier":
        if size:
            raise GeneratorError(f"a barrier moves no data: drop --size {size} (its comm_size is 0)")
        size = 0
    elif size is None:
        raise GeneratorError(f"{collective} needs --size BYTES")
    if size < 0:
        raise GeneratorError("--size must be >= 0")
    if collective in ROOTED and not 0 <= root < npus:
        raise GeneratorError(f"--root {root} is not a rank (0..{npus - 1})")
    base = f"{collective}_{npus}npus_{size_label(size)}"
    ranks = []
    for rank in range(npus):
        nodes = []
        for i in range(iterations):
            node = pb.Node(id=i * npus + rank, name=base if iterations == 1 else f"{base}.{i}",
                           type=pb.COMM_COLL_NODE)
            if i:
                node.data_deps.append((i - 1) * npus + rank)
            node.attr.extend(read_collective(COLLECTIVES[collective], size))
            if collective in ROOTED:
                node.attr.append(int_attr("root_rank", root))
            nodes.append(node)
        ranks.append(nodes)
    return ranks


def _send_recv_traces(size: int | None, npus: int, iterations: int, pattern: str,
                      shift: int) -> list[list[pb.Node]]:
    if size is None or size < 0:
        raise GeneratorError("send_recv needs --size BYTES (>= 0)")
    if npus < 2:
        raise GeneratorError("send_recv needs at least 2 NPUs")
    if pattern == "pairwise" and npus % 2:
        raise GeneratorError(f"the pairwise pattern pairs ranks 2i and 2i+1: it needs an even number of "
                             f"NPUs, not {npus}")
    if pattern == "ring" and shift % npus == 0:
        raise GeneratorError(f"--shift {shift} sends every rank to itself on {npus} NPUs")
    rounds = p2p_rounds(pattern, npus, shift)
    ranks = []
    for rank in range(npus):
        stream = Stream()
        for i in range(iterations):
            for k, messages in enumerate(rounds):
                tag = i * len(rounds) + k
                posted = []
                for src, dst in messages:
                    if src == rank:
                        posted.append(stream.launch(
                            pb.COMM_SEND_NODE, f"send.{i}.{k}.to{dst}",
                            attrs=p2p_attrs(src, dst, tag, size)))
                for src, dst in messages:
                    if dst == rank:
                        posted.append(stream.launch(
                            pb.COMM_RECV_NODE, f"recv.{i}.{k}.from{src}",
                            attrs=p2p_attrs(src, dst, tag, size)))
                stream.frontier = posted
        ranks.append(stream.nodes)
    return ranks


def write_microbenchmark(prefix: str | os.PathLike, collective: str, size: int | None, npus: int,
                         iterations: int = 1, root: int = 0, pattern: str = "ring", shift: int = 1,
                         compress: bool = False) -> list[Path]:
    ranks = microbenchmark_traces(collective, size, npus, iterations, root, pattern, shift)
    # version only, like ASTRA-sim's microbenchmark files (so one iteration is byte-identical)
    return write_rank_files(prefix, ranks, metadata({}), compress=compress)


# Transformer ---------------------------------------------------------------------------------------------
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
TENSOR_TYPES = {"fp16": "Tensor(c10::Half)", "bf16": "Tensor(c10::BFloat16)", "fp32": "Tensor(float)"}
"""Operand type strings as PyTorch execution traces write them."""
DEVICE = "cuda:0"
"""The device of generated tensors (each rank's own accelerator)."""
ADAM_STATES = ("master_weights", "exp_avg", "exp_avg_sq")
OPTIMIZER_OPS_PER_PARAM = 10
"""Adam with weight decay, per parameter: two moment updates, bias corrections, sqrt, divide, update."""
OPTIMIZER_FP32_STATE_BYTES = 24
"""Adam reads and writes the fp32 master weight and both moments: 3 x 4 bytes x 2 per parameter."""


@dataclass(frozen=True)
class TransformerConfig:
    """A Megatron-style GPT and how it is parallelised (see docs/tools.md)."""

    layers: int
    hidden: int
    heads: int
    seq: int
    batch: int                      # global batch, sequences per iteration
    vocab: int
    dtype: str = "bf16"
    dp: int = 1
    tp: int = 1
    pp: int = 1
    sp: bool = False
    microbatches: int | None = None     # per DP replica; default: pp
    ffn: int | None = None              # MLP hidden size; default 4 x hidden
    schedule: str = "1f1b"              # or "gpipe"
    dp_reduce: str = "allreduce"        # or "rs-ag" (distributed optimizer)
    grad_dtype: str | None = None       # default: dtype
    peak_tflops: float = 312.0          # for duration_micros estimates only
    mem_bw_gbps: float = 2039.0

    # Derived sizes ------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def f(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def m(self) -> int:
        return self.microbatches or self.pp

    @property
    def micro_batch(self) -> int:
        return self.batch // (self.dp * self.m)

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch: n = micro-batch size x sequence length."""
        return self.micro_batch * self.seq

    @property
    def e(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def ge(self) -> int:
        return DTYPE_BYTES[self.grad_dtype or self.dtype]

    @property
    def layers_per_stage(self) -> int:
        return self.layers // self.pp

    def problems(self) -> list[str]:
        out = []
        for name in ("layers", "hidden", "heads", "seq", "batch", "vocab", "dp", "tp", "pp"):
            if getattr(self, name) < 1:
                out.append(f"--{name} must be at least 1")
        if out:
            return out
        if self.dtype not in DTYPE_BYTES:
            out.append(f"--dtype {self.dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
        if self.grad_dtype is not None and self.grad_dtype not in DTYPE_BYTES:
            out.append(f"--grad-dtype {self.grad_dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
        if self.schedule not in ("1f1b", "gpipe"):
            out.append(f"--schedule {self.schedule!r}: expected 1f1b or gpipe")
        if self.dp_reduce not in ("allreduce", "rs-ag"):
            out.append(f"--dp-reduce {self.dp_reduce!r}: expected allreduce or rs-ag")
        if self.ffn is not None and self.ffn < 1:
            out.append("--ffn-hidden must be at least 1")
        if self.microbatches is not None and self.microbatches < 1:
            out.append("--microbatches must be at least 1")
        if self.hidden % self.heads:
            out.append(f"--hidden {self.hidden} is not divisible by --heads {self.heads}")
        if self.heads % self.tp:
            out.append(f"--heads {self.heads} is not divisible by --tp {self.tp}")
        if self.f % self.tp:
            out.append(f"the MLP hidden size {self.f} is not divisible by --tp {self.tp}")
        if self.vocab % self.tp:
            out.append(f"--vocab {self.vocab} is not divisible by --tp {self.tp} (Megatron pads the "
                       "vocabulary; pass the padded size)")
        if self.sp and self.seq % self.tp:
            out.append(f"--sp needs --seq {self.seq} divisible by --tp {self.tp}")
        if self.layers % self.pp:
            out.append(f"--layers {self.layers} is not divisible by --pp {self.pp}")
        if not out and self.batch % (self.dp * self.m):
            out.append(f"--batch {self.batch} is not divisible by --dp {self.dp} x {self.m} micro-batches"
                       + ("" if self.microbatches else " (the default is one per pipeline stage; "
                          "set --microbatches)"))
        if self.peak_tflops <= 0 or self.mem_bw_gbps <= 0:
            out.append("--peak-tflops and --mem-bw-gbps must be positive")
        return out

    def check(self) -> None:
        problems = self.problems()
        if problems:
            raise GeneratorError("invalid transformer configuration:\n" +
                                 "\n".join(f"  {p}" for p in problems))

    # Parameters ---------------------------------------------------------------------------
    def layer_params_per_rank(self) -> int:
        """One transformer layer on one TP rank: QKV and fc1 split by columns (with their biases),
        proj and fc2 split by rows (biases replicated), two layer norms replicated."""
        h, f, t = self.hidden, self.f, self.tp
        return (3 * h * h + 3 * h) // t + h * h // t + h + (h * f + f) // t + f * h // t + h + 4 * h

    def stage_params_per_rank(self, stage: int) -> int:
        params = self.layers_per_stage * self.layer_params_per_rank()
        embedding = self.vocab // self.tp * self.hidden
        if stage == 0:
            params += embedding
        if stage == self.pp - 1:
            params += 2 * self.hidden                 # final layer norm
            if self.pp > 1:
                params += embedding                   # the LM head's copy of the tied embedding
        return params

    def model_params(self) -> int:
        """Parameters of the model (each counted once): what 6 x P x T counts."""
        h, f = self.hidden, self.f
        return self.layers * (4 * h * h + 2 * h * f + 9 * h + f) + self.vocab * h + 2 * h


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

    def value(self) -> list:
        return [self.tensor_id, self.storage, self.offset, math.prod(self.shape), self.elem, DEVICE]


class _TransformerRank:
    """The program of one rank: its stage's layers, for every micro-batch, in schedule order.

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

    def blocking(self, name: str, comm_type: int, size: int, group, inputs: Sequence[_Tensor] = (),
                 outputs: Sequence[_Tensor] = ()) -> None:
        self.s.wait(self.collective(name, comm_type, size, group, inputs=inputs, outputs=outputs))

    def p2p(self, ops: list[tuple[str, int, int, _Tensor]], size: int) -> None:
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

    # One micro-batch ------------------------------------------------------------------------------------
    def forward(self, mb: int) -> None:
        cfg = self.cfg
        h, t, n, b, s = cfg.hidden, cfg.tp, cfg.tokens, cfg.micro_batch, cfg.seq
        a, dh, f = cfg.heads // cfg.tp, cfg.hidden // cfg.heads, cfg.f
        local, sl = self.local_tokens, self.local_seq
        if self.first:
            name = f"mb{mb}.embedding"
            emb = self.act(s, b, h)
            self.kernel(name, "embedding", n * h, 2 * n * h * cfg.e, self.params(None, "embedding.weight"), [emb])
            x = self.tp_out(name, emb) if t > 1 else emb
        else:
            x = self._boundary("act_in", mb)
        for layer in self._layers():
            p = f"mb{mb}.L{layer}."
            W = functools.partial(self.params, layer)
            ln1 = self.act(sl, b, h)
            self.elementwise(p + "ln1", local * h, 2, [x, *W("ln1.weight", "ln1.bias")], [ln1])
            ln1_full = self.tp_in(p + "ln1", ln1)
            qkv = self.act(s, b, 3 * h // t)
            self.gemm(p + "qkv", n, h, 3 * h // t, inputs=[ln1_full, *W("qkv.weight", "qkv.bias")], outputs=[qkv])
            scores = self.act(b, a, s, s)
            self.gemm(p + "attn_scores", s, dh, s, batch=b * a, kind="bmm", inputs=[qkv], outputs=[scores])
            probs = self.act(b, a, s, s)
            self.elementwise(p + "softmax", b * a * s * s, 2, [scores], [probs])
            context = self.act(s, b, h // t)
            self.gemm(p + "attn_context", s, s, dh, batch=b * a, kind="bmm", inputs=[probs, qkv],
                      outputs=[context])
            proj = self.act(s, b, h)
            self.gemm(p + "attn_proj", n, h // t, h, inputs=[context, *W("proj.weight", "proj.bias")],
                      outputs=[proj])
            proj = self.tp_out(p + "attn_proj", proj)
            x1 = self.act(sl, b, h)
            self.elementwise(p + "residual1", local * h, 3, [x, proj], [x1])
            ln2 = self.act(sl, b, h)
            self.elementwise(p + "ln2", local * h, 2, [x1, *W("ln2.weight", "ln2.bias")], [ln2])
            ln2_full = self.tp_in(p + "ln2", ln2)
            fc1 = self.act(s, b, f // t)
            self.gemm(p + "fc1", n, h, f // t, inputs=[ln2_full, *W("fc1.weight", "fc1.bias")], outputs=[fc1])
            gelu = self.act(s, b, f // t)
            self.elementwise(p + "gelu", n * f // t, 2, [fc1], [gelu])
            fc2 = self.act(s, b, h)
            self.gemm(p + "fc2", n, f // t, h, inputs=[gelu, *W("fc2.weight", "fc2.bias")], outputs=[fc2])
            fc2 = self.tp_out(p + "fc2", fc2)
            out = self.act(sl, b, h)
            self.elementwise(p + "residual2", local * h, 3, [x1, fc2], [out])
            # what the backward pass reads (no dropout, no recomputation)
            self.saved[(mb, layer)] = dict(x=x, ln1=ln1, ln1_full=ln1_full, qkv=qkv, probs=probs,
                                           context=context, x1=x1, ln2=ln2, ln2_full=ln2_full, fc1=fc1,
                                           gelu=gelu)
            x = out
        if self.last:
            p = f"mb{mb}."
            v = cfg.vocab // t
            y = self.act(sl, b, h)
            self.elementwise(p + "final_ln", local * h, 2, [x, *self.params(None, "final_ln.weight",
                                                                             "final_ln.bias")], [y])
            y_full = self.tp_in(p + "final_ln", y)
            logits = self.act(s, b, v)
            self.gemm(p + "lm_head", n, h, v, inputs=[y_full, *self.params(None, "lm_head.weight")],
                      outputs=[logits])
            # vocab-parallel cross entropy keeps the fp32 softmax for the backward pass
            softmax = self.tensor((s, b, v), dtype="fp32")
            self.elementwise(p + "cross_entropy", n * v, 2, [logits], [softmax])
            if t > 1:   # vocab-parallel cross entropy: max, target logit, sum of exponentials (fp32)
                for what in ("max", "target", "sum_exp"):
                    self.blocking(f"{p}cross_entropy.tp_all_reduce_{what}", pb.ALL_REDUCE, n * 4,
                                  self.groups.tp)
            self.saved[(mb, "head")] = dict(x=x, y=y, y_full=y_full, softmax=softmax)
        else:
            self.boundary[("act_out", mb)] = x

    def backward(self, mb: int) -> None:
        cfg = self.cfg
        h, t, n, b, s = cfg.hidden, cfg.tp, cfg.tokens, cfg.micro_batch, cfg.seq
        a, dh, f = cfg.heads // cfg.tp, cfg.hidden // cfg.heads, cfg.f
        local, sl = self.local_tokens, self.local_seq
        if self.last:
            p = f"mb{mb}."
            v = cfg.vocab // t
            head = self.saved.pop((mb, "head"))
            dlogits = self.act(s, b, v)
            self.elementwise(p + "cross_entropy.bwd", n * v, 2, [head["softmax"]], [dlogits])
            dy = self.column_bwd(p + "lm_head", n, h, v, dlogits, head["y"], head["y_full"],
                                 self.params(None, "lm_head.weight"), self.param_grads(None, "lm_head.weight"))
            grad = self.act(sl, b, h)
            self.elementwise(p + "final_ln.bwd", local * h, 2,
                             [dy, head["x"], *self.params(None, "final_ln.weight", "final_ln.bias")],
                             [grad, *self.param_grads(None, "final_ln.weight", "final_ln.bias")])
        else:
            grad = self._boundary("grad_in", mb)
        for layer in reversed(self._layers()):
            p = f"mb{mb}.L{layer}."
            W = functools.partial(self.params, layer)
            G = functools.partial(self.param_grads, layer)
            saved = self.saved.pop((mb, layer))
            d_fc2 = self.act(sl, b, h)
            self.elementwise(p + "residual2.bwd", local * h, 3, [grad], [d_fc2])
            d_gelu = self.row_bwd(p + "fc2", n, f // t, h, d_fc2, saved["gelu"], W("fc2.weight"),
                                  G("fc2.weight", "fc2.bias"))
            d_fc1 = self.act(s, b, f // t)
            self.elementwise(p + "gelu.bwd", n * f // t, 2, [d_gelu, saved["fc1"]], [d_fc1])
            d_ln2 = self.column_bwd(p + "fc1", n, h, f // t, d_fc1, saved["ln2"], saved["ln2_full"],
                                    W("fc1.weight"), G("fc1.weight", "fc1.bias"))
            d_x1 = self.act(sl, b, h)   # the layer norm's gradient plus the residual's
            self.elementwise(p + "ln2.bwd", local * h, 2, [d_ln2, saved["x1"], *W("ln2.weight", "ln2.bias"), grad],
                             [d_x1, *G("ln2.weight", "ln2.bias")])
            d_proj = self.act(sl, b, h)
            self.elementwise(p + "residual1.bwd", local * h, 3, [d_x1], [d_proj])
            d_context = self.row_bwd(p + "attn_proj", n, h // t, h, d_proj, saved["context"],
                                     W("proj.weight"), G("proj.weight", "proj.bias"))
            d_probs, d_qkv, d_scores = self.act(b, a, s, s), self.act(s, b, 3 * h // t), self.act(b, a, s, s)
            self.gemm(p + "attn_context.bwd_probs", s, dh, s, batch=b * a, kind="bmm",
                      inputs=[d_context, saved["qkv"]], outputs=[d_probs])
            self.gemm(p + "attn_context.bwd_values", s, s, dh, batch=b * a, kind="bmm",
                      inputs=[d_context, saved["probs"]], outputs=[d_qkv])
            self.elementwise(p + "softmax.bwd", b * a * s * s, 2, [d_probs, saved["probs"]], [d_scores])
            self.gemm(p + "attn_scores.bwd_query", s, s, dh, batch=b * a, kind="bmm",
                      inputs=[d_scores, saved["qkv"]], outputs=[d_qkv])
            self.gemm(p + "attn_scores.bwd_key", s, s, dh, batch=b * a, kind="bmm",
                      inputs=[d_scores, saved["qkv"]], outputs=[d_qkv])
            d_ln1 = self.column_bwd(p + "qkv", n, h, 3 * h // t, d_qkv, saved["ln1"], saved["ln1_full"],
                                    W("qkv.weight"), G("qkv.weight", "qkv.bias"))
            d_x = self.act(sl, b, h)
            self.elementwise(p + "ln1.bwd", local * h, 2, [d_ln1, saved["x"], *W("ln1.weight", "ln1.bias"), d_x1],
                             [d_x, *G("ln1.weight", "ln1.bias")])
            grad = d_x
        if self.first:
            name = f"mb{mb}.embedding"
            if t > 1:
                grad = self.tp_in(name + ".bwd", grad)
            self.kernel(name + ".bwd", "embedding", n * h, 2 * n * h * cfg.e, [grad],
                        self.param_grads(None, "embedding.weight"))
        else:
            self.boundary[("grad_out", mb)] = grad

    def _layers(self) -> list[int]:
        per = self.cfg.layers_per_stage
        return list(range(self.stage * per, (self.stage + 1) * per))

    # Schedule -------------------------------------------------------------------------------------------
    def run(self) -> list[pb.Node]:
        cfg = self.cfg
        dt = cfg.dp * cfg.tp
        prev = self.rank - dt if not self.first else None
        nxt = self.rank + dt if not self.last else None
        size = self.shard_bytes() if cfg.sp else self.act_bytes()
        io = self._boundary

        def recv_fwd(mb): return [("recv", prev, 2 * mb, io("act_in", mb))] if prev is not None else []
        def send_fwd(mb): return [("send", nxt, 2 * mb, io("act_out", mb))] if nxt is not None else []
        def recv_bwd(mb): return [("recv", nxt, 2 * mb + 1, io("grad_in", mb))] if nxt is not None else []
        def send_bwd(mb): return [("send", prev, 2 * mb + 1, io("grad_out", mb))] if prev is not None else []

        def comm(ops):
            if ops:
                self.p2p(ops, size)

        m = cfg.m
        if cfg.schedule == "gpipe":
            for mb in range(m):
                comm(recv_fwd(mb))
                self.forward(mb)
                comm(send_fwd(mb))
            for mb in range(m):
                comm(recv_bwd(mb))
                self.backward(mb)
                comm(send_bwd(mb))
        else:   # 1F1B (PipeDream-Flush), as Megatron's forward_backward_pipelining_without_interleaving
            warmup = min(cfg.pp - self.stage - 1, m)
            steady = m - warmup
            fwd = bwd = 0
            for _ in range(warmup):
                comm(recv_fwd(fwd))
                self.forward(fwd)
                comm(send_fwd(fwd))
                fwd += 1
            if steady:
                comm(recv_fwd(fwd))
            for i in range(steady):
                self.forward(fwd)
                comm(send_fwd(fwd) + recv_bwd(bwd))
                fwd += 1
                self.backward(bwd)
                if i == steady - 1:
                    comm(send_bwd(bwd))
                else:
                    comm(send_bwd(bwd) + recv_fwd(fwd))
                bwd += 1
            for _ in range(warmup):
                comm(recv_bwd(bwd))
                self.backward(bwd)
                comm(send_bwd(bwd))
                bwd += 1
        self.finalize()
        return self.s.nodes

    def finalize(self) -> None:
        """Gradient synchronisation and the optimizer step, after the last micro-batch."""
        cfg = self.cfg
        h, ge = cfg.hidden, cfg.ge
        if cfg.sp and cfg.tp > 1:   # layer norms and row-parallel biases see only a sequence shard
            replicated = 6 * h * cfg.layers_per_stage + (2 * h if self.last else 0)
            grads = [g for layer in self._layers() for g in self.param_grads(
                layer, "ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "proj.bias", "fc2.bias")]
            if self.last:
                grads += self.param_grads(None, "final_ln.weight", "final_ln.bias")
            self.blocking("grads.tp_all_reduce_sequence_parallel", pb.ALL_REDUCE, replicated * ge,
                          self.groups.tp, grads, grads)
        if self.groups.emb is not None:
            grads = self.param_grads(None, "embedding.weight" if self.first else "lm_head.weight")
            self.blocking("grads.embedding_all_reduce", pb.ALL_REDUCE, cfg.vocab // cfg.tp * h * ge,
                          self.groups.emb, grads, grads)
        params = cfg.stage_params_per_rank(self.stage)
        updated, grads, weights = params, self.grad_buffer, self.weight_buffer
        if self.distributed:   # the buffer is padded to a multiple of dp; this rank updates its shard
            updated = self.shard
            grads = self.view(self.grad_buffer, self.dp_index * updated, (updated,))
            weights = self.view(self.weight_buffer, self.dp_index * updated, (updated,))
            self.blocking("grads.dp_reduce_scatter", pb.REDUCE_SCATTER, updated * cfg.dp * ge, self.groups.dp,
                          [self.grad_buffer], [grads])
        elif cfg.dp > 1:
            self.blocking("grads.dp_all_reduce", pb.ALL_REDUCE, params * ge, self.groups.dp,
                          [self.grad_buffer], [self.grad_buffer])
        self.kernel("optimizer", "optimizer", OPTIMIZER_OPS_PER_PARAM * updated,
                    updated * (OPTIMIZER_FP32_STATE_BYTES + ge + cfg.e),
                    [grads, *self.adam, weights], [*self.adam, weights])
        if self.distributed:
            self.blocking("params.dp_all_gather", pb.ALL_GATHER, updated * cfg.e, self.groups.dp,
                          [weights], [self.weight_buffer])


def transformer_traces(cfg: TransformerConfig) -> list[list[pb.Node]]:
    """One node list per rank (rank = stage x dp x tp + dp_index x tp + tp_index)."""
    return list(iter_transformer_traces(cfg))


def iter_transformer_traces(cfg: TransformerConfig) -> Iterator[list[pb.Node]]:
    """The node lists of `transformer_traces`, one rank at a time (memory: one rank's nodes)."""
    cfg.check()
    for rank in range(cfg.world):
        yield _TransformerRank(cfg, rank).run()


def transformer_metadata(cfg: TransformerConfig) -> pb.GlobalMetadata:
    fields = ("layers", "hidden", "heads", "seq", "batch", "vocab", "dtype", "dp", "tp", "pp", "sp",
              "schedule", "dp_reduce")
    attrs: dict[str, object] = {"generator": "chakra-sim generate transformer"}
    attrs.update({name: getattr(cfg, name) for name in fields})
    attrs.update({"microbatches": cfg.m, "ffn_hidden": cfg.f, "grad_dtype": cfg.grad_dtype or cfg.dtype})
    return metadata(attrs)


def write_transformer(prefix: str | os.PathLike, cfg: TransformerConfig,
                      compress: bool = False) -> list[Path]:
    # Rank by rank: a 16,384-rank job never holds more than one rank's nodes.
    return write_rank_files(prefix, iter_transformer_traces(cfg), transformer_metadata(cfg), compress=compress)


# Command line ----------------------------------------------------------------------------------------------
@click.group("generate")
def generate() -> None:
    """Generate synthetic Chakra traces (collective microbenchmarks, transformer training)."""


@generate.command("microbenchmark")
@click.option("--collective", required=True, type=click.Choice([*COLLECTIVES, "send_recv"]),
              help="the operation every rank runs")
@click.option("--size", type=click.IntRange(min=0), metavar="BYTES",
              help="comm_size in bytes, as docs/collectives.md defines it per type (each rank's input; "
                   "scatter: the piece each rank receives); not for barrier")
@click.option("--npus", required=True, type=click.IntRange(min=1), help="number of ranks")
@click.option("--iterations", default=1, show_default=True, type=click.IntRange(min=1),
              help="back-to-back repetitions on every rank")
@click.option("--root", default=0, show_default=True, type=click.IntRange(min=0),
              help="root rank of broadcast/reduce/gather/scatter")
@click.option("--pattern", default="ring", show_default=True, type=click.Choice(P2P_PATTERNS),
              help="send_recv: ring shift, pairwise exchange (2i <-> 2i+1), or all-pairs (N-1 rounds)")
@click.option("--shift", default=1, show_default=True, type=int, help="send_recv ring: send to rank + SHIFT")
@click.option("--output", required=True, metavar="PREFIX", help="writes PREFIX.<rank>.et")
@click.option("--compress", is_flag=True, help="gzip the .et files")
def microbenchmark(collective, size, npus, iterations, root, pattern, shift, output, compress) -> None:
    """A collective (or point-to-point) microbenchmark, one trace per rank.

    With one iteration the collective files are identical to ASTRA-sim's
    examples/workload/microbenchmarks.

    \b
    Examples:
      chakra-sim generate microbenchmark --collective all_reduce --size 1048576 \\
                 --npus 8 --output traces/all_reduce
      chakra-sim generate microbenchmark --collective send_recv --pattern pairwise \\
                 --size 65536 --npus 8 --iterations 4 --output traces/p2p
    """
    with tool_errors(f"{output}.<rank>.et"):
        files = write_microbenchmark(output, collective, size, npus, iterations, root, pattern, shift,
                                     compress)
    click.echo(f"wrote {files[0]} ... {files[-1]}" if len(files) > 1 else f"wrote {files[0]}")


@generate.command("transformer")
@click.option("--layers", required=True, type=int, help="transformer layers (L)")
@click.option("--hidden", required=True, type=int, help="hidden size (h)")
@click.option("--heads", required=True, type=int, help="attention heads (a)")
@click.option("--seq", required=True, type=int, help="sequence length (s)")
@click.option("--batch", required=True, type=int, help="global batch in sequences per iteration (B)")
@click.option("--vocab", required=True, type=int, help="vocabulary size (V; divisible by --tp)")
@click.option("--dtype", default="bf16", show_default=True, type=click.Choice(list(DTYPE_BYTES)),
              help="activation and parameter type")
@click.option("--dp", default=1, show_default=True, type=int, help="data-parallel replicas")
@click.option("--tp", default=1, show_default=True, type=int, help="tensor-parallel ranks")
@click.option("--pp", default=1, show_default=True, type=int, help="pipeline stages")
@click.option("--sp", is_flag=True, help="sequence parallelism (TP all-reduces become reduce-scatter + "
                                         "all-gather)")
@click.option("--microbatches", type=int, help="micro-batches per replica and iteration [default: --pp]")
@click.option("--ffn-hidden", type=int, help="MLP hidden size [default: 4 x --hidden]")
@click.option("--schedule", default="1f1b", show_default=True, type=click.Choice(["1f1b", "gpipe"]),
              help="pipeline schedule")
@click.option("--dp-reduce", default="allreduce", show_default=True,
              type=click.Choice(["allreduce", "rs-ag"]),
              help="gradient all-reduce, or reduce-scatter + all-gather (distributed optimizer)")
@click.option("--grad-dtype", type=click.Choice(list(DTYPE_BYTES)),
              help="type of the reduced gradients [default: --dtype]")
@click.option("--peak-tflops", default=312.0, show_default=True, type=float,
              help="nominal device for duration_micros (a replay fallback; the roofline plugin uses "
                   "num_ops / tensor_size instead)")
@click.option("--mem-bw-gbps", default=2039.0, show_default=True, type=float,
              help="nominal device memory bandwidth, GB/s (10^9 B/s)")
@click.option("--output", required=True, metavar="PREFIX", help="writes PREFIX.<rank>.et")
@click.option("--compress", is_flag=True, help="gzip the .et files")
def transformer(layers, hidden, heads, seq, batch, vocab, dtype, dp, tp, pp, sp, microbatches, ffn_hidden,
                schedule, dp_reduce, grad_dtype, peak_tflops, mem_bw_gbps, output, compress) -> None:
    """One training iteration of a Megatron-style GPT, one trace per rank.

    Ranks are numbered tensor-parallel first, then data-parallel, then
    pipeline stage: rank = stage x dp x tp + replica x tp + tp_index.

    \b
    Example (GPT-2 medium on 16 GPUs: TP 2 with SP, PP 2, DP 4):
      chakra-sim generate transformer --layers 24 --hidden 1024 --heads 16 \\
                 --seq 1024 --batch 64 --vocab 50304 --dtype bf16 \\
                 --dp 4 --tp 2 --pp 2 --sp --microbatches 8 --output traces/gpt
    """
    cfg = TransformerConfig(layers=layers, hidden=hidden, heads=heads, seq=seq, batch=batch, vocab=vocab,
                            dtype=dtype, dp=dp, tp=tp, pp=pp, sp=sp, microbatches=microbatches,
                            ffn=ffn_hidden, schedule=schedule, dp_reduce=dp_reduce, grad_dtype=grad_dtype,
                            peak_tflops=peak_tflops, mem_bw_gbps=mem_bw_gbps)
    with tool_errors(f"{output}.<rank>.et"):
        files = write_transformer(output, cfg, compress)
    params = cfg.model_params()
    tokens = cfg.batch * cfg.seq
    click.echo(f"{cfg.world} ranks (dp {dp} x tp {tp} x pp {pp}{', sp' if sp else ''}), {cfg.m} "
               f"micro-batch(es) of {cfg.micro_batch} sequence(s) per replica, {schedule}")
    click.echo(f"model: {params:,} parameters; 6 x parameters x tokens = {6 * params * tokens:.4g} FLOPs "
               f"per iteration ({tokens:,} tokens)")
    click.echo(f"wrote {files[0]} ... {files[-1]}" if len(files) > 1 else f"wrote {files[0]}")
