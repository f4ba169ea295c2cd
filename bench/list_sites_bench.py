"""GPU benchmark of `--list-sites`: site tables, and whether the parts add up to the model.

For each model the in-situ site times plus the time kept with PyTorch should come within 10%
of the model time measured separately. Also measures the ceilings floors are computed against.

    python bench/list_sites_bench.py [--out DIR] [--trials N]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from core.profile.in_situ import ProfileConfig
from core.profile.load import BuiltinShape
from core.profile.pipeline import ListSitesConfig, list_sites
from core.profile.site_table import print_site_table

CASES = [
    ("torchvision:resnet50", "fp32", BuiltinShape(batch=32)),
    ("torchvision:resnet50", "bf16", BuiltinShape(batch=32)),
    ("hf:gpt2", "fp32", BuiltinShape(batch=8, seq_len=1024)),
    ("hf:gpt2", "bf16", BuiltinShape(batch=8, seq_len=1024)),
]


def _median_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def ceilings() -> dict[str, float]:
    """Copy bandwidth and matrix rates on random data, the figures floors rest on."""
    n = 2**30
    buffers = [torch.randn(n // 4, device="cuda"), torch.empty(n // 4, device="cuda")]
    copy_ms = _median_ms(lambda: buffers[1].copy_(buffers[0]))
    result = {"copy_TBps": 2 * n / (copy_ms * 1e-3) / 1e12}
    buffers.clear()
    size = 8192
    for label, dtype, tf32 in (("bf16", torch.bfloat16, False), ("fp16", torch.float16, False),
                               ("fp32", torch.float32, False), ("tf32", torch.float32, True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(size, size, device="cuda", dtype=dtype)
        b = torch.randn(size, size, device="cuda", dtype=dtype)
        ms = _median_ms(lambda a=a, b=b: a @ b, reps=10)
        result[f"{label}_TFLOPs"] = 2 * size**3 / (ms * 1e-3) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("kiln-out/bench"))
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    versions = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "cuda": torch.version.cuda, "python": platform.python_version(),
                "date": time.strftime("%Y-%m-%d")}
    print("versions:", json.dumps(versions))
    peaks = ceilings()
    print("ceilings:", json.dumps({k: round(v, 2) for k, v in peaks.items()}))
    summary = []
    for spec, dtype, shape in CASES:
        start = time.perf_counter()
        report = list_sites(ListSitesConfig(
            model=spec, device="cuda", dtype=dtype, out=args.out, shape=shape,
            profile=ProfileConfig(warmup=5, trials=args.trials), max_input_bytes=16 * 2**20,
        ))
        wall = time.perf_counter() - start
        print(f"\n=== {spec} {dtype} batch {shape.batch}"
              + (f" seq {shape.seq_len}" if spec.startswith("hf:") else "") + " ===")
        print_site_table(report)
        (args.out / f"{spec.replace(':', '_')}_{dtype}.json").write_text(json.dumps(report))
        sites_ms = sum(s["time_ms"] for s in report["sites"])
        summary.append((spec, dtype, report["total_ms"], report["captured_ms"], sites_ms,
                        report["kept_ms"] + report["outside_ms"], report["accounted_ms"],
                        len(report["sites"]), report["graphs"], wall))
    print(f"\n{'model':<22}{'dtype':<6}{'eager ms':>10}{'captured':>10}{'sites ms':>10}"
          f"{'kept ms':>9}{'sum/capt':>9}{'sum/eager':>10}{'sites':>6}{'graphs':>7}{'wall s':>8}")
    for spec, dtype, total, captured, sites_ms, kept, accounted, n, graphs, wall in summary:
        print(f"{spec:<22}{dtype:<6}{total:10.3f}{captured:10.3f}{sites_ms:10.3f}{kept:9.3f}"
              f"{accounted / captured:9.3f}{accounted / total:10.3f}{n:6d}{graphs:7d}"
              f"{wall:8.1f}")


if __name__ == "__main__":
    main()
