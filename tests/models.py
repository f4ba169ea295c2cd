"""Small real models the tests capture, cut and rebuild."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLPBlock(nn.Module):
    """Linear + GELU, linear, residual, LayerNorm: the shape of a post-norm (BERT-style)
    transformer MLP, whose norm the down projection's tiles finish."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(F.gelu(self.up(x))))


class StackedMLP(nn.Module):
    """Three identical blocks: one site per kind of region, each with three call sites."""

    def __init__(self, hidden: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(hidden) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class DataDependent(nn.Module):
    """Python control flow on tensor values: graph breaks that defeat tracing and export."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.proj(x))
        h = h * 2 + 1 if h.sum() > 0 else h.softmax(dim=-1)
        for _ in range(int(x.abs().max().item() > 0) + 1):
            h = torch.sigmoid(self.proj(h)) * x
        return h.mean(dim=0)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class TinyResNet(nn.Module):
    """ResNet's shape: stem, residual blocks with in-place ReLU, pooling, classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(inplace=True))
        self.layers = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 8, 1),
                                    BasicBlock(8, 16, 2))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class TupleReductions(nn.Module):
    """Reductions with two results (values and indices): one result used, then both."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        largest = torch.max(x, dim=1)[0]
        values, indices = torch.min(torch.relu(x), dim=-1)
        return largest, values * 2, indices


def _randomize_norms(model: nn.Module) -> nn.Module:
    """Non-trivial running statistics, so batch norm is not an identity."""
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.5, generator=generator)
            module.running_var.uniform_(0.5, 2.0, generator=generator)
    return model.eval()


def make_mlp() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return MLPBlock().eval(), (torch.randn(4, 8, 32),)


def make_stacked_mlp() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return StackedMLP().eval(), (torch.randn(4, 8, 32),)


def make_cnn() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return _randomize_norms(SmallCNN()), (torch.randn(2, 3, 16, 16),)


def make_data_dependent() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return DataDependent().eval(), (torch.randn(4, 16),)


def make_resnet() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return _randomize_norms(TinyResNet()), (torch.randn(2, 3, 16, 16),)


def make_tuple_reductions() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return TupleReductions().eval(), (torch.randn(4, 9, 7),)


def make_raising() -> tuple[nn.Module, tuple]:
    raise ValueError("checkpoint missing")


class ReturnsNothing(nn.Module):
    def forward(self, x: torch.Tensor) -> None:
        x.sum()


def make_returns_nothing() -> tuple[nn.Module, tuple]:
    return ReturnsNothing(), (torch.randn(3),)


class FixedPrecision(nn.Module):
    """Computes in fp32 whatever its weights are: a cast to fp16 breaks it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() @ self.weight


def make_fixed_precision() -> tuple[nn.Module, tuple]:
    return FixedPrecision(), (torch.randn(4, 8),)


GPT2_TINY = "hf:gpt2?n_layer=2&n_embd=64&n_head=4&vocab_size=128&n_positions=32"
