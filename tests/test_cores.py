"""usable_cores: the cores this process may run on, which every default worker count starts from."""

from __future__ import annotations

import os

import pytest

from chakra_core import cores
from chakra_core.jobs import rank_writer


def test_a_process_confined_to_some_cores_counts_those(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5, 9}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert cores.usable_cores() == 3


def test_without_an_affinity_the_machines_count(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 12)
    assert cores.usable_cores() == 12
    monkeypatch.setattr(os, "cpu_count", lambda: None)   # undeterminable
    assert cores.usable_cores() == 1


@pytest.mark.parametrize("usable, workers", [(1, 1), (3, 3), (64, rank_writer.DEFAULT_MOST_WORKERS)])
def test_trace_writers_default_to_the_usable_cores_up_to_their_cap(monkeypatch, usable, workers):
    monkeypatch.setattr(rank_writer, "usable_cores", lambda: usable)
    assert rank_writer.default_workers() == workers
