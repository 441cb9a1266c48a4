"""Sections of a hardware profile that plugins own (docs/writing-a-plugin.md, "A profile section of
your own").

The core profile knows the GPU, the node and the scale-out network (chakra_core.hardware.profiles).
What one model needs beyond them (NCCL's topology search, a GPU's achievable rates, a fitted
calibration) is a section its plugin registers through `chakra_sim_register_profile_sections`:
a key path (`nccl`, or `gpu.achievable` inside a part of the core profile), a pydantic model of
its values, and optionally

- `check(section, profile)`: cross-checks against the core profile; raise ValueError with the
  reason (an achievable rate above the GPU's peak is a typo);
- `rates(raw)`: the rates in the section that hold only for the core values they were measured
  with, {key path inside the section: key paths of the profile it depends on}, read from the
  section as the file gives it (any shape: check before use). A profile that `extends` another
  and changes such a value without restating the rate records it (`Profile.inherited_rates`).

The loader validates each section a profile file gives when it reads the profile; a key that no
installed plugin registers is an error naming the sections that are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from chakra_core.hardware.profiles import Profile

CORE_KEYS = frozenset({"name", "description", "extends", "gpu", "node", "network", "inherited_rates"})
"""Top-level keys of a profile the core reads itself: no section may take one."""
CORE_PARTS = ("gpu", "node", "network")
"""Parts of the core profile a section may sit inside (`gpu.achievable`)."""

M = TypeVar("M", bound=BaseModel)

RateRules = Callable[[Mapping[str, Any]], Mapping[str, tuple[str, ...]]]
"""A section's raw values -> {key path inside it: key paths of the profile the rate there depends on}."""


class ProfileSectionModel(BaseModel):
    """Base for a section's schema: unknown keys are errors, and a loaded profile never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class ProfileSection(Generic[M]):
    """A section of a profile, as a plugin registered it."""

    key: str
    schema: type[M]
    check: Callable[[M, "Profile"], None] | None = None
    rates: RateRules | None = None
    owner: str = "<unknown>"


@dataclass(frozen=True)
class ProfileSections:
    """The sections one plugin host's plugins registered, as the profile loader takes them (hashable:
    loaded profiles are cached per set of sections)."""

    entries: tuple[ProfileSection[Any], ...] = ()

    def get(self, key: str) -> ProfileSection[Any] | None:
        return next((section for section in self.entries if section.key == key), None)

    def keys(self) -> tuple[str, ...]:
        return tuple(section.key for section in self.entries)

    def listing(self) -> str:
        """The registered sections and the plugin owning each, for an error message."""
        return ", ".join(f"{s.key} (plugin '{s.owner}')" for s in self.entries) or "none"
