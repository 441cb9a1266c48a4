"""benchmarks/training_accuracy.py's cache key: a cached run holds while the data files any run reads
and its own profile chain are unchanged, so editing another GPU's profile keeps it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def accuracy(tmp_path, monkeypatch):
    """The benchmark module over a small tree: one preset and three profiles, b extending a."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("training_accuracy_under_test",
                                                  ROOT / "benchmarks" / "training_accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    profiles = tmp_path / "chakra_core" / "hardware" / "profiles"
    profiles.mkdir(parents=True)
    (tmp_path / "chakra_core" / "presets.json").write_text("{}")
    bands = tmp_path / module.BANDS_FILE   # the error bands the script writes
    bands.parent.mkdir(parents=True)
    bands.write_text("{}")
    (tmp_path / "chakra_core" / "jobs" / "presets" / "models.yaml").write_text("{}")   # beside them, keyed
    (tmp_path / "plugins").mkdir()
    (profiles / "a.yaml").write_text("name: a\n")
    (profiles / "b.yaml").write_text("extends: a\n")
    (profiles / "c.yaml").write_text("name: c\n")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "PROFILE_DIR", profiles)
    yield module, tmp_path
    sys.modules.pop("training_accuracy_under_test", None)


def _key(module, profile: str) -> str:
    module._shared_data_digest.cache_clear()
    module._profile_digest.cache_clear()
    return module._cache_key("run", {"cluster": {"profile": profile}}, None)


def test_a_profile_edit_rekeys_only_the_runs_on_its_chain(accuracy):
    module, root = accuracy
    before = {name: _key(module, name) for name in "abc"}
    (root / "chakra_core" / "hardware" / "profiles" / "a.yaml").write_text("name: a\nchanged: 1\n")
    after = {name: _key(module, name) for name in "abc"}
    assert after["a"] != before["a"] and after["b"] != before["b"]   # b extends a
    assert after["c"] == before["c"]
    (root / "chakra_core" / "hardware" / "profiles" / "d.yaml").write_text("name: d\n")   # a new profile
    assert {name: _key(module, name) for name in "abc"} == after


def test_a_shared_data_file_rekeys_every_run(accuracy):
    module, root = accuracy
    before = {name: _key(module, name) for name in "abc"}
    (root / "chakra_core" / "presets.json").write_text('{"changed": 1}')
    after = {name: _key(module, name) for name in "abc"}
    assert all(after[name] != before[name] for name in "abc")


def test_the_error_bands_the_script_writes_rekey_nothing(accuracy):
    module, root = accuracy
    before = {name: _key(module, name) for name in "abc"}
    (root / module.BANDS_FILE).write_text('{"runs": []}')
    assert {name: _key(module, name) for name in "abc"} == before
    (root / "chakra_core" / "jobs" / "presets" / "models.yaml").write_text('{"changed": 1}')
    assert all(_key(module, name) != before[name] for name in "abc")
