"""Writing a model directory so that a reader never sees it half-written."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable

__all__ = ["write_new_dir"]


def write_new_dir(out_dir: str, write: Callable[[str], None]) -> str:
    """Call ``write(tmp_dir)`` on a temporary sibling of ``out_dir`` and rename it into place when it returns.

    ``out_dir`` must not exist or be empty (``FileExistsError`` otherwise); on an error nothing is left behind.
    Returns the absolute ``out_dir``."""
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise FileExistsError(f"{out_dir} already exists and is not empty; choose another directory")
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        write(tmp_dir)
        os.chmod(tmp_dir, 0o755)
        if os.path.exists(out_dir):
            os.rmdir(out_dir)
        os.rename(tmp_dir, out_dir)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir
