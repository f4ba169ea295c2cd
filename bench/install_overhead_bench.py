"""What installing costs a whole model: each site replaced by its own PyTorch ops.

    python -m bench.install_overhead_bench torchvision:resnet50 [--dtype bf16] [--batch 32]
                                           [--family conv] [--sites 1,all] [--rules]
                                           [--drafts N] [--channels-last]

A site whose kernel is its own ops (the site problem's `Model` as the `ModelNew`) gives the
model nothing to gain, so whatever it loses against `torch.compile` is the price of the
boundary: the custom op inductor cannot fuse across, the layout it must hand over, the Python
call. Rows: torch.compile, then the largest `--family` sites (by floor) replaced by their own
ops, one count per `--sites` entry; `--rules` adds the same sites with the rules generator's
first draft, called through the custom op and traced into inductor's graph (`core.runtime.inline`),
and with `--drafts N` its next N-1 drafts too, traced (a convolution site's second draft is its
channels-last twin): which of a site's kernels keeps its speed in the model, and where the
time goes when one does not (a copy inductor adds, a lost fusion). `--channels-last` captures,
drafts and installs the model behind an entry that makes its 4-D inputs channels-last, as
inductor's layout optimization does, so that every site is judged on the strides inductor
would give it (the first row stays `torch.compile` of the model as given, the baseline).
Each row gives the median time (the evaluator's timing), the CPU time to enqueue one forward,
the kernels the GPU ran per forward and their summed time (torch.profiler), and the kernel
calls against fallbacks.
`--device cpu` runs the same rows on the CPU (Triton drafts need TRITON_INTERPRET=1 there).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.optimize.e2e import fresh_like  # noqa: E402
from core.profile.load import BuiltinShape, load_model  # noqa: E402
from core.profile.roofline import GpuPeaks  # noqa: E402
from core.profile.sites import Site, find_sites  # noqa: E402
from core.runtime.capture import capture  # noqa: E402
from core.runtime.guarded import SiteKernel
from core.runtime.install import install  # noqa: E402
from core.timing.device_lock import device_lock_path, exclusive_device
from core.timing.model_timing import time_model  # noqa: E402
from generators.rules import RulesGenerator  # noqa: E402

PASSTHROUGH = "\n\nclass ModelNew(Model):\n    \"\"\"The site's own ops.\"\"\"\n"


def own_ops(site: Site) -> SiteKernel:
    return SiteKernel(site.key, site.problem.source + PASSTHROUGH, site.problem.source)


class ChannelsLastEntry(torch.nn.Module):
    """`model` with its 4-D floating-point inputs made channels-last first: cuDNN then returns
    channels-last outputs, and the ops after them keep that layout."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: object) -> object:
        return self.model(*(a.contiguous(memory_format=torch.channels_last)
                            if isinstance(a, torch.Tensor) and a.dim() == 4
                            and a.is_floating_point() else a for a in args))


def rules_drafts(site: Site, folder: Path, count: int) -> list[tuple[SiteKernel, str]]:
    """The rules generator's first `count` Triton drafts for `site`, each with why it was made."""
    problem = folder / site.key / "problem.py"
    problem.parent.mkdir(parents=True, exist_ok=True)
    problem.write_text(site.problem.source)
    drafts = RulesGenerator().propose(problem, None, count, tiers=("triton",)).children
    return [(SiteKernel(site.key, d.source, site.problem.source), d.rationale)
            for d in drafts[:count]]


def profile(run: object, inputs: list, device: torch.device
            ) -> tuple[int, float, list[tuple[str, float]]]:
    """Kernels per forward, their summed device time (ms) and the five longest kernel names
    (on the CPU: the ATen ops at the bottom of the stack)."""
    activity, kind = ((torch.profiler.ProfilerActivity.CUDA, torch.autograd.DeviceType.CUDA)
                      if device.type == "cuda" else
                      (torch.profiler.ProfilerActivity.CPU, torch.autograd.DeviceType.CPU))
    with torch.no_grad(), torch.profiler.profile(activities=[activity]) as prof:
        run(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == kind and not e.cpu_children]
    by_name: Counter[str] = Counter()
    for event in kernels:
        by_name[event.name[:60]] += event.device_time / 1e3
    return len(kernels), sum(by_name.values()), by_name.most_common(5)


def enqueue_time_us(run: object, inputs: list, device: torch.device, calls: int = 50) -> float:
    """CPU time per forward with the GPU left to catch up: what each call costs before its
    work is queued (the queue holds far more than `calls` forwards' kernels)."""
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(calls):
            run(*inputs)
        spent = time.perf_counter() - start
        if device.type == "cuda":
            torch.cuda.synchronize()
    return spent / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--family", default="conv")
    parser.add_argument("--sites", default="1,all", help="site counts to replace")
    parser.add_argument("--rules", action="store_true", help="also the rules' first drafts")
    parser.add_argument("--drafts", type=int, default=1,
                        help="with --rules, each site's first N drafts, one row each")
    parser.add_argument("--channels-last", action="store_true",
                        help="sites captured and installed behind a channels-last entry")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    loaded = load_model(args.model, device, args.dtype, shape=BuiltinShape(batch=args.batch))
    original, inputs = loaded.model, loaded.inputs
    model = ChannelsLastEntry(original) if args.channels_last else original
    table = find_sites(capture(model, inputs, device), GpuPeaks())
    # Largest by byte/FLOP floor over all calls: sites are not timed here.
    sites = sorted((s for s in table.sites if s.family == args.family),
                   key=lambda s: -s.floor_ms)
    input_sets = [list(fresh_like(inputs, seed)) for seed in (101, 102, 103)]
    rows: list[tuple[str, object, Counter[str]]] = [("torch.compile", torch.compile(original),
                                                      Counter())]
    if args.channels_last:
        rows.append(("torch.compile, channels-last entry", torch.compile(model), Counter()))
    folder = Path(tempfile.mkdtemp(prefix="kiln-install-overhead-"))
    for count in args.sites.split(","):
        chosen = sites if count == "all" else sites[:int(count)]
        variants = [("own ops", [own_ops(s) for s in chosen], None)]
        if args.rules:
            per_site = [rules_drafts(s, folder, args.drafts) for s in chosen]
            first = [drafts[0][0] for drafts in per_site if drafts]
            variants += [("rules draft, custom op", first, False),
                         ("rules draft, traced", first, True)]
            for index in range(1, args.drafts):
                later = [drafts[index] for drafts in per_site if len(drafts) > index]
                why = f" ({later[0][1]})" if len(later) == 1 else ""
                variants.append((f"rules draft {index + 1}, traced{why}",
                                 [kernel for kernel, _ in later], True))
        for label, kernels, trace in variants:
            calls: Counter[str] = Counter()
            torch._dynamo.reset()
            rows.append((f"{len(kernels)} site(s), {label}",
                         install(model, kernels, rest="inductor", calls=calls, trace=trace),
                         calls))
    where = torch.cuda.get_device_name() if device.type == "cuda" else "the CPU"
    entry = ", behind a channels-last entry" if args.channels_last else ""
    print(f"{args.model} {args.dtype} batch {args.batch}{entry} on {where}, "
          f"torch {torch.__version__}; {len(sites)} {args.family} sites, largest first: "
          + ", ".join(f"{s.key} (floor {s.floor_ms:.4f} ms)" for s in sites[:3]))
    print("\n| model | ms | CPU µs / forward | kernels / forward | GPU kernel ms | kernel calls "
          "| fallbacks | longest kernels |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, run, calls in rows:
        with torch.no_grad():
            run(*input_sets[0])
        with exclusive_device(device_lock_path(device.type)):  # other Kiln runs wait
            ms = time_model(run, input_sets, device, 10, 50, 500.0).median_ms
            enqueue_us = enqueue_time_us(run, input_sets[0], device)
            calls.clear()  # from here, one forward's
            count, kernel_ms, longest = profile(run, input_sets[0], device)
        kernel_calls = sum(n for k, n in calls.items() if k.endswith(": kernel"))
        fallbacks = sum(calls.values()) - kernel_calls
        print(f"| {label} | {ms:.4f} | {enqueue_us:.0f} | {count} | {kernel_ms:.4f} "
              f"| {kernel_calls} | {fallbacks} "
              f"| {'; '.join(f'{name} {t:.3f}' for name, t in longest)} |", flush=True)


if __name__ == "__main__":
    main()
