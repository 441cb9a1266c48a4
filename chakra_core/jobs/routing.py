"""Load imbalance among a mixture of experts' experts: how many tokens each expert gets (issue 34).

`training.routing` says how a MoE layer's router spreads the tokens over the experts:

- `balanced` (the default): as published benchmarks force it (`--moe-router-force-load-balancing`);
  nothing is echoed and the traces are those written before this setting existed.
- `{zipf: s}`: expert e (0-based, Megatron's expert index) gets a share proportional to
  (e + 1)^-s, its expected share, not a sample, so a run is bit-identical to the next. s = 0 is
  balanced; a larger s is more skewed. Experts sit on EP ranks in index order (moe_layer.py at
  NVIDIA/Megatron-LM d98e8a64: EP rank r holds experts r x E/ep ... (r+1) x E/ep - 1), so the
  hottest experts share EP rank 0, the worst placement of that distribution; a histogram gives
  any other. Top-k routing sends a token to k different experts, so no expert can take more than
  1/k of the routed tokens: shares above that are capped and the excess spread over the others in
  proportion (the largest set of capped experts that keeps the rest below the cap).
- `{histogram: FILE or [v0, v1, ...]}`: tokens (or shares) per expert, e.g. counted in a real run;
  normalised to shares. A file (relative to the manifest's folder) holds a JSON or YAML list, or
  text / CSV: one row of values, or one row per expert whose last cell is its value (a header row
  is skipped). The values are echoed with `source: FILE`, so a changed file regenerates the traces.
  Equal values are balanced routing.

Every rank routes its t x topk token copies with the same shares (rank-independent expected
counts), rounded to whole tokens by cumulative rounding: expert e gets round(T x C_e) - round(T x
C_e-1), C the cumulative share, T = t x topk. The counts sum to T exactly, and a rank's experts'
total only grows with their cumulative share, so more skew never gives the hottest rank fewer
tokens. A capacity factor caps each expert's tokens from each rank (moe_utils.get_capacity), and
the rest are dropped.

**Which rank sets the pace.** The hottest EP rank is the one whose experts receive the most
tokens: ep x (its experts' tokens from one rank), times etp after the expert-TP all-gather
(token_dispatcher.py preprocess: output_splits, num_global_tokens_per_local_expert). Its experts
compute longest, and the combine all-to-all waits for every EP peer, so every EP rank leaves the
layer at its pace. The generator gives every rank the hottest rank's expert sizes, and the ranks
of a pipeline stage stay alike, so runs still fold. It writes:
- each local expert's tokens as the hottest rank's (grouped GEMMs with their own M per expert:
  `gemm_m_list`, or `gemm_k_list` for weight gradients), and the chunk sorts, activation and saved
  tensors at the hottest rank's token count;
- the all-to-alls at the hottest rank's buffer, ep x its tokens from each peer. Megatron sends
  uneven splits (all_to_all_single with input/output_splits), which a trace can carry as
  comm_send_splits / comm_recv_splits (converted traces do: docs/collectives.md), each rank its
  own, so that no two ranks of an EP group would fold together; here every rank writes the even
  split of the hottest rank's buffer instead, so each peer's piece is what the hottest rank
  receives from each peer in the dispatch and sends back in the combine. That is the most any
  rank sends or receives: a rank sends its tokens for the other ranks' experts, T x (1 - its own
  share), and the hottest rank's receive, (ep - 1) x T x its share, is at least that, since each
  of the other ep - 1 shares is at most the hottest's; the nccl layer, which ends an uneven
  all-to-all with its slowest member, gives both the same time. The expert-TP all-gather and
  reduce-scatter carry the same tokens.
What this approximates: a cooler rank's experts finish earlier and its rank waits in the combine
instead, so its step ends at the same time but its split shows expert compute where it waited,
and its own all-to-all sizes, activation memory and kernel counts are written as the hottest
rank's (what the results report is the hottest rank's). The permutation, router and unpermute
kernels keep each rank's own tokens.

**Monotone.** With dropless routing (no capacity factor), a larger Zipf exponent never gives the
hottest rank fewer tokens, and with one expert per EP rank (E = ep, e.g. Mixtral 8x7B on EP 8) its
one GEMM only grows, so more skew never makes a step faster (tests/test_moe_routing.py). With
several experts per rank, a more skewed split of the same tokens can need fewer GEMM tiles (two
experts of 129 tokens take four 128-row tiles, 256 and 2 take three): a GPU's tile quantization,
so there the guarantee is for a rank whose every expert gets at least as many tokens. A capacity
factor drops more tokens the more skewed the routing is, which can make a step faster.

Not modelled: per-layer or per-micro-batch histograms (one distribution for every MoE layer),
randomness of the routing (expected counts), other placements of a distribution's hottest experts
than Megatron's index order, and the time a cooler rank waits, shown as the hottest rank's compute.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationInfo, model_serializer, \
    model_validator

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

BALANCED: Literal["balanced"] = "balanced"

MAP_BYTES = 1
"""A routing-map element (torch.bool): the dispatchers keep the map for the backward."""


class Routing(BaseModel):
    """`training.routing` when not balanced: a distribution with its parameter, or a histogram."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    zipf: float | None = Field(None, ge=0, le=100, description="Zipf exponent s: expert e's expected share is "
                                                               "proportional to (e + 1)^-s (0: balanced)")
    histogram: tuple[float, ...] | None = Field(
        None, description="tokens (or shares) per expert, in expert order: a list, or a file (JSON or YAML list, "
                          "text or CSV; relative to the manifest's folder)")
    source: str | None = Field(None, description="the histogram's file (set when it was read from one)")

    @model_validator(mode="before")
    @classmethod
    def _read_file(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and isinstance(data.get("histogram"), str):
            base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
            data = {**data, "source": data["histogram"], "histogram": read_histogram(data["histogram"], base)}
        return data

    @model_validator(mode="after")
    def _one(self) -> "Routing":
        if (self.zipf is None) == (self.histogram is None):
            raise ValueError("give one of zipf (an exponent) or histogram (a file or a list of tokens per expert), "
                             "or routing: balanced")
        if self.source is not None and self.histogram is None:
            raise ValueError("source names a histogram's file: give histogram too")
        if self.histogram is not None:
            where = f"histogram {self.source}" if self.source else "histogram"
            bad = [i for i, v in enumerate(self.histogram) if not math.isfinite(v) or v < 0]
            if bad:
                raise ValueError(f"{where}: expert {bad[0]}'s value {self.histogram[bad[0]]} is not a "
                                 "non-negative number")
            if not any(self.histogram):
                raise ValueError(f"{where}: every expert's value is 0; no token is routed")
        return self

    @model_serializer(mode="wrap")
    def _echo(self, handler: SerializerFunctionWrapHandler) -> object:
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    def describe(self) -> str:
        if self.zipf is not None:
            return f"zipf s={self.zipf:g}"
        return f"histogram from {self.source}" if self.source else "histogram"


def histogram_anchored(job: Mapping[str, Any], base_dir: Path) -> Mapping[str, Any]:
    """`job` (a manifest's `job:` mapping) with a routing histogram's relative file made absolute
    against `base_dir`, the manifest's folder: for code that validates the job again without that
    context (plan's layouts and their runs, from wherever plan was started)."""
    training = job.get("training")
    routing = training.get("routing") if isinstance(training, Mapping) else None
    if not isinstance(routing, Mapping) or not isinstance(routing.get("histogram"), str):
        return job
    assert isinstance(training, Mapping)
    file = Path(routing["histogram"])
    if file.is_absolute():
        return job
    return {**job, "training": {**training, "routing": {**routing, "histogram": str(base_dir / file)}}}


def read_histogram(path: str, base_dir: Path | str | None) -> list[float]:
    """The values of a histogram file (see the module docstring); ValueError naming the file."""
    file = Path(path)
    file = file if file.is_absolute() or base_dir is None else Path(base_dir) / file
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"histogram {path}: cannot read {file}: {exc.strerror or exc}") from None
    try:
        if file.suffix.lower() in (".json", ".yaml", ".yml"):
            data = json.loads(text) if file.suffix.lower() == ".json" else yaml.safe_load(text)
            if not isinstance(data, list):
                raise ValueError(f"a list of numbers (one per expert), not {type(data).__name__}")
            return [_number(v, i) for i, v in enumerate(data)]
        rows = [[c.strip() for c in row if c.strip()] for row in csv.reader(io.StringIO(text))]
        rows = [row for row in rows if row and not row[0].startswith("#")]
        if rows and not _numeric(rows[0][-1]):
            rows = rows[1:]   # a header
        cells = rows[0] if len(rows) == 1 else [row[-1] for row in rows]
        return [_number(cell, i) for i, cell in enumerate(cells)]
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"histogram {path}: {exc}") from None


def _numeric(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _number(value: object, index: int) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or \
            (isinstance(value, str) and not _numeric(value)):
        raise ValueError(f"expert {index}'s value {value!r} is not a number")
    return float(value)


# Shares and tokens ----------------------------------------------------------------------------------
def shares(routing: Routing, experts: int, topk: int) -> tuple[float, ...]:
    """Each expert's share of the routed token copies (summing to 1; none above 1/topk for Zipf)."""
    if routing.histogram is not None:
        total = sum(routing.histogram)
        return tuple(v / total for v in routing.histogram)
    weights = [(e + 1) ** -(routing.zipf or 0.0) for e in range(experts)]
    out, free, left, cap = [0.0] * experts, list(range(experts)), 1.0, 1.0 / topk
    while True:   # water-filling: the experts over the cap take it, the rest share what is left
        scale = left / sum(weights[e] for e in free)
        over = [e for e in free if weights[e] * scale > cap]
        if not over:
            for e in free:
                out[e] = weights[e] * scale
            return tuple(out)
        for e in over:
            out[e] = cap
            left -= cap
        free = [e for e in free if e not in over]


def routing_problems(job: "JobSpec") -> list[str]:
    """The routing's rules against the model, each naming its keys."""
    routing, m = job.training.routing, job.shape
    if not isinstance(routing, Routing):
        return []
    if not m.moe:
        return ["training.routing needs a mixture of experts (model.num_experts)"]
    experts, topk = m.num_experts or 1, m.router_topk
    if routing.histogram is None:
        return []
    where = f"training.routing.histogram {routing.source}" if routing.source else "training.routing.histogram"
    if len(routing.histogram) != experts:
        return [f"{where} gives {len(routing.histogram)} values, one per expert, but model.num_experts is {experts}"]
    share = shares(routing, experts, topk)
    top = max(range(experts), key=lambda e: share[e])
    if share[top] > 1 / topk * (1 + 1e-9):
        return [f"{where}: expert {top} gets {share[top]:.1%} of the routed tokens, but with topk {topk} an expert "
                f"receives each token at most once (at most {1 / topk:.1%})"]
    return []


@dataclass(frozen=True)
class ExpertLoad:
    """One MoE layer's routing, the same on every rank (see the module docstring)."""

    sent: tuple[int, ...]
    """Token copies one rank sends to each expert (after the capacity)."""
    hottest: int
    """The EP rank whose experts receive the most."""
    tokens: tuple[int, ...]
    """Tokens each of the hottest rank's local experts computes (from every EP rank, all-gathered over etp)."""
    arrived: int
    """Token copies the hottest rank receives over EP (ep x what each rank sends it): its all-to-all buffer."""
    routed: int
    """Token copies one rank routes before the capacity (t x topk)."""

    @property
    def kept(self) -> int:
        """Token copies one rank sends (fewer than `routed` when the capacity drops some)."""
        return sum(self.sent)


def expert_load(job: "JobSpec", tokens: int) -> ExpertLoad | None:
    """The routing of a rank's `tokens` (its sequence-parallel share); None when balanced."""
    routing, m, p = job.training.routing, job.shape, job.parallel
    if not isinstance(routing, Routing) or not m.moe:
        return None
    return _load(routing, m.num_experts or 1, m.router_topk, m.capacity_factor, p.ep, p.expert_tp, tokens)


@lru_cache(maxsize=64)
def _load(routing: Routing, experts: int, topk: int, capacity_factor: float | None, ep: int, etp: int,
          tokens: int) -> ExpertLoad | None:
    share = shares(routing, experts, topk)
    if len(set(share)) == 1:   # equal shares are balanced routing, written as balanced routing is
        return None
    routed = tokens * topk
    counts = _apportion(share, routed, tokens)
    if capacity_factor is not None:
        capacity = int(-(-routed * capacity_factor // experts))   # moe_utils.get_capacity: ceil
        counts = [min(c, capacity) for c in counts]
    local = experts // ep
    per_rank = [sum(counts[r * local:(r + 1) * local]) for r in range(ep)]
    hottest = max(range(ep), key=lambda r: (per_rank[r], -r))
    here = counts[hottest * local:(hottest + 1) * local]
    return ExpertLoad(tuple(counts), hottest, tuple(ep * etp * c for c in here), ep * per_rank[hottest], routed)


def _apportion(share: Sequence[float], total: int, most: int) -> list[int]:
    """Whole tokens per expert summing to `total`, by cumulative rounding (module docstring), none
    above `most` (a token reaches an expert once; rounding could pass it by one)."""
    counts, cumulative, before = [], 0.0, 0
    for e, s in enumerate(share):
        cumulative += s
        upto = total if e == len(share) - 1 else min(total, math.floor(total * cumulative + 0.5))
        counts.append(upto - before)
        before = upto
    for e in range(len(counts)):   # a rounding excess goes to the next expert with room
        while counts[e] > most:
            counts[e] -= 1
            counts[next(i for i in [*range(e + 1, len(counts)), *range(e)] if counts[i] < most)] += 1
    return counts
