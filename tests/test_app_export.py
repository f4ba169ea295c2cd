"""The Export page: the store's export formats, zipped for download."""

import csv
import io
import json
import zipfile

import pytest

from app_pages.queries import export_zip
from store import EXPORT_FORMATS, open_reader
from tests.app_fixture import AppStore, app_store, open_page
from tests.store_fixture import fill_verdict_kinds

__all__ = ["app_store"]


def test_page_offers_every_format_and_a_download(app_store: AppStore, monkeypatch):
    monkeypatch.setenv("KILN_DB", str(app_store.path))
    app = open_page("export.py")
    assert tuple(app.radio[0].options) == tuple(app.radio[0].format_func(f) for f in EXPORT_FORMATS)
    assert not app.get("download_button")
    app.radio[0].set_value("json").run()
    app.button[0].click().run()
    (download,) = app.get("download_button")
    assert download.proto.label.startswith("Download kiln-json-all.zip")


def test_kernelbench_zip_holds_each_sites_problem_and_best_kernel(tmp_path):
    path = fill_verdict_kinds(tmp_path / "kiln.db").path
    with open_reader(path) as reader:
        best = reader.best()
        expected = {f"{c.site_key}/model_new.py": reader.candidate(c.id).source for c in best} | {
            f"{c.site_key}/problem.py": reader.site(c.site_id).problem_source for c in best
        }
    assert best, "no accepted kernel: the zip went unchecked"
    archive = zipfile.ZipFile(io.BytesIO(export_zip(str(path), "kernelbench", None)))
    assert {name: archive.read(name).decode() for name in archive.namelist()} == expected


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_record_exports_hold_every_candidate(app_store: AppStore, fmt: str):
    archive = zipfile.ZipFile(io.BytesIO(export_zip(str(app_store.path), fmt, app_store.run)))
    if fmt == "json":
        records = json.loads(archive.read("kiln-export.json"))
        assert [c["id"] for c in records["candidates"]] == app_store.candidates
    else:
        rows = list(csv.DictReader(io.StringIO(archive.read("candidates.csv").decode())))
        assert [int(row["id"]) for row in rows] == app_store.candidates
        assert {"runs.csv", "sites.csv", "verdicts.csv"} <= set(archive.namelist())
