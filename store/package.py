"""The `package` export: a Python package of a run's winning kernels and `install(model)`.

The package carries everything it needs and nothing of Kiln's beyond a copy of `core/runtime/`
(as `_kiln/`: the modules that find sites in a graph and swap them, and the CUDA launcher), so
it runs where only torch and triton (and pycuda, for CUDA kernels) are installed.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict
from pathlib import Path

from core.runtime.errors import KilnInputError
from core.runtime.guarded import SiteKernel
from store.labels import CPU_TIMINGS
from store.reader import StoreReader
from store.records import Run
from store.site_names import check_site_keys

PACKAGE = "kiln_kernels"
FILES = Path(__file__).resolve().parent / "package_files"
RUNTIME = Path(__file__).resolve().parents[1] / "core" / "runtime"
# A CUDA kernel imports its launcher as `core.runtime.cuda` (or, stored by earlier versions,
# `core.cuda_runtime`): in the package, that is the copy in `_kiln`.
_CUDA_IMPORT = re.compile(r"^from core\.(?:runtime\.cuda|cuda_runtime) import ", re.MULTILINE)


def _vendor(kernel_source: str) -> str:
    """Point a kernel's import of the CUDA launcher at the package's own copy."""
    return _CUDA_IMPORT.sub(f"from {PACKAGE}._kiln.cuda import ", kernel_source)


def _cell(value: object) -> str:
    """`value` as one cell of a Markdown table: a `|` would end the cell, a newline the row."""
    return " ".join(str(value).splitlines()).replace("|", "\\|")


def _readme(run: Run, sites: list[dict[str, object]]) -> str:
    rows = "\n".join(
        f"| `{_cell(s['key'])}` | {_cell(s['family'])} | {_cell(s['tier'])} | "
        f"{s['latency_ms']:.4f} | {s['speedup']:.2f}x | {_cell(s['signature'])} |" for s in sites)
    measured = (f"{CPU_TIMINGS}: the Triton interpreter on the CPU, not a GPU's speed"
                if run.cpu_timings else "measured by the evaluator")
    return f"""# {PACKAGE}

Kernels Kiln found for `{run.model_spec}` (run {run.id}, {run.gpu}), each proven correct
against PyTorch by Kiln's evaluator and timed against it.

```python
import {PACKAGE}
fast = {PACKAGE}.install(model)   # the unmodified model, its sites calling these kernels
fast(*inputs)
{PACKAGE}.stats()                 # kernel calls and fallbacks per site
```

A call whose inputs differ from those a kernel was proven on (shape, stride, dtype, device),
or that needs gradients, runs the site's original PyTorch ops instead.

On a machine where no CUDA device is visible, `import {PACKAGE}` turns on Triton's interpreter
(sets `TRITON_INTERPRET=1`) so that the Triton kernels run on the CPU; it can do so only before
Triton is imported, so if Triton was imported first it raises an error saying to set
`TRITON_INTERPRET=1` in the environment.

| site | family | tier | latency ms | speedup | signature |
| --- | --- | --- | --- | --- | --- |
{rows}

Speedups are against the site's PyTorch reference on {_cell(run.gpu)}, {measured}.
"""


def export_package(store: StoreReader, out: Path, run_id: int | None = None,
                   min_speedup: float = 1.0) -> list[Path]:
    """Write `out/kiln_kernels/`: the run's fastest kernel per site that is faster than PyTorch
    by more than `min_speedup`; below 1, correct kernels slower than PyTorch qualify too."""
    run_id = store.latest_run_id() if run_id is None else run_id
    run = store.run(run_id)
    # Kernels the end-to-end check took out (wrong or slower in the whole model) stay out.
    removed = set((run.e2e or {}).get("removed", {}))
    winners = [w for w in store.best(run_id, slower=min_speedup < 1.0)
               if (w.speedup or 0.0) > min_speedup and w.site_key not in removed]
    if not winners:
        raise KilnInputError(
            f"run {run_id} has no correct kernel faster than PyTorch by more than "
            f"{min_speedup}x", "let the search find one, or pass a lower --min-speedup")
    check_site_keys((winner.site_key for winner in winners), run_id)
    root = out / PACKAGE
    try:
        if root.exists():
            shutil.rmtree(root)
        for folder in (root / "kernels", root / "problems"):
            folder.mkdir(parents=True)
        written = []
        for name in ("__init__.py", "install.py"):
            shutil.copyfile(FILES / name, root / name)
            written.append(root / name)
        shutil.copytree(RUNTIME, root / "_kiln", ignore=shutil.ignore_patterns("__pycache__"))
        written += sorted((root / "_kiln").glob("*.py"))
        sites = []
        for winner in winners:
            site = store.site(winner.site_id)
            kernel = root / "kernels" / f"{site.key}.py"
            kernel.write_text(_vendor(store.candidate(winner.id).source))
            problem = root / "problems" / f"{site.key}.py"
            problem.write_text(site.problem_source)
            written += [kernel, problem]
            sites.append({"key": site.key, "family": site.family, "signature": site.signature,
                          "tier": winner.tier, "generator": winner.generator,
                          "candidate_id": winner.id, "latency_ms": winner.latency_ms,
                          "speedup": winner.speedup,
                          "proven": [asdict(p) for p in SiteKernel(
                              site.key, "", site.problem_source).proven()]})
        (root / "sites.json").write_text(json.dumps(sites, indent=2))
        (root / "README.md").write_text(_readme(run, sites))
    except OSError as err:
        raise KilnInputError(f"cannot write {root}: {err.strerror or err}",
                             "pass --out with a writable folder") from err
    return [*written, root / "sites.json", root / "README.md"]
