"""The compiled CUDA kernels on the norms the cluster norm writer was written for, held to what it
was held to: realistic sizes, bf16, a channels-last input, and statistics far from zero. The GPU
tests judge the CUDA tier's drafts of each site (clusters, shares kept in registers or shared
memory) through the evaluator; the CPU test runs kept walks on the CPU's stand-in for CUDA."""

from __future__ import annotations

import pytest
import torch

from core.evaluate import EvalConfig, evaluate
from generators.compiler.launches import main_kernel
from generators.compiler.schedule import Schedule, cuda_drafts, in_vectors
from generators.compiler.site import program_of
from generators.cuda.program import write_cuda_compiled
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.program import compiled_drafts
from tests.cuda_on_cpu import kernels_on_cpu
from tests.kernel_checks import one_input_problem

NORMS = [
    ("F.silu(F.group_norm(x, 32, w, b))",
     "torch.randn(4, 512, 64, 64), torch.randn(512), torch.randn(512)"),
    ("F.batch_norm(x, None, None, w, b, True, 0.1, 1e-5)",
     "torch.randn(32, 256, 56, 56).bfloat16(), torch.randn(256).bfloat16(), "
     "torch.randn(256).bfloat16()"),
    ("torch.relu(F.batch_norm(x, None, None, w, b, True))",
     "torch.randn(8, 14, 14, 64).permute(0, 3, 1, 2), torch.randn(64), torch.randn(64)"),
]
IDS = ["group norm + silu", "batch norm bf16", "batch norm channels last"]
# Far from zero: a variance from plain sums of squares would lose every digit.
FAR = [("F.group_norm(x, 4, w, b)", "torch.randn(2, 8, 6, 10) + 300.0, torch.randn(8), "
        "torch.randn(8)"),
       ("torch.relu(F.batch_norm(x, None, None, w, b, True))",
        "torch.randn(6, 4, 5, 8) + 300.0, torch.randn(4), torch.randn(4)")]


def _cuda_schedules(graph) -> list[Schedule]:
    """The CUDA tier's own drafts of the site's main kernel, or, where it drafts none (a site
    L2 holds), the compiler's first two drafts in vectors."""
    program = program_of(graph)
    kernel = main_kernel(program)
    found = cuda_drafts(kernel) or in_vectors(kernel, list(compiled_drafts(graph)))[:2]
    return [schedule for schedule, _ in found]


@pytest.mark.parametrize(("body", "inputs"), FAR, ids=["group norm", "batch norm"])
@pytest.mark.parametrize("schedule", [Schedule(1, 16, 1, keep_row=True),
                                      Schedule(1, 16, 1, keep_row=True, vector=4),
                                      Schedule(1, 16, 1, splits=2)],
                         ids=["kept", "kept in vectors", "split"])
def test_statistics_stay_accurate_far_from_zero(tmp_path, body, inputs, schedule):
    path = one_input_problem(tmp_path, body, inputs, "x, w, b")
    source = write_cuda_compiled(load_site_graph(path), schedule)
    torch.manual_seed(0)
    x, w, b = eval(f"({inputs})")  # the problem's own draw, seeded
    model = eval(f"lambda x, w, b: {body}", {"torch": torch, "F": torch.nn.functional})
    namespace: dict = {}
    with kernels_on_cpu():
        exec(compile(source, "model_new.py", "exec"), namespace)
        actual = namespace["ModelNew"]()(x, w, b)
    # At 300 a value's own rounding is 1e-5 of the deviations the norm divides by, so PyTorch
    # is that far from the exact answer too: the kernel is held to a few times its error.
    exact = model(x.double(), w.double(), b.double())
    ours, theirs = ((actual - exact).abs().max().item(),
                    (model(x, w, b) - exact).abs().max().item())
    assert ours <= 4 * theirs, (f"{body} under {schedule.describe()}: {ours:.2e} from the "
                                f"exact answer, PyTorch {theirs:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize(("body", "inputs"), NORMS + FAR, ids=IDS + ["far group", "far batch"])
def test_every_cuda_draft_of_a_norm_is_accepted_on_a_gpu(tmp_path, body, inputs):
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    path = one_input_problem(tmp_path, body, inputs, "x, w, b")
    graph = load_site_graph(path)
    judged = 0
    for schedule in _cuda_schedules(graph):
        try:
            source = write_cuda_compiled(graph, schedule)
        except Unsupported:
            continue  # a share too large for registers or shared memory: the writer says so
        verdict = evaluate(path, source, EvalConfig(device="cuda", time=False))
        assert verdict.correct, f"{body} under {schedule.describe()}: {verdict.reason}"
        judged += 1
    assert judged, f"no CUDA draft of {body} was written"
