"""Exports write nothing outside the folder given, whatever site keys a hostile run stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_fixture import POINTWISE_PROBLEM, run_cli, triton_candidate, verdict

from core.runtime.errors import KilnInputError
from store import EXPORT_FORMATS, Store, export, open_reader

ESCAPE = "../../escape"
REFUSING = ("kernelbench", "package")  # the formats that name files after sites


def hostile_store(path: Path, key: str) -> Path:
    """A store whose one site, with an accepted kernel, is keyed `key`, as a hostile run could
    write it through the store's own writer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with Store.open(path) as store:
        run = store.start_run(model_spec="evil.py", model_hash="0", gpu="NVIDIA H200",
                              versions={}, config={})
        site = store.add_site(
            run, key=key, family="pointwise", signature="relu(x + y) * 0.5", ops=[], calls=1,
            share=0.5, time_ms=1.0, eager_ms=1.0, compile_ms=None, floor_ms=0.1,
            problem_source=POINTWISE_PROBLEM)
        kernel = store.add_candidate(site, parent_id=None, tier="triton", generator="llm",
                                     rationale="r", source=triton_candidate(256)).id
        store.add_verdict(kernel, verdict(accepted=True, latency_ms=0.5))
        store.finish_run(run)
    return path


def files_under(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_a_site_key_that_climbs_out_writes_nothing_outside(tmp_path, fmt):
    db = hostile_store(tmp_path / "db" / "kiln.db", ESCAPE)
    work = tmp_path / "work"
    out = work / "a" / "b" / "out"
    out.parent.mkdir(parents=True)
    before = files_under(work)
    result = run_cli("--db", str(db), "export", "--format", fmt, "--out", str(out),
                     "--min-speedup", "1.0")
    written = files_under(work) - before
    assert all(path == out or out in path.parents for path in written), sorted(written)
    assert not (work / "a" / "escape").exists() and not (work / "escape").exists()
    if fmt in REFUSING:
        assert result.returncode == 2, result.stderr
        assert "not plain file names" in result.stderr and repr(ESCAPE) in result.stderr
        assert len(result.stderr.strip().splitlines()) <= 2, result.stderr
        assert written == set(), "a refused export wrote something"
    else:
        assert result.returncode == 0, result.stderr
        assert written, "the export wrote nothing"


@pytest.mark.parametrize("key", ["{tmp}/absolute", "a/b", "a\\b", "x\x00y", "..", ".hidden",
                                 "C:evil", ""])
@pytest.mark.parametrize("fmt", REFUSING)
def test_keys_that_are_not_plain_names_are_refused(tmp_path, fmt, key):
    key = key.format(tmp=tmp_path)
    db = hostile_store(tmp_path / "db" / "kiln.db", key)
    with open_reader(db) as reader, pytest.raises(KilnInputError, match="not plain file names"):
        export(reader, fmt, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["db"], "a refused export wrote something"
