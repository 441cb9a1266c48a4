"""One `run` per output folder: a second writer fails at once, a job's traces are never replaced
under a running run, a failed run leaves no empty folder, and Ctrl-C says what was written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.output_lock import LOCK_NAME, OutputLock
from chakra_core.schema import pb
from chakra_core.testing import collective, manifest, write_ranks
from tests.test_plan import manifest as job_manifest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "allreduce_8npu.yaml"


def _job(tmp_path: Path, out: Path, **training) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**job_manifest(gpus=8, **training), "output": {"dir": str(out)}}))
    return path


def test_a_run_into_a_folder_another_run_holds_fails_at_once_and_changes_nothing(tmp_path):
    out = tmp_path / "out"
    assert CliRunner().invoke(main, ["run", str(EXAMPLE), "--out", str(out), "-q"]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with OutputLock(out):
        result = CliRunner().invoke(main, ["run", str(EXAMPLE), "--out", str(out), "-q"])
    assert result.exit_code == 2
    assert f"output folder {out} is in use by another run" in result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (out / LOCK_NAME).exists()


def test_a_job_does_not_replace_the_traces_of_a_run_that_holds_the_folder(tmp_path):
    out = tmp_path / "out"
    assert CliRunner().invoke(main, ["run", str(_job(tmp_path, out)), "-q"]).exit_code == 0
    traces = {p: p.read_bytes() for p in (out / "traces").iterdir()}
    with OutputLock(out):   # a run holding the folder: a changed job must not write its traces there
        result = CliRunner().invoke(main, ["run", str(_job(tmp_path, out, micro_batch=2)), "-q"])
    assert result.exit_code == 2 and "is in use by another run" in result.output
    assert {p: p.read_bytes() for p in (out / "traces").iterdir()} == traces


def test_a_run_that_fails_while_simulating_leaves_no_folder_it_created(tmp_path):
    prefix = write_ranks(tmp_path / "trace", [[collective(1, pb.ALL_REDUCE, 1 << 20)], []])   # rank 1 never joins
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(manifest(prefix, {"plugin": "analytical", "topology": ["Ring"], "npus_count": [2],
                                                    "bandwidth": [50], "latency": [500]})))
    out = tmp_path / "new" / "out"
    result = CliRunner().invoke(main, ["run", str(bad), "--out", str(out), "-q"])
    assert result.exit_code == 2 and "deadlock" in result.output.lower(), result.output
    assert not out.exists() and (tmp_path / "new").is_dir()   # only what it created, and only if empty


def test_ctrl_c_after_a_job_wrote_its_traces_says_so(tmp_path, monkeypatch):
    out = tmp_path / "out"

    def interrupted(prepared, quiet):
        raise KeyboardInterrupt
    monkeypatch.setattr("chakra_core.cli.simulate._simulate", interrupted)
    result = CliRunner().invoke(main, ["run", str(_job(tmp_path, out))])
    assert result.exit_code == 130
    assert result.stderr == (f"interrupted: no results written; earlier results in {out} are unchanged; the "
                             f"job's traces in {out / 'traces'} were written\n")
    assert not (out / "results.json").exists() and not (out / LOCK_NAME).exists()


def test_a_job_refused_after_writing_its_traces_lets_its_folder_go(tmp_path):
    from chakra_core import run
    from chakra_core.errors import ManifestError
    out = tmp_path / "out"
    bad = {**job_manifest(gpus=8), "compute": {"plugin": "achievable", "no_such_setting": 1}}
    with pytest.raises(ManifestError, match="no_such_setting") as refused:   # keeps the traceback alive
        run.load(bad, base_dir=tmp_path, out_dir=out)
    assert (out / "traces").is_dir() and not (out / LOCK_NAME).exists(), refused.value
    run.load(job_manifest(gpus=8), base_dir=tmp_path, out_dir=out)   # the same folder, at once
