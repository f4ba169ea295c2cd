"""What an optimize run is started with, and the settings stored with it to start it again.

`run_settings` turns a config into the settings the store keeps with the run, named as the
command line names them; `config_of_settings` turns settings back into a config. `--resume`
goes through the pair, so a resumed run is the run that was started, whatever the defaults of
the day. How a run is executed (the store, the workers and where they run, the LLM endpoint)
is no setting of the run: it comes from the command line each time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from core.evaluate import EvalConfig
from core.profile.gpu_peaks import device_peaks
from core.profile.in_situ import ProfileConfig
from core.profile.load import BuiltinShape
from core.profile.pipeline import ListSitesConfig
from core.profile.roofline import GpuPeaks
from core.search.tree import SearchConfig
from generators.llm.config import LlmConfig
from store import Run

# The settings that decide what the model's profile is: a resumed run keeps them, since its
# stored kernels were judged on the sites they made.
PROFILE_SETTINGS = ("device", "dtype", "seed", "batch", "seq_len", "image_size", "out",
                    "warmup", "trials", "max_input_mb", "bandwidth", "matrix_tflops",
                    "allow_tf32")
# The settings of the search: a resumed run keeps them too, unless given again on its
# command line.
SEARCH_SETTINGS = ("budget", "max_candidates", "sites", "tiers", "cuda_share", "generator",
                   "strategy", "feedback", "counters", "site_compile", "e2e", "llm_model")


@dataclass(frozen=True)
class OptimizeConfig:
    profile: ListSitesConfig
    db: Path = Path("kiln.db")
    budget_minutes: float = 10.0
    max_candidates: int = 200
    sites: int = 5
    tiers: tuple[str, ...] = ("triton", "cuda")
    cuda_share: float = 0.10
    workers: int = 1
    gpus: tuple[int, ...] | None = None  # local executor: GPUs to spread workers over; None: all
    memory_gb: float | None = None  # device memory judging may hold per GPU; None: what is free
    executor: str = "local"  # "local": worker processes here; "ray": Ray tasks on a cluster
    ray_address: str | None = None  # None: start a Ray instance on this machine
    search: SearchConfig = SearchConfig()
    generators: tuple[str, ...] = ("rules",)  # "rules", "llm" or both, in one tree
    llm: LlmConfig = LlmConfig()
    site_compile: bool = True  # time each searched site under torch.compile as well as eager
    e2e: bool = True  # install the winners and check and time the whole model
    # Diagnoses (from kernel reports, timing and counters) steer the generators; off, they see
    # only verdicts and timings.
    feedback: bool = True
    counters: int = 0  # per site, the best kernels to read hardware counters for (0: none)

    def eval_config(self) -> EvalConfig:
        """How the run's candidates are judged."""
        memory = None if self.memory_gb is None else int(self.memory_gb * 2**30)
        return EvalConfig(device=self.profile.device, gpus=self.gpus, memory_bytes=memory,
                          allow_tf32=self.profile.allow_tf32)


def gpu_peaks(bandwidth_tbs: float | None, matrix_tflops: float | None, dtype: str | None,
              device: str) -> GpuPeaks:
    """The ceilings of the GPU `device` names (`core.profile.gpu_peaks`), or the bandwidth and
    matrix peak for the run's dtype given in their place."""
    if bandwidth_tbs is None:
        peaks = device_peaks(device)
    elif bandwidth_tbs * 1e12 == GpuPeaks().bandwidth:
        peaks = GpuPeaks()  # an H200's copy figure given: its measured ceilings
    else:
        peaks = GpuPeaks().with_bandwidth(bandwidth_tbs * 1e12)
    if not matrix_tflops:
        return peaks
    return replace(peaks, name="custom GPU",
                   matrix_flops={**peaks.matrix_flops, dtype or "fp32": matrix_tflops * 1e12})


def run_settings(config: OptimizeConfig) -> dict[str, object]:
    """What a run was started with, named as the command line names it."""
    profile = config.profile
    peaks = profile.peaks
    matrix = (None if peaks.matrix_flops == GpuPeaks().matrix_flops
              else peaks.matrix_flops[profile.dtype or "fp32"] / 1e12)
    return {"device": profile.device, "dtype": profile.dtype, "seed": profile.seed,
            "batch": profile.shape.batch, "seq_len": profile.shape.seq_len,
            "image_size": profile.shape.image_size, "out": str(profile.out),
            "warmup": profile.profile.warmup, "trials": profile.profile.trials,
            "max_input_mb": profile.max_input_bytes / 2**20,
            "bandwidth": None if peaks.detected else peaks.bandwidth / 1e12,
            "matrix_tflops": matrix,
            "allow_tf32": profile.allow_tf32,
            "budget": config.budget_minutes, "max_candidates": config.max_candidates,
            "sites": config.sites, "tiers": list(config.tiers), "cuda_share": config.cuda_share,
            "generator": ",".join(config.generators), "strategy": config.search.strategy,
            "feedback": config.feedback, "counters": config.counters,
            "site_compile": config.site_compile, "e2e": config.e2e,
            "llm_model": config.llm.model}


def config_of_settings(settings: Mapping[str, object], base: OptimizeConfig) -> OptimizeConfig:
    """`base` with `settings` in place: a setting `settings` lacks (a run stored by an older
    Kiln) stays `base`'s, and so does everything that is no setting of the run."""
    s = {**run_settings(base), **settings}
    profile = replace(
        base.profile, device=s["device"], dtype=s["dtype"], seed=s["seed"], out=Path(s["out"]),
        shape=BuiltinShape(s["batch"], s["seq_len"], s["image_size"]),
        profile=ProfileConfig(s["warmup"], s["trials"]),
        peaks=gpu_peaks(s["bandwidth"], s["matrix_tflops"], s["dtype"], s["device"]),
        max_input_bytes=int(s["max_input_mb"] * 2**20), allow_tf32=bool(s["allow_tf32"]))
    return replace(
        base, profile=profile, budget_minutes=s["budget"], max_candidates=s["max_candidates"],
        sites=s["sites"], tiers=tuple(s["tiers"]), cuda_share=s["cuda_share"],
        generators=tuple(s["generator"].split(",")),
        search=replace(base.search, seed=s["seed"], strategy=s["strategy"]),
        feedback=s["feedback"], counters=s["counters"], site_compile=s["site_compile"],
        e2e=s["e2e"], llm=replace(base.llm, model=s["llm_model"]))


def minutes_spent(run: Run) -> float:
    """The minutes a stopped run ran, from its start to its last sign of life.

    The store keeps when a run started and when it was last seen, not when each resume began:
    a run resumed before counts the time it lay stopped between its earlier stops and resumes
    too, which stops it early rather than late.
    """
    end = run.finished_at or run.heartbeat_at
    elapsed = datetime.fromisoformat(end) - datetime.fromisoformat(run.started_at)
    return max(0.0, elapsed.total_seconds() / 60)
