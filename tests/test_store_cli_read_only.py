"""The read commands of `python -m store` open the store read-only: they work in a read-only
folder and leave the store's folder as it was, file, modification time and all."""

from __future__ import annotations

import json
from pathlib import Path

from store_fixture import fill_store, read_only, run_cli, triton_candidate

from store import Store


def read_commands(filled, out: Path) -> dict[tuple[str, ...], str]:
    """Each read command, with a piece of what it must print."""
    return {
        ("runs",): "examples/block.py",
        ("candidates", "--site", "pointwise-1a2b3c4d"): "smaller blocks",
        ("search", "registers"): "whole row in [registers]",
        ("search", "--fts", "reason:compile*"): "[compile]_error",
        ("show", str(filled.faster)): "BLOCK_SIZE = 256",
        ("diff", str(filled.mismatch)): "-    tl.store(out_ptr + offsets",
        ("best",): "pointwise-1a2b3c4d",
        ("export", "--format", "json", "--out", str(out / "json")): "kiln-export.json",
        ("export", "--format", "kernelbench", "--out", str(out / "kb")): "model_new.py",
    }


def state(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {path.name: (path.stat().st_mtime_ns, path.read_bytes()) for path in folder.iterdir()}


def assert_reads_leave_folder_as_it_was(filled, folder: Path, out: Path) -> None:
    before = state(folder)
    for args, shown in read_commands(filled, out).items():
        result = run_cli("--db", str(filled.path), *args)
        assert result.returncode == 0, f"{args}: {result.stderr}"
        assert shown in result.stdout, f"{args}: {result.stdout}"
    assert state(folder) == before, "a read command changed the store's folder"


def test_read_commands_work_in_a_read_only_folder(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    filled = fill_store(folder / "kiln.db")
    with read_only(filled.path, folder):
        assert_reads_leave_folder_as_it_was(filled, folder, tmp_path / "out")
    exported = json.loads((tmp_path / "out" / "json" / "kiln-export.json").read_text())
    assert len(exported["candidates"]) == 5


def test_read_commands_create_no_journal_files_beside_an_idle_store(tmp_path):
    folder = tmp_path / "store"
    folder.mkdir()
    filled = fill_store(folder / "kiln.db")
    assert_reads_leave_folder_as_it_was(filled, folder, tmp_path / "out")
    assert sorted(path.name for path in folder.iterdir()) == ["kiln.db"]


def test_read_commands_see_what_a_running_writer_committed(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        new = store.add_candidate(
            filled.pointwise, parent_id=filled.pending, tier="triton", generator="rules",
            rationale="committed while the writer is open", source=triton_candidate(64),
        ).id  # fmt: skip
        shown = run_cli("--db", str(filled.path), "--json", "show", str(new))
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["rationale"] == "committed while the writer is open"
        still = store.add_candidate(
            filled.pointwise, parent_id=new, tier="triton", generator="rules",
            rationale="after a reader came and went", source=triton_candidate(32),
        ).id  # fmt: skip
    listed = run_cli("--db", str(filled.path), "--json", "candidates")
    assert [row["id"] for row in json.loads(listed.stdout)][-2:] == [new, still], listed.stderr
