"""Shared experts beside the dispatcher's all-to-alls (`--moe-shared-expert-overlap`; a mixin of
`moe.MixtureOfExperts`).

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/transformer/moe/:
shared_experts.py (SharedExpertMLP with moe_shared_expert_overlap: its linears lose their own TP
communication and Transformer Engine userbuffers (parallel_mode None), and the MLP runs in pieces
on a stream of its own, SharedExpertMLP.stream) and token_dispatcher.py (MoEAlltoAllTokenDispatcher
calls the pieces). Without the option the shared experts run first, before the router (moe.py).

Forward, on the shared stream, each piece after the main stream's work so far (wait_current_stream):
- dispatch_preprocess, after the routing and before the permutation: pre_forward_comm, the input's
  all-gather over TP (sequence parallel; NCCL);
- token_dispatch, after the tokens' all-to-all is launched and before the probabilities': fc1 and
  the activation, beside the all-to-alls and the routed experts' start;
- token_combine, after the routed experts (its comment: "the shared experts fc2 is not overlapped
  with routed experts fc1") and the combine all-to-all's launch: fc2 and the output's reduce-scatter
  over TP, beside the all-to-all;
- combine_postprocess: the main stream waits for the shared stream before adding its output.
Backward (autograd runs each piece on its forward's stream; set_tensor_grad_fn_sequence_sr orders
them: "probs A2A -> tokens A2A -> shared experts fc1"): the output gradient's all-gather over TP and
fc2's dgrad and wgrad from the block's start, beside the combine's backward all-to-all; the
activation's and fc1's backward after the routed experts' fc1 backward (_BackwardStreamWait) and
the dispatch's backward all-to-alls' launch, beside them; then the input gradient's reduce-scatter;
the main stream waits for it before the second norm's backward (the gradients meet there).

As a plain linear, fc1 saves the gathered input and needs no second all-gather in the backward,
and no amax is reduced over TP under fp8 current scaling (TE linear.py reduces it only for
sequence-parallel column-parallel inputs and row-parallel output gradients). Megatron refuses the
option together with --overlap-moe-expert-parallel-comm (overlap_problems).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from chakra_core.jobs.primitives import KernelPrimitives
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec


class SharedExpertOverlap(KernelPrimitives):
    """The shared experts' stream (see the module docstring)."""

    _shared_side: list[int]

    @property
    def shared_overlap(self) -> bool:
        """--moe-shared-expert-overlap on a block with shared experts (without them it does nothing)."""
        return self.job.parallel.moe_shared_expert_overlap and bool(self.job.shape.shared_ffn)

    @contextmanager
    def _on_shared_stream(self, *waits: list[int]) -> Iterator[None]:
        """Nodes written inside run on the shared stream, after its last one and `waits` (the main
        stream's frontier when the piece was launched); the main stream's frontier is kept."""
        main = self.stream.frontier
        self.stream.frontier = list(self._shared_side)
        for frontier in waits:
            self.stream.wait(*frontier)
        try:
            yield
        finally:
            self._shared_side = self.stream.frontier
            self.stream.frontier = main

    def _shared_sizes(self) -> tuple[int, int]:
        ffn_here = self.job.shape.shared_ffn // self.tp
        return ffn_here, self.job.shape.up_projections() * ffn_here

    def _shared_tp(self, name: str, kind: int, size: int) -> None:
        if "tp" in self.groups:
            self.blocking(name, "tp", kind, size)

    # Forward ----------------------------------------------------------------------------------------
    def shared_gather(self, p: str) -> None:
        """pre_forward_comm: the input's all-gather over TP, after the routing."""
        self._shared_side = list(self.stream.frontier)
        with self._on_shared_stream():
            self._shared_tp(p + "shared.fc1.tp_all_gather", pb.ALL_GATHER, self.local_tokens * self.h * self.act_bytes)

    def shared_fc1(self, p: str, permuted: list[int]) -> None:
        """linear_fc1_forward_and_act, after the permutation (`permuted`: the main frontier then)."""
        h, n, b = self.h, self.n, self.act_bytes
        ffn_here, up = self._shared_sizes()
        with self._on_shared_stream(permuted):
            fc1 = self.gemm(p + "shared.fc1", n, h, up, cast=True)
            self._keep(fc1, "fc1_in", n * h, self.gemm_in, output=False)   # the gathered input
            self._keep(fc1, "fc1", n * up, b)
            act = self.elementwise(p + "shared.activation", n * ffn_here, (up + ffn_here) * n * b, 4)
            self._keep(act, "act", n * ffn_here, self.gemm_in)

    def shared_fc2(self, p: str, computed: list[int]) -> None:
        """linear_fc2_forward and post_forward_comm, after the routed experts (`computed`)."""
        ffn_here, _ = self._shared_sizes()
        with self._on_shared_stream(computed):
            self.gemm(p + "shared.fc2", self.n, ffn_here, self.h, cast=True)
            self._shared_tp(p + "shared.fc2.tp_reduce_scatter", pb.REDUCE_SCATTER, self.n * self.h * self.act_bytes)

    def shared_join(self) -> None:
        """The main stream waits for the shared stream (get_output; in the backward, the gradients' sum)."""
        self.stream.wait(*self._shared_side)

    # Backward ---------------------------------------------------------------------------------------
    def shared_fc2_backward(self, p: str) -> None:
        """The output gradient's all-gather over TP (the reduce-scatter's backward), fc2's dgrad and
        wgrad, from the block's backward start."""
        h, n = self.h, self.n
        ffn_here, _ = self._shared_sizes()
        self._shared_side = list(self.stream.frontier)
        with self._on_shared_stream():
            self._shared_tp(p + "shared.fc2.dgrad.tp_all_gather", pb.ALL_GATHER, self.local_tokens * h * self.act_bytes)
            self.gemm(p + "shared.fc2.dgrad", n, h, ffn_here, cast=True)
            self._read(self.gemm(p + "shared.fc2.wgrad", ffn_here, n, h, accumulate=True), "act")

    def shared_fc1_backward(self, p: str, routed_fc1: list[int]) -> None:
        """The activation's and fc1's backward after the routed experts' fc1 backward (`routed_fc1`),
        then the input gradient's reduce-scatter over TP (the all-gather's backward)."""
        h, n, b = self.h, self.n, self.act_bytes
        ffn_here, up = self._shared_sizes()
        with self._on_shared_stream(routed_fc1):
            self._read(self.elementwise(p + "shared.activation.bwd", n * ffn_here, (up + ffn_here + up) * n * b, 6),
                       "fc1")
            self.gemm(p + "shared.fc1.dgrad", n, up, h, cast=True)
            self._read(self.gemm(p + "shared.fc1.wgrad", up, n, h, accumulate=True), "fc1_in")
            self._shared_tp(p + "shared.fc1.tp_reduce_scatter", pb.REDUCE_SCATTER, n * h * b)


def overlap_problems(job: JobSpec) -> list[str]:
    """What Megatron-LM refuses of the MoE overlaps (at d98e8a64: TransformerConfig.__post_init__ in
    megatron/core/transformer/transformer_config.py, lines 3002-3077), and Transformer Engine (at
    d0067d0d) of delayed weight gradients."""
    p, t = job.parallel, job.training
    out = []
    if p.overlap_moe_expert_parallel_comm:
        if p.pp > 1 and job.vp == 1:
            out.append("parallel.overlap_moe_expert_parallel_comm with pp > 1 needs parallel.vp > 1 (Megatron: "
                       "virtual_pipeline_model_parallel_size must be specified)")
        if p.ep == 1:
            out.append("parallel.overlap_moe_expert_parallel_comm needs parallel.ep > 1 (expert model parallelism)")
        if t.recompute == "full":
            out.append("parallel.overlap_moe_expert_parallel_comm needs training.recompute other than full")
        if p.moe_shared_expert_overlap:
            out.append("parallel.moe_shared_expert_overlap and parallel.overlap_moe_expert_parallel_comm exclude "
                       "each other (Megatron: disable moe_shared_expert_overlap)")
    if p.delay_wgrad_compute and not p.overlap_moe_expert_parallel_comm:
        out.append("parallel.delay_wgrad_compute needs parallel.overlap_moe_expert_parallel_comm")
    if p.delay_wgrad_compute and p.tp_comm_overlap and p.tp > 1:
        # module/layernorm_linear.py and linear.py: NotImplementedError for a delayed wgrad GEMM with
        # userbuffers, whose bulk wgrad overlap Megatron turns on by default (tp_comm_bulk_wgrad)
        out.append("parallel.delay_wgrad_compute with parallel.tp_comm_overlap: Transformer Engine does not "
                   "delay weight gradients with userbuffers")
    return out
