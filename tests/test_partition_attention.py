"""Attention written out is one attention site: softmax(Q·Kᵀ, scaled, masked or biased)·V in any
of its spellings, its site problem runnable and equal to the model; near misses stay cut as
before."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites, write_site_folder
from core.runtime.capture import capture
from generators.site_graph import load_site_graph
from tests.test_partition import ops_by_family, sites_of
from tests.test_site_problems import assert_same, import_problem

CPU = torch.device("cpu")
B, H, T, D = 2, 3, 11, 8


class Attention(nn.Module):
    """q, k, v [B, H, T, D] through `body`; a causal buffer for the forms that read one."""

    def __init__(self, body) -> None:
        super().__init__()
        self.body = body
        self.register_buffer("bias", torch.tril(torch.ones(16, 16, dtype=torch.bool))[None, None])

    def forward(self, q, k, v, *extra):
        return self.body(self, q, k, v, *extra)


def gpt2_eager(self, q, k, v):
    w = torch.matmul(q, k.transpose(-1, -2))
    w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
    mask = self.bias[:, :, k.size(-2) - q.size(-2):k.size(-2), :k.size(-2)]
    low = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
    w = F.softmax(torch.where(mask, w.to(w.dtype), low), dim=-1)
    return torch.matmul(F.dropout(w.type(v.dtype), 0.1, False), v)


def nanogpt(self, q, k, v):
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(self.bias[:, :, :q.size(-2), :q.size(-2)] == 0, float("-inf"))
    return F.dropout(F.softmax(att, dim=-1), 0.1, training=False) @ v


def causal_built_here(self, q, k, v):
    causal = torch.tril(torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device))
    w = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~causal, float("-inf"))
    return w.softmax(-1) @ v


def llama(self, q, k, v):
    mask = torch.full((q.size(-2), k.size(-2)), float("-inf"), device=q.device).triu(1)
    scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.size(-1)) + mask
    return torch.matmul(F.softmax(scores.float(), dim=-1).type_as(q), v)


FORMS = {
    "scaled": (lambda self, q, k, v: torch.softmax(q @ k.transpose(-2, -1) * 0.3, dim=-1) @ v,
               ("matmul", "mul", "softmax", "matmul")),
    "gpt2 eager": (gpt2_eager, ("matmul", "new_full", "new_full", "div", "to", "where",
                                "softmax", "type", "dropout", "matmul")),
    "nanogpt": (nanogpt, ("matmul", "mul", "eq", "masked_fill", "softmax", "dropout",
                          "matmul")),
    "causal mask built in the site": (causal_built_here, (
        "matmul", "new_ones", "tril", "bitwise_not", "div", "masked_fill", "softmax",
        "matmul")),
    "llama": (llama, ("matmul", "new_full", "triu", "div", "add", "float", "softmax",
                      "type_as", "matmul")),
    "additive bias": (lambda self, q, k, v, bias: torch.softmax(
        q @ k.transpose(-2, -1) * 0.3 + bias, -1) @ v, ("matmul", "mul", "add", "softmax",
                                                         "matmul")),
    "bmm": (lambda self, q, k, v: torch.bmm(torch.bmm(
        q[0], k[0].transpose(1, 2)).div(2.0).softmax(-1), v[0]),
        ("bmm", "div", "softmax", "bmm")),
}


def qkv() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return tuple(torch.randn(B, H, T, D) for _ in range(3))


@pytest.mark.parametrize("form", list(FORMS))
def test_each_written_form_is_one_attention_site_whose_problem_reproduces_it(form, tmp_path):
    body, ops = FORMS[form]
    model = Attention(body).eval()
    inputs = qkv() + ((torch.randn(B, 1, 1, T),) if form == "additive bias" else ())
    table = sites_of(model, *inputs)
    assert ops_by_family(table) == {("attention", ops)}
    site = table.sites[0]
    folder = write_site_folder(site, tmp_path, max_input_bytes=2**30)
    problem = import_problem(folder / "problem.py")
    with torch.no_grad():
        expected = model(*inputs)
        actual = problem.Model()(*torch.load(folder / "inputs.pt", weights_only=True))
    assert_same(actual, site.example_outputs[0], site.problem.signature)
    assert_same(actual, expected, f"{form}: the site against the model")
    assert load_site_graph(folder / "problem.py").family == "attention"
    # A mask or scale built in the site is made on the scores' device: the problem names none.
    assert "device" not in site.problem.source.split("def get_inputs")[0]


def test_attention_between_projections_in_a_transformer_block(tmp_path):
    """q, k and v split from one projection and viewed into heads, the output merged back: the
    views stay outside, the attention between them is one site."""

    class Block(nn.Module):
        def __init__(self, width: int = 24, heads: int = 3) -> None:
            super().__init__()
            self.heads = heads
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.register_buffer("bias", torch.tril(torch.ones(T, T))[None, None])

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                       for z in self.qkv(x).split(c, dim=2))
            y = nanogpt(self, q, k, v)
            return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

    model, x = Block().eval(), torch.randn(B, T, 24)
    table = sites_of(model, x)
    assert ("attention", FORMS["nanogpt"][1]) in ops_by_family(table)
    for site in table.sites:
        folder = write_site_folder(site, tmp_path, max_input_bytes=2**30)
        with torch.no_grad():
            out = import_problem(folder / "problem.py").Model()(
                *torch.load(folder / "inputs.pt", weights_only=True))
        assert_same(out, site.example_outputs[0], site.problem.signature)


def test_attention_whose_weights_are_also_averaged_and_dropped_is_one_site():
    """nn.MultiheadAttention's way: the weights also go to a mean its caller throws away. The
    dead mean is dropped, so the softmax has one reader and the chain is attention."""

    def with_dropped_weights(self, q, k, v):
        weights = torch.softmax(q @ k.transpose(-2, -1) * 0.3, dim=-1)
        return weights @ v, weights.mean(dim=1)

    class Caller(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = Attention(with_dropped_weights)

        def forward(self, q, k, v):
            out, _ = self.attention(q, k, v)
            return out

    table = sites_of(Caller().eval(), *qkv())
    assert ops_by_family(table) == {("attention", FORMS["scaled"][1])}


def test_scaled_dot_product_attention_stays_an_attention_site():
    for kwargs in ({"is_causal": True}, {"attn_mask": torch.ones(T, T, dtype=torch.bool),
                                         "scale": 0.5}):
        model = Attention(lambda self, q, k, v, kw=kwargs:
                          F.scaled_dot_product_attention(q, k, v, **kw))
        assert ops_by_family(sites_of(model, *qkv())) == {
            ("attention", ("scaled_dot_product_attention",))}


# Near misses: each is cut as if attention were not recognized (a softmax over the scores'
# rows then finished by the first product's tiles).
NOT_ATTENTION = {
    "softmax over the queries": (
        lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) * 0.3, dim=-2) @ v,
        {("matmul", ("matmul", "mul")), ("reduction", ("softmax",)), ("matmul", ("matmul",))}),
    "the scores read again": (
        lambda q, k, v: ((s := q @ k.transpose(-2, -1) * 0.3).softmax(-1) @ v, s),
        {("matmul", ("matmul", "mul", "softmax")), ("matmul", ("matmul",))}),
    "the probabilities returned": (
        lambda q, k, v: ((p := torch.softmax(q @ k.transpose(-2, -1), -1)) @ v, p),
        {("matmul", ("matmul", "softmax")), ("matmul", ("matmul",))}),
    "K not transposed": (
        lambda q, k, v: torch.softmax(q @ k.contiguous().transpose(-2, -1).contiguous(),
                                      -1) @ v,
        {("matmul", ("matmul", "softmax")), ("matmul", ("matmul",))}),
    "dropout in training": (
        lambda q, k, v: F.dropout(torch.softmax(q @ k.transpose(-2, -1), -1), 0.1, True) @ v,
        {("matmul", ("matmul", "softmax")), ("other", ("dropout",)), ("matmul", ("matmul",))}),
}


def test_weights_without_a_softmax_are_attention_but_wide_products_are_not():
    relu_attention = Attention(lambda self, q, k, v: torch.relu(q @ k.transpose(-2, -1) * 0.25)
                               @ v)
    assert ops_by_family(sites_of(relu_attention, *qkv())) == {
        ("attention", ("matmul", "mul", "relu", "matmul"))}

    class Products(nn.Module):  # x · w1ᵀ, then ·w2: a hidden row wider than a kernel holds
        def forward(self, x, w1, w2):
            return torch.relu(x @ w1.t()) @ w2

    wide = sites_of(Products(), torch.randn(8, 300), torch.randn(16, 300), torch.randn(16, 5))
    assert ops_by_family(wide) == {("matmul", ("matmul", "relu")), ("matmul", ("matmul",))}


@pytest.mark.parametrize("form", list(NOT_ATTENTION))
def test_what_is_not_attention_is_cut_as_before(form):
    body, expected = NOT_ATTENTION[form]
    model = Attention(lambda self, q, k, v: body(q, k, v))
    assert ops_by_family(sites_of(model, *qkv())) == expected


def test_no_attention_region_spans_a_mutation():
    def body(self, q, k, v):
        w = q @ k.transpose(-2, -1)
        v.mul_(2.0)  # a graph input written between the two matmuls: kept as written
        return torch.softmax(w, -1) @ v

    q, k, v = qkv()
    captured = capture(Attention(body), (q, k, v.clone()), CPU)
    families = [r.family for g in captured.graphs for r in g.regions]
    assert "attention" not in families and families.count("matmul") == 2
    table = find_sites(captured, GpuPeaks())
    assert all("mul" not in s.problem.ops for s in table.sites if s.family == "matmul")
