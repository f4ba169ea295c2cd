"""The app's Altair charts, built from plain tables so tests can read the data back."""

from __future__ import annotations

import altair as alt
import pandas as pd

from store import VERDICTS

# A site's search tree can hold thousands of candidates; Altair's default cap of 5,000 rows
# would refuse to draw a big one.
alt.data_transformers.disable_max_rows()

# Only "accepted" (correct and faster) is green; "correct, slower" is amber, not a success.
VERDICT_COLORS = alt.Scale(
    domain=list(VERDICTS),
    range=["#2e7d32", "#f9a825", "#ef6c00", "#c62828", "#6a1b9a", "#9e9e9e"],
)
TIER_SHAPES = alt.Scale(domain=["triton", "cuda"], range=["circle", "diamond"])


def runs_chart(runs: pd.DataFrame) -> alt.Chart:
    """Per run: candidates tried and accepted (bars) and end-to-end speedups (points)."""
    counts = runs.melt(
        id_vars=["run"], value_vars=["candidates", "accepted"], var_name="kind", value_name="count"
    )
    bars = (
        alt.Chart(counts, title="Kernels tried and accepted per run")
        .mark_bar()
        .encode(
            x=alt.X("run:O", title="run"),
            xOffset="kind:N",
            y=alt.Y("count:Q", title="candidates"),
            color=alt.Color("kind:N", title=""),
            tooltip=["run", "kind", "count"],
        )
    )
    speedups = runs.melt(
        id_vars=["run"],
        value_vars=["vs eager", "vs torch.compile"],
        var_name="baseline",
        value_name="speedup",
    ).dropna()
    points = (
        alt.Chart(speedups, title="End-to-end speedup per run")
        .mark_line(point=True)
        .encode(
            x=alt.X("run:O", title="run"),
            y=alt.Y("speedup:Q", title="speedup (x)"),
            color=alt.Color("baseline:N", title="against"),
            tooltip=["run", "baseline", alt.Tooltip("speedup:Q", format=".3f")],
        )
    )
    return alt.hconcat(bars, points) if not speedups.empty else bars


def amdahl_chart(parts: pd.DataFrame) -> alt.Chart:
    """Model time by part, before the kernels and after: where the time went."""
    return (
        alt.Chart(parts, title="Where the time goes (ms per forward)")
        .mark_bar()
        .encode(
            y=alt.Y("phase:N", title="", sort=["before", "after"]),
            x=alt.X("ms:Q", title="ms", stack="zero"),
            color=alt.Color("part:N", title="site", sort=alt.SortField("order")),
            order=alt.Order("order:Q"),
            tooltip=["phase", "part", alt.Tooltip("ms:Q", format=".4g"), "note"],
        )
    )


def phase_chart(phases: pd.DataFrame) -> alt.Chart:
    """One candidate's judging: seconds per phase (`phase`, `seconds`), in the order they ran."""
    return (
        alt.Chart(phases, title="Seconds in each phase of judging")
        .mark_bar()
        .encode(
            y=alt.Y("phase:N", title="", sort=list(phases["phase"])),
            x=alt.X("seconds:Q", title="s"),
            tooltip=["phase", alt.Tooltip("seconds:Q", format=".3g")],
        )
        .properties(height=alt.Step(22))
    )


def judging_chart(judging: pd.DataFrame, phases: list[str]) -> alt.Chart:
    """Per site: the median seconds a candidate spent in each of `phases` (in the order they run),
    stacked, with the candidates judged and judged per worker-minute."""
    return (
        alt.Chart(judging, title="Median seconds per candidate, by phase of judging")
        .mark_bar()
        .encode(
            y=alt.Y("label:N", title="", sort=list(dict.fromkeys(judging["label"]))),
            x=alt.X("seconds:Q", title="median s per candidate", stack="zero"),
            color=alt.Color("phase:N", sort=phases),
            order=alt.Order("order:Q"),
            tooltip=["site", "phase", alt.Tooltip("seconds:Q", format=".3g"), "judged",
                     alt.Tooltip("per_minute:Q", title="judged per worker-minute",
                                 format=".3g")],
        )
    )


def progress_chart(tried: pd.DataFrame) -> alt.LayerChart:
    """Each candidate's latency in the order tried, and the best accepted latency so far."""
    base = alt.Chart(tried).encode(x=alt.X("order:Q", title="candidate, in the order tried"))
    points = base.mark_point(filled=True, size=60).encode(
        y=alt.Y("latency_ms:Q", title="latency (ms)", scale=alt.Scale(type="log")),
        color=alt.Color("verdict:N", scale=VERDICT_COLORS),
        shape=alt.Shape("tier:N", scale=TIER_SHAPES),
        href="kernel:N",
        tooltip=["id", "tier", "verdict", alt.Tooltip("latency_ms:Q", format=".4g"), "rationale"],
    )
    line = base.mark_line(interpolate="step-after", color="#1565c0").encode(y="best_so_far:Q")
    return alt.layer(points, line, title="Latency of each candidate, best so far as a line")


def tree_chart(nodes: pd.DataFrame, edges: pd.DataFrame) -> alt.LayerChart:
    """The search tree: parents to children left to right, coloured by verdict, shaped by tier."""
    links = (
        alt.Chart(edges)
        .mark_rule(color="#bdbdbd")
        .encode(x=alt.X("x:Q", axis=None), y=alt.Y("y:Q", axis=None), x2="x2:Q", y2="y2:Q")
    )
    points = (
        alt.Chart(nodes)
        .mark_point(filled=True, size=120)
        .encode(
            x=alt.X("depth:Q", title="generation"),
            y=alt.Y("slot:Q", axis=None),
            color=alt.Color("verdict:N", scale=VERDICT_COLORS),
            shape=alt.Shape("tier:N", scale=TIER_SHAPES),
            href="kernel:N",
            tooltip=["id", "parent_id", "tier", "verdict", "latency_ms", "rationale"],
        )
    )
    return alt.layer(links, points, title="Search tree (click a kernel to open it)")


def tree_layout(candidates: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Positions for the search tree: generation across, leaves one slot apart down, each
    parent centred on its children. Gives the nodes and the parent-child edges."""
    ids = candidates["id"].tolist()
    known = set(ids)
    kids: dict[int | None, list[int]] = {}
    for ident, parent in zip(ids, candidates["parent_id"].tolist(), strict=True):
        parent = None if pd.isna(parent) or int(parent) not in known else int(parent)
        kids.setdefault(parent, []).append(ident)
    depth: dict[int, int] = {}
    slot: dict[int, float] = {}
    next_leaf = 0
    # Iterative post-order walk: a chain of thousands of refinements is deeper than Python's
    # recursion limit.
    stack: list[tuple[int, int, bool]] = [(root, 0, False) for root in reversed(kids.get(None, []))]
    while stack:
        ident, level, done = stack.pop()
        if done:
            below = kids.get(ident, [])
            if below:
                slot[ident] = sum(slot[k] for k in below) / len(below)
            else:
                slot[ident], next_leaf = float(next_leaf), next_leaf + 1
            continue
        depth[ident] = level
        stack.append((ident, level, True))
        stack.extend((k, level + 1, False) for k in reversed(kids.get(ident, [])))
    nodes = candidates.assign(depth=[depth[i] for i in ids], slot=[slot[i] for i in ids])
    edges = pd.DataFrame(
        [
            {"x": depth[p], "y": slot[p], "x2": depth[k], "y2": slot[k]}
            for p, below in kids.items()
            if p is not None
            for k in below
        ],
        columns=["x", "y", "x2", "y2"],
    )
    return nodes, edges
