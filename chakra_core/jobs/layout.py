"""A custom pipeline layout (Megatron's --pipeline-model-parallel-layout): which layers each model
chunk of each pipeline stage holds.

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553,
megatron/core/transformer/pipeline_parallel_layer_layout.py: the string lists the virtual stages
separated by `|`, in layer order, each a run of `E` (embedding), `t` (transformer layer), `m`
(multi-token prediction layer) and `L` (loss); `(...)*n` and `x*n` repeat, commas are cosmetic.
Virtual stage i runs on pipeline rank i mod pp as its model chunk i div pp, so pp x vp stages are
listed. Megatron checks that the embedding comes first and the loss last, each once, that the
transformer layers number num_layers and the MTP layers mtp_num_layers, after every transformer
layer and in a last model chunk of a rank (validate_layer_layout).

Modelled here: the embedding in the first virtual stage, the loss in the last and the MTP layers
beside the loss (the layout DeepSeek-V3's published runs use, "Et|(tt|)*30mL"); an MTP layer on
another rank (Megatron's "standalone" MTP) is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

KINDS = {"E": "embedding", "t": "transformer", "m": "mtp", "L": "loss"}


def expand(layout: str) -> list[str]:
    """The virtual stages of a layout string, each as its layer characters (parse_str_to_list)."""
    text = layout.replace(",", "").replace(" ", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    return text.split("|")


@dataclass(frozen=True)
class Layout:
    """The parsed layout: virtual stages in layer order."""

    stages: tuple[str, ...]
    pp: int

    @property
    def vp(self) -> int:
        return len(self.stages) // self.pp

    def stage_of(self, stage: int, chunk: int) -> str:
        return self.stages[chunk * self.pp + stage]

    def transformer_layers(self, stage: int, chunk: int) -> list[int]:
        """The 0-based transformer layers of a rank's model chunk (get_layer_offset / get_num_layers_to_build)."""
        index = chunk * self.pp + stage
        first = sum(s.count("t") for s in self.stages[:index])
        return list(range(first, first + self.stages[index].count("t")))

    def mtp_layers(self, stage: int, chunk: int) -> int:
        return self.stage_of(stage, chunk).count("m")


def problems(layout: str, pp: int, layers: int, mtp_layers: int) -> list[str]:
    """What is wrong with a layout for this model and pipeline size, in the terms of the key."""
    stages = expand(layout)
    unknown = sorted({c for s in stages for c in s} - set(KINDS))
    if unknown:
        return [f"parallel.pipeline_layout '{layout}': unknown layer character(s) {', '.join(unknown)} "
                "(E embedding, t transformer layer, m MTP layer, L loss, | between virtual stages)"]
    out = []
    if len(stages) % pp:
        out.append(f"parallel.pipeline_layout lists {len(stages)} virtual stages, not a multiple of pp {pp}")
    flat = "".join(stages)
    if flat.count("E") != 1 or flat.count("L") != 1 or not stages[0].startswith("E") or not stages[-1].endswith("L"):
        out.append("parallel.pipeline_layout must start with the embedding E and end with the loss L, each once, "
                   "E in the first virtual stage and L in the last")
    if flat.count("t") != layers:
        out.append(f"parallel.pipeline_layout holds {flat.count('t')} transformer layers (t), the model {layers}")
    if flat.count("m") != mtp_layers:
        out.append(f"parallel.pipeline_layout holds {flat.count('m')} MTP layers (m), the model's mtp_num_layers "
                   f"{mtp_layers}")
    elif mtp_layers and stages[-1].count("m") != mtp_layers:
        out.append("parallel.pipeline_layout: MTP layers (m) are modelled in the virtual stage of the loss only "
                   "(Megatron's standalone MTP stage is not)")
    elif mtp_layers and flat.index("m") < flat.rindex("t"):
        out.append("parallel.pipeline_layout: MTP layers come after every transformer layer")
    return out


@lru_cache(maxsize=64)
def parse(layout: str, pp: int) -> Layout:
    return Layout(tuple(expand(layout)), pp)


def job_problems(job: "JobSpec") -> list[str]:
    """The layout's problems for this job (`problems`), and its conflicts with other keys."""
    p = job.parallel
    out = problems(p.pipeline_layout or "", p.pp, job.shape.layers, job.shape.mtp_layers)
    stages = len(expand(p.pipeline_layout or ""))
    if not out and p.vp is not None and p.vp * p.pp != stages:
        out.append(f"parallel.vp {p.vp} with a pipeline_layout of {stages} virtual stages: vp is {stages} / pp "
                   f"{p.pp} (or leave vp out)")
    if p.account_for_embedding_and_loss:
        # megatron/training/arguments.py at d98e8a64: the layout places the embedding and loss itself
        out.append("parallel.account_for_embedding_and_loss with a pipeline_layout: the layout places E and L")
    return out


def mtp_layers_in(job: "JobSpec", stage: int, chunk: int) -> int:
    """MTP layers a stage's model chunk runs: the layout's, else all on the last stage's last chunk
    (multi_token_prediction.py mtp_on_this_rank at d98e8a64)."""
    layout = job.layout
    if layout is not None:
        return layout.mtp_layers(stage, chunk)
    last = stage == job.parallel.pp - 1 and chunk == job.vp - 1
    return job.shape.mtp_layers if last else 0


def split_problem(layers: int, chunks: int, counted: bool) -> str:
    """Why the pipeline split fails, and the setting that makes it work when there is one."""
    if counted:
        hint = (" (without parallel.account_for_embedding_and_loss the split divides the "
                f"{layers} layers alone, which works)") if layers % chunks == 0 else ""
        return f"layers {layers} + 2 (embedding and loss) are not divisible by pp x vp = {chunks}{hint}"
    hint = (f"; parallel.account_for_embedding_and_loss: true counts the embedding and the loss as a "
            f"layer each ({layers} + 2 = {layers + 2}), as Meta's Llama 3 405B layout needs"
            if (layers + 2) % chunks == 0 else "")
    return f"layers {layers} are not divisible by pp x vp = {chunks}{hint}"
