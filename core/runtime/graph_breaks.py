"""What Kiln asks of torch.compile before every compile it makes, the baselines' included, so that
a model's graphs are the same whether Kiln captures them, installs kernels in them or times
them under torch.compile.

`warnings.warn` is traced as a call run after the graph, not as a graph break: module code that
warns on its inputs (InstanceNorm's "does not match num_features", say) otherwise splits the
graph there and leaves the ops around the warning to run eagerly between graphs, out of reach
of Kiln's sites and of inductor's fusions alike. The compiled graph issues the warning after
its ops, or, for a call with keyword arguments (InstanceNorm's `stacklevel=2`), not at all: the
model's eager forward, which Kiln runs to check the installed one, still issues it.
"""

from __future__ import annotations

import warnings

import torch


def trace_through_warnings() -> None:
    """Let torch.compile reorder `warnings.warn` after the graph (a process-wide setting)."""
    torch._dynamo.config.reorderable_logging_functions.add(warnings.warn)
