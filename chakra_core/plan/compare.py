"""`plan --vary`'s comparison: each value's best layout against the first value's.

An architect varies the GPU (a profile), the cluster size or the network to ask how much faster,
and how much cheaper in GPU-hours, a job trains. For each value: its best simulated layout, the
step, tokens per second per GPU and GPU-hours per million tokens, each against the first value's
as a ratio, and what the model's error on published runs like each one (`ErrorBand`,
docs/training-accuracy.md) means for that ratio:

- `bias`: if each value's class of runs keeps its mean signed error, the predicted ratio is off
  by (1 + signed error of this value) / (1 + signed error of the first) - 1 (negative: the
  model favours this value more than the published runs do). Zero when both come from one class.
- `across_domains`: the best layout's communicator roles (tp, cp, ep, dp, pp, ...) whose groups
  span NVLink domains (nodes, or a rack's domain) and so use the network.
- `tie`: the steps differ by less than the larger of the two classes' geomean errors, the rule
  `plan` ranks layouts by: the model cannot tell the two apart.

Per million tokens, beside the GPU-hours: the GPUs' energy at their maximum power (the profile's
`gpu.power_w`, the envelope the clocks are held to: an upper bound on what the GPUs draw, and the
GPUs only, not hosts, network or cooling) and, when the user gives a price per GPU-hour (a
contract's, a region's, a year's: no profile can know it), the cost. Both are GPU-hours times a
constant, so their ratios carry the same error band as the step's.
"""

from __future__ import annotations

import json
from typing import Mapping

from chakra_core.jobs.bands import ErrorBand
from chakra_core.json_types import JsonObject
from chakra_core.jobs.step import TrainingStep
from chakra_core.plan.search import GIB, SIMULATED, Candidate, Plan
from chakra_core.sweep.table import table_csv

SECONDS_PER_HOUR = 3600.0
COLUMNS = ["value", "profile", "gpus", "best_layout", "across_domains", "step_s", "step_vs_first", "tokens_per_s_per_gpu",
           "gpu_hours_per_million_tokens", "gpu_hours_vs_first", "gpu_power_w", "kwh_per_million_tokens",
           "energy_vs_first", "usd_per_gpu_hour", "usd_per_million_tokens", "cost_vs_first", "tflops_per_gpu", "mfu",
           "memory_gib", "error_band_scope", "error_band_geomean", "error_band_signed", "bias_vs_first",
           "tie_with_first"]
TEXT = {"value", "profile", "best_layout", "across_domains", "error_band_scope"}
KINDS = {c: "str" if c in TEXT else "int" if c == "gpus" else "bool" if c == "tie_with_first" else "float"
         for c in COLUMNS}


def best_simulated(found: Plan) -> tuple[Candidate, TrainingStep] | None:
    """The fastest simulated layout and its step; None when none was simulated or its step took
    no time (nothing per token to say)."""
    best = next((c for c in found.ranked() if c.status == SIMULATED and c.training is not None), None)
    if best is None or best.training is None or best.training.tokens_per_s_per_gpu <= 0:
        return None
    return best, best.training


def per_million_tokens(step: TrainingStep, power_w: float | None, usd_per_gpu_hour: float | None = None) -> JsonObject:
    """A step's GPU-hours, energy at the GPUs' maximum power `power_w` (kWh; None without it) and
    cost (USD; None without a price) per million tokens."""
    gpu_hours = 1e6 / (step.tokens_per_s_per_gpu * SECONDS_PER_HOUR)
    return {"gpu_hours_per_million_tokens": gpu_hours, "gpu_power_w": power_w,
            "kwh_per_million_tokens": None if power_w is None else gpu_hours * power_w / 1000,
            "usd_per_gpu_hour": usd_per_gpu_hour,
            "usd_per_million_tokens": None if usd_per_gpu_hour is None else gpu_hours * usd_per_gpu_hour}


def comparison_rows(summary: list[tuple[str | None, Plan]],
                    prices: Mapping[str, float] | None = None) -> list[JsonObject]:
    """One row per --vary value (COLUMNS), the first value's best as the reference; a value with
    no simulated layout (or a step of no time) has its value and profile only. `prices`: --price's
    USD per GPU-hour (`price_for`)."""
    rows: list[JsonObject] = []
    first: tuple[float, JsonObject, ErrorBand | None] | None = None
    for label, found in summary:
        row: JsonObject = {"value": label, "profile": found.profile}
        found_best = best_simulated(found)
        if found_best is None:
            rows.append(row)
            continue
        best, step = found_best
        costs = per_million_tokens(step, found.power_w, price_for(prices or {}, label))
        band = step.error_band
        reference = first is None
        if first is None:
            first = (step.step_time_s, costs, band)
        first_step, first_costs, first_band = first
        row.update({"gpus": step.gpus, "best_layout": best.layout.label(), "across_domains": step.across_domains,
                    "step_s": step.step_time_s,
                    "step_vs_first": step.step_time_s / first_step, "tokens_per_s_per_gpu": step.tokens_per_s_per_gpu,
                    **costs, "gpu_hours_vs_first": _ratio(costs, first_costs, "gpu_hours_per_million_tokens"),
                    "energy_vs_first": _ratio(costs, first_costs, "kwh_per_million_tokens"),
                    "cost_vs_first": _ratio(costs, first_costs, "usd_per_million_tokens"),
                    "tflops_per_gpu": step.tflops_per_gpu, "mfu": step.mfu, "memory_gib": best.memory.total / GIB,
                    "error_band_scope": None if band is None else band.scope,
                    "error_band_geomean": None if band is None else band.geomean_error,
                    "error_band_signed": None if band is None else band.mean_signed_error,
                    **({"bias_vs_first": None, "tie_with_first": None} if reference
                       else _versus(step.step_time_s / first_step, band, first_band))})
        rows.append(row)
    return rows


def _ratio(row: JsonObject, first: JsonObject, key: str) -> float | None:
    this, reference = row.get(key), first.get(key)
    return this / reference if isinstance(this, float) and isinstance(reference, float) and reference > 0 else None


def price_for(prices: Mapping[str, float], label: str | None) -> float | None:
    """--price's USD per GPU-hour for a --vary value: given for the whole label
    (`job.cluster.profile=h100-hgx-ndr400`), for its value alone (`h100-hgx-ndr400`), or for
    every value (key "")."""
    if label is not None:
        for key in (label, label.partition("=")[2]):
            if key in prices:
                return prices[key]
    return prices.get("")


def _versus(ratio: float, band: ErrorBand | None, first: ErrorBand | None) -> JsonObject:
    if band is None or first is None:
        return {"bias_vs_first": None, "tie_with_first": None}
    bias = 0.0 if band.scope == first.scope else (1 + band.mean_signed_error) / (1 + first.mean_signed_error) - 1
    return {"bias_vs_first": bias, "tie_with_first": abs(ratio - 1) < max(band.geomean_error, first.geomean_error)}


def comparison_files(rows: list[JsonObject]) -> dict[str, str | bytes]:
    """comparison.csv and comparison.json, written beside the values' folders."""
    return {"comparison.csv": table_csv(COLUMNS, rows, KINDS),
            "comparison.json": json.dumps({"reference": next((row["value"] for row in rows if "step_s" in row), None),
                                           "rows": rows},
                                          indent=1, allow_nan=False) + "\n"}


def describe_versus(row: JsonObject, first: JsonObject) -> str | None:
    """A sentence on how a value's best compares with the first value's (None for the first or
    a value without a simulated layout)."""
    ratio, hours = row.get("step_vs_first"), row.get("gpu_hours_vs_first")
    if row is first or not isinstance(ratio, float) or not isinstance(hours, float):
        return None
    text = (f"{row['value']}: the best step is {ratio:.2f}x {first['value']}'s ({_faster(ratio)}), "
            f"{hours:.2f}x the GPU-hours per token")
    energy, cost = row.get("energy_vs_first"), row.get("cost_vs_first")
    if isinstance(energy, float):
        text += (f", {energy:.2f}x the energy per token at the GPUs' maximum power ({row['gpu_power_w']:,.0f} W "
                 f"against {first['gpu_power_w']:,.0f} W)")
    if isinstance(cost, float):
        text += (f", {cost:.2f}x the cost per token (${row['usd_per_gpu_hour']:,.2f} against "
                 f"${first['usd_per_gpu_hour']:,.2f} per GPU-hour)")
    bias, tie = row.get("bias_vs_first"), row.get("tie_with_first")
    if isinstance(bias, float) and bias:
        text += (f"; the model's mean signed errors on published runs ({_percent(row['error_band_signed'])} "
                 f"{row['error_band_scope']}, {_percent(first['error_band_signed'])} {first['error_band_scope']}) "
                 f"would put the true ratio {_percent(-bias / (1 + bias))} from this one")
    if tie:
        text += "; within the error band: the model cannot rank the two"
    return text


def _faster(ratio: float) -> str:
    return f"{1 / ratio:.2f}x as fast" if ratio <= 1 else f"{ratio:.2f}x as slow"


def _percent(value: object) -> str:
    return f"{100 * value:+.1f}%" if isinstance(value, float) else "?"
