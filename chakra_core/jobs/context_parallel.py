"""Context-parallel attention as Transformer Engine runs it (a mixin of `kernels.LayerKernels`).

`parallel.cp_comm_type` picks the variant, as Megatron-LM's `--cp-comm-type` does (default p2p;
megatron/training/arguments.py, NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553).
The kernels follow Transformer Engine's `AttnFuncWithCPAndKVP2P` and
`AttnFuncWithCPAndQKVOA2A` (transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py, NVIDIA/TransformerEngine at d0067d0da6cb01811b8072a7d304f0e00344ce2b):

- p2p (ring attention): the sequence is split in 2 x cp chunks, rank r holding chunks r and
  2cp-1-r (the load-balanced causal split). The forward runs cp steps: step i waits for the
  key/value block of step i-1's exchange, starts the exchange of the block it holds with its ring
  neighbours (send to the next rank, receive from the previous one) and runs attention on it, so
  each exchange overlaps one step's kernel; from step 1 on a correction kernel merges the step's
  output and softmax statistics. Step 0 is the causal diagonal block; the other steps are half
  blocks without a mask (half of the queries against all keys, or all queries against half of the
  keys: the same FLOPs). The backward runs the steps again in the other direction, sending the key/
  value block with the key/value gradient accumulated so far (only the block at the first step,
  only the gradient at the last), waiting for each exchange before accumulating the gradients.
- a2a (Ulysses): all-to-alls of q, k and v over the CP group give each rank the whole sequence for
  a/cp of its heads; attention runs once over the whole sequence; an all-to-all returns the output
  (the backward: the output gradient in, dq, dk and dv back).
- allgather: the key/value blocks are all-gathered beside the attention, which waits for them; the
  backward reduce-scatters their gradient.
- a2a+p2p (hierarchical, `hierarchical_context_parallel_sizes: [a2a, p2p]`; TE's
  AttnFuncWithCPAndKVP2P with a list of two groups): q, k and v are all-to-alled inside groups of
  a2a consecutive CP ranks (Megatron's create_hierarchical_groups, level 1), giving each rank
  a/a2a of its heads over the sequence of its group; ring attention then runs over the p2p ranks
  of the same a2a index (send_dst = cp_global_ranks[(rank + 1) % cp_size * cp_size_a2a +
  rank_a2a]), and an all-to-all returns the output. The backward all-to-alls the output gradient
  before its ring and dq, dk, dv after it.

The half-block steps are written with rank 0's shapes (queries of half a block against a whole
block, as TE's "upper-triangle" section); the other ranks run some steps as the mirrored shape
(whole queries against half the keys), with the same FLOPs and sequence lengths: only how many
thread blocks a step launches differs, which matters only when a step cannot fill the GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from chakra_core.et.build import p2p_attrs, str_attr
from chakra_core.jobs.primitives import KernelPrimitives
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec


CP_TAG_BASE = 1 << 40
"""Tags of the ring's exchanges start here, apart from the pipeline's (a rank's k-th exchange
meets its neighbour's k-th: every rank of a CP group runs the same program)."""


class ContextParallel(KernelPrimitives):
    """Ring (p2p) and all-to-all attention over the CP group (see the module docstring)."""

    rank: int
    cp: int
    b: int
    s: int
    a: int
    g: int
    d: int
    dqk: int
    dv: int
    _cp_exchanges: int

    if TYPE_CHECKING:   # provided by kernels.LayerKernels
        def flash_attention(self, name: str, backward: bool, seq_q: int, seq_kv: int, causal: bool,
                            heads: int) -> int:
            raise NotImplementedError

    def _kv_bytes(self) -> int:
        """This rank's key/value block: its n tokens' k (head size dqk) and v (dv) for its g query groups."""
        return self.n * self.g * (self.dqk + self.dv) * self.act_bytes

    def _ring_exchange(self, name: str, size: int, forward: bool, role: str) -> tuple[int, int]:
        """The send to one ring neighbour and the receive from the other (the forward sends to the
        next rank of the ring, the backward to the previous one, as TE's send_dst/recv_src)."""
        members = self.groups[role]
        here = members.index(self.rank)
        ahead, behind = members[(here + 1) % len(members)], members[(here - 1) % len(members)]
        to, source = (ahead, behind) if forward else (behind, ahead)
        tag = CP_TAG_BASE + self._cp_exchanges
        self._cp_exchanges += 1
        send = self.stream.launch(pb.COMM_SEND_NODE, name + ".send",
                                  attrs=[*p2p_attrs(self.rank, to, tag, size), str_attr("step_part", "cp")])
        recv = self.stream.launch(pb.COMM_RECV_NODE, name + ".recv",
                                  attrs=[*p2p_attrs(source, self.rank, tag, size), str_attr("step_part", "cp")])
        return send, recv

    def ring_attention(self, name: str, backward: bool, role: str = "cp", heads: int | None = None) -> int:
        """p2p: a step of attention per rank of the `role` ring, each beside the exchange of the next
        step's block, over `heads` query heads (default all of this rank's); returns the node that
        writes the output (forward) or the last gradient accumulation (backward)."""
        ring = len(self.groups[role])
        block, half = self.s // ring, self.s // (2 * ring)
        kv, out_elements = self._kv_bytes(), self.n * self.a * self.dv   # the same bytes after a2a+p2p's all-to-all
        pending: Iterable[int] = ()
        last = -1
        for i in range(ring):
            self.stream.wait(*pending)     # this step's block (and the gradient so far) arrived
            step = f"{name}.cp{i}"
            if backward:
                # the block at the first step, the block and its gradient between, the gradient at the last
                size = kv if i in (0, ring - 1) else 2 * kv
                pending = self._ring_exchange(step, size, forward=False, role=role)
                diagonal = i == ring - 1
            else:
                pending = self._ring_exchange(step, kv, forward=True, role=role) if i < ring - 1 else ()
                diagonal = i == 0
            seq_q = block if diagonal else half
            last = self.flash_attention(step, backward, seq_q, block, diagonal, heads or self.a)
            if backward:
                self.stream.wait(*pending)     # TE waits for the gradient before accumulating it
                grads = out_elements + kv // self.act_bytes
                last = self.elementwise(step + ".accumulate", grads, 3 * grads * self.act_bytes)
            elif i > 0:    # merge the step's output and softmax statistics into the running output
                last = self.elementwise(step + ".correction", out_elements, 3 * out_elements * self.act_bytes, 4)
        return last

    def a2a_attention(self, name: str, backward: bool, hierarchical: bool = False) -> int:
        """a2a: all-to-alls around one attention over the whole sequence with a/cp heads;
        `hierarchical` (a2a+p2p): around ring attention over the sequence of the a2a group."""
        q, kv = self.n * self.a * self.dqk * self.act_bytes, self._kv_bytes()
        out = self.n * self.a * self.dv * self.act_bytes
        role = "cp_a2a" if hierarchical else "cp"
        if backward:   # the output gradient in; dq, dk and dv back
            self.blocking(name + ".cp_dout_all_to_all", role, pb.ALL_TO_ALL, out, "cp")
        else:
            self.blocking(name + ".cp_qkv_all_to_all", role, pb.ALL_TO_ALL, q + kv, "cp")
        if hierarchical:
            node = self.ring_attention(name, backward, "cp_p2p", self.a // len(self.groups["cp_a2a"]))
        else:
            node = self.flash_attention(name, backward, self.s, self.s, True, self.a // self.cp)
        if backward:
            self.blocking(name + ".cp_dqkv_all_to_all", role, pb.ALL_TO_ALL, q + kv, "cp")
        else:
            self.blocking(name + ".cp_out_all_to_all", role, pb.ALL_TO_ALL, out, "cp")
        return node


def hierarchical_problems(job: JobSpec) -> list[str]:
    """a2a+p2p's sizes as Megatron-LM takes them (megatron/training/arguments.py at d98e8a64: the
    sizes must be set with a2a+p2p and multiply to cp) and Transformer Engine runs them (two
    levels; the all-to-all splits each rank's heads)."""
    p, m = job.parallel, job.shape
    sizes = p.hierarchical_context_parallel_sizes
    if p.cp_comm_type != "a2a+p2p":
        return [] if sizes is None else ["parallel.hierarchical_context_parallel_sizes needs cp_comm_type a2a+p2p"]
    if sizes is None:
        return ["cp_comm_type a2a+p2p needs parallel.hierarchical_context_parallel_sizes: [a2a, p2p] "
                "(--hierarchical-context-parallel-sizes must be set when a2a+p2p is used)"]
    a2a, ring = sizes
    out = []
    if a2a * ring != p.cp:
        out.append(f"parallel.hierarchical_context_parallel_sizes {a2a} x {ring} must be cp {p.cp}")
    if (m.heads // p.tp) % a2a or (m.groups // p.tp) % a2a:
        out.append(f"cp_comm_type a2a+p2p splits each rank's {m.heads // p.tp} query heads and {m.groups // p.tp} "
                   f"key/value heads over the all-to-all group: both must be divisible by {a2a}")
    return out
