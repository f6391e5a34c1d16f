"""Run a Python program in a fresh subprocess with layers of isolation: the runner behind the ``python`` tool of the
agent loop (``verl.tools.sandbox_tool``) and the local code rewards (``verl.utils.reward_score.sandbox_fusion``).

Isolation, in layers (all on by default):

* a new temporary directory per run as the working directory (and ``HOME`` / ``TMPDIR``), removed afterwards;
* resource limits (``setrlimit``): address space ``memory_limit_mb`` (default 512), CPU seconds, file size
  (16 MiB), open files; wall clock ``timeout`` seconds (default 10) after which the whole process group is killed;
* no network: where unprivileged user namespaces work (``unshare --user --net``, probed once), the code runs in
  its own network namespace with no interfaces up; in every case a Python audit hook (which code inside the
  interpreter cannot remove) refuses sockets, starting processes, ``ctypes``, and any file write, rename or
  delete outside the temporary directory;
* an isolated interpreter (``python -I -B``: no user site, no environment variables, no bytecode written) and a
  minimal environment.

Output (stdout, stderr) is cut to ``max_output_chars`` (default 4096). This is a guard against mistakes and
casual escapes of a policy under training, not a security boundary against a determined attacker: run untrusted
production workloads in a container or VM sandbox (for code rewards: a Sandbox Fusion server).
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Optional

__all__ = ["run_python", "run_python_sync", "network_namespace_available"]

# Runs inside the sandboxed interpreter: read the program, install the audit hook, run the program.
_PRELUDE = r'''
import os, sys
_root = os.path.realpath(os.getcwd())
with open("main.py", encoding="utf-8") as _f:
    _src = _f.read()
_blocked = {"socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
            "socket.getaddrinfo", "socket.gethostbyname", "subprocess.Popen", "os.system", "os.exec", "os.spawn",
            "os.posix_spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "ctypes.dlopen",
            "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof", "mmap.__new__", "sys.remote_exec"}
_path_events = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
                "os.chown", "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.mkfifo", "os.mknod",
                "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copymode", "shutil.copystat",
                "shutil.copytree"}
_write = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
def _inside(p):
    if isinstance(p, int):
        return True
    try:
        real = os.path.realpath(os.fsdecode(p))
    except Exception:
        return False
    return real == _root or real.startswith(_root + os.sep)
def _hook(event, args):
    if event in _blocked:
        raise PermissionError("sandbox: " + event + " is not allowed")
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, 0))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _write)
        if writing and not _inside(path):
            raise PermissionError("sandbox: writing outside the sandbox directory is not allowed: " + str(path))
    elif event in _path_events:
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                raise PermissionError("sandbox: " + event + " outside the sandbox directory is not allowed")
sys.addaudithook(_hook)
del _hook
exec(compile(_src, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
'''

_NETNS: Optional[bool] = None


def network_namespace_available() -> bool:
    """Whether ``unshare --user --net`` works for this user (probed once per process)."""
    global _NETNS
    if _NETNS is None:
        exe = shutil.which("unshare")
        ok = False
        if exe is not None:
            try:
                ok = subprocess.run([exe, "--user", "--net", "--map-root-user", "true"], capture_output=True,
                                    timeout=10).returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
        _NETNS = ok
    return _NETNS


def _limits(memory_mb: int, cpu_seconds: int):
    def apply():
        mem = int(memory_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024 * 1024, 16 * 1024 * 1024))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [output cut: {len(text) - limit} more characters]"


def _prepare(code: str, isolate_network: bool) -> tuple[str, list[str], dict]:
    """A new sandbox directory holding the program, the command that runs it there, and its environment."""
    workdir = tempfile.mkdtemp(prefix="verl_sandbox_")
    with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
        f.write(code)
    cmd = [sys.executable, "-I", "-B", "-c", _PRELUDE]
    if isolate_network and network_namespace_available():
        cmd = [shutil.which("unshare"), "--user", "--net", "--map-root-user"] + cmd
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "PYTHONIOENCODING": "utf-8",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANG": "C.UTF-8"}
    return workdir, cmd, env


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _result(out: bytes, err: bytes, returncode: int, timed_out: bool, workdir: str, limit: int) -> dict[str, Any]:
    return {"stdout": _cut(out.decode("utf-8", "replace"), limit), "stderr": _cut(err.decode("utf-8", "replace"), limit),
            "returncode": returncode, "timed_out": timed_out, "sandbox_dir": workdir}


async def run_python(code: str, timeout: float = 10.0, memory_limit_mb: int = 512, max_output_chars: int = 4096,
                     isolate_network: bool = True, stdin: Optional[str] = None) -> dict[str, Any]:
    """Run ``code`` in the sandbox (``stdin``: its standard input, else none) without blocking the event loop;
    returns ``{stdout, stderr, returncode, timed_out, sandbox_dir}`` (the directory no longer exists when this
    returns)."""
    return await asyncio.to_thread(run_python_sync, code, timeout, memory_limit_mb, max_output_chars,
                                   isolate_network, stdin)


def run_python_sync(code: str, timeout: float = 10.0, memory_limit_mb: int = 512, max_output_chars: int = 4096,
                    isolate_network: bool = True, stdin: Optional[str] = None) -> dict[str, Any]:
    """Run ``code`` in the sandbox; see :func:`run_python` (its form for an event loop)."""
    workdir, cmd, env = _prepare(code, isolate_network)
    try:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env,
                                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=_limits(memory_limit_mb, int(timeout) + 1))
        data = stdin.encode() if stdin is not None else None
        timed_out = False
        try:
            out, err = proc.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            out, err = proc.communicate()
        return _result(out, err, proc.returncode, timed_out, workdir, max_output_chars)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
