"""File-system helpers (verl's names). Only local paths are supported; HDFS paths fail with a clear error."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

__all__ = ["is_non_local", "copy_to_local", "copy_local_path_from_hdfs", "copy", "local_mkdir_safe", "md5_encode",
           "get_local_temp_path", "atomic_write_text"]


def is_non_local(path: str) -> bool:
    return str(path).startswith("hdfs://")


def md5_encode(path: str) -> str:
    return hashlib.md5(str(path).encode()).hexdigest()


def get_local_temp_path(hdfs_path: str, cache_dir: str) -> str:
    return os.path.join(cache_dir, md5_encode(hdfs_path), os.path.basename(str(hdfs_path)))


def _check_local(path: str) -> str:
    if is_non_local(path):
        raise ValueError(f"HDFS paths are not supported here: {path}; copy the files to a local directory")
    return os.path.expanduser(str(path))


def copy_to_local(src: str, cache_dir: str | None = None, filelock: str = ".file.lock", verbose: bool = False,
                  always_recopy: bool = False, use_shm: bool = False) -> str:
    """verl copies remote checkpoints/models to a local cache; here every path is local: return it expanded.

    ``use_shm=True`` copies a model directory to /dev/shm once (faster reloads), as verl does.
    """
    local = _check_local(src)
    if use_shm and os.path.isdir(local) and os.path.isdir("/dev/shm"):
        return _copy_to_shm(local, always_recopy)
    return local


SHM_CACHE = "/dev/shm/verl-cache"


def _copy_to_shm(local: str, always_recopy: bool = False) -> str:
    """The model directory ``local`` copied once per machine to ``/dev/shm/verl-cache/<md5 of its path>``. Every
    process of a run may ask at once: each copies into its own temporary directory and renames it into place, so
    a reader never sees a half-copied model; the first rename wins and the others drop their copy."""
    dst = os.path.join(SHM_CACHE, md5_encode(os.path.abspath(local)))
    if os.path.isdir(dst) and not always_recopy:
        return dst
    os.makedirs(SHM_CACHE, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(dst) + ".tmp-", dir=SHM_CACHE)
    try:
        shutil.copytree(local, tmp, dirs_exist_ok=True)
        if always_recopy and os.path.isdir(dst):
            shutil.rmtree(dst, ignore_errors=True)
        try:
            os.rename(tmp, dst)
        except OSError:  # another process renamed its copy first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def copy_local_path_from_hdfs(src: str, cache_dir: str | None = None, filelock: str = ".file.lock",
                              verbose: bool = False, always_recopy: bool = False) -> str:
    """verl's older name of :func:`copy_to_local` (same behaviour)."""
    return copy_to_local(src, cache_dir=cache_dir, filelock=filelock, verbose=verbose, always_recopy=always_recopy)


def copy(src: str, dst: str, **kwargs) -> None:
    src, dst = _check_local(src), _check_local(dst)
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def local_mkdir_safe(path: str) -> str:
    """mkdir -p that tolerates several processes creating the same directory."""
    path = _check_local(path)
    os.makedirs(path, exist_ok=True)
    return path


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never a partial one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
