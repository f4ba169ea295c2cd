"""Rules Triton for attention sites: the flash-attention kernel for every written form, with and
without masks and causality, judged by the evaluator; causal tiles skipped only where the mask is
known when the kernel is written; what it cannot compute declined."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.evaluate import EvalConfig, Evaluator, evaluate
from core.runtime.install import install
from core.runtime.problem_loader import import_file
from generators.base import Parent
from generators.rules import RulesGenerator
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.attention import AttentionConfig, attention_drafts, write_attention
from generators.triton.attention_plan import read_plan
from tests.kernel_checks import assert_matches
from tests.test_install import assert_close, site_kernels
from tests.test_partition_attention import Attention, causal_built_here, gpt2_eager
from tests.test_site_problems import import_problem

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# 16 × 16 tiles: 37 keys are three steps, the last partial; 19 queries two blocks.
SMALL = AttentionConfig(block_m=16, block_n=16, num_warps=4, num_stages=2)
B, H, L, S = 2, 3, 19, 37
# Each form: (extra forward parameters, forward body, extra inputs drawn), as a site problem
# has it: written-out forms read Kᵀ as `kt`, drawn with a transposed view's strides, the others
# `k`. Every drawn mask hides all of query 3's keys (but in bf16): a row with no weight.
FORMS = {
    "scaled matmuls": ("", "return torch.softmax(q @ kt * 0.25, dim=-1) @ v",
                       ""),
    "gpt2 where with a buffer mask": (", mask", """w = torch.matmul(q, kt)
        w = w / torch.full([], q.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        low = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(mask, w.to(w.dtype), low)
        w = torch.nn.functional.softmax(w, dim=-1)
        w = torch.nn.functional.dropout(w.type(v.dtype), 0.1, False)
        return torch.matmul(w, v)""", "_mask((1, 1, L, S))"),
    "masked_fill of a causal mask built in the site": ("", """t = q.size(-2)
        causal = torch.tril(torch.ones(t, kt.size(-1), dtype=torch.bool, device=q.device))
        w = (q @ kt) / 4.0
        w = w.masked_fill(~causal, float("-inf"))
        return torch.softmax(w, dim=-1) @ v""", ""),
    "masked_fill of an input mask == 0": (", mask", """w = q @ kt * 0.25
        w = w.masked_fill(mask == 0, float("-inf"))
        return w.softmax(-1) @ v""", "_mask((B, 1, L, S)).float()"),
    "additive bias": (", bias", """w = q @ kt * 0.25 + bias
        return torch.softmax(w, dim=-1) @ v""",
                      "torch.randn(B, 1, 1, S).masked_fill(torch.rand(B, 1, 1, S) < 0.2, "
                      "float('-inf')).to(DTYPE)"),
    "llama: an additive causal mask built in the site": ("", """w = q @ kt * 0.25
        mask = torch.full((q.size(-2), kt.size(-1)), float("-inf"), device=q.device).triu(1)
        return torch.softmax((w + mask).float(), dim=-1).type_as(q) @ v""", ""),
    "a mask made before the scores, an epilogue": (", pad", """hidden = pad == 0
        w = (q @ kt * 0.25).masked_fill(hidden, float("-inf")) * 2.0
        return torch.softmax(w, -1) @ v + 1.5""", "(torch.rand(B, 1, 1, S) < 0.8).long()"),
    "an epilogue of inputs scaled before the scores": (", r, g", """scaled = r * 2.0
        w = q @ kt * 0.25
        return torch.softmax(w, -1) @ v + scaled * g""",
                                                        "torch.randn(D).to(DTYPE), "
                                                        "torch.randn(B, 1, L, 1).to(DTYPE)"),
    "relu weights of a masked scores, no softmax": (", mask", """w = q @ kt * 0.25
        w = w.masked_fill(mask == 0, float("-inf"))
        return torch.relu(w) @ v""", "_mask((B, 1, L, S)).float()"),
    "sigmoid weights, bmm, no softmax": ("", """w = torch.sigmoid(torch.bmm(q, kt) * 0.25)
        return torch.bmm(w, v) * 2.0""", ""),
    "bmm without heads": ("", """w = torch.bmm(q, kt)
        return torch.bmm(w.div(4.0).softmax(-1), v)""", ""),
    "sdpa": ("", "return torch.nn.functional.scaled_dot_product_attention(q, k, v)", ""),
    "sdpa, bool mask": (", mask", "return torch.nn.functional.scaled_dot_product_attention("
                                  "q, k, v, attn_mask=mask)", "_mask((L, S))"),
    "sdpa, float mask and scale": (", mask", "return torch.nn.functional."
                                             "scaled_dot_product_attention(q, k, v, "
                                             "attn_mask=mask, scale=0.3)",
                                   "torch.randn(B, 1, L, S).to(DTYPE)"),
    "sdpa, a residual epilogue": (", r", "return torch.nn.functional."
                                        "scaled_dot_product_attention(q, k, v) * 0.5 + r",
                                  "torch.randn(B, H, L, D).to(DTYPE)"),
    "sdpa, causal": ("", "return torch.nn.functional.scaled_dot_product_attention("
                         "q, k, v, is_causal=True)", ""),
}


def attention_problem(folder: Path, params: str, body: str, extra: str, dtype: torch.dtype,
                      head: int = 16, queries: int = L, keys: int = S) -> Path:
    """`folder/problem.py`: attention of q [B, H, queries, head] over k and v [B, H, keys,
    head]; without heads when the body calls bmm."""
    path = folder / "problem.py"
    lead = "B * H" if "bmm" in body else "B, H"
    draws = [f"torch.randn({lead}, {n}, {head}).to(DTYPE)" for n in (queries, keys, keys)]
    key = "k"
    if "kt" in body:
        draws[1] += ".transpose(-2, -1)"
        key = "kt"
    path.write_text(
        f"import torch\nimport torch.nn as nn\n\nB, H, L, S = {B}, {H}, {queries}, {keys}\n"
        f"D = {head}\n"
        f"DTYPE = {dtype}\n\n\ndef _mask(shape):\n"
        # PyTorch's CPU matmul in bf16 spreads a NaN row of P to its neighbour: there the
        # reference of a query with no key is wrong, so none is drawn.
        "    mask = torch.rand(shape) < 0.7\n    if DTYPE != torch.bfloat16:\n"
        "        mask[..., 3, :] = False\n    return mask\n\n\n"
        f"class Model(nn.Module):\n    def forward(self, q, {key}, v{params}):\n"
        f"        {body}\n\n\n"
        f"def get_inputs():\n    return [{', '.join(draws + ([extra] if extra else []))}]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    return path


def run_kernel(path: Path, config: AttentionConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's output and the problem's, on the problem's own inputs."""
    namespace: dict = {}
    exec(compile(write_attention(load_site_graph(path), config), "model_new.py", "exec"),
         namespace)
    problem = import_problem(path)
    torch.manual_seed(5)
    inputs = problem.get_inputs()
    with torch.no_grad():
        return namespace["ModelNew"]()(*inputs), problem.Model()(*inputs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_is_one_flash_kernel_the_evaluator_accepts(form, dtype, tmp_path):
    path = attention_problem(tmp_path, *FORMS[form], dtype)
    source = write_attention(load_site_graph(path), SMALL)
    verdict = evaluate(path, source, EvalConfig(device="cpu", time=False))
    assert verdict.correct, f"{form} ({dtype}): {verdict.reason}"


@pytest.mark.parametrize("head", [16, 32, 24])
def test_head_dims_and_tiles_that_do_not_divide_the_sequence(head, tmp_path):
    path = attention_problem(tmp_path, *FORMS["masked_fill of a causal mask built in the site"],
                             torch.float32, head=head, queries=37, keys=37)
    for config in (SMALL, AttentionConfig(block_m=32, block_n=16),
                   AttentionConfig(block_m=16, block_n=64)):
        actual, expected = run_kernel(path, config)
        assert_matches(actual, expected, f"head {head}, {config.describe()}")


@pytest.mark.parametrize("form,rows", [
    ("masked_fill of an input mask == 0", "nan"), ("sdpa, bool mask", "zero"),
    ("gpt2 where with a buffer mask", "uniform")])
def test_a_query_whose_keys_are_all_masked_gets_what_the_reference_gives(form, rows, tmp_path):
    path = attention_problem(tmp_path, *FORMS[form], torch.float32)
    actual, expected = run_kernel(path, SMALL)
    hidden = actual[..., 3, :]
    if rows == "nan":
        assert expected[..., 3, :].isnan().all() and hidden.isnan().all(), hidden
    elif rows == "zero":
        assert (expected[..., 3, :] == 0).all() and (hidden == 0).all(), hidden
    else:  # every logit the same finite minimum: the mean of V
        assert torch.allclose(hidden, expected[..., 3, :], atol=1e-5), hidden
    keep = torch.ones(L, dtype=torch.bool)
    keep[3] = False
    assert_matches(actual[..., keep, :], expected[..., keep, :], form)


@pytest.mark.parametrize("form,offset", [
    ("masked_fill of a causal mask built in the site", 0),
    ("llama: an additive causal mask built in the site", 0), ("sdpa, causal", 0),
    ("gpt2 where with a buffer mask", None), ("masked_fill of an input mask == 0", None),
    ("scaled matmuls", None)])
def test_causal_tiles_are_skipped_only_for_masks_known_when_written(form, offset, tmp_path):
    path = attention_problem(tmp_path, *FORMS[form], torch.float32)
    assert read_plan(load_site_graph(path)).causal_offset == offset
    assert ("hi = tl.minimum" in write_attention(load_site_graph(path), SMALL)) == (
        offset is not None)


@pytest.mark.parametrize("diagonal,fill,offset", [
    (2, 'float("-inf")', 2), (-1, 'float("-inf")', -1), (-1, "-1e9", None), (5, "-1e9", 5),
    (0, "-5.0", None)])
def test_a_causal_band_off_the_diagonal_skips_what_it_hides(diagonal, fill, offset, tmp_path):
    """Keys up to query + diagonal kept: the skipped tiles move with it. A finite fill skips only
    a fill no softmax weighs and only while every query keeps a key (else the reference spreads
    a hidden row's weight evenly)."""
    body = f"""causal = torch.ones(q.size(-2), kt.size(-1), device=q.device).tril({diagonal})
        w = (q @ kt).masked_fill(causal == 0, {fill})
        return torch.softmax(w, dim=-1) @ v"""
    path = attention_problem(tmp_path, "", body, "", torch.float32, queries=37, keys=37)
    assert read_plan(load_site_graph(path)).causal_offset == offset
    actual, expected = run_kernel(path, SMALL)
    assert torch.equal(actual.isnan(), expected.isnan())
    rows = ~expected.isnan().any(-1).flatten(0, 1).any(0)
    assert_matches(actual[..., rows, :], expected[..., rows, :], f"tril({diagonal}), {fill}")


@pytest.mark.parametrize("params,body,reason", [
    ("", "return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1)",
     "dropout"),
    ("", "return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)",
     "grouped query"),
    ("", """band = torch.ones(q.size(-2), kt.size(-1), device=q.device).tril().triu(-2)
        w = (q @ kt).masked_fill(band == 0, float("-inf"))
        return torch.softmax(w, dim=-1) @ v""", "neither one value nor a band"),
])
def test_what_it_cannot_compute_is_declined_with_the_reason(params, body, reason, tmp_path):
    path = attention_problem(tmp_path, params, body, "", torch.float32)
    with pytest.raises(Unsupported, match=reason):
        write_attention(load_site_graph(path), SMALL)


def test_a_head_dimension_over_what_a_program_holds_is_declined(tmp_path):
    path = attention_problem(tmp_path, *FORMS["scaled matmuls"], torch.float32, head=1024,
                             queries=32, keys=32)
    with pytest.raises(Unsupported, match="head dimension 1024, over 256"):
        write_attention(load_site_graph(path), SMALL)
    proposals = RulesGenerator().propose(path, None, n=3)
    assert not proposals.children and "head dimension 1024" in proposals.declined


def test_tiles_over_what_shared_memory_holds_are_declined(tmp_path):
    """GPT-2's masked attention in fp32 (head dim 64): three tf32 products at 128 × 64 tiles
    fit sm_90's shared memory at two stages, not at three (Triton asked 288 KiB of 227)."""
    path = attention_problem(tmp_path, *FORMS["gpt2 where with a buffer mask"], torch.float32,
                             head=64)
    graph = load_site_graph(path)
    fitting = AttentionConfig(128, 64, 4, 2, precision="tf32x3")
    write_attention(graph, fitting)
    with pytest.raises(Unsupported, match="at least 256 KiB in shared memory, more than "
                                          "sm_90's 227: fewer stages or smaller tiles"):
        write_attention(graph, AttentionConfig(128, 64, 4, 3, precision="tf32x3"))
    for config, _ in attention_drafts(graph):
        write_attention(graph, config)  # every draft fits


def test_the_rules_generator_drafts_and_mutates_attention(tmp_path):
    path = attention_problem(tmp_path, *FORMS["gpt2 where with a buffer mask"], torch.float32)
    generator = RulesGenerator()
    drafts = generator.propose(path, None, n=4)
    assert drafts.children, drafts.declined
    assert {d.settings["writer"] for d in drafts.children} == {"write_attention"}
    assert drafts.children[0].settings["precision"] == "tf32x3"  # fp32 at fp32's accuracy
    children = generator.propose(path, Parent(drafts.children[0]), n=8).children
    assert len(children) >= 4, [c.rationale for c in children]
    for child in children:
        moved = [k for k, v in child.settings.items() if drafts.children[0].settings[k] != v]
        assert len(moved) == 1 and moved[0] in ("block_m", "block_n", "num_warps",
                                                "num_stages", "precision"), child.settings
    for config, why in attention_drafts(load_site_graph(path)):
        verdict = evaluate(path, write_attention(load_site_graph(path), config),
                           EvalConfig(device="cpu", time=False))
        assert verdict.correct, f"{why}: {verdict.reason}"


@pytest.mark.parametrize("body", [causal_built_here, gpt2_eager])
def test_the_kernel_installed_in_the_model_keeps_it_correct(body, tmp_path):
    """Captured from a model, cut, written as a site problem, drafted, installed back."""
    model = Attention(body).eval()
    torch.manual_seed(0)
    inputs = tuple(torch.randn(2, 3, 13, 8) for _ in range(3))
    kernels = [k for k in site_kernels(model, inputs, tmp_path) if k.key.startswith("attention")]
    assert len(kernels) == 1 and "attention_kernel" in kernels[0].source
    torch._dynamo.reset()
    installed = install(model, kernels, rest="eager")
    with torch.no_grad():
        assert_close(installed(*inputs), model(*inputs), body.__name__)
    assert installed.stats() == {f"{kernels[0].key}: kernel": 1}, installed.stats()


@pytest.fixture(scope="module")
def gpu_evaluator():
    """Four workers: a form's drafts compile side by side (the compiles are most of the time)."""
    with Evaluator(EvalConfig(device="cuda", time=False), workers=4) as shared:
        yield shared


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_and_draft_on_the_gpu(form, dtype, tmp_path, gpu_evaluator):
    path = attention_problem(tmp_path, *FORMS[form], dtype, head=64, queries=200, keys=200)
    graph = load_site_graph(path)
    drafts = [(SMALL, "small tiles"), *attention_drafts(graph)]
    verdicts = gpu_evaluator.evaluate_many([(path, write_attention(graph, config))
                                            for config, _ in drafts])
    for (_, why), verdict in zip(drafts, verdicts, strict=True):
        assert verdict.correct, f"{form} ({dtype}), {why}: {verdict.reason}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpt2_small_masked_causal_attention_against_torch_compile(dtype, tmp_path):
    """Batch 8, 12 heads, 1024 tokens, head dim 64: written with matmuls and masked_fill."""
    import triton.testing

    path = attention_problem(tmp_path, *FORMS["masked_fill of a causal mask built in the site"],
                             dtype, head=64, queries=1024, keys=1024)
    path.write_text(path.read_text().replace("B, H, L, S = 2, 3,", "B, H, L, S = 8, 12,"))
    problem = import_problem(path)
    inputs = [x.cuda() for x in problem.get_inputs()]
    model = problem.Model().cuda()
    compiled = torch.compile(model)
    with torch.no_grad():
        exact = model(*(x.double() for x in inputs))
        eager_error = relative_error(model(*inputs), exact)
        compiled_ms = triton.testing.do_bench(lambda: compiled(*inputs))
    graph = load_site_graph(path)
    for number, (config, why) in enumerate(attention_drafts(graph)):
        source = tmp_path / f"model_new_{number}.py"  # Triton reads a kernel's source file
        source.write_text(write_attention(graph, config))
        kernel = import_file(source, source.stem).ModelNew()
        with torch.no_grad():
            actual = kernel(*inputs)
            kernel_ms = triton.testing.do_bench(lambda kernel=kernel: kernel(*inputs))
        error = relative_error(actual, exact)
        print(f"{dtype} {why}; {config.describe()}: {kernel_ms:.3f} ms, torch.compile "
              f"{compiled_ms:.3f} ms, {compiled_ms / kernel_ms:.2f}x, relative error {error:.2e} "
              f"(eager {eager_error:.2e})")
        # As close to the fp64 answer as PyTorch's own kernels in the same dtype, give or take
        # a rounding of the output.
        assert error <= 2 * eager_error + (1e-4 if dtype == torch.float32 else 8e-3), error


def relative_error(actual: torch.Tensor, exact: torch.Tensor) -> float:
    """The largest error over the largest magnitude of the exact answer."""
    return ((actual.double() - exact).abs().max() / exact.abs().max()).item()
