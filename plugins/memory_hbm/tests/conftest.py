"""Fixtures of the memory_hbm tests."""

from __future__ import annotations

import pytest

from chakra_core.plugins import PluginHost


@pytest.fixture
def installed_plugins(chakra_installed) -> PluginHost:
    """A plugin host with hbm and analytical installed (and chakra-sim's testing network); skips
    the test when they are not."""
    chakra_installed("memory", "hbm")
    return chakra_installed("network", "analytical")
