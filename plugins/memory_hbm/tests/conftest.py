"""Fixtures of the memory_hbm tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def installed_plugins():
    """A plugin host with hbm and analytical installed; skips the test when they are not."""
    from chakra_core.contract.host import make_plugin_host

    try:
        host = make_plugin_host()
        host.get("memory", "hbm")
        host.get("network", "analytical")
    except Exception as exc:  # a plugin not installed
        pytest.skip(str(exc))
    return host
