"""The README's shell commands, run as written on this CPU machine: an example that breaks
fails here.

Every command of the README's `sh` and `bash` blocks runs in a fresh process, from a folder
that sees the repository's `examples/` and `tests/` (so what a command writes lands there,
not in the checkout), against a store the test fills (`$KILN_DB`); placeholders become real
ids, `[optional]` parts are given, `a|b` alternatives each run. A command must exit 0, or with
the code a comment line right above it names (`... exit code 1`). The models of the table of
`MODEL` specs are profiled with `--list-sites`. What cannot run here is listed below, each
with why, and each entry must still match the README.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.store_fixture import Filled, fill_store
from tests.test_list_sites_cli import ROOT

README = ROOT / "README.md"

# Commands not run, by how they start, with why.
NOT_RUN = {
    "make example": "a search of minutes under the Triton interpreter",
    "make test": "the whole test suite",
    "python -m core.optimize MODEL": "a synopsis: MODEL stands for any model",
    "python -m core.evaluate PROBLEM": "a synopsis: PROBLEM and CANDIDATE stand for any files",
    "export OPENAI_API_KEY": "an LLM endpoint",
    "python -m core.optimize examples/mlp_block.py --generator": "an LLM endpoint",
    "vllm serve": "a GPU and a model server",
    "ollama pull": "a model server and a download",
    "streamlit run": "a web server, which runs until stopped",
}
# Model specs of the README's table not profiled, with why.
SPECS_NOT_RUN = {
    "path/to/problem.py": "a placeholder for a file",
    "package.module:function": "a placeholder for a callable",
    "torchvision:resnet50": "torchvision, which the test environment lacks, and minutes of CPU",
}


@dataclass(frozen=True)
class Command:
    text: str  # as the README writes it
    exit_code: int  # 0, or what the comment line above it says


def readme_commands(text: str) -> list[Command]:
    """Each command of the `sh` and `bash` blocks, continuation lines (after a backslash, or
    indented under the command) joined."""
    commands: list[Command] = []
    for block in re.findall(r"^```(?:sh|bash)\n(.*?)^```", text, re.M | re.S):
        expected = 0
        for raw in block.replace("\\\n", " ").splitlines():
            line = raw.strip()
            if line.startswith("#"):
                found = re.search(r"exit code (\d+)", line)
                expected = int(found.group(1)) if found else expected
            elif line and raw[0].isspace() and commands:
                last = commands.pop()
                commands.append(Command(f"{last.text} {line}", last.exit_code))
            elif line:
                commands.append(Command(line, expected))
                expected = 0
    return commands


def model_specs(text: str) -> list[str]:
    table = text.split("`MODEL` is one of:", 1)[1].split("\n\n", 2)[1]
    return re.findall(r"^\| `([^`]+)` \|", table, re.M)


def skipped(command: Command) -> bool:
    return any(command.text.startswith(prefix) for prefix in NOT_RUN)


COMMANDS = readme_commands(README.read_text())
SPECS = model_specs(README.read_text())


def concrete(text: str, filled: Filled, out: Path) -> list[list[str]]:
    """The command's argument lists: placeholders filled, optional parts given, each
    alternative of an `a|b` token once."""
    text = text.replace("[", "").replace("]", "")
    text = re.sub(r"--run ID\b", f"--run {filled.run}", text)
    text = re.sub(r"--site ID\b", f"--site {filled.pointwise}", text)
    text = re.sub(r"\bID\b", str(filled.faster), text)
    text = re.sub(r"\bOTHER\b", str(filled.draft), text)
    text = re.sub(r"\bKEY\b", "pointwise-1a2b3c4d", text)
    tokens = shlex.split(text, comments=True)
    choices = [token.split("|") if "|" in token else [token] for token in tokens]
    return [[token.replace("DIR", str(out / "export" / "-".join(combination)))
             for token in combination] for combination in itertools.product(*choices)]


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> tuple[Path, Filled]:
    """A folder that sees the repository's examples and tests, and a filled store."""
    folder = tmp_path_factory.mktemp("readme")
    for name in ("examples", "tests"):
        (folder / name).symlink_to(ROOT / name)
    return folder, fill_store(folder / "kiln.db")


def run(args: list[str], folder: Path, db: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KILN_DB": str(db)}
    if args[0] == "python":
        args = [sys.executable, *args[1:]]
    return subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("command", [c for c in COMMANDS if not skipped(c)],
                         ids=lambda c: c.text)
def test_readme_command_runs(command, place):
    folder, filled = place
    for args in concrete(command.text, filled, folder):
        result = run(args, folder, filled.path)
        assert result.returncode == command.exit_code, \
            f"{shlex.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("spec", [s for s in SPECS if s not in SPECS_NOT_RUN])
def test_readme_model_spec_profiles(spec, place):
    folder, filled = place
    args = ["python", "-m", "core.optimize", spec, "--list-sites", "--device", "cpu",
            "--seq-len", "32", "--warmup", "0", "--trials", "2", "--out", str(folder / "out")]
    result = run(args, folder, filled.path)
    assert result.returncode == 0, result.stderr[-3000:]


def test_every_command_not_run_is_still_in_the_readme():
    """A skip that matches nothing would hide a command the README no longer has."""
    unused = [p for p in NOT_RUN if not any(c.text.startswith(p) for c in COMMANDS)]
    assert unused == []
    assert set(SPECS_NOT_RUN) <= set(SPECS)
    assert len([c for c in COMMANDS if not skipped(c)]) >= 10, "the README lost its examples"
