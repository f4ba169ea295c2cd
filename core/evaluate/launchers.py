"""Triton's C launchers, built by the judge once per signature and read by every candidate.

Before its first launch of a kernel, Triton builds a small C module (its launcher) with the C
compiler, cached under a key of its source; its source depends only on the kernel's argument
types, so one site's candidates, whose block sizes differ, all need the same one. A candidate's
process has a Triton cache of its own (its scratch folder), where it would build it anew every
time. Here the judge builds each launcher once, from Triton's own source generator and argument
types it has checked, into a folder of its own that candidates' processes read (the sandbox
lets them write only their scratch folder): nothing a candidate makes ever reaches another.

In the candidate's process `use_shared_launchers` makes Triton's cache look in that folder
first and records which launchers it had to build itself; the judge reads that record after
the candidate (`CandidateProcess.stats`) and builds them (`LauncherFolder.build`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from triton.runtime.cache import FileCacheManager

LAUNCHER = "__triton_launcher"
FOLDER_VARIABLE = "KILN_TRITON_LAUNCHERS"
# A signature with more arguments, or more signatures from one candidate, is left to the
# candidate's process to build: a bound on the judge's work that no honest kernel meets.
MAX_ARGUMENTS = 256
MAX_PER_CANDIDATE = 8
ARGUMENT_TYPE = re.compile(r"(\*k?)?(i1|[iu](8|16|32|64)|fp(8e4nv|8e5|8e4b15|16|32|64)|bf16)"
                           r"|constexpr")


def suffix() -> str:
    return str(sysconfig.get_config_var("EXT_SUFFIX"))


def launcher_key(source: str) -> str:
    """The folder Triton's cache gives a module built from `source`
    (`triton.runtime.build.compile_module_from_src`, then `get_cache_manager`)."""
    from triton.runtime.build import platform_key
    from triton.runtime.cache import _base32

    return _base32(hashlib.sha256((source + platform_key()).encode("utf-8")).hexdigest())


def launcher_path(folder: Path, source: str) -> Path:
    """Where in `folder` Triton's cache (`SharedLaunchers`) finds the launcher built from
    `source`."""
    return folder / launcher_key(source) / f"{LAUNCHER}{suffix()}"


def checked_signature(value: Any) -> tuple[str, ...] | None:
    """`value` as a launcher signature the judge will build, or None when it is not one: a list
    of Triton's scalar, pointer and constexpr type names (no tuples, no tensor descriptors)."""
    if not isinstance(value, list) or not 0 < len(value) <= MAX_ARGUMENTS:
        return None
    if not all(isinstance(v, str) and ARGUMENT_TYPE.fullmatch(v) for v in value):
        return None
    return tuple(value)


class SharedLaunchers(FileCacheManager):
    """Triton's file cache, which in a candidate's process finds launchers in the judge's folder
    first."""

    def get_file(self, filename: str) -> str | None:
        folder = os.environ.get(FOLDER_VARIABLE)
        if folder and filename.startswith(LAUNCHER):
            shared = Path(folder, self.key, filename)
            if shared.is_file():
                return str(shared)
        return super().get_file(filename)


def use_shared_launchers(folder: Path) -> list[list[str]]:
    """In a candidate's process, before its walls: read launchers from `folder`, and record the
    signatures of those not found there (the list returned, filled as kernels launch)."""
    import triton
    from triton.backends.nvidia import driver

    os.environ[FOLDER_VARIABLE] = str(folder)
    triton.knobs.cache.manager_class = SharedLaunchers
    missing: list[list[str]] = []
    make_launcher = driver.make_launcher

    def recording(constants: Any, signature: dict[Any, Any], tensordesc_meta: Any) -> str:
        source = make_launcher(constants, signature, tensordesc_meta)
        if not launcher_path(folder, source).is_file():
            missing.append([str(v) for v in signature.values()])
        return source

    driver.make_launcher = recording
    return missing


class LauncherFolder:
    """The judge's folder of launchers, built from signatures candidates' processes asked for."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.failed: dict[tuple[str, ...], str] = {}  # tried once, not again
        folder.mkdir(parents=True, exist_ok=True)

    def source_and_path(self, signature: tuple[str, ...]) -> tuple[str, Path]:
        """Triton's launcher source for `signature`, and where the candidates' caches look."""
        from triton.backends.nvidia.driver import make_launcher

        source = make_launcher({}, dict(enumerate(signature)), None)
        return source, launcher_path(self.folder, source)

    def path_of(self, signature: tuple[str, ...]) -> Path:
        return self.source_and_path(signature)[1]

    def build(self, requested: Any) -> list[tuple[str, ...]]:
        """Build the launchers of `requested` (a candidate's record: checked here, the rest
        dropped) not built yet; the signatures built."""
        signatures = [s for s in map(checked_signature, requested if isinstance(requested, list)
                                     else []) if s is not None]
        built = []
        for signature in dict.fromkeys(signatures[:MAX_PER_CANDIDATE]):
            if signature in self.failed or self.path_of(signature).is_file():
                continue
            try:
                self._build(signature)
            except Exception as err:  # noqa: BLE001 - the candidate's process builds its own
                self.failed[signature] = f"{type(err).__name__}: {err}"
                print(f"kiln: the judge could not build Triton's launcher for {list(signature)} "
                      f"({self.failed[signature]}); candidates' processes build it themselves",
                      file=sys.stderr)
                continue
            built.append(signature)
        return built

    def _build(self, signature: tuple[str, ...]) -> None:
        from triton.backends.nvidia.driver import include_dirs, libraries, library_dirs
        from triton.runtime.build import _build

        source, target = self.source_and_path(signature)
        with tempfile.TemporaryDirectory(dir=self.folder) as work:
            source_path = Path(work, f"{LAUNCHER}.c")
            source_path.write_text(source)
            module = _build(LAUNCHER, str(source_path), work, library_dirs(), include_dirs,
                            libraries, [])
            target.parent.mkdir(exist_ok=True)
            partial = Path(work, "ready")
            shutil.copyfile(module, partial)
            os.replace(partial, target)  # whole or absent, for a process reading the folder
