"""ASTRA-sim 1.0's workload loop for one NPU, as a Chakra dependency graph (`RankProgram`).

The converter reproduces ASTRA-sim 1.0's workload loop (`Workload.cc`,
`Layer.cc` at astra-sim c94c7460) as a dependency graph, one graph per NPU:

- the loop is sequential: every compute step waits for the previous one;
- a *blocking* collective (forward-pass collectives of the model/hybrid
  policies) is waited for before the next step; a *non-blocking* one
  (weight-gradient collectives everywhere, input-gradient ones of the hybrid
  policies) runs in the background until a later step waits for it: the
  forward pass of layer i waits for layer i's weight-gradient collective of
  the previous pass, the input-gradient step of layer i-1 for layer i's
  input-gradient collective;
- the per-layer update time delays, as in `Layer::call`, the moment a
  collective of that layer counts as finished: it becomes a CPU node of that
  duration after the collective (so it never occupies the GPU stream);
- which collectives a policy issues, and on which NPUs, follows ASTRA-sim's
  `decode_involved_dimensions`: DATA weight gradients among all NPUs; MODEL
  forward and input gradients among all NPUs; the hybrids split the NPUs into
  consecutive blocks (ASTRA-sim's first network dimension, or the
  model-parallel group of the transformer policies) and strided groups (the
  remaining dimensions). A collective whose group is a single NPU does nothing
  in ASTRA-sim and is left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chakra_core.schema import pb
from chakra_core.et.build import Stream, bool_attr, read_collective, micros_from_ns, uint_attr
from chakra_core.tools.text.parse import COMM_TYPES, DLRMS, PHASE_NAMES, TRANSFORMERS, LayerSpec, TextWorkload

# Where each policy runs each phase's collective (ASTRA-sim's decode_involved_dimensions):
# "world" = all NPUs, "model"/"data" = the model-/data-parallel group, None = nowhere.
_PHASE_GROUPS: dict[str, dict[str, str | None]] = {
    "DATA": {"fwd": None, "ig": None, "wg": "world"},
    "MICRO": {"fwd": None, "ig": None, "wg": "world"},
    "HYBRID_DLRM": {"fwd": None, "ig": None, "wg": "world"},
    "HYBRID_DLRM_ENHANCED": {"fwd": None, "ig": None, "wg": "world"},
    "MODEL": {"fwd": "world", "ig": "world", "wg": None},
    "DISTRIBUTED_INFERENCE": {"fwd": "world", "ig": "world", "wg": None},
    "HYBRID_DATA_MODEL": {"fwd": "model", "ig": "model", "wg": "data"},
    "HYBRID_MODEL_DATA": {"fwd": "model", "ig": "model", "wg": "data"},
    "HYBRID_TRANSFORMER": {"fwd": "model", "ig": "model", "wg": "data"},
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD": {"fwd": "model", "ig": "model", "wg": "data"},
}
_ALL_WORLD: dict[str, str | None] = {"fwd": "world", "ig": "world", "wg": "world"}
# Which group is the consecutive block ("block") and which the strided one ("stride").
_LAYOUT = {
    "HYBRID_DATA_MODEL": {"model": "block", "data": "stride"},
    "HYBRID_MODEL_DATA": {"model": "stride", "data": "block"},
    "HYBRID_TRANSFORMER": {"model": "block", "data": "stride"},
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD": {"model": "block", "data": "stride"},
}


# Communicator groups -----------------------------------------------------------------------------
def default_first_dim(num_npus: int) -> int:
    """The largest divisor of `num_npus` not above its square root (8 -> 2, 16 -> 4, 64 -> 8)."""
    best = 1
    for k in range(1, math.isqrt(num_npus) + 1):
        if num_npus % k == 0:
            best = k
    return best


@dataclass
class GroupLayout:
    """Consecutive blocks of `block` NPUs ("block<i>") and the strided groups across them ("stride<j>")."""

    num_npus: int
    block: int

    def block_members(self, rank: int) -> tuple[str, list[int]]:
        index = rank // self.block
        return f"block{index}", list(range(index * self.block, (index + 1) * self.block))

    def stride_members(self, rank: int) -> tuple[str, list[int]]:
        index = rank % self.block
        return f"stride{index}", list(range(index, self.num_npus, self.block))



class RankProgram:
    """ASTRA-sim 1.0's workload loop for one NPU, emitted as a Chakra graph."""

    def __init__(self, workload: TextWorkload, rank: int, layout: GroupLayout | None,
                 compute_scale: float, comm_scale: float, update_time: bool,
                 notes: dict[tuple[int, str], str]):
        self.wl = workload
        self.rank = rank
        self.layout = layout
        self.compute_scale, self.comm_scale = compute_scale, comm_scale
        self.update_time = update_time
        self.notes = notes
        self.s = Stream()
        self.pass_index = 0
        self.compute_ns = self.compute_replay_ns = self.compute_nodes = self.sub_500 = 0
        self.reached: set[tuple[int, str]] = set()
        self.phase_groups = [self._phase_groups(i, layer) for i, layer in enumerate(workload.layers)]
        self._group_names = self._resolve_groups()
        if self._group_names:
            self.s.define_groups(sorted(self._group_names.values(), key=lambda g: g[0]))

    # Groups ------------------------------------------------------------------------------------
    def _phase_groups(self, index: int, layer: LayerSpec) -> dict[str, str | None]:
        kind = self.wl.parallelism
        if kind in DLRMS and index == 0:
            return dict(_ALL_WORLD)
        policy = layer.policy or kind
        return dict(_PHASE_GROUPS[policy])

    def _layout_of(self, index: int) -> dict[str, str]:
        policy = self.wl.layers[index].policy or self.wl.parallelism
        return _LAYOUT.get(policy, {})

    def _resolve_groups(self) -> dict[str, tuple[str, list[int]]]:
        """Group kind ("block"/"stride") -> (name, members) for the groups this rank uses."""
        out: dict[str, tuple[str, list[int]]] = {}
        if self.layout is None:
            return out
        for index in range(len(self.wl.layers)):
            for role in self.phase_groups[index].values():
                if role in ("model", "data"):
                    which = self._layout_of(index)[role]
                    name, members = (self.layout.block_members(self.rank) if which == "block"
                                     else self.layout.stride_members(self.rank))
                    if len(members) > 1:
                        out[which] = (name, members)
        return out

    # Emission ---------------------------------------------------------------------------------------
    def _label(self, layer: LayerSpec, what: str) -> str:
        return f"p{self.pass_index}.{layer.name}.{what}"

    def compute(self, index: int, phase: str, recompute: bool = False) -> None:
        layer = self.wl.layers[index]
        ns = int(layer.compute[phase] * self.compute_scale)
        if ns <= 0:
            return   # ASTRA-sim waits 0 cycles: nothing to emit
        micros = micros_from_ns(ns)
        self.compute_ns += ns
        self.compute_replay_ns += micros * 1000 if micros else 1
        self.compute_nodes += 1
        self.sub_500 += ns < 500
        suffix = phase + (".recompute" if recompute else "")
        self.s.step(pb.COMP_NODE, self._label(layer, suffix), duration_micros=micros,
                    attrs=[bool_attr("is_cpu_op", False), uint_attr("duration_ns", ns)])

    def comm(self, index: int, phase: str, blocking: bool) -> int | None:
        """Issue layer `index`'s collective of `phase`; return the id that marks it finished."""
        layer = self.wl.layers[index]
        ctype = layer.comm_type[phase]
        if ctype == "NONE":
            return None
        self.reached.add((index, phase))
        role = self.phase_groups[index][phase]
        group_name = None
        if role is None:
            self._note(index, phase, f"not run: the {layer.policy or self.wl.parallelism} policy "
                                     f"involves no NPUs in {PHASE_NAMES[phase]} collectives")
            return None
        if role != "world":
            which = self._layout_of(index)[role]
            group = self._group_names.get(which)
            if group is None:
                self._note(index, phase, f"not run: its {role}-parallel group is a single NPU")
                return None
            group_name = group[0]
        size = int(layer.comm_size[phase] * self.comm_scale)
        comm_type = COMM_TYPES[ctype]
        assert comm_type is not None        # "NONE" returned above
        node = self.s.launch(pb.COMM_COLL_NODE, self._label(layer, f"{phase}.{ctype}"),
                             attrs=read_collective(comm_type, size, group_name))
        done = node
        if self.update_time and layer.update > 0:
            ns = layer.update
            done = self.s.add(pb.COMP_NODE, self._label(layer, f"{phase}.{ctype}.update"), deps=[node],
                              duration_micros=micros_from_ns(ns),
                              attrs=[bool_attr("is_cpu_op", True), uint_attr("duration_ns", ns)])
        if blocking:
            self.s.wait(done)
        return done

    def _note(self, index: int, phase: str, text: str) -> None:
        layer = self.wl.layers[index]
        key = (index, phase)
        if key not in self.notes:
            self.notes[key] = (f"line {layer.line}: layer {layer.name!r} {PHASE_NAMES[phase]} "
                               f"{layer.comm_type[phase]} {text}")

    # ASTRA-sim 1.0's loops (Workload::iterate_*) ---------------------------------------------------------
    def run(self, passes: int) -> list[pb.Node]:
        kind = self.wl.parallelism
        loop = {
            "DATA": self._data, "MODEL": self._model, "MICRO": self._micro,
            "HYBRID_DATA_MODEL": self._hybrid, "HYBRID_MODEL_DATA": self._hybrid,
            "HYBRID_CUSTOMIZED": self._hybrid, "HYBRID_TRANSFORMER": self._hybrid,
            "HYBRID_TRANSFORMER_FWD_IN_BCKWD": self._hybrid,
            "HYBRID_DLRM": self._dlrm, "HYBRID_DLRM_ENHANCED": self._dlrm,
            "DISTRIBUTED_INFERENCE": self._inference,
        }[kind]
        self.wg_done: list[int | None] = [None] * len(self.wl.layers)
        self.ig_done: list[int | None] = [None] * len(self.wl.layers)
        for self.pass_index in range(passes):
            loop()
        return self.s.nodes

    def _micro(self) -> None:
        # iterate_micro_benchmark: weight-gradient collectives only, all issued at once.
        for index in range(len(self.wl.layers)):
            self.comm(index, "wg", blocking=False)

    def _data(self) -> None:
        n = len(self.wl.layers)
        for index in range(n):
            self.s.wait(self.wg_done[index])
            self.compute(index, "fwd")
        for index in range(n - 1, -1, -1):
            self.compute(index, "wg")
            self.wg_done[index] = self.comm(index, "wg", blocking=False)
            if index > 0:
                self.compute(index, "ig")

    def _model(self) -> None:
        n = len(self.wl.layers)
        for index in range(n):
            self.compute(index, "fwd")
            self.comm(index, "fwd", blocking=True)
        for index in range(n - 1, -1, -1):
            self.compute(index, "ig")
            pending = self.comm(index, "ig", blocking=False) if index > 0 else None
            self.compute(index, "wg")
            self.s.wait(pending)

    def _hybrid(self) -> None:
        n = len(self.wl.layers)
        transformer = self.wl.parallelism in TRANSFORMERS
        checkpoints = sorted(set(self.wl.checkpoints))
        initiators = set(self.wl.initiators)
        for index in range(n):
            self.s.wait(self.wg_done[index])
            self.compute(index, "fwd")
            self.comm(index, "fwd", blocking=True)
        for index in range(n - 1, -1, -1):
            if index in initiators:
                start = max(c for c in checkpoints if c < index)
                for layer in range(start, index):
                    self.compute(layer, "fwd", recompute=True)
                    self.comm(layer, "fwd", blocking=True)
            self.compute(index, "ig")
            pending = self.comm(index, "ig", blocking=False) if (index > 0 or transformer) else None
            self.compute(index, "wg")
            self.wg_done[index] = self.comm(index, "wg", blocking=False)
            self.s.wait(pending)

    def _dlrm(self) -> None:
        n = len(self.wl.layers)
        last_bottom = self.wl.last_bottom_layer
        assert last_bottom is not None      # the parser sets it for the DLRM policies
        fwd_done: list[int | None] = [None] * n
        for index in range(n):
            self.s.wait(self.wg_done[index])
            self.compute(index, "fwd")
            if self.wl.layers[index].comm_type["fwd"] == "ALLTOALL":
                fwd_done[index] = self.comm(index, "fwd", blocking=False)
            elif index == last_bottom:
                self.s.wait(fwd_done[0])
        for index in range(n - 1, -1, -1):
            self.compute(index, "wg")
            self.wg_done[index] = self.comm(index, "wg", blocking=False)
            if self.wl.parallelism == "HYBRID_DLRM":
                self.s.wait(self.ig_done[index])
                self.ig_done[index] = None
            if index == 0:
                break
            self.compute(index, "ig")
            if index == last_bottom + 1:
                self.ig_done[0] = self.comm(0, "ig", blocking=False)

    def _inference(self) -> None:
        for index in range(len(self.wl.layers)):
            self.compute(index, "fwd")
            self.comm(index, "fwd", blocking=True)
