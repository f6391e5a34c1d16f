"""verl's file helpers that also accept ``hdfs://`` paths, for local paths: ``exists``, ``makedirs``, ``copy``.

There is no Hadoop client here, so an ``hdfs://`` path is refused with an error naming it (copy the files to a
local directory, or mount the file system, and pass the local path).
"""

from __future__ import annotations

import os
import shutil

from verl.utils.fs import is_non_local

__all__ = ["exists", "makedirs", "copy"]


def _local(path: str) -> str:
    if is_non_local(path):
        raise ValueError(f"{path}: hdfs:// paths need a Hadoop client, which this installation does not use; copy "
                         "the files to a local directory (or mount the file system) and pass that path")
    return os.path.expanduser(str(path))


def exists(path: str, **kwargs) -> bool:
    """``os.path.exists`` (False for a broken symbolic link)."""
    return os.path.exists(_local(path))


def makedirs(name: str, mode: int = 0o777, exist_ok: bool = False, **kwargs) -> None:
    """``os.makedirs``: the directory and every missing parent (FileExistsError if it exists and not exist_ok)."""
    os.makedirs(_local(name), mode=mode, exist_ok=exist_ok)


def copy(src: str, dst: str, **kwargs) -> str:
    """``shutil.copy`` for a file (``dst`` may be a directory), ``shutil.copytree`` for a directory (``dst`` must
    not exist unless ``dirs_exist_ok=True``); returns the destination path."""
    src, dst = _local(src), _local(dst)
    if os.path.isdir(src):
        return shutil.copytree(src, dst, **kwargs)
    return shutil.copy(src, dst, **kwargs)
