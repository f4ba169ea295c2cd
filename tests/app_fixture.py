"""A store filled by a real small CPU run, for the app's tests.

A small transformer-style block is profiled by `python -m core.optimize --list-sites` on the
CPU; every site it finds goes into the store with its problem file, the rules generator drafts
Triton and CUDA kernels for it and one generation of children from the first correct draft, and
the evaluator judges each one (Triton under its CPU interpreter, CUDA compile-checked with nvcc).
Nothing in the store is made up: sites, sources, verdicts and timings are what the tools gave.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
import torch
import triton
from streamlit.testing.v1 import AppTest

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.verdict import Verdict
from core.optimize.run import feedback_of
from generators.base import Parent, Proposal
from generators.rules import RulesGenerator
from store import Store, open_reader

REPO = Path(__file__).resolve().parents[1]

# Small enough that the Triton interpreter judges each kernel in seconds on one core.
MODEL_SOURCE = '''"""A small MLP block on normalized inputs: layer norm (a site of its own, as both
the up projection and the residual read it), up projection, GELU, down projection, residual."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32)

    def forward(self, x):
        h = self.norm(x)
        return h + self.down(F.gelu(self.up(h))) * 0.5


def get_inputs():
    return [torch.randn(2, 8, 32)]


def get_init_inputs():
    return []
'''
DRAFTS_PER_SITE = 2
CHILDREN_PER_SITE = 2


@dataclass(frozen=True)
class AppStore:
    """A filled store and the ids the tests look things up by."""

    path: Path
    run: int
    sites: dict[str, int]  # site key -> site id
    candidates: list[int]  # in the order proposed
    parents: dict[int, int]  # child id -> parent id


def list_sites(model: Path, out: Path) -> dict:
    """The site report of `python -m core.optimize MODEL --list-sites` on the CPU."""
    result = subprocess.run(
        [sys.executable, "-m", "core.optimize", str(model), "--list-sites", "--device", "cpu",
         "--json", "--out", str(out)],
        cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"--list-sites failed ({result.returncode}):\n{result.stderr}")
    return json.loads(result.stdout)


def _judge(
    store: Store, evaluator: Evaluator, jobs: list[tuple[int, Path, Proposal, int | None]]
) -> list[tuple[int, int, Proposal, Verdict]]:
    """Store each proposal as a candidate of its site, judge them together, store the verdicts.

    Gives back (site id, candidate id, proposal, verdict) for each job, in order.
    """
    stored = []
    for site_id, _, proposal, parent_id in jobs:
        new = store.add_candidate(
            site_id, parent_id=parent_id, tier=proposal.tier, generator=proposal.generator,
            rationale=proposal.rationale, source=proposal.source,
        )  # fmt: skip
        stored.append(new.id)
    verdicts = evaluator.evaluate_many([(problem, p.source) for _, problem, p, _ in jobs])
    for candidate_id, verdict in zip(stored, verdicts, strict=True):
        store.add_verdict(candidate_id, verdict)
    return [
        (site_id, candidate_id, proposal, verdict)
        for (site_id, _, proposal, _), candidate_id, verdict in zip(
            jobs, stored, verdicts, strict=True
        )
    ]


def wrong_on_purpose(draft: Proposal) -> Proposal:
    """A draft whose answer is off by half: the store needs a rejected kernel to show."""
    source = draft.source + (
        "\n\nclass ModelNew(ModelNew):\n"
        "    def forward(self, *args):\n"
        "        return super().forward(*args) * 1.5\n")
    return Proposal(source, draft.tier, draft.generator, "output scaled by 1.5", {})


def fill_app_store(folder: Path) -> AppStore:
    """Profile the small block, then draft, refine and judge kernels for each of its sites."""
    model = folder / "mlp_block_small.py"
    model.write_text(MODEL_SOURCE)
    report = list_sites(model, folder / "kiln-out")
    path = folder / "kiln.db"
    generator = RulesGenerator()
    sites: dict[str, int] = {}
    with Store.open(path) as store, Evaluator(EvalConfig(device="cpu"), workers=2) as evaluator:
        run = store.start_run(
            model_spec=model.name,
            model_hash=hashlib.sha256(MODEL_SOURCE.encode()).hexdigest()[:12],
            gpu="cpu",  # as `python -m core.optimize --device cpu` records it
            versions={"torch": torch.__version__, "triton": triton.__version__,
                      "python": platform.python_version()},
            config={"device": "cpu", "generator": "rules", "tiers": ["triton", "cuda"]},
        )  # fmt: skip
        problems: dict[int, tuple[Path, float | None]] = {}
        for site in report["sites"]:
            problem = Path(site["problem"])
            site_id = store.add_site(
                run, key=site["id"], family=site["family"], signature=site["signature"],
                ops=site["ops"], calls=site["calls"], share=site["share"],
                time_ms=site["time_ms"], eager_ms=site["time_ms"], compile_ms=None,
                floor_ms=site["floor_ms"], problem_source=problem.read_text(),
            )  # fmt: skip
            sites[site["id"]] = site_id
            problems[site_id] = (problem, site["floor_ms"])
        drafts = [
            (site_id, problem, proposal, None)
            for site_id, (problem, _) in problems.items()
            for tier, count in (("triton", DRAFTS_PER_SITE), ("cuda", 1))
            for proposal in generator.propose(problem, None, count, tiers=(tier,)).children
        ]
        site_id, problem, draft, _ = drafts[0]
        drafts.append((site_id, problem, wrong_on_purpose(draft), None))
        first = _judge(store, evaluator, drafts)
        children = []
        for site_id, (problem, floor_ms) in problems.items():
            # On the CPU the interpreter is slower than PyTorch, so no kernel is accepted:
            # refine the first correct one.
            correct = [(c, p, v) for s, c, p, v in first if s == site_id and v.correct]
            if not correct:
                continue
            parent_id, proposal, verdict = correct[0]
            parent = Parent(proposal, feedback_of(verdict, floor_ms))
            for child in generator.propose(problem, parent, CHILDREN_PER_SITE).children:
                children.append((site_id, problem, child, parent_id))
        second = _judge(store, evaluator, children)
        parents = {
            child: parent
            for (_, _, _, parent), (_, child, _, _) in zip(children, second, strict=True)
        }
        # The profiler's eager time of the whole model; torch.compile is not timed here, as
        # compiling the model with inductor on the CPU takes about 25 s.
        store.finish_run(run, e2e={"eager_ms": report["total_ms"]})
    judged = [candidate for _, candidate, _, _ in first + second]
    return AppStore(path, run, sites, judged, parents)


_SHARED: dict[str, AppStore] = {}


@pytest.fixture(scope="session")
def app_store(tmp_path_factory: pytest.TempPathFactory) -> AppStore:
    """One filled store for the whole test session: filling it judges a dozen kernels.

    Each test module imports this fixture, which gives each its own copy of the definition, so
    the store is kept here, once per process.
    """
    if "store" not in _SHARED:
        _SHARED["store"] = fill_app_store(tmp_path_factory.mktemp("app-store"))
    return _SHARED["store"]


APP = REPO / "app.py"
# A cold render of the heaviest page takes under a second; the first run of a process also
# imports torch through the store, which can take a while on a loaded machine.
RENDER_TIMEOUT_S = 60


def open_page(page: str, **query: str | int) -> AppTest:
    """Run the app on the store in $KILN_DB, switch to `page` (a file under app_pages/) with
    the given query parameters, and render it."""
    app = AppTest.from_file(APP, default_timeout=RENDER_TIMEOUT_S)
    app.run()
    app.switch_page(f"app_pages/{page}")
    app.query_params.update({name: str(value) for name, value in query.items()})
    app.run()
    assert not app.exception, [e.message for e in app.exception]
    return app


def charts(app: AppTest) -> list:
    return list(app.get("vega_lite_chart"))


def chart_spec(chart) -> dict:
    return json.loads(chart.proto.spec)


def chart_data(chart) -> list[dict]:
    """Every row of every dataset a chart carries, each row with its dataset's columns."""
    rows = []
    for dataset in chart.proto.datasets:
        table = pa.ipc.open_stream(dataset.data.data).read_all()
        rows += table.to_pylist()
    return rows


def texts(app: AppTest) -> str:
    """All the text a page shows in titles, captions, markdown, alerts, code and plain text, as
    one string."""
    parts = []
    for kind in (
        "title",
        "subheader",
        "caption",
        "markdown",
        "info",
        "error",
        "success",
        "warning",
        "code",
        "text",
    ):
        parts += [str(element.value) for element in getattr(app, kind)]
    return "\n".join(parts)


def replay_run(source: Path, target: Path, signals: Path) -> None:
    """Write the filled store's run again into `target`, one candidate at a time, as a live run.

    After each write it creates `signals/written-N` (N candidates so far) and waits for
    `signals/go-N` before the next, so a test reads the store at known points of a run in
    progress; after the last it waits for `signals/finish`, then finishes the run.
    """

    def wait_for(name: str) -> None:
        while not (signals / name).exists():
            time.sleep(0.02)

    with open_reader(source) as reader, Store.open(target) as store:
        old = reader.run(reader.latest_run_id())
        run = store.start_run(
            model_spec=old.model_spec, model_hash=old.model_hash, gpu=old.gpu,
            versions=old.versions, config=old.config,
        )  # fmt: skip
        site_ids = {}
        for site in reader.sites(old.id):
            site_ids[site.id] = store.add_site(
                run, key=site.key, family=site.family, signature=site.signature, ops=site.ops,
                calls=site.calls, share=site.share, time_ms=site.time_ms, eager_ms=site.eager_ms,
                compile_ms=site.compile_ms, floor_ms=site.floor_ms,
                problem_source=site.problem_source,
            )  # fmt: skip
        new_ids: dict[int, int] = {}
        for count, old_candidate in enumerate(reader.iter_candidates(old.id), 1):
            s = old_candidate.summary
            new_ids[s.id] = store.add_candidate(
                site_ids[s.site_id], parent_id=new_ids.get(s.parent_id), tier=s.tier,
                generator=s.generator, rationale=s.rationale, source=old_candidate.source,
            ).id  # fmt: skip
            store.add_verdict(new_ids[s.id], old_candidate.verdict)
            (signals / f"written-{count}").touch()
            wait_for(f"go-{count}")
        wait_for("finish")
        store.finish_run(run, e2e=old.e2e)


def wait_for_file(path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.02)
