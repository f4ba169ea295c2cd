"""Site keys as file names: an export names folders and files after sites, inside the folder the
user gave and nowhere else."""

from __future__ import annotations

import re
from collections.abc import Iterable

from core.runtime.errors import KilnInputError

# A site key names a folder or file of an export: it must stay one path component inside the
# folder given, on any OS. Kiln's keys (family-hash) are; a key with a slash, a backslash, a
# NUL, a leading dot or a drive came from a store someone else wrote, and is refused.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,126}[A-Za-z0-9])?")


def check_site_keys(keys: Iterable[str], run_id: int) -> None:
    """Refuse, before anything is written, site keys that are not plain file names."""
    unsafe = sorted({key for key in keys if not _PLAIN_NAME.fullmatch(key)})
    if unsafe:
        raise KilnInputError(
            f"run {run_id} has site keys that are not plain file names"
            f" ({', '.join(map(repr, unsafe[:3]))}): exporting them would write outside the"
            " folder given",
            "this store was not written by Kiln's optimizer: export another run with --run, or"
            " use --format json or csv, which name no file after a site",
        )
