"""`python -m core.optimize MODEL`: profile a model, search kernels for its hot sites, report.

With `--list-sites` it stops after profiling and prints the ranked site table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from core.optimize.config import (
    PROFILE_SETTINGS,
    SEARCH_SETTINGS,
    OptimizeConfig,
    config_of_settings,
)
from core.optimize.interrupt import EXIT_INTERRUPTED
from core.optimize.markdown_report import write_markdown_report
from core.optimize.report import note_declines, print_search_table
from core.optimize.run import OptimizeRun
from core.profile.load import DTYPES
from core.profile.pipeline import ListSitesConfig, list_sites
from core.profile.progress import Progress
from core.profile.site_table import print_site_table
from core.runtime.errors import KilnInputError, error_line
from generators.llm.config import LlmConfig
from store import open_reader

TIERS = ("triton", "cuda")
GENERATORS = ("rules", "llm")
SETTINGS = PROFILE_SETTINGS + SEARCH_SETTINGS  # each the name of its command-line option


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m core.optimize", description=__doc__)
    parser.add_argument("model", nargs="?",
                        help="KernelBench .py file, package.module:callable, "
                        "torchvision:<name> or hf:<model_type>[?key=value&...]")
    parser.add_argument("--list-sites", action="store_true",
                        help="stop after profiling and print the ranked site table")
    parser.add_argument("--device", choices=["cuda", "cpu"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), help="cast model and inputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--out", type=Path, default=Path("kiln-out"),
                        help="where site problems are written (default: kiln-out)")
    parser.add_argument("--batch", type=int, default=1, help="batch size of built-in models")
    parser.add_argument("--seq-len", type=int, default=128, help="sequence length (hf: text)")
    parser.add_argument("--image-size", type=int, default=224, help="image size (vision)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--trials", type=int, default=20, help="timed forwards (median)")
    parser.add_argument("--max-input-mb", type=float, default=256,
                        help="save a site's captured inputs up to this size")
    parser.add_argument("--bandwidth", type=float,
                        help="GPU memory bandwidth for floors, TB/s (default: the GPU's, read "
                        "from its memory clock and bus width; an H200's measured figures on an "
                        "H200 and on the CPU)")
    parser.add_argument("--matrix-tflops", type=float,
                        help="matrix peak for the model's dtype, TFLOP/s (default: an H200's, "
                        "which the H100 shares)")
    parser.add_argument("--allow-tf32", action="store_true",
                        help="let fp32 matmuls run on TF32 tensor cores, in the baselines as in "
                             "the kernels (default: fp32 stays fp32, as in PyTorch)")
    search = parser.add_argument_group("search (without --list-sites)")
    search.add_argument("--budget", type=float, default=10.0, help="minutes of search")
    search.add_argument("--max-candidates", type=int, default=200,
                        help="kernels evaluated in all, across sites")
    search.add_argument("--sites", type=int, default=5, help="how many of the hottest sites")
    search.add_argument("--tiers", default="triton,cuda",
                        help="comma-separated: triton, cuda (cuda needs a GPU)")
    search.add_argument("--cuda-share", type=float, default=0.10,
                        help="a site still holding this share of the model time gets CUDA")
    search.add_argument("--generator", default="rules",
                        help="who writes kernels: rules (offline), llm, or rules,llm in one "
                        "tree (default: rules)")
    search.add_argument("--site-compile", action=argparse.BooleanOptionalAction, default=True,
                        help="time each searched site under torch.compile too, and measure "
                        "kernels against the faster of eager and compiled (default: on)")
    search.add_argument("--e2e", action=argparse.BooleanOptionalAction, default=True,
                        help="install the winners in the model, check it on fresh inputs and "
                        "time it against eager and torch.compile (default: on)")
    search.add_argument("--feedback", action=argparse.BooleanOptionalAction, default=True,
                        help="steer the generators with each kernel's diagnosis (compiler "
                        "report, timing, hardware counters); off, they see verdicts and "
                        "timings only and no counters are read (default: on)")
    search.add_argument("--counters", type=int, metavar="K",
                        help="read Nsight Compute hardware counters for each site's K best "
                        "kernels, about 9 s each (default: 1 on a GPU, 0 on the CPU)")
    search.add_argument("--strategy", choices=["uct", "random"], default="uct",
                        help="how a site's tree is grown: UCT (default), or expanding a node "
                        "drawn at random, the baseline to compare the search against")
    llm = parser.add_argument_group("LLM generator (--generator llm or rules,llm)")
    llm.add_argument("--llm-model", default=os.environ.get("KILN_LLM_MODEL", "gpt-4o"),
                     help="model name at the endpoint (default: $KILN_LLM_MODEL, else gpt-4o)")
    llm.add_argument("--llm-base-url",
                     help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 "
                     "(default: $OPENAI_BASE_URL, else OpenAI); the key is $OPENAI_API_KEY")
    llm.add_argument("--llm-temperature", type=float, default=0.7)
    llm.add_argument("--llm-max-tokens", type=int, default=8192, help="per reply")
    llm.add_argument("--llm-timeout", type=float, default=300.0,
                     help="seconds per request before it is retried")
    llm.add_argument("--llm-concurrency", type=int, default=4, help="requests in flight")
    search.add_argument("--db", type=Path, default=Path(os.environ.get("KILN_DB", "kiln.db")),
                        help="the kernel store (default: $KILN_DB, else ./kiln.db)")
    search.add_argument("--workers", type=int, default=2,
                        help="evaluation worker processes in all, spread over the GPUs round "
                        "robin (local executor)")
    search.add_argument("--memory-gb", type=float, metavar="GB",
                        help="device memory the evaluation workers of one GPU may hold at once, "
                        "GiB (default: what the GPU has free when judging starts)")
    search.add_argument("--gpus", help="comma-separated GPU indices the workers run on, e.g. "
                        "0,1 (default: every visible GPU; local executor)")
    search.add_argument("--executor", choices=["local", "ray"], default="local",
                        help="where candidates are judged: worker processes on this machine "
                        "(default), or Ray tasks, one GPU each, on a cluster")
    search.add_argument("--ray-address", metavar="ADDR",
                        help="the Ray cluster to join, e.g. auto or ray://head:10001 "
                        "(default: start Ray on this machine)")
    search.add_argument("--resume", type=int, metavar="RUN",
                        help="continue an interrupted or failed run of the store with its model "
                        "and settings: the minutes it ran count against its --budget and the "
                        "kernels it tried against its --max-candidates; a flag of the search "
                        "given again (--budget, --max-candidates, --sites, --tiers, "
                        "--generator, ...) replaces the run's for this resume, while the "
                        "profile's (--device, --dtype, --seed, the input sizes, --trials, ...) "
                        "must stay the run's")
    return parser


def _given(parser: argparse.ArgumentParser, argv: list[str] | None,
           args: argparse.Namespace) -> set[str]:
    """The options given on the command line, not left at their defaults: argparse fills in
    a default only where the namespace lacks the name."""
    unset = object()
    blank = argparse.Namespace(**dict.fromkeys(vars(args), unset))
    return {name for name, value in vars(parser.parse_args(argv, blank)).items()
            if value is not unset}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    args.tiers = _tiers(args.tiers)
    if args.resume is not None:
        _settings_of_run(args, _given(parser, argv, args))
    if args.model is None:
        raise KilnInputError("no MODEL given", "name a model, or --resume RUN from the store")
    args.generator = ",".join(_generators(args))
    args.gpus = _gpus(args)
    if args.max_candidates < 1 or args.sites < 1 or args.workers < 1 or args.budget <= 0:
        raise KilnInputError("--budget, --max-candidates, --sites and --workers must be "
                             "positive", "pass positive numbers")
    if args.counters is None:
        # Each read re-judges the kernel and runs ncu: seconds alone, several times that when
        # runs share the GPU. With the best 3 read, the feedback arm of the A/B benchmark judged
        # far fewer kernels than the no-feedback arm in the same minutes
        # (bench/results/counters_h200.md); the best one suffices to steer the children of the
        # kernel the search expands most.
        args.counters = 1 if args.device == "cuda" else 0
    if args.counters < 0:
        raise KilnInputError(f"--counters {args.counters} is negative",
                             "pass how many of each site's best kernels to profile, e.g. 3")
    for flag, value in (("--bandwidth", args.bandwidth), ("--matrix-tflops", args.matrix_tflops)):
        if value is not None and value <= 0:
            raise KilnInputError(f"{flag} {value} is not positive",
                                 f"pass the GPU's figure, e.g. {flag} 3.35, or leave it out "
                                 "to read the GPU's own")
    if args.memory_gb is not None and args.memory_gb <= 0:
        raise KilnInputError(f"--memory-gb {args.memory_gb} is not positive",
                             "pass the GiB of device memory judging may hold, e.g. 40")
    if args.trials < 1 or args.warmup < 0 or args.batch < 1 or args.seq_len < 1:
        raise KilnInputError("--trials, --batch and --seq-len must be positive, --warmup >= 0",
                             "pass positive counts")
    return args


def _config(args: argparse.Namespace) -> OptimizeConfig:
    """The run the command line asks for: its settings, and how to execute it."""
    base = OptimizeConfig(
        profile=ListSitesConfig(model=args.model, device=args.device,
                                quiet=args.json and not args.list_sites),
        db=args.db, workers=args.workers, gpus=args.gpus, memory_gb=args.memory_gb,
        executor=args.executor,
        ray_address=args.ray_address,
        llm=LlmConfig(base_url=args.llm_base_url, temperature=args.llm_temperature,
                      max_tokens=args.llm_max_tokens, timeout_s=args.llm_timeout,
                      concurrency=args.llm_concurrency))
    return config_of_settings({name: getattr(args, name) for name in SETTINGS}, base)


def _tiers(text: str) -> list[str]:
    tiers = [t.strip() for t in text.split(",") if t.strip()]
    if not tiers or any(t not in TIERS for t in tiers):
        raise KilnInputError(f"unknown tier(s) in --tiers {text!r}",
                             "pass --tiers triton, --tiers cuda or --tiers triton,cuda")
    return tiers


def _gpus(args: argparse.Namespace) -> tuple[int, ...] | None:
    """--gpus as indices; checks that --executor ray has Ray and no --gpus."""
    if args.ray_address and args.executor != "ray":
        raise KilnInputError("--ray-address was given without --executor ray",
                             "add --executor ray, or drop --ray-address")
    if args.executor == "ray":
        from core.evaluate.ray_executor import import_ray

        import_ray()
    if args.gpus is None:
        return None
    if args.executor == "ray":
        raise KilnInputError("--gpus picks GPUs of this machine; on Ray the cluster assigns "
                             "them", "drop --gpus, or use --executor local")
    names = [name.strip() for name in args.gpus.split(",") if name.strip()]
    indices = [int(name) for name in names if name.isdigit()]
    if not names or len(indices) < len(names) or len(set(indices)) < len(indices):
        raise KilnInputError(f"--gpus {args.gpus!r} is not a list of distinct GPU indices",
                             "pass indices separated by commas, e.g. --gpus 0,1")
    if args.device != "cuda":
        raise KilnInputError("--gpus was given, but the run is on the CPU",
                             "drop --gpus, or run with --device cuda on a GPU machine")
    return tuple(indices)


def _generators(args: argparse.Namespace) -> tuple[str, ...]:
    names = tuple(g.strip() for g in args.generator.split(",") if g.strip())
    if not names or any(g not in GENERATORS for g in names) or len(set(names)) < len(names):
        raise KilnInputError(f"unknown --generator {args.generator!r}",
                             "pass --generator rules, llm or rules,llm")
    if "llm" in names:
        if args.llm_concurrency < 1 or args.llm_max_tokens < 1 or args.llm_timeout <= 0:
            raise KilnInputError("--llm-concurrency, --llm-max-tokens and --llm-timeout must "
                                 "be positive", "pass positive numbers")
        local = args.llm_base_url or os.environ.get("OPENAI_BASE_URL")
        if not local and not os.environ.get("OPENAI_API_KEY"):
            raise KilnInputError(
                "--generator llm needs an endpoint: neither OPENAI_API_KEY nor a base URL is set",
                "export OPENAI_API_KEY for OpenAI, or pass --llm-base-url (or set "
                "OPENAI_BASE_URL) for a local vLLM, Ollama or LM Studio server")
    return names


def _settings_of_run(args: argparse.Namespace, given: set[str]) -> None:
    """On --resume, the model and the settings come from the run being resumed; a setting of
    the search given on the command line replaces the run's, one of the profile must match."""
    if args.list_sites:
        raise KilnInputError("--resume continues a search; --list-sites only profiles",
                             "drop one of them")
    with open_reader(args.db) as reader:
        run = reader.run(args.resume)
    if args.model is not None and args.model != run.model_spec:
        raise KilnInputError(f"run {run.id} optimized {run.model_spec}, not {args.model}",
                             f"drop MODEL, or resume a run of {args.model}")
    args.model = run.model_spec
    for name, value in run.config.items():
        if name not in SETTINGS:
            continue  # a setting an older Kiln stored and no longer reads
        if name not in given:
            setattr(args, name, value)
        elif name in PROFILE_SETTINGS and str(getattr(args, name)) != str(value):
            flag = "--" + name.replace("_", "-")
            raise KilnInputError(
                f"run {run.id} was profiled with {flag} {value}, not {getattr(args, name)}: its "
                "kernels were judged on the sites that profile made",
                f"drop {flag} to resume the run, or start a new run")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list_sites:
        report = note_declines(list_sites(_config(args).profile))
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print_site_table(report)
        return 0
    progress = Progress()
    if args.device == "cpu" and "cuda" in args.tiers:
        progress.step("the CUDA tier needs a GPU: searching Triton kernels only, under the "
                      "Triton interpreter (CPU timings)")
        args.tiers = [t for t in args.tiers if t != "cuda"] or ["triton"]
    run: OptimizeRun | None = None
    try:
        run = OptimizeRun(_config(args), progress)
        report = run.execute(resume=args.resume)
    except KeyboardInterrupt:
        run_id = run.run_id if run is not None else None
        print("kiln: interrupted before the run started; nothing was stored" if run_id is None
              else f"kiln: run {run_id} interrupted; resume it with: python -m core.optimize "
              f"--resume {run_id} --db {args.db}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except torch.OutOfMemoryError as err:
        if run is not None and run.run_id is not None:
            raise  # a started run keeps its failure in its report (`OptimizeRun.execute`)
        print(f"kiln: {args.model} did not fit in the GPU's free memory while it was profiled "
              f"({error_line(err)}); nothing was stored; free the GPU (other runs, say), then "
              "run again", file=sys.stderr)
        return 1
    write_markdown_report(report, Path(report["report_md"]))
    progress.step(f"report written to {report['report_md']}")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_site_table(report)
        print_search_table(report)
    if report["failure"]:
        judged = sum(site["evaluations"] for site in report["searched"])
        print(f"kiln: run {report['run_id']} failed {report['failure']}; kept: {judged} judged "
              f"kernel(s) in {args.db} and the report {report['report_md']}; to go on: "
              f"python -m core.optimize --resume {report['run_id']} --db {args.db}",
              file=sys.stderr)
        return 1
    return 0
