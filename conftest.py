"""Settings for every test of the repository, the plugins' included (fixtures: tests/conftest.py)."""

from __future__ import annotations

import os

from hypothesis import settings

# Property tests: random exploration by default; fixed examples in CI (HYPOTHESIS_PROFILE=ci)
# so a red CI always reproduces.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
