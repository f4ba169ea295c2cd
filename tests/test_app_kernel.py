"""The Kernel page: source, verdict, errors, timings, lineage and diffs of one candidate."""

import pytest

from store import diff_to_best, diff_to_parent, open_reader
from tests.app_fixture import AppStore, app_store, open_page, texts

__all__ = ["app_store"]


@pytest.fixture
def store_env(app_store: AppStore, monkeypatch: pytest.MonkeyPatch) -> AppStore:
    monkeypatch.setenv("KILN_DB", str(app_store.path))
    return app_store


def codes(app, language: str) -> list[str]:
    """The code blocks of one language, without the final newline a code block drops."""
    return [code.value.rstrip("\n") for code in app.code if code.language == language]


def test_a_refined_kernel_shows_its_source_verdict_timing_and_diffs(store_env):
    child, parent = next(iter(store_env.parents.items()))
    with open_reader(store_env.path) as reader:
        kernel = reader.candidate(child)
        to_parent = diff_to_parent(reader, child)
        to_best = diff_to_best(reader, child)
    app = open_page("kernel.py", id=child)
    page = texts(app) + "\n".join(text.value for text in app.text)
    label = kernel.summary.verdict_label
    assert app.title[0].value == f"Kernel {child}: {label}"
    assert kernel.source.rstrip() in codes(app, "python")
    assert to_parent.text.rstrip() in codes(app, "diff")
    assert (
        f"--- candidate {parent}" in to_parent.text and f"+++ candidate {child}" in to_parent.text
    )
    assert kernel.summary.rationale in page
    assert f"[{parent}](kernel?id={parent})" in page
    if to_best is not None and to_best.base_id != child:
        assert to_best.text.rstrip() in codes(app, "diff")
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["median"] == f"{kernel.verdict['latency_ms']:.4g} ms"
    assert metrics["baseline"] == f"{kernel.verdict['baseline_ms']:.4g} ms"
    assert f"{kernel.verdict['timing_trials']} trials on" in page
    box = {"accepted": app.success, "correct, slower": app.warning}.get(label, app.error)
    assert len(box) == 1, label


def test_a_first_draft_is_diffed_against_its_site_problem(store_env):
    draft = store_env.candidates[0]
    with open_reader(store_env.path) as reader:
        expected = diff_to_parent(reader, draft)
        site = reader.site(reader.candidate(draft).summary.site_id)
    app = open_page("kernel.py", id=draft)
    assert expected.base_id is None
    assert expected.text.rstrip() in codes(app, "diff")
    assert f"Against site {site.key} reference" in texts(app)
    assert "A first draft: no parent." in texts(app)
    assert site.problem_source.rstrip() in codes(app, "python")


def test_a_rejected_kernel_shows_why(store_env):
    with open_reader(store_env.path) as reader:
        rejected = next(c for c in reader.candidates()
                        if c.verdict_label in ("rejected", "incorrect", "compile failed"))
        verdict = reader.candidate(rejected.id).verdict
    app = open_page("kernel.py", id=rejected.id)
    (error,) = app.error
    assert error.value.lower().startswith(rejected.verdict_label)
    (why,) = [text.value for text in app.text if verdict["reason"] in text.value]
    assert why.startswith(f"{verdict['reason_code']}: ")
    if verdict.get("compile_log"):
        assert verdict["compile_log"].rstrip() in codes(app, "text")


def test_an_unknown_id_says_so(store_env):
    app = open_page("kernel.py", id=99999)
    (error,) = app.error
    assert "there is no candidate 99999" in error.value
