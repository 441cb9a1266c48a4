"""An ASTRA-sim 1.0 text workload converted: one Chakra trace per NPU (`convert_text_workload`).

Time: Chakra's `duration_micros` is an integer number of µs, so compute and
update times are rounded to the nearest µs there (ASTRA-sim's replay, and
chakra-sim's, run a 0 µs node for 1 ns); the exact ns value is kept in the
uint64 attribute `duration_ns`. The command reports how much the rounding
changes the total.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from chakra_core.et.build import metadata, write_rank_files
from chakra_core.limits import check_rank_count
from chakra_core.tools.text.parse import PHASES, TRANSFORMERS, TextWorkload, TextWorkloadError
from chakra_core.tools.text.program import GroupLayout, RankProgram, default_first_dim


@dataclass
class ConversionReport:
    files: list[Path]
    parallelism: str
    nodes_per_rank: list[int]
    layout: GroupLayout | None
    compute_ns: int                  # one rank, exact
    compute_replay_ns: int           # one rank, after rounding to whole µs (0 µs replays as 1 ns)
    compute_nodes: int
    sub_500ns_nodes: int
    notes: list[str]



def convert_text_workload(workload: TextWorkload, num_npus: int, prefix: str | os.PathLike[str],
                          num_passes: int = 1, model_parallel_group: int | None = None,
                          first_dim_npus: int | None = None, compute_scale: float = 1.0,
                          comm_scale: float = 1.0, update_time: bool = True,
                          compress: bool = False) -> ConversionReport:
    """Write PREFIX.<rank>.et for `num_npus` NPUs running `num_passes` iterations of `workload`."""
    check_rank_count(num_npus, "--num-npus")
    if num_npus < 1:
        raise TextWorkloadError("the number of NPUs must be at least 1")
    if num_passes < 1:
        raise TextWorkloadError("the number of passes must be at least 1")
    if compute_scale <= 0 or comm_scale <= 0:
        raise TextWorkloadError("--compute-scale and --comm-scale must be positive")
    kind = workload.parallelism
    layout = None
    notes: list[str] = []
    if kind in TRANSFORMERS:
        if first_dim_npus is not None:
            raise TextWorkloadError(f"{kind} groups NPUs by its model-parallel group (the header's "
                                    "model_parallel_NPU_group or --model-parallel-group), not "
                                    "--first-dim-npus")
        block = model_parallel_group or workload.model_parallel_group
        assert block is not None            # the parser sets a transformer's model-parallel group
        if num_npus % block:
            raise TextWorkloadError(f"{workload.path}: the model-parallel group of {block} NPUs does not "
                                    f"divide {num_npus} NPUs")
        layout = GroupLayout(num_npus, block)
    elif kind in ("HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA", "HYBRID_CUSTOMIZED"):
        if model_parallel_group is not None:
            raise TextWorkloadError(f"--model-parallel-group applies to the transformer workloads; "
                                    f"{kind} groups NPUs by --first-dim-npus")
        block = first_dim_npus or default_first_dim(num_npus)
        if num_npus % block:
            raise TextWorkloadError(f"--first-dim-npus {block} does not divide {num_npus} NPUs")
        if first_dim_npus is None:
            notes.append(f"first network dimension: {block} NPUs (default; set it with --first-dim-npus)")
        layout = GroupLayout(num_npus, block)
    elif model_parallel_group is not None or first_dim_npus is not None:
        raise TextWorkloadError(f"{kind} runs its collectives among all NPUs; --model-parallel-group and "
                                "--first-dim-npus do not apply")
    per_layer_notes: dict[tuple[int, str], str] = {}
    ranks = []
    programs = []
    for rank in range(num_npus):
        program = RankProgram(workload, rank, layout, compute_scale, comm_scale, update_time,
                               per_layer_notes)
        ranks.append(program.run(num_passes))
        programs.append(program)
    first = programs[0]
    for index, layer in enumerate(workload.layers):
        for phase in PHASES:
            if layer.comm_type[phase] != "NONE" and (index, phase) not in first.reached:
                first._note(index, phase, f"not run: ASTRA-sim 1.0's {kind} loop never issues it")
    notes.extend(per_layer_notes[key] for key in sorted(per_layer_notes))
    if workload.ignored_lines:
        notes.append(f"lines after the {len(workload.layers)} announced layers were ignored "
                     f"(first: line {workload.ignored_lines[0]})")
    meta = metadata({
        "generator": "chakra-sim convert text",
        "source": Path(workload.path).name,
        "parallelism": kind,
        "num_npus": num_npus,
        "num_passes": num_passes,
        "time_unit": "duration_micros rounded to whole us; exact ns in the duration_ns attribute",
    })
    files = write_rank_files(prefix, ranks, meta, compress=compress, count=num_npus, what="--num-npus")
    return ConversionReport(files=files, parallelism=kind, nodes_per_rank=[len(r) for r in ranks],
                            layout=layout, compute_ns=first.compute_ns,
                            compute_replay_ns=first.compute_replay_ns, compute_nodes=first.compute_nodes,
                            sub_500ns_nodes=first.sub_500, notes=notes)
