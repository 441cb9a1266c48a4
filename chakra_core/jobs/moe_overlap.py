"""One micro-batch's forward and another's backward run together, layer by layer, so that each
one's expert-parallel all-to-alls run beside the other's compute (`--overlap-moe-expert-parallel-comm`,
with `--delay-wgrad-compute`; Megatron-Bridge's moe_a2a_overlap sets both).

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/:
- Which passes are merged (pipeline_parallel/schedules.py, combined_1f1b.py): every step of the
  steady state, the forward of virtual micro-batch k + warm-up with the backward of k
  (forward_backward_helper_wrapper -> combined_1f1b_schedule_for_interleaved_pipelining). The
  warm-up has one forward more than without the option (get_pp_rank_microbatches: "to ensure
  the forward and backward computations are independent"); the warm-up forwards and cool-down
  backwards run alone through the same path, their all-to-alls exposed. Without pipelining
  (combined_1f1b_schedule_for_no_pipelining) the first micro-batch's forward and the last one's
  backward run alone, every other forward beside the previous micro-batch's backward. With pp > 1
  Megatron needs interleaving (spec.py lists what it refuses).
- A merged step (combined_forward_backward_step, models/common/model_chunk_schedule_plan.py
  TransformerModelChunkSchedulePlan.run): the forward's receive and embedding, the backward's
  receive and output layer, then forward layer i with backward layer n-1-i while both have
  layers left, the backward's remaining layers, the forward's remaining layers; then the forward's
  send (on the communication stream), the backward's send, the weight gradients of the backward's
  last layer (kept back to run beside the send), the forward's output layer and the backward's
  embedding.
- A layer is five sub-modules (models/gpt/fine_grained_callables.py): pre_dispatch (attention,
  the second norm, shared experts, router, permutation) and mlp (expert TP all-gather, experts,
  expert TP reduce-scatter; a dense layer's norm, MLP and residual) on the compute stream, dispatch
  (the all-to-alls) and combine (the all-to-all, unpermutation, residual add) on a communication
  stream; a dense layer has no dispatch or combine. TransformerLayerSchedulePlan.run orders a
  pair of layers: combine.bwd | pre_dispatch.fwd | mlp.bwd | dispatch.fwd | mlp.bwd_dw |
  dispatch.bwd | mlp.fwd | combine.fwd | pre_dispatch.bwd | pre_dispatch.bwd_dw.
- Streams and events (pipeline_parallel/utils.py ScheduleNode.stream_acquire_context): a
  sub-module waits for its micro-batch's chunk event, runs on its stream, records the event. So a
  node here depends on its stream's last node and its micro-batch's last sub-module; weight
  gradients (backward_dw) run on the compute stream without the event.
- --delay-wgrad-compute (TransformerLayerNode.backward_dw; TE's WeightGradStore): Transformer
  Engine's weight gradient GEMMs leave the backward and run in backward_dw: the experts' (or dense
  MLP's) fc2 then fc1 after mlp.bwd, beside the dispatch's backward all-to-all; the shared
  experts' then attention's (qkv, proj; _BackwardDWWrapper) after pre_dispatch.bwd. The router and
  the output layer are not TE modules and keep theirs. Without it backward_dw does nothing.
Gradient reductions start after a layer's weight gradients (register_grad_ready, run by the
post-wgrad hooks with delayed wgrad). Delayed fp8 scaling's amax reductions stay one per pass,
at the merged step's end (the whole step is one fp8_autocast there).

Not modelled: ep_overlap_early_attn_memory_release (off by default; it only moves pre_dispatch.bwd
before mlp.fwd), the communication stream's high priority (a scheduling hint), and CUDA
streams running two kernels at once: this trace's GPU runs one kernel at a time, so the overlap
hides communication behind compute, not compute behind compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable, Iterator, Sequence

from chakra_core.jobs.kernels import LayerKernels
from chakra_core.jobs.moe import Tokens
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.schedule import COMBINED_EXTRA_WARMUP, stage_schedule, warmup_steps
from chakra_core.jobs.spec import JobSpec

Pass = tuple[int, int]
"""A micro-batch and model chunk."""
Phase = tuple[Pass | None, Pass | None]
"""A forward, a backward, or both merged."""


def combined_phases(stage: int, pp: int, vp: int, microbatches: int) -> list[Phase]:
    """The steps of a stage with the combined schedule: warm-up forwards alone, each steady-state
    forward merged with the backward after it, cool-down backwards alone."""
    steps = stage_schedule(stage, pp, vp, microbatches, extra_warmup=COMBINED_EXTRA_WARMUP)
    warmup = warmup_steps(stage, pp, vp, microbatches, COMBINED_EXTRA_WARMUP)
    phases: list[Phase] = [((mb, chunk), None) for _, mb, chunk in steps[:warmup]]
    steady = len(steps) - 2 * warmup   # (forward, backward) pairs after the warm-up
    for i in range(warmup, warmup + steady, 2):
        (_, fmb, fchunk), (_, bmb, bchunk) = steps[i], steps[i + 1]
        phases.append(((fmb, fchunk), (bmb, bchunk)))
    phases += [(None, (mb, chunk)) for _, mb, chunk in steps[warmup + steady:]]
    return phases


@dataclass
class DelayedWgrad:
    """A delayed weight gradient: the GEMM to write, the layer it belongs to, what it reads."""

    make: Callable[[], int]
    name: str
    key: tuple[int, int | str]
    reads: list[Hashable] = field(default_factory=list)


@dataclass
class _Pass:
    """One micro-batch's pass through a chunk in a merged step: its CUDA event (the frontier its
    next sub-module waits for) and where its layer's code stands."""

    mb: int
    chunk: int
    part: str
    frontier: list[int]
    parts: Iterator[str] = field(default_factory=lambda: iter(()))
    key: tuple[int, int | str] = (0, 0)
    saving: bool = True
    wgrads: dict[str, list[DelayedWgrad]] = field(default_factory=dict)


def _union(*frontiers: Sequence[int]) -> list[int]:
    return list(dict.fromkeys(node for frontier in frontiers for node in frontier))


def _dw_order(wgrad: DelayedWgrad) -> int:
    """_BackwardDWWrapper.backward_dw: shared experts, then attention's qkv, then its proj."""
    return 1 if wgrad.name.endswith(".qkv.wgrad") else 2 if wgrad.name.endswith(".proj.wgrad") else 0


class CombinedSchedule(LayerKernels):
    """The merged forward-backward steps (see the module docstring); RankProgram builds on it."""

    _first_forward: bool
    _last_backward: bool
    step_starts: list[int]

    if TYPE_CHECKING:   # provided by program.RankProgram
        def _begin_forward(self, chunk: int) -> None:
            raise NotImplementedError

        def _exchange(self, send: bool, direction: str, mb: int, chunk: int) -> int | None:
            raise NotImplementedError

        def _send(self, direction: str, mb: int, chunk: int) -> None:
            raise NotImplementedError

        def _fp8_weights(self, layer: int) -> None:
            raise NotImplementedError

        def chunk_layers(self, chunk: int) -> list[int]:
            raise NotImplementedError

        def has_embedding(self, chunk: int) -> bool:
            raise NotImplementedError

        def has_head(self, chunk: int) -> bool:
            raise NotImplementedError

    def __init__(self, job: JobSpec, placement: Placement, rank: int):
        super().__init__(job, placement, rank)
        self._deferring: list[DelayedWgrad] | None = None   # a backward sub-module's delayed weight gradients
        self._delayed: dict[int, DelayedWgrad] = {}          # stand-in -> delayed weight gradient
        self._comp: list[int] = []                     # the compute stream's frontier in a merged step
        self._comm: list[int] = []                     # the communication stream's

    # Delayed weight gradients -------------------------------------------------------------------------
    def gemm(self, name: str, m: int, k: int, n: int, cast: bool = False, tp_amax: bool = False,
             sm_margin: int = 0, accumulate: bool = False, chunks: int = 1) -> int:
        """A Transformer Engine module's weight gradient (linear_fp8: a TE module) is delayed."""
        gemm = super().gemm
        if accumulate and self.linear_fp8 and self._deferring is not None:
            return self._defer(name, lambda: gemm(name, m, k, n, cast, tp_amax, sm_margin, accumulate, chunks))
        return gemm(name, m, k, n, cast, tp_amax, sm_margin, accumulate, chunks)

    def grouped_gemm(self, name: str, m: Tokens, k: Tokens, n: int, cast: bool = False,
                     accumulate: bool = False) -> int:
        grouped = super().grouped_gemm
        if accumulate and self._deferring is not None:
            return self._defer(name, lambda: grouped(name, m, k, n, cast, accumulate))
        return grouped(name, m, k, n, cast, accumulate)

    def _defer(self, name: str, make: Callable[[], int]) -> int:
        """Keep a weight gradient for backward_dw; returns a stand-in (< 0) that `_read` knows."""
        assert self._deferring is not None
        wgrad = DelayedWgrad(make, name, self._layer_key)
        self._deferring.append(wgrad)
        token = -len(self._delayed) - 1
        self._delayed[token] = wgrad
        return token

    def _read(self, node: int | None, *what: str) -> None:
        if node is not None and node < 0:   # a delayed weight gradient reads them when it runs
            self._delayed[node].reads.extend((*self._layer_key, w) for w in what)
        else:
            super()._read(node, *what)

    def _weight_grads(self, pass_: _Pass, sub_module: str) -> None:
        """backward_dw of a sub-module: its delayed weight gradients on the compute stream, after its
        last work and without the micro-batch's event."""
        wgrads = pass_.wgrads.pop(sub_module, [])
        if not wgrads:
            return
        if sub_module == "pre_dispatch":
            wgrads = sorted(wgrads, key=_dw_order)
        self.stream.frontier = list(self._comp)
        self.part = "backward"
        for wgrad in wgrads:
            self._layer_key = wgrad.key
            self.ledger.use(wgrad.make(), *wgrad.reads)
        self._comp = list(self.stream.frontier)

    # Sub-modules on streams ---------------------------------------------------------------------------
    def _run(self, pass_: _Pass, comm: bool, run: Callable[[], object]) -> object:
        """One sub-module of `pass_` on the compute or communication stream: it waits for the
        stream's last node and its micro-batch's event, and records both (stream_acquire_context).
        A sub-module that writes nothing is Megatron's NoopScheduleNode and touches neither."""
        first = len(self.stream.nodes)
        self.stream.frontier = _union(self._comm if comm else self._comp, pass_.frontier)
        self.part, self._layer_key, self._saving = pass_.part, pass_.key, pass_.saving
        delay = pass_.part == "backward" and self.job.parallel.delay_wgrad_compute
        self._deferring = [] if delay else None
        result = run()
        if self._deferring:   # kept for the backward_dw of the sub-module that just ended
            assert isinstance(result, str), f"weight gradients delayed outside a sub-module: {self._deferring}"
            pass_.wgrads[result] = self._deferring
        self._deferring = None
        pass_.key, pass_.saving = self._layer_key, self._saving
        if len(self.stream.nodes) > first:
            pass_.frontier = list(self.stream.frontier)
            if comm:
                self._comm = list(pass_.frontier)
            else:
                self._comp = list(pass_.frontier)
        return result

    def _sub_module(self, pass_: _Pass, comm: bool, expect: str | None) -> None:
        """The layer's code of `pass_` up to the end of the sub-module `expect` (None: its end)."""
        ended = self._run(pass_, comm, lambda: next(pass_.parts, None))
        assert ended == expect, (ended, expect)

    def _layer_pair(self, f: _Pass | None, f_layer: int, b: _Pass | None, b_layer: int, last: bool) -> None:
        """TransformerLayerSchedulePlan.run: forward layer `f_layer` of `f` with backward layer
        `b_layer` of `b` (either may be None); `last`: the backward's last layer, whose weight
        gradients the chunk's step runs later (with delayed weight gradients)."""
        comp, comm = False, True
        last = last and self.job.parallel.delay_wgrad_compute
        if f is not None:
            f.parts = self.layer_forward_parts(f.mb, f_layer)
        if b is not None:
            b.parts = self.layer_backward_parts(b.mb, b_layer)
            self._sub_module(b, comm, "combine")
        if f is not None:
            forward = f

            def pre_dispatch() -> object:
                self._fp8_weights(f_layer)
                return next(forward.parts, None)
            ended = self._run(f, comp, pre_dispatch)
            assert ended == "pre_dispatch", ended
        if b is not None:
            self._sub_module(b, comp, "mlp")
        if f is not None:
            self._sub_module(f, comm, "dispatch")
        if b is not None:
            self._weight_grads(b, "mlp")
            self._sub_module(b, comm, "dispatch")
        if f is not None:
            self._sub_module(f, comp, "mlp")
            self._sub_module(f, comm, None)
        if b is not None:
            self._sub_module(b, comp, "pre_dispatch")
            if not last:
                self._finish_backward(b)

    def _finish_backward(self, b: _Pass) -> None:
        """The layer's delayed weight gradients, then its gradients are ready (bucket reductions)."""
        self._weight_grads(b, "pre_dispatch")
        self._sub_module(b, False, None)

    # The merged step ----------------------------------------------------------------------------------
    def _on_comp(self, run: Callable[[], object]) -> None:
        """Stream work outside the sub-modules (receives, waits) on the compute stream."""
        self.stream.frontier = list(self._comp)
        run()
        self._comp = list(self.stream.frontier)

    def combined_step(self, forward: Pass | None, backward: Pass | None) -> None:
        """combined_forward_backward_step and TransformerModelChunkSchedulePlan.run (see the module
        docstring): `forward`'s chunk and `backward`'s, either alone when the other is None."""
        self.step_starts.append(len(self.stream.nodes))
        self._comp = self._comm = list(self.stream.frontier)
        # both receives are posted at once (send_forward_backward_recv_forward_backward, or the
        # prefetch of overlap_p2p_comm); pre_forward and pre_backward make the compute stream wait
        received = [self._exchange(False, "fwd", *forward) if forward else None,
                    self._exchange(False, "bwd", *backward) if backward else None]
        f = b = None
        if forward is not None:
            mb, chunk = forward
            self.part = "forward"
            self._begin_forward(chunk)
            self._on_comp(lambda: self.stream.wait(received[0]))
            f = _Pass(mb, chunk, "forward", list(self._comp))
            if self.has_embedding(chunk):
                self._run(f, False, lambda: self.embedding_forward(mb))
        if backward is not None:
            bmb, bchunk = backward
            self._last_backward = bmb == self.job.microbatches - 1
            self._on_comp(lambda: self.stream.wait(received[1]))
            b = _Pass(bmb, bchunk, "backward", list(self._comp))
            if self.has_head(bchunk):
                self._run(b, False, lambda: self.head_backward(bmb))
        f_layers = self.chunk_layers(f.chunk) if f is not None else []
        b_layers = self.chunk_layers(b.chunk)[::-1] if b is not None else []
        both = min(len(f_layers), len(b_layers))
        for i in range(both):
            self._layer_pair(f, f_layers[i], b, b_layers[i], i == len(b_layers) - 1)
        for i in range(both, len(b_layers)):
            self._layer_pair(None, 0, b, b_layers[i], i == len(b_layers) - 1)
        for i in range(both, len(f_layers)):
            self._layer_pair(f, f_layers[i], None, 0, False)
        self._end_step(f, b, len(f_layers), len(b_layers))

    def _end_step(self, f: _Pass | None, b: _Pass | None, f_layers: int, b_layers: int) -> None:
        """The sends (the forward's on the communication stream after its pass, the backward's on the
        compute stream after its pass), the backward's last weight gradients beside them, the
        forward's output layer and the backward's embedding; then the compute stream waits for both."""
        if f is not None:
            forward = f
            self.stream.frontier = _union(self._comm, f.frontier)
            self._send("fwd", forward.mb, forward.chunk)
        if b is not None:
            backward = b
            self._comp = _union(self._comp, b.frontier)
            self._on_comp(lambda: self._send("bwd", backward.mb, backward.chunk))
            if b_layers and self.job.parallel.delay_wgrad_compute:
                self._finish_backward(b)
        if f is not None and self.has_head(f.chunk):
            self._run(f, False, lambda: self.head_forward(forward.mb))
        if b is not None and self.has_embedding(b.chunk):
            self._run(b, False, lambda: self.embedding_backward(backward.mb))
        self.stream.frontier = _union(self._comp, f.frontier if f else [], b.frontier if b else [])
        if f is not None:
            self.part = "forward"
            self.amax_reduction(f"mb{f.mb}.c{f.chunk}.fwd", f_layers)
        if b is not None:
            self.part = "backward"
            self.amax_reduction(f"mb{b.mb}.c{b.chunk}.bwd", b_layers)
