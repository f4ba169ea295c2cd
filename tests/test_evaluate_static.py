"""Static rules: what a candidate may import, call and do before anything of it runs."""

from __future__ import annotations

import pytest

from core.evaluate.static_rules import check_candidate, problem_anchors

POINTWISE = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
             "        return x * 2\n")
MATMUL = ("import torch\nimport torch.nn.functional as F\nclass Model(torch.nn.Module):\n"
          "    def forward(self, x, w):\n        return F.gelu(F.linear(x, w))\n")

KERNEL = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2, mask=offsets < n)
'''


def candidate(forward_body: str, header: str = "") -> str:
    return header + KERNEL + (
        "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        out = torch.empty_like(x)\n"
        "        double[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)\n"
        + "".join(f"        {line}\n" for line in forward_body.splitlines())
    )


def test_a_plain_triton_candidate_passes_as_tier_triton():
    report = check_candidate(candidate("return out"), POINTWISE)
    assert report.ok, report.violations
    assert report.tier == "triton"


@pytest.mark.parametrize(
    ("header", "body", "expected"),
    [
        ("import os\n", "return out", "imports os"),
        ("import socket\n", "return out", "imports socket"),
        ("import time\n", "return out", "imports time"),
        ("from concurrent.futures import ThreadPoolExecutor\n", "return out",
         "imports concurrent.futures"),
        ("import pycuda.autoinit\n", "return out", "a second CUDA context"),
        ("", "s = torch.cuda.Stream()\nreturn out", "torch.cuda.Stream"),
        ("", "e = torch.cuda.Event(enable_timing=True)\nreturn out", "timers"),
        ("", "out.record_stream(None)\nreturn out", ".record_stream"),
        ("", "torch.backends.cuda.matmul.allow_tf32 = True\nreturn out",
         "global numeric flags"),
        ("", "torch.save(out, 'x.pt')\nreturn out", "file I/O"),
        ("", "open('/tmp/x').read()\nreturn out", "uses open()"),
        ("", "f = getattr(torch, 'relu')\nreturn out", "uses getattr()"),
        ("", "try:\n    pass\nexcept Exception:\n    pass\nreturn out", "catches exceptions"),
        ("", "global CACHE\nreturn out", "declares globals"),
        ("", "return torch.softmax(out, -1)", "calls torch.softmax"),
        ("", "return torch.matmul(out, out)", "allowed only on a matmul site"),
        ("", "return x.__class__(out)", ".__class__"),
        ("import triton.testing\n", "return out", "timers"),
    ],
)
def test_banned_constructs_are_named_with_their_line(header, body, expected):
    report = check_candidate(candidate(body, header), POINTWISE)
    assert not report.ok
    assert any(expected in violation for violation in report.violations), report.violations
    assert all(violation.startswith("line ") for violation in report.violations)


def test_monkey_patching_a_module_is_banned():
    source = candidate("return out") + "\ntriton.testing.do_bench = lambda fn: 0.0\n"
    report = check_candidate(source, POINTWISE)
    assert any("monkey-patch" in v for v in report.violations), report.violations


def test_caching_decorators_are_banned():
    source = candidate("return out", "import functools\n") + (
        "\n@functools.lru_cache\ndef remembered(key):\n    return key\n")
    assert any("may not cache" in v for v in check_candidate(source, POINTWISE).violations)


def test_no_custom_kernel_is_rejected():
    source = ("import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
              "    def forward(self, x):\n        return x.clone()\n")
    report = check_candidate(source, POINTWISE)
    assert any(v.startswith("no custom kernel") for v in report.violations)


def test_library_anchor_is_allowed_on_a_matmul_site_and_recorded():
    body = "y = torch.nn.functional.linear(out, out)\nreturn y"
    report = check_candidate(candidate(body), MATMUL)
    assert report.ok, report.violations
    assert report.library_ops == ["torch.nn.functional.linear"]


def test_cuda_source_with_the_runtime_helper_is_tier_cuda():
    source = ('import torch.nn as nn\nfrom core.runtime.cuda import load_kernel\n'
              'SRC = r"""\n__global__ void k(float* x) { x[0] = 1.0f; }\n"""\n'
              'class ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n')
    report = check_candidate(source, POINTWISE)
    assert report.ok, report.violations
    assert report.tier == "cuda"
    assert report.cuda_sources[0][0] == 3


def test_problem_anchors_cover_functional_modules_and_the_matmul_operator():
    assert problem_anchors(MATMUL) == {"matmul"}
    assert problem_anchors("import torch.nn as nn\nl = nn.Conv2d(3, 3, 3)\n") == {"conv"}
    assert problem_anchors("def f(a, b):\n    return a @ b\n") == {"matmul"}
    assert problem_anchors(POINTWISE) == set()


def test_a_syntax_error_is_raised_for_the_caller_to_report():
    with pytest.raises(SyntaxError):
        check_candidate("def broken(:\n", POINTWISE)
