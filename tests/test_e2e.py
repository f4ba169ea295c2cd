"""The end-to-end check: the whole model with its winners, against eager and torch.compile."""

from __future__ import annotations

import io
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

from core.optimize.e2e import (
    EndToEndCheck,
    SiteGain,
    correctness_text,
    fresh_like,
    predicted_speedup,
)
from core.optimize.markdown_report import markdown_report
from core.optimize.report import print_end_to_end
from core.profile.progress import Progress
from core.runtime.guarded import SiteKernel
from tests import models
from tests.test_install import site_kernels

SLOW_KERNEL = '''
import time

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.reference = Model()

    def forward(self, *args):
        time.sleep(0.05)
        return self.reference(*args)
'''


class RoundedChain(nn.Module):
    """Forty multiply-adds: eager rounds each to bf16, inductor only the last, so in bf16
    torch.compile lands 3.5% of the output's scale from eager (the tolerance is 1%)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(40):
            x = x * 1.01 + 0.05
        return x


def gains(kernels: list[SiteKernel]) -> list[SiteGain]:
    return [SiteGain(k, time_ms=1.0, speedup_vs_eager=2.0) for k in kernels]


def check(drop_slower: bool = False) -> EndToEndCheck:
    """On the CPU the interpreted kernels are slower than PyTorch: kept unless asked."""
    model, inputs = models.make_mlp()
    return EndToEndCheck(model, inputs, "cpu", tf32=True,
                         progress=Progress(enabled=False), rest="eager",
                         drop_slower=drop_slower)


def test_inputs_as_large_as_the_l2_are_timed_on_themselves():
    # One set covers what the rotation is for (the CPU has no L2 to cover): no copies of
    # inputs that can be gigabytes.
    timed = check()
    assert len(timed.input_sets) == 1
    assert all(a is b for a, b in zip(timed.input_sets[0], timed.inputs, strict=True))


def test_amdahl_prediction():
    kernel = SiteKernel("k", "", "")
    assert predicted_speedup(10.0, []) == 1.0
    # 4 of 10 ms made 2x faster saves 2 ms: 10 / 8.
    assert predicted_speedup(10.0, [SiteGain(kernel, 4.0, 2.0)]) == pytest.approx(1.25)


def test_fresh_inputs_keep_shapes_dtypes_and_ranges():
    ids = torch.randint(3, 50, (2, 7))
    x = torch.randn(4, 5) * 3 + 1
    fresh_ids, fresh_x = fresh_like((ids, x), seed=1)
    assert fresh_ids.dtype == ids.dtype and int(fresh_ids.min()) >= 3 and int(fresh_ids.max()) < 50
    assert fresh_x.shape == x.shape and not torch.equal(fresh_x, x)
    assert torch.equal(fresh_like((x,), 1)[0], fresh_like((x,), 1)[0])


def test_winners_installed_are_checked_and_timed(tmp_path):
    model, inputs = models.make_mlp()
    kernels = site_kernels(model, inputs, tmp_path)
    result = check().run(total_ms=10.0, gains=gains(kernels))
    assert result.correct, result.reason
    assert result.installed == sorted(k.key for k in kernels)
    assert result.timing == "cpu" and result.rest == "eager"
    for name in ("eager_ms", "optimized_ms", "compile_ms"):
        assert getattr(result, name) > 0
    assert result.speedup_vs_eager == pytest.approx(result.eager_ms / result.optimized_ms)
    assert result.speedup_vs_compile == pytest.approx(result.compile_ms / result.optimized_ms)
    assert result.predicted_speedup == pytest.approx(10 / (10 - 0.5 * len(kernels)))
    assert set(result.to_dict()) >= {"correct", "eager_ms", "optimized_ms", "compile_ms",
                                     "speedup_vs_eager", "speedup_vs_compile",
                                     "predicted_speedup"}


def test_a_kernel_the_whole_model_disagrees_with_is_taken_out(tmp_path):
    model, inputs = models.make_mlp()
    kernels = site_kernels(model, inputs, tmp_path)
    bad = scaled(kernels[0], 1.01)
    result = check().run(total_ms=10.0, gains=gains([bad, *kernels[1:]]))
    assert result.correct, result.reason
    assert bad.key not in result.installed
    assert result.removed[bad.key].startswith("the model was wrong with it: fresh inputs")


def test_a_kernel_that_slows_the_model_is_taken_out(tmp_path):
    model, inputs = models.make_mlp()
    kernel = site_kernels(model, inputs, tmp_path)[0]
    slow = SiteKernel(kernel.key, kernel.problem_source + SLOW_KERNEL, kernel.problem_source)
    result = check(drop_slower=True).run(total_ms=10.0, gains=gains([slow]))
    assert result.installed == []
    assert result.removed[slow.key].startswith("the model took ")
    assert "medians of 5 rounds timed in turns" in result.removed[slow.key]
    # Why, read from one forward's kernels with it and without (which ops differ, and how
    # they rank, is the CPU profiler's to say: `tests/test_kernel_diff.py` holds the wording).
    assert re.search(r"; one forward ran \d+ kernels in [\d.]+ ms with it, \d+ in [\d.]+ ms "
                     r"without", result.removed[slow.key]), result.removed[slow.key]
    assert result.optimized_ms < 50, "the slow kernel was still timed in the model"
    # Nothing left installed: the model is the eager baseline, and its time is eager's.
    assert result.optimized_ms == result.eager_ms
    assert result.speedup_vs_eager == result.speedup_vs_compile == 1.0


def test_with_no_kernel_the_model_is_its_own_baseline_at_1x():
    """However eager and torch.compile time on a CPU, no kernel of Kiln's means 1.00x."""
    model, inputs = models.make_mlp()
    result = EndToEndCheck(model, inputs, "cpu", tf32=True,
                           progress=Progress(enabled=False)).run(total_ms=10.0, gains=[])
    assert result.installed == [] and result.correct
    assert result.speedup_vs_eager == result.speedup_vs_compile == 1.0
    assert result.predicted_speedup == 1.0
    assert result.optimized_ms == {"eager": result.eager_ms,
                                   "inductor": result.compile_ms}[result.rest]


def report_of(e2e: dict, key: str, device: str) -> dict:
    site = {"id": key, "family": "matmul", "share": 0.5, "time_ms": 1.0,
            "floor_ms": 0.01, "calls": 1, "signature": "linear → gelu | f32[4,8]"}
    searched = {"id": key, "evaluations": 3, "eager_ms": 1.0, "compile_ms": 0.8,
                "declined": "", "best": {"tier": "triton", "latency_ms": 0.4, "speedup": 2.0}}
    return {"model": "mlp", "run_id": 1, "db": "kiln.db", "dtype": "fp32", "device": device,
            "timing": device.upper(), "total_ms": 2.0, "captured_ms": 2.0, "floor_gpu": "H200",
            "e2e": e2e, "sites": [site], "searched": [searched]}


def end_to_end(markdown: str) -> str:
    """The report's end-to-end section."""
    return markdown.split("## End to end")[1].split("## Searched sites")[0]


def test_the_markdown_report_carries_the_figures(tmp_path):
    model, inputs = models.make_mlp()
    kernels = site_kernels(model, inputs, tmp_path)
    e2e = {**check().run(total_ms=10.0, gains=gains(kernels)).to_dict(), "timing": "gpu"}
    text = markdown_report(report_of(e2e, kernels[0].key, "cuda"))
    assert f"{e2e['optimized_ms']:.4f}" in text and f"{e2e['speedup_vs_eager']:.2f}x" in text
    assert f"| `{kernels[0].key}` | 3 | 1.0000 | 0.8000 | triton | 0.4000 | 2.00x |" in text
    assert "linear → gelu \\| f32[4,8]" in text
    assert "custom op" not in text and "indicative" not in text
    assert f"each time the median of 5 rounds timed in turns, whose range was at most " \
           f"{e2e['spread_ms']:.4f} ms" in text
    assert "floor" not in end_to_end(text), "no floor known, none shown"
    e2e["floor_ms"] = e2e["optimized_ms"] * 0.9
    terminal = io.StringIO()
    print_end_to_end(e2e, terminal)
    for shown in (markdown_report(report_of(e2e, kernels[0].key, "cuda")), terminal.getvalue()):
        assert (f"the model's floor {e2e['floor_ms']:.4f} ms (its sites' roofline floors "
                "summed): it runs at 90% of the floor") in shown, shown
    e2e["untraceable"] = {kernels[0].key: "RuntimeError: reads tensor data"}
    text = markdown_report(report_of(e2e, kernels[0].key, "cuda"))
    assert f"- `{kernels[0].key}`: RuntimeError: reads tensor data" in text


def test_cpu_reports_label_timings_indicative_and_claim_no_speedup(tmp_path):
    model, inputs = models.make_mlp()
    kernels = site_kernels(model, inputs, tmp_path)
    e2e = check().run(total_ms=10.0, gains=gains(kernels)).to_dict()
    assert e2e["timing"] == "cpu" and e2e["installed"]
    terminal = io.StringIO()
    print_end_to_end(e2e, terminal)
    for text in (markdown_report(report_of(e2e, kernels[0].key, "cpu")), terminal.getvalue()):
        assert "CPU timings, indicative only: no speedup is claimed" in text
        assert f"{e2e['optimized_ms']:.4f}" in text
        assert f"{e2e['speedup_vs_eager']:.2f}x" not in text and "vs eager" not in text
    # CPU times say nothing of a GPU's floor: none is set beside them.
    e2e["floor_ms"] = 0.001
    assert "floor" not in end_to_end(markdown_report(report_of(e2e, kernels[0].key, "cpu")))


def test_with_no_kernel_installed_the_reports_say_1x(tmp_path):
    model, inputs = models.make_mlp()
    e2e = check(drop_slower=True).run(total_ms=10.0, gains=[]).to_dict()
    terminal = io.StringIO()
    print_end_to_end(e2e, terminal)
    markdown = markdown_report(report_of(e2e, "none", "cpu")).split("## Searched sites")[0]
    for text in (markdown, terminal.getvalue()):
        assert "No kernel of Kiln's installed, the model runs as it did: 1.00x" in text
        assert re.findall(r"\d+\.\d+x", text) == ["1.00x"], "a speedup besides 1.00x"


def scaled(kernel: SiteKernel, factor: float) -> SiteKernel:
    """`kernel` with every output multiplied by `factor`: a wrong kernel."""
    wrong = kernel.source.replace("class ModelNew(nn.Module):", f"""class ModelNew(nn.Module):
    def __call__(self, *args):
        out = super().__call__(*args)
        return out * {factor} if isinstance(out, torch.Tensor) else out
""")
    assert wrong != kernel.source
    return SiteKernel(kernel.key, wrong, kernel.problem_source)


def chain_check() -> tuple[nn.Module, tuple, EndToEndCheck]:
    model, inputs = RoundedChain().eval(), (torch.randn(64, 64).bfloat16(),)
    return model, inputs, EndToEndCheck(model, inputs, "cpu", tf32=False,
                                        progress=Progress(enabled=False), rest="inductor",
                                        drop_slower=False)


def test_a_model_as_close_to_eager_as_torch_compile_is_correct(tmp_path):
    model, inputs, e2e = chain_check()
    kernels = site_kernels(model, inputs, tmp_path)
    result = e2e.run(total_ms=1.0, gains=gains(kernels))
    assert result.compile_max_rel_err > 1e-2, "torch.compile was within the bf16 tolerance"
    assert result.correct, result.reason
    assert result.installed == [k.key for k in kernels]
    assert 1e-2 < result.max_rel_err <= 1.5 * result.compile_max_rel_err
    assert "torch.compile's own" in correctness_text(result.to_dict())


def test_a_kernel_far_beyond_torch_compiles_own_error_is_taken_out(tmp_path):
    model, inputs, e2e = chain_check()
    bad = scaled(site_kernels(model, inputs, tmp_path)[0], 1.2)
    result = e2e.run(total_ms=1.0, gains=gains([bad]))
    assert result.correct, result.reason
    assert result.installed == []
    assert "torch.compile's own worst element is" in result.removed[bad.key]


class ScriptedTimes(EndToEndCheck):
    """The model's time by which kernels it holds (GPU timings cannot run here): one figure,
    or one per round, in turn."""

    def __init__(self, times: dict[frozenset[str], float | list[float]]) -> None:
        model, inputs = models.make_mlp()
        super().__init__(model, inputs, "cpu", tf32=True,
                         progress=Progress(enabled=False), rest="eager")
        self.times = {held: value if isinstance(value, list) else [value]
                      for held, value in times.items()}
        self.calls: dict[frozenset[str], int] = {}

    def time(self, run: Callable) -> float:
        held = frozenset(k.replace("-", "_") for k in getattr(run, "kernels", {}))
        self.calls[held] = self.calls.get(held, 0) + 1
        rounds = self.times[held]
        return rounds[(self.calls[held] - 1) % len(rounds)]


def pair(tmp_path) -> tuple[SiteKernel, SiteKernel, str, str]:
    model, inputs = models.make_mlp()
    first, second = site_kernels(model, inputs, tmp_path)[:2]
    return first, second, first.key.replace("-", "_"), second.key.replace("-", "_")


def test_a_kernel_the_model_is_faster_without_is_taken_out(tmp_path):
    """Together the two kernels beat the baseline, yet the model is faster with one alone."""
    first, second, a, b = pair(tmp_path)
    check = ScriptedTimes({frozenset(): 10.0, frozenset({a, b}): 8.0, frozenset({a}): 6.0,
                           frozenset({b}): 9.0})
    result = check.run(total_ms=10.0, gains=[SiteGain(first, 1.0, 2.0),
                                             SiteGain(second, 0.5, 2.0)])
    assert result.installed == [first.key]
    assert result.removed[second.key].startswith(
        "the model took 8.0000 ms with it, 6.0000 ms without")
    assert result.optimized_ms == 6.0
    assert result.speedup_vs_eager == pytest.approx(10.0 / 6.0)


def test_a_gain_within_the_spread_of_the_rounds_is_no_gain(tmp_path):
    """0.8% slower or faster by less than the rounds move: taken out; faster beyond: kept."""
    first, second, a, b = pair(tmp_path)
    check = ScriptedTimes({
        frozenset(): [10.0, 10.3, 9.9, 10.1, 10.0],
        # Its median is faster than the baseline's, but by less than the rounds' spread.
        frozenset({a}): [9.9, 10.2, 9.7, 9.95, 10.05],
        frozenset({b}): [9.0, 9.1, 8.9, 9.05, 9.0],
        frozenset({a, b}): [9.4, 9.5, 9.3, 9.45, 9.4]})
    result = check.run(total_ms=10.0, gains=[SiteGain(first, 1.0, 2.0),
                                             SiteGain(second, 0.5, 2.0)])
    assert result.installed == [second.key]
    assert "not faster by more than the rounds' spread of 0.5000 ms" in result.removed[first.key]
    assert result.optimized_ms == 9.0
    # The widest range behind the figures: the baseline's rounds, 9.9 to 10.3 ms.
    assert (result.rounds, result.spread_ms) == (5, pytest.approx(0.4))
