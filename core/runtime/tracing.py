"""What Kiln asks of torch.compile before every compile it makes, the baselines' included, so that
a model's graphs are the same whether Kiln captures them, installs kernels in them or times
them under torch.compile.

- `warnings.warn` is traced as a call run after the graph, not as a graph break: module code
  that warns on its inputs (InstanceNorm's "does not match num_features", say) otherwise splits
  the graph there and leaves the ops around the warning to run eagerly between graphs, out of
  reach of Kiln's sites and of inductor's fusions alike. The compiled graph issues the warning
  after its ops, or, for a call with keyword arguments (InstanceNorm's `stacklevel=2`), not at
  all: the model's eager forward, which Kiln runs to check the installed one, still issues it.
- `F.multi_head_attention_forward` (what `nn.MultiheadAttention` calls) is traced through, not
  kept whole in the graph as dynamo keeps it: its projections and its
  scaled_dot_product_attention become matmul and attention sites, where one opaque node was
  kept with PyTorch.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

# Functions dynamo keeps whole in the graph that Kiln has it trace through.
TRACED_THROUGH = (F.multi_head_attention_forward,)


def set_tracing_rules() -> None:
    """Apply both rules (process-wide settings of torch.compile; applying them again is a no-op)."""
    torch._dynamo.config.reorderable_logging_functions.add(warnings.warn)
    from torch._dynamo import trace_rules

    rules = trace_rules.get_torch_obj_rule_map()
    for function in TRACED_THROUGH:
        rules.pop(function, None)
