#!/usr/bin/env python3
"""Write examples/traces/memory/offload.<rank>.et: a synthetic weight-streaming workload.

Each of 4 ranks runs 6 layers. Layer l:

    load_weights.l   MEM_LOAD_NODE   256 MiB of bf16 weights (storage 100+l)     after load_weights.l-1
                                                                                 and layer.l-2
    layer.l          COMP_NODE       300 us; reads the weights and act.l,        after load_weights.l
                                     writes act.l+1 (64 MiB, storage 200+l+1)    and layer.l-1
    offload_act.l    MEM_STORE_NODE  64 MiB: act.l+1 saved for the backward pass after layer.l

so the next layer's weights are prefetched while a layer computes (one layer
ahead: at most two layers' weights are resident), and the
activation offload overlaps the next layer. act.0 (32 MiB, storage 200) is the
input batch, never produced in the trace. Tensors are written into the nodes'
inputs/outputs in Chakra's converter format ([tensor_id, storage_id, offset,
num_elements, element_size, device]) so the memory model can follow them.

    python examples/make_memory_trace.py [--out examples/traces/memory] [--ranks 4] [--layers 6]

The output is deterministic (no timestamps); the committed files were made with the defaults.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core.et.io import write_trace  # noqa: E402
from chakra_core.schema import pb  # noqa: E402

MiB = 1 << 20
WEIGHTS = 256 * MiB
ACTIVATION = 64 * MiB
BATCH = 32 * MiB
LAYER_MICROS = 300
BF16 = 2


def tensor(tensor_id: int, storage: int, size: int) -> str:
    return f"[{tensor_id}, {storage}, 0, {size // BF16}, {BF16}, 'cuda:0']"


def node(node_id: int, name: str, node_type: int, deps: list[int], inputs: list[str] = (),
         outputs: list[str] = (), duration_micros: int = 0, tensor_size: int | None = None) -> pb.Node:
    out = pb.Node(id=node_id, name=name, type=node_type, duration_micros=duration_micros)
    out.data_deps.extend(deps)
    out.inputs.values = "[" + ", ".join(inputs) + "]"
    out.outputs.values = "[" + ", ".join(outputs) + "]"
    if tensor_size is not None:
        out.attr.append(pb.AttributeProto(name="tensor_size", uint64_val=tensor_size))
    out.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=False))
    return out


def rank_nodes(layers: int) -> list[pb.Node]:
    nodes = []
    for layer in range(layers):
        load, comp, store = 3 * layer + 1, 3 * layer + 2, 3 * layer + 3
        weights = tensor(1000 + layer, 100 + layer, WEIGHTS)
        act_in = tensor(2000 + layer, 200 + layer, BATCH if layer == 0 else ACTIVATION)
        act_out = tensor(2000 + layer + 1, 200 + layer + 1, ACTIVATION)
        load_deps = ([load - 3] if layer else []) + ([comp - 6] if layer >= 2 else [])
        nodes.append(node(load, f"load_weights.{layer}", pb.MEM_LOAD_NODE, load_deps,
                          outputs=[weights], tensor_size=WEIGHTS))
        nodes.append(node(comp, f"layer.{layer}", pb.COMP_NODE, [load] + ([comp - 3] if layer else []),
                          inputs=[weights, act_in], outputs=[act_out], duration_micros=LAYER_MICROS))
        nodes.append(node(store, f"offload_act.{layer}", pb.MEM_STORE_NODE, [comp],
                          inputs=[act_out], tensor_size=ACTIVATION))
    return nodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "examples" / "traces" / "memory")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for rank in range(args.ranks):
        path = args.out / f"offload.{rank}.et"
        write_trace(path, pb.GlobalMetadata(version="0.0.4"), rank_nodes(args.layers))
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
