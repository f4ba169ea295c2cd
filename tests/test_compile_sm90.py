"""The rules generator's kernels compiled by Triton for sm_90, on this machine with no GPU: each
draft run under the interpreter, every launch recorded with the types, constants and alignments
a GPU would specialize it for, and compiled in a process of its own. The interpreter runs what
the compiler may refuse (a row kernel's loop failed Triton's passes on sm_90 and nowhere else:
bench/NOTES.md, 2026-12-05, 11:50-12:10 UTC)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from bench.sm90_compile_bench import compile_for_sm90, launched_kernels
from generators.compiler.schedule import Schedule
from generators.rules import RulesGenerator
from generators.site_graph import load_site_graph
from generators.triton.attention import attention_drafts, write_attention
from generators.triton.program import compiled_drafts, write_compiled
from tests.kernel_checks import one_input_problem
from tests.test_generator_attention import FORMS, attention_problem
from tests.test_generator_conv import BN, norm_mean_problem, write_problem
from tests.test_generator_matmul_rows import write

# Launches are recorded under the interpreter; on a GPU host the GPU tests compile for real.
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="records launches under the Triton interpreter")
# Drafts a problem's test compiles: the first few the rules generator proposes.
DRAFTS = 3
ONE_INPUT = {
    "pointwise chain": ("torch.sigmoid(x * 1.5 + 0.5) * x", "torch.randn(64, 96)"),
    "softmax of rows": ("torch.softmax(x, dim=-1)", "torch.randn(32, 1000)"),
    "layer norm": ("torch.nn.functional.layer_norm(x, (384,))", "torch.randn(16, 384)"),
    "sum over a middle dimension": ("x.sum(dim=1)", "torch.randn(8, 100, 64)"),
    # An int64 count over rows long enough to loop: the accumulator keeps its type.
    "count over long rows": ("(x > 0).sum(dim=-1)", "torch.randn(4, 20000)"),
}


def compile_drafts(sources: list[str], problem, tmp_path) -> None:
    failed = {}
    for index, source in enumerate(sources):
        folder = tmp_path / f"draft{index}"
        folder.mkdir()
        module, jobs = launched_kernels(source, problem, folder)
        assert jobs, f"draft {index} launched no Triton kernel"
        for name, result in compile_for_sm90(module, jobs).items():
            if "error" in result:
                failed[f"draft {index}: {name} ({source.splitlines()[0][:140]})"] = (
                    result["error"][-400:])
    assert not failed, failed


def rules_drafts(problem) -> list[str]:
    drafts = RulesGenerator().propose(problem, None, n=DRAFTS).children
    assert drafts, f"no draft for {problem}"
    return [draft.source for draft in drafts]


@pytest.mark.parametrize("name", list(ONE_INPUT))
def test_elementwise_and_reduction_drafts_compile(name, tmp_path):
    body, inputs = ONE_INPUT[name]
    problem = one_input_problem(tmp_path, body, inputs)
    compile_drafts(rules_drafts(problem), problem, tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("body", [["r = torch.nn.functional.gelu(v)"],
                                  ["r = torch.logsumexp(v * 2.0, dim=-1)"]])
def test_matmul_drafts_compile(body, dtype, tmp_path):
    problem = write(tmp_path / "problem.py", body, "r", "linear", {"m": 64, "n": 1100, "k": 64},
                    dtype)
    compile_drafts(rules_drafts(problem), problem, tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_1x1_convolutions_matmul_drafts_compile(dtype, tmp_path):
    problem = write_problem(tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w)",
                            [BN, "v + r", "torch.relu(v)"],
                            {"x": "2, 64, 9, 9", "w": "96, 64, 1, 1", "mean": "96", "var": "96",
                             "g": "96", "b": "96", "r": "2, 96, 9, 9"}, dtype)
    drafts = RulesGenerator().propose(problem, None, n=8).children
    sources = [d.source for d in drafts if d.settings["writer"] == "write_triton_matmul"]
    assert sources, [d.settings for d in drafts]
    compile_drafts(sources, problem, tmp_path)


@pytest.mark.parametrize("dtype,channels", [(torch.float32, 3), (torch.bfloat16, 3),
                                            (torch.float32, 16)])
def test_kilns_own_convolution_compiles(dtype, channels, tmp_path):
    # A window of 81 (fp32 as three TF32 products) and of 432 (as one).
    problem = norm_mean_problem(tmp_path / "problem.py", f"2, {channels}, 6, 7, 5", 24, 2, dtype)
    graph = load_site_graph(problem)
    sources = [write_compiled(graph, replace(schedule, library_layout="gemm"))
               for schedule, _ in compiled_drafts(graph)[:2]]
    compile_drafts(sources, problem, tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_drafts_with_an_input_mask_compile(dtype, tmp_path):
    problem = attention_problem(tmp_path, *FORMS["masked_fill of an input mask == 0"], dtype,
                                head=64, queries=80, keys=80)
    graph = load_site_graph(problem)
    sources = [write_attention(graph, config) for config, _ in attention_drafts(graph)[:DRAFTS]]
    compile_drafts(sources, problem, tmp_path)


def test_a_schedule_striding_over_the_rows_compiles(tmp_path):
    problem = one_input_problem(tmp_path, "x / torch.norm(x, p=2, dim=1, keepdim=True)",
                                "torch.randn(5, 9000)")
    source = write_compiled(load_site_graph(problem), Schedule(1, 4096, 16, resident_per_sm=1))
    compile_drafts([source], problem, tmp_path)


def test_a_problem_of_gigabytes_compiles_from_launches_recorded_on_meta_tensors(tmp_path):
    # 8.6 GB of input were it drawn: the forward runs on meta tensors, its launches unrun.
    problem = one_input_problem(tmp_path, "x / torch.norm(x, p=2, dim=1, keepdim=True)",
                                "torch.randn(32768, 65535)")
    drafts = rules_drafts(problem)
    assert any("L2" in d for d in
               [p.rationale for p in RulesGenerator().propose(problem, None, n=DRAFTS).children])
    folder = tmp_path / "meta"
    folder.mkdir()
    module, jobs = launched_kernels(drafts[0], problem, folder, run=False)
    assert jobs and all(job["constexprs"].get("PASSES") for job in jobs), jobs
    failed = {name: r["error"][-300:] for name, r in compile_for_sm90(module, jobs).items()
              if "error" in r}
    assert not failed, failed


def test_a_launch_past_the_grids_limit_is_refused_where_it_is_recorded(tmp_path, monkeypatch):
    """Sizes only a GPU run reaches are checked here: 8192² elementwise, 65536 blocks of 1024
    columns, one past the 65535 a grid's second dimension takes were the splits not capped."""
    from generators.compiler import schedule

    problem = one_input_problem(tmp_path, "torch.relu(x * 2.0)", "torch.randn(8192, 8192)")
    graph = load_site_graph(problem)
    capped = write_compiled(graph, Schedule(1, 1024, 4))
    monkeypatch.setattr(schedule, "MAX_SPLITS", 1 << 20)
    uncapped = write_compiled(graph, Schedule(1, 1024, 4))
    for name in ("capped", "uncapped"):
        (tmp_path / name).mkdir()
    launched_kernels(capped, problem, tmp_path / "capped", run=False)
    with pytest.raises(ValueError, match=r"grid \(1, 65536, 1\): CUDA takes at most"):
        launched_kernels(uncapped, problem, tmp_path / "uncapped", run=False)
