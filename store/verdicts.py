"""An evaluator verdict (`core.evaluate.verdict.Verdict`) → the indexed columns of the `verdicts`
table.

The whole verdict is kept as JSON too, so a field the evaluator adds later is stored without a
migration; only the fields that listings, search and ranking need get their own column, named
as the evaluator names them. A field the verdict lacks is stored as NULL, except the three
flags every verdict has.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from store.records import Site

REQUIRED_FLAGS = ("compiled", "correct", "accepted")
OPTIONAL_FLAGS = ("flagged", "crashed", "timed_out")
NUMBERS = (
    "max_abs_err", "max_rel_err", "tolerance", "latency_ms", "latency_mean_ms", "latency_min_ms",
    "latency_max_ms", "latency_stdev_ms", "baseline_ms", "speedup",
)  # fmt: skip
INTEGERS = ("timing_trials", "kernel_launches")
TEXTS = ("reason", "reason_code", "tolerance_name", "timing_device", "compile_log")


def as_mapping(verdict: Mapping[str, Any] | object) -> Mapping[str, Any]:
    """A verdict given as a mapping, or as the evaluator's `Verdict` (through its `to_dict`)."""
    if isinstance(verdict, Mapping):
        return verdict
    to_dict = getattr(verdict, "to_dict", None)
    if not callable(to_dict):
        raise TypeError(f"a verdict is a mapping or has to_dict(), not {type(verdict).__name__}")
    return to_dict()


def _number(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def verdict_columns(verdict: Mapping[str, Any], site: Site) -> dict[str, Any]:
    missing = [name for name in REQUIRED_FLAGS if name not in verdict]
    if missing:
        raise ValueError(f"the verdict lacks {', '.join(missing)}; it has {sorted(verdict)}")
    columns: dict[str, Any] = {name: bool(verdict[name]) for name in REQUIRED_FLAGS}
    columns |= {
        name: None if verdict.get(name) is None else bool(verdict[name]) for name in OPTIONAL_FLAGS
    }
    columns |= {name: _number(verdict.get(name)) for name in NUMBERS}
    columns |= {name: verdict.get(name) for name in INTEGERS}
    columns |= {name: None if verdict.get(name) is None else str(verdict[name]) for name in TEXTS}
    library_ops = verdict.get("library_ops")
    columns["library_ops"] = None if library_ops is None else json.dumps(list(library_ops))
    latency = columns["latency_ms"]
    # Against the profiler's times of the site in the model; meaningful when the verdict was
    # timed on the device the run profiled on.
    columns["speedup_vs_eager"] = _ratio(site.eager_ms, latency)
    columns["speedup_vs_compile"] = _ratio(site.compile_ms, latency)
    # Share of the roofline reached: 1.0 means the kernel runs at the byte/FLOP floor.
    columns["roofline_fraction"] = _ratio(site.floor_ms, latency)
    columns["verdict"] = json.dumps(dict(verdict), default=str)
    return columns
