"""How the evaluator starts Python processes of its own: from Kiln's folder, Kiln importable,
Triton under its interpreter exactly when the process judges on the CPU, and no secrets: the
environment keeps only what finding programs, libraries and the GPU needs
(`core.evaluate.sandbox.scrubbed_env`), so an API key of the optimizer's never reaches a process
that runs candidates."""

from __future__ import annotations

import os
from pathlib import Path

from core.evaluate.sandbox import scrubbed_env

REPO_ROOT = Path(__file__).resolve().parents[2]


def child_env(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with `extra` on top, for a child judging on `device`."""
    env = {**scrubbed_env(os.environ), **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return env
