"""Hardware counters for the best few kernels of a site, and the sharper diagnosis they give.

After each round of a site's search, its `count` fastest correct kernels that have no counters yet
are judged once more, with Nsight Compute reading their counters (`core.evaluate.counters`),
beside the site's next round of candidates rather than between rounds (a read takes seconds of
one worker, which would leave the others idle). The search ranked them by their first timing, so
their verdict keeps it; it takes the counters and the diagnosis drawn with them, and is stored as
the candidate's latest verdict. The node's feedback takes the new diagnosis, so the generator's
later children of that kernel answer what the counters showed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from core.evaluate.verdict import Verdict
from core.search.tree import Node, SiteSearch


def unprofiled_best(search: SiteSearch, count: int, profiled: set[int]) -> list[Node]:
    """The site's `count` fastest correct kernels, those among them not yet profiled."""
    ranked = sorted((n for n in search.nodes()
                     if n.latency_ms is not None and n.candidate_id is not None),
                    key=lambda n: n.latency_ms or 0.0)
    return [n for n in ranked[:count] if n.candidate_id not in profiled]


def with_counters(first: Verdict, profiled: Verdict) -> Verdict:
    """The first verdict (its timing ranked the kernel) with the counters and diagnosis of the
    profiled one; when judging it again failed, the first diagnosis and a note on why."""
    if not profiled.correct:
        note = (f"no counters: judged again to read them, it was rejected "
                f"({profiled.reason_code}): {profiled.reason}")
        return replace(first, counters={"kernels": [], "notes": [note], "seconds": 0.0})
    return replace(first, counters=profiled.counters, diagnosis=profiled.diagnosis)


def source_of(node: Node) -> str:
    """A kernel node's candidate source, to judge it again."""
    if node.proposal is None:
        raise ValueError("the root stands for PyTorch's reference: it has no kernel to judge")
    return node.proposal.source


def merge_counters(nodes: list[Node], verdicts: list[Verdict], profiled: set[int],
                   first_verdicts: dict[int, Verdict],
                   store: Callable[[int, Verdict], None]) -> list[Verdict]:
    """Each node's verdict judged again with counters (`verdicts`, in the order of `nodes`)
    merged into its first one (`first_verdicts`, by candidate id), kept by `store`, and its
    diagnosis given to the node's feedback; the merged verdicts."""
    merged_verdicts = []
    for node, verdict in zip(nodes, verdicts, strict=True):
        assert node.candidate_id is not None and node.feedback is not None
        merged = with_counters(first_verdicts[node.candidate_id], verdict)
        store(node.candidate_id, merged)
        first_verdicts[node.candidate_id] = merged
        profiled.add(node.candidate_id)
        node.feedback = replace(node.feedback, diagnosis=merged.diagnosis)
        merged_verdicts.append(merged)
    return merged_verdicts
