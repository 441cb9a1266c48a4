"""TraceLibrary: one index per distinct file content, whatever the file names or sizes."""

from __future__ import annotations

import shutil

from chakra_core.feeder.library import TraceLibrary
from chakra_core.schema import pb
from chakra_core.testing import collective, comp, manifest, simulate, write_et, write_ranks
from tests.simhelpers import ring_network


def _chain(micros: list[int]) -> list[pb.Node]:
    return [comp(i, us, deps=[i - 1] if i else []) for i, us in enumerate(micros)]


def _drain(feeder) -> list[int]:
    order = []
    while feeder.has_nodes_to_issue():
        node_id = feeder.next_issuable_node()
        order.append(node_id)
        feeder.free_children(node_id)
    return order


def test_identical_files_share_one_index_and_keep_their_own_progress(tmp_path):
    first = write_et(tmp_path / "a.et", _chain([1, 2, 3]))
    second = tmp_path / "b.et"
    shutil.copy(first, second)
    library = TraceLibrary()
    a, b = library.open(first), library.open(second)
    assert library.distinct == 1
    assert a._trace is b._trace
    assert _drain(a) == [0, 1, 2]
    assert b.has_nodes_to_issue()          # b's progress is its own
    assert _drain(b) == [0, 1, 2]


def test_files_of_equal_size_but_different_bytes_get_their_own_index(tmp_path):
    # Same structure, one duration differs by a digit: same size, different bytes.
    paths = [write_et(tmp_path / f"t{i}.et", _chain([1, 2, 3 + i])) for i in range(3)]
    assert len({p.stat().st_size for p in paths}) == 1
    shutil.copy(paths[1], tmp_path / "copy.et")
    library = TraceLibrary()
    feeders = [library.open(p) for p in [*paths, tmp_path / "copy.et"]]
    assert library.distinct == 3
    assert feeders[3]._trace is feeders[1]._trace
    assert len({id(f._trace) for f in feeders[:3]}) == 3
    for feeder, micros in zip(feeders, ([1, 2, 3], [1, 2, 4], [1, 2, 5], [1, 2, 4])):
        assert [feeder.lookup_node(i).duration_micros for i in range(3)] == micros


def test_files_of_different_sizes_are_not_hashed(tmp_path, monkeypatch):
    import chakra_core.feeder.library as library_module

    monkeypatch.setattr(library_module, "file_digest", lambda path: (_ for _ in ()).throw(AssertionError(path)))
    library = TraceLibrary()
    library.open(write_et(tmp_path / "short.et", _chain([1])))
    library.open(write_et(tmp_path / "long.et", _chain([1, 2, 3])))
    assert library.distinct == 2


def test_identical_files_of_one_size_are_compared_without_hashing(tmp_path, monkeypatch):
    import chakra_core.feeder.library as library_module

    monkeypatch.setattr(library_module, "file_digest", lambda path: (_ for _ in ()).throw(AssertionError(path)))
    first = write_et(tmp_path / "r0.et", _chain([1, 2, 3]))
    for rank in range(1, 4):
        shutil.copy(first, tmp_path / f"r{rank}.et")
    library = TraceLibrary()
    feeders = [library.open(tmp_path / f"r{rank}.et") for rank in range(4)]
    assert library.distinct == 1
    assert len({id(f._trace) for f in feeders}) == 1


def test_same_bytes_compares_block_by_block(tmp_path):
    from chakra_core.feeder.library import same_bytes

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_bytes(b"x" * 10 + b"y")
    b.write_bytes(b"x" * 10 + b"y")
    c.write_bytes(b"x" * 10 + b"z")
    assert same_bytes(a, b, block=4)
    assert not same_bytes(a, c, block=4)


def test_the_same_path_twice_shares_without_hashing(tmp_path):
    path = write_et(tmp_path / "a.et", _chain([5, 6]))
    library = TraceLibrary()
    assert library.open(path)._trace is library.open(path)._trace
    assert library.distinct == 1


def test_shared_indexes_give_the_same_results_as_separate_ones(tmp_path):
    rank = [comp(0, 3), collective(1, pb.ALL_REDUCE, 1 << 20, deps=[0]), comp(2, 2, deps=[1])]
    prefix = write_ranks(tmp_path / "same", [rank] * 4)
    # The same program with a per-rank byte of difference: nothing can be shared.
    distinct = write_ranks(tmp_path / "distinct",
                           [[comp(0, 3, tag=f"r{r}"), collective(1, pb.ALL_REDUCE, 1 << 20, deps=[0]),
                             comp(2, 2, deps=[1])] for r in range(4)])
    shared = simulate(manifest(prefix, ring_network(4), fold="off"))
    separate = simulate(manifest(distinct, ring_network(4), fold="off"))
    assert [r["finish_ns"] for r in shared["ranks"]] == [r["finish_ns"] for r in separate["ranks"]]
    assert shared["finish_ns"] == separate["finish_ns"] > 0


def test_files_too_large_to_keep_are_compared_on_disk(tmp_path, monkeypatch):
    # Small files are compared from memory; larger ones block by block and by digest, as before.
    import chakra_core.feeder.library as library_module

    calls = {"same_bytes": 0, "file_digest": 0}
    for name in calls:
        real = getattr(library_module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(library_module, name, counted)
    paths = [write_et(tmp_path / f"t{i}.et", _chain([1] * 400 + [3 + i])) for i in range(2)]
    assert paths[0].stat().st_size == paths[1].stat().st_size > library_module._COMPARED_IN_MEMORY
    shutil.copy(paths[0], tmp_path / "copy.et")
    library = TraceLibrary()
    feeders = [library.open(p) for p in [paths[0], tmp_path / "copy.et", paths[1]]]
    assert library.distinct == 2
    assert feeders[0]._trace is feeders[1]._trace is not feeders[2]._trace
    assert calls["same_bytes"] == 2 and calls["file_digest"] == 2
