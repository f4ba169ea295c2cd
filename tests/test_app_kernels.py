"""The Kernels page: full-text search with filters by tier, generator, verdict, family, GPU, run."""

import pytest

from store import open_reader
from tests.app_fixture import AppStore, app_store, open_page

__all__ = ["app_store"]


@pytest.fixture
def store_env(app_store: AppStore, monkeypatch: pytest.MonkeyPatch) -> AppStore:
    monkeypatch.setenv("KILN_DB", str(app_store.path))
    return app_store


def found_ids(app) -> list[int]:
    if not app.dataframe:
        return []
    return [int(url.split("=")[1]) for url in app.dataframe[0].value["kernel"]]


def test_search_finds_the_kernel_by_its_rationale(store_env):
    with open_reader(store_env.path) as reader:
        target = next(c for c in reader.candidates() if "wider column blocks" in c.rationale)
        ranked = [c.id for c in reader.search("wider column blocks")]
    app = open_page("kernels.py", q="wider column blocks")
    assert found_ids(app) == ranked
    assert ranked[0] == target.id
    row = app.dataframe[0].value.iloc[0]
    assert row["rationale"] == target.rationale
    assert "[wider] [column] [blocks]" in row["snippet"]


def test_search_by_the_text_of_a_source(store_env):
    with open_reader(store_env.path) as reader:
        expected = {c.id for c in reader.search("tl.dot", limit=100)}
        sources = {c.id: reader.candidate(c.id).source for c in reader.candidates()}
    app = open_page("kernels.py")
    app.text_input[0].set_value("tl.dot").run()
    assert set(found_ids(app)) == expected
    assert expected == {ident for ident, source in sources.items() if "tl.dot" in source}


def test_filters_narrow_the_list(store_env):
    with open_reader(store_env.path) as reader:
        candidates = reader.candidates()
    app = open_page("kernels.py")
    assert found_ids(app) == sorted((c.id for c in candidates), reverse=True)
    tier, generator, verdict, family, gpu, run = app.multiselect
    tier.set_value(["cuda"]).run()
    cuda = [c.id for c in candidates if c.tier == "cuda"]
    assert cuda and sorted(found_ids(app)) == cuda
    tier.set_value([]).run()
    # On the CPU the interpreter is slower than PyTorch: its correct kernels are not accepted.
    verdict.set_value(["correct, slower"]).run()
    family.set_value(["reduction"]).run()
    expected = [c.id for c in candidates
                if c.verdict_label == "correct, slower" and c.family == "reduction"]
    assert expected and sorted(found_ids(app)) == expected
    assert set(app.dataframe[0].value["verdict"]) == {"correct, slower"}
    gpu.set_value([store_env_gpu(store_env)]).run()
    assert sorted(found_ids(app)) == expected
    app.text_input[0].set_value("wider column blocks").run()
    assert found_ids(app) == [c.id for c in candidates if "wider column" in c.rationale]
    family.set_value(["matmul"]).run()
    assert found_ids(app) == []
    assert "No kernel matches" in app.info[0].value


def store_env_gpu(app_store: AppStore) -> str:
    with open_reader(app_store.path) as reader:
        return reader.run(app_store.run).gpu


def test_bad_full_text_syntax_is_explained(store_env):
    app = open_page("kernels.py")
    app.toggle[0].set_value(True).run()
    app.text_input[0].set_value('"unbalanced').run()
    assert not app.exception
    (error,) = app.error
    assert "not valid full-text search syntax" in error.value
    assert "double quotes" in error.value


def test_words_match_the_start_of_words_as_in_the_store(store_env):
    with open_reader(store_env.path) as reader:
        target = next(c for c in reader.candidates() if "wider column blocks" in c.rationale)
        ranked = [c.id for c in reader.search("wide colu lon", limit=200)]
        gpu = reader.run(target.run_id).gpu
    app = open_page("kernels.py", q="wide colu lon")
    assert found_ids(app) == ranked
    assert ranked[0] == target.id
    row = app.dataframe[0].value.iloc[0]
    assert "[wider] [column] blocks: [longer]" in row["snippet"]
    assert row["gpu"] == gpu
