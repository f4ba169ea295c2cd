"""The LLM inside the search: drafts evaluated and stored, failed kernels repaired as their
children, every call in the store, `--generator rules,llm` in one tree, a dead endpoint."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from core.optimize.run import OptimizeConfig, OptimizeRun
from core.profile.in_situ import ProfileConfig
from core.profile.load import BuiltinShape
from core.profile.pipeline import ListSitesConfig
from core.profile.progress import Progress
from core.search.tree import SearchConfig, SiteSearch
from generators.base import Feedback, Parent, Proposal, Proposals
from generators.llm.config import LlmConfig
from tests.llm_server import LlmServer, Reply, closed_port_url, contains, prompt_text
from tests.test_list_sites_cli import run_cli

DATA = Path(__file__).parent / "data" / "evaluate"
MODEL = DATA / "pointwise_problem.py"  # one pointwise site: in0 * in1 + in0
GOOD = (DATA / "good_pointwise.py").read_text()
BAD = GOOD.replace("tl.arange(0, BLOCK)", "tl.arange(0, BLOK)")  # a NameError when compiled
SITE_OPS = "v0 = in0 * in1"  # in the site problem Kiln writes from the model


def block(source: str, size: int) -> str:
    return source.replace("256", str(size))


def fenced(source: str) -> str:
    return f"```python\n{source}```\nFuses the multiply and the add in one pass."


def optimize(tmp_path: Path, generators: tuple[str, ...], base_url: str,
             max_candidates: int) -> dict:
    profile = ListSitesConfig(model=str(MODEL), device="cpu", out=tmp_path / "out",
                              shape=BuiltinShape(), profile=ProfileConfig(0, 2), quiet=True)
    config = OptimizeConfig(
        profile=profile, db=tmp_path / "kiln.db", max_candidates=max_candidates, sites=1,
        tiers=("triton",), workers=1, search=SearchConfig(), generators=generators,
        site_compile=False, e2e=False,
        llm=LlmConfig(base_url=base_url, api_key="test", model="gpt-4o-mini", timeout_s=10,
                      backoff_s=0.01, concurrency=1))
    return OptimizeRun(config, Progress(enabled=False)).execute()


def rows(db: Path, sql: str) -> list[tuple]:
    return sqlite3.connect(db).execute(sql).fetchall()


def test_a_failed_draft_is_repaired_as_its_child_and_every_call_is_stored(tmp_path):
    feedback = contains("NameError", "BLOK", SITE_OPS)
    script = [Reply(fenced(BAD), expect=contains(SITE_OPS)),
              Reply(fenced(GOOD), expect=contains(SITE_OPS)),
              Reply(fenced(block(GOOD, 128)), expect=feedback),  # the repair of BAD
              Reply(fenced(block(GOOD, 512)), expect=contains(SITE_OPS))]
    with LlmServer(script) as server:
        report = optimize(tmp_path, ("llm",), server.url, max_candidates=4)
    assert server.failures == []
    assert len(server.requests) == 4
    assert "failed. Fix it." in prompt_text(server.requests[2])
    db = tmp_path / "kiln.db"
    candidates = {source: (cid, parent, generator, accepted, call) for
                  cid, parent, generator, accepted, call, source in rows(db, """
        SELECT c.id, c.parent_id, c.generator, v.correct, c.llm_call_id, c.source
        FROM candidates c JOIN verdicts v ON v.id = c.verdict_id""")}
    assert set(candidates) == {BAD, GOOD, block(GOOD, 128), block(GOOD, 512)}
    bad_id, bad_parent, _, bad_accepted, _ = candidates[BAD]
    assert bad_parent is None and bad_accepted == 0
    fix_id, fix_parent, _, fix_accepted, _ = candidates[block(GOOD, 128)]
    assert fix_parent == bad_id and fix_accepted == 1, "the fix hangs under the failed draft"
    assert candidates[GOOD][3] == 1
    assert {c[2] for c in candidates.values()} == {"llm"}
    calls = rows(db, "SELECT id, site_id, model, prompt, reply, prompt_tokens, "
                     "completion_tokens, cost_usd, error FROM llm_calls ORDER BY id")
    assert len(calls) == 4
    assert {c[4] for c in candidates.values()} == {c[0] for c in calls}
    for _, site_id, model, prompt, reply, prompt_tokens, completion_tokens, cost, error in calls:
        assert site_id is not None and model == "gpt-4o-mini" and error is None
        assert SITE_OPS in prompt and reply.startswith("```python")
        assert (prompt_tokens, completion_tokens) == (1200, 300) and cost > 0
    (searched,) = report["searched"]
    assert searched["evaluations"] == 4


def test_rules_and_llm_share_one_tree(tmp_path):
    script = [Reply(fenced(block(GOOD, size)), expect=contains(SITE_OPS))
              for size in (64, 128, 512, 1024)]
    with LlmServer(script) as server:
        optimize(tmp_path, ("rules", "llm"), server.url, max_candidates=4)
    assert server.failures == []
    generators = [g for (g,) in rows(tmp_path / "kiln.db",
                                     "SELECT generator FROM candidates ORDER BY id")]
    assert generators[:2] == ["rules", "llm"], "the first two drafts are split between them"
    assert len(generators) == 4 and {"rules", "llm"} <= set(generators)


def test_a_dead_endpoint_leaves_the_rules_search_going_with_one_clear_message(tmp_path):
    db = tmp_path / "kiln.db"
    result = run_cli(str(MODEL), "--device", "cpu", "--json", "--db", str(db),
                     "--generator", "rules,llm", "--llm-base-url", closed_port_url(),
                     "--max-candidates", "4", "--sites", "1", "--workers", "1",
                     "--trials", "2", "--warmup", "0", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("the LLM generator stopped: cannot reach") == 1
    generators = rows(db, "SELECT generator, COUNT(*) FROM candidates GROUP BY generator")
    assert generators == [("rules", 4)]
    assert rows(db, "SELECT status FROM runs") == [("done",)]


def test_the_llm_needs_an_endpoint_or_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    result = run_cli(str(MODEL), "--device", "cpu", "--generator", "llm",
                     "--db", str(tmp_path / "kiln.db"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "neither OPENAI_API_KEY nor a base URL" in result.stderr
    assert "Traceback" not in result.stderr
    bad = run_cli(str(MODEL), "--device", "cpu", "--generator", "rules,gpt",
                  "--db", str(tmp_path / "kiln.db"), "--out", str(tmp_path / "out"))
    assert bad.returncode == 2 and "unknown --generator 'rules,gpt'" in bad.stderr


def test_a_repair_comes_ahead_of_the_next_batch_and_its_subtree_is_searched():
    """On a synthetic world: kernel 'a' fails, its repair 'a1' is fast, and 'a1' is refined."""
    latency = {"a": None, "b": 2.0, "a1": 1.0, "a1x": 0.5, "bx": 1.9}
    asked: list[str] = []

    def propose(parent: Parent | None, n: int) -> Proposals:
        name = "root" if parent is None else parent.proposal.source
        asked.append(name)
        children = {"root": ["a", "b"], "a": ["a1"], "a1": ["a1x"], "b": ["bx"]}.get(name, [])
        fresh = [c for c in children if c not in asked and c not in seen][:n]
        seen.update(fresh)
        return Proposals([Proposal(c, "triton", "llm", c) for c in fresh])

    def evaluate(proposals: list[Proposal]) -> list[Feedback]:
        return [Feedback(correct=latency[p.source] is not None,
                         latency_ms=latency[p.source], baseline_ms=4.0) for p in proposals]

    seen: set[str] = set()
    search = SiteSearch(4.0, 0.1, propose, evaluate, record=lambda node: None,
                        config=SearchConfig(batch=1, stall=100),
                        repairable=lambda p, f: p.source == "a")
    for _ in range(4):
        search.step()
    assert asked[:2] == ["root", "a"], "the failed draft is repaired first"
    assert "a1" in asked, "the repair's subtree is searched"
    assert search.best.proposal.source == "a1x" and search.best.parent.parent.proposal.source == "a"
