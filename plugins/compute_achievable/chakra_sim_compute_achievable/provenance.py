"""Where a profile's achievable rates come from, as a run must say it (docs/hardware.md, "What-if
without silent answers").

- A rate measured on another GPU is refused: a profile that `extends` another and changes the
  GPU's architecture, or the peak a rate is a fraction of, keeps its parent's kernel measurements
  for a chip they were not taken on (an H100's 794.5 TFLOP/s under a B200's 2,250 peak gives the
  H100's step). The run stops and names the profile, each such key, and what to give instead: this
  GPU's own measurement with its source, or a derivation written out (`derived:`).
- A rate a profile derives (`derived:` on the value) is listed in the run's results and terminal
  (`kernel_summary`, `kernel_tables`: the model's results), so that a prediction resting on another
  GPU's measurement says so.

A rate inherited although only the GPU's model, memory or bandwidth changed stays a warning (the
model's `inherited` warnings): the kernels' shape of work is the parent's, only the figure may be
stale.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from chakra_core import JsonObject, Profile, SimulationError, Sourced
from chakra_sim_compute_achievable.section import ARCHITECTURE, KEY, AchievableSpec

_PEAK = "gpu.peak_tflops."


def _founding(key: str) -> bool:
    """Whether a rate that depends on `key` cannot be carried over when it changes."""
    return key == ARCHITECTURE or key.startswith(_PEAK)


def refusal(profile: Profile) -> str | None:
    """Why the `achievable` model refuses this profile (its rates measured on another GPU), or None."""
    kept = [rate for rate in profile.inherited(KEY + ".") if any(_founding(c.key) for c in rate.changed)]
    if not kept:
        return None
    lines = []
    for rate in kept:
        changes = ", ".join(f"{c.key} {c.was!r} -> {c.now!r}" if isinstance(c.was, str)
                            else f"{c.key} {c.was:g} -> {c.now:g}" for c in rate.changed if _founding(c.key))
        lines.append(f"{rate.key} ({rate.stated_in}'s, although {changes}){_suggestion(rate)}")
    return (f"profile '{profile.name}' keeps {len(kept)} achievable rate(s) measured on another GPU: "
            + "; ".join(lines) + ". Give each in the profile's gpu.achievable with this GPU's own measurement "
            "and its source, or derive it explicitly (value, source, and `derived:` saying how); "
            "docs/hardware.md, 'What-if without silent answers'")


def _suggestion(rate: Any) -> str:
    """For a rate that follows its peak: the parent's fraction of its peak on this profile's."""
    peaks = [c for c in rate.changed if c.key.startswith(_PEAK) and not isinstance(c.was, str) and c.was]
    if len(peaks) != 1 or any(c.key == ARCHITECTURE for c in rate.changed):
        return ""
    scale = peaks[0].now / peaks[0].was
    if isinstance(rate.value, list):
        return f" [the parent's fraction of its peak: its points x {scale:.4g}]"
    return f" [the parent's fraction of its peak: {rate.value:g} x {scale:.4g} = {rate.value * scale:.1f}]"


def derived_rates(ach: AchievableSpec) -> dict[str, str]:
    """{key path: how it was derived} of the section's rates that are not this GPU's own figures."""
    return {f"{KEY}.{key}": how for key, how in _derived(ach) if how}


def _derived(ach: AchievableSpec) -> Iterator[tuple[str, str | None]]:
    for name in type(ach).model_fields:
        value = getattr(ach, name)
        if isinstance(value, Sourced):
            yield name, value.derived
        elif name == "matmul_tflops":
            yield from ((f"{name}.{dtype}", rate.derived) for dtype, rate in value.items())
        elif name == "attention":
            yield from ((f"{name}.{dtype}.{p}", curve.derived) for dtype, passes in value.items()
                        for p, curve in passes.items())


def kernel_summary(profile: str, kinds: Sequence[str], stats: Sequence[Sequence[Any]], peak: float,
                   derived: dict[str, str]) -> JsonObject:
    """The run's results of the model: per kind of kernel its count, time, FLOPs and rate (checked
    against the peak), and the derived rates the profile gave it."""
    found: JsonObject = {}
    for name, (count, ns, flops) in zip(kinds, stats):
        if not count:
            continue
        achieved = flops / (ns * 1e-9) / 1e12 if ns else 0.0
        if name != "measured" and name != "replayed" and achieved > peak / 1e12 * (1 + 1e-9):
            raise SimulationError(f"internal error in compute plugin 'achievable': {name} kernels "
                                  f"achieved {achieved:.1f} TFLOP/s, above the peak {peak / 1e12:g}")
        found[name] = {"count": count, "time_ns": ns, "flops": flops, "achieved_tflops": round(achieved, 3)}
    summary: JsonObject = {"profile": profile, "kinds": found, "achieved_within_peak": True}
    if derived:   # rates resting on another GPU's measurement, and how
        summary["derived_rates"] = dict(derived)
    return summary


def kernel_tables(kinds: Sequence[str], stats: Sequence[Sequence[Any]],
                  derived: dict[str, str]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The terminal's tables: kernels by kind (a folded run's representatives count for their class
    mates: every rank's kernels), and the derived rates."""
    rows = [[name, f"{count:,}", f"{ns / 1e6:,.3f}", f"{flops / ns / 1e3:,.1f}" if ns else "-"]
            for name, (count, ns, flops) in zip(kinds, stats) if count]
    tables = [("kernels by kind, every rank's summed", ["kind", "count", "time ms", "TFLOP/s"], rows)] if rows else []
    if derived:
        tables.append(("achievable rates derived, not measured on this GPU", ["rate", "how"],
                       [[key, how] for key, how in derived.items()]))
    return tables
