"""Extract the override lists of verl's example scripts into ``v0_7_0_overrides.json`` (run by hand; the sweep
test reads the committed JSON and needs neither verl nor this script).

    python tests/compat/verl_examples/extract.py --git-dir /path/to/verl/.git [--ref v0.7.0] [--out FILE]

``--git-dir`` is a clone of https://github.com/volcengine/verl (a bare one works: only ``git ls-tree`` and
``git show`` are used). Every ``examples/**/*.sh`` at ``--ref`` is evaluated by bash in a sandbox, so the
script's own variables, arrays, ``${X:-default}`` fallbacks, arithmetic and if/else branches resolve exactly as
bash resolves them:

* ``PATH`` points at an empty directory and ``command_not_found_handle`` records every external command instead
  of running it: nothing is installed, downloaded, started or deleted, and ``until nvidia-smi`` loops end;
* a recorded command whose arguments contain ``-m verl.trainer.<entry point>`` (directly, or behind ``torchrun``,
  ``srun``, ``ray job submit --``, ...) or a ``main_*.py`` file is one launch: the arguments after the entry
  point are kept, ``--config-path/--config-name`` apart from the ``key=value`` overrides;
* a variable the script reads but never sets (``$MODEL_PATH``, ``$SLURM_*``) expands to the marker
  ``__UNSET_<NAME>__``; a token that keeps a marker is replaced here by a stated value and listed under
  ``"substituted"`` (path keys are left for the test, which points every model/data/output path at local files);
* scripts that require positional arguments (verl's SFT scripts: ``<nproc_per_node> <save_path>``) get
  ``POSITIONAL_ARGS`` below, also listed under ``"substituted"``.

Files of verl's tree that a launch reads besides its overrides (an ``examples/`` yaml named by ``--config-path``
/ ``--config-name`` or by a ``main_*.py``'s ``@hydra.main``; tool and interaction configs named by a path
override) are stored parsed, under ``"files"``, as data only: comments and ``description`` texts are dropped and a
string longer than ``LONG_STRING`` characters (a chat template) becomes ``PLACEHOLDER_TEMPLATE`` (listed under the
file's ``"substituted"``). The test writes them back under a stand-in verl checkout.

JSON shape: ``{"source": {repository, ref, commit}, "scripts": {script: {"entrypoint": module, "launcher": {...},
"config_path": ..., "config_name": ..., "config_file": verl path, "overrides": [...], "substituted": {key: why},
"missing_in_verl": [relative paths the overrides name that verl's tree lacks]}},
"files": {verl path: {"content": ..., "substituted": [...]}}, "verl_configs": {config name: content}}``; a script
that launches twice would get ``script#2`` for the second. ``{verl}`` in a value stands for the verl checkout the
script runs in.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "v0_7_0_overrides.json"
HOME = "/home/user"
ENTRY_MODULES = ("verl.trainer.main_ppo", "verl.trainer.fsdp_sft_trainer", "verl.trainer.sft_trainer",
                 "verl.trainer.main_generation", "verl.trainer.main_eval")
# verl's SFT scripts stop with a usage line without them; 2 processes = the smallest launch their
# sequence-parallel (sp2) variants run on
POSITIONAL_ARGS = {"<nproc_per_node>": "2", "<save_path>": "/tmp/verl_sft_save"}
# values for keys a script reads from an unset variable (not a path: those are swapped by the test)
UNSET_VALUES = {
    "trainer.nnodes": "1",
    "trainer.n_gpus_per_node": "8",
    "actor_rollout_ref.actor.use_kl_loss": "True",  # the same command sets it to True a few lines before
    "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "verl_examples",
}
LONG_STRING = 300
PLACEHOLDER_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
UNSET_RE = re.compile(r"__UNSET_([A-Za-z_][A-Za-z0-9_]*)__")
PRELUDE = r"""
set() { :; }                      # scripts' set -euxo pipefail: keep going past stubs and unset names
shopt() { :; }
source() { :; }                   # env files of the user's machine (Ascend toolkit, env.sh)
command_not_found_handle() {
    { printf '%s\0' "$@"; printf '\1\0'; } >> "$VERL_EXTRACT_CAPTURE"
    return 0
}
"""


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def names_read_but_never_set(text: str) -> set[str]:
    """Names the script expands without a ``${X:-default}`` fallback and never assigns."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    read = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", code))
    with_default = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?[-=]", code))
    assigned = set(re.findall(r"(?:^|[\s;(])(?:export\s+|local\s+|declare\s+-\w+\s+)?([A-Za-z_][A-Za-z0-9_]*)\+?=",
                              code, flags=re.M))
    assigned |= set(re.findall(r"\bfor\s+\(?\(?\s*([A-Za-z_][A-Za-z0-9_]*)", code))
    assigned |= set(re.findall(r"\bread\s+(?:-\w+\s+)*([A-Za-z_][A-Za-z0-9_]*)", code))
    builtin = {"HOME", "PWD", "BASH_SOURCE", "PATH", "OLDPWD", "RANDOM", "LINENO", "SECONDS", "IFS", "BASHPID"}
    return read - with_default - assigned - builtin


def run_script(root: Path, rel: str, text: str) -> list[list[str]]:
    """Every command the script would run outside bash, as argument lists."""
    capture = root / "capture.bin"
    capture.write_bytes(b"")
    env = {"PATH": str(root / "empty-bin"), "HOME": HOME, "VERL_EXTRACT_CAPTURE": str(capture), "LANG": "C"}
    for name in names_read_but_never_set(text):
        env[name] = f"__UNSET_{name}__"
    positional = list(POSITIONAL_ARGS.values()) if re.search(r'"\$#"\s+-lt', text) else []
    cmd = ["/bin/bash", "--norc", "--noprofile", "-c", f'{PRELUDE}\ncd "{root}"\n. "$0" "$@"', str(root / rel),
           *positional]
    subprocess.run(cmd, env=env, cwd=root, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    records, current = [], []
    for arg in capture.read_bytes().split(b"\0")[:-1]:
        if arg == b"\1":
            records.append(current)
            current = []
        else:
            current.append(arg.decode())
    return records


def launch_of(argv: list[str]) -> tuple[str, dict, list[str]] | None:
    """(entry point, launcher flags, arguments after it) when ``argv`` starts one of verl's entry points."""
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] in ENTRY_MODULES:
            return argv[i + 1], launcher_flags(argv[:i]), argv[i + 2:]
        if arg.startswith("-m") and arg[2:] in ENTRY_MODULES:
            return arg[2:], launcher_flags(argv[:i]), argv[i + 1:]
        if re.fullmatch(r"(.*/)?main_\w+\.py", arg):
            return arg, launcher_flags(argv[:i]), argv[i + 1:]
    return None


def launcher_flags(argv: list[str]) -> dict:
    """torchrun's process-count flags (the SFT check needs the world size); other launchers' flags are dropped."""
    if not argv or os.path.basename(argv[0]) != "torchrun":
        return {}
    flags = {}
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        name = name.replace("-", "_").lstrip("_")
        if name in ("nnodes", "nproc_per_node"):
            flags[name] = value or argv[i + 1]
    return flags


def split_args(args: list[str], root: Path) -> dict:
    entry = {"overrides": []}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):
            name, _, value = arg.partition("=")
            if not value and i + 1 < len(args):
                value, i = args[i + 1], i + 1
            key = {"--config-path": "config_path", "-cp": "config_path", "--config-name": "config_name",
                   "-cn": "config_name"}.get(name)
            if key:
                entry[key] = value.replace(f"{root}/", "{verl}/")
            else:
                entry.setdefault("flags", []).append(f"{name}={value}")
        elif arg:
            entry["overrides"].append(arg.replace(f"{root}/", ""))
        i += 1
    return entry


def substitute_unset(entry: dict) -> None:
    """Replace each token that still holds an unset-variable marker by a stated value and say so."""
    substituted, out = {}, []
    for token in entry["overrides"]:
        names = UNSET_RE.findall(token)
        if not names:
            out.append(token)
            continue
        key, _, value = token.partition("=")
        bare = key.lstrip("+~")
        if bare in UNSET_VALUES:
            new = UNSET_VALUES[bare]
        elif re.search(r"(path|files?|dir)$", bare):
            new = UNSET_RE.sub("unset", value)  # a path: the test points it at local files
        else:
            raise SystemExit(f"{token!r}: ${names[0]} is unset in the script; add {bare} to UNSET_VALUES")
        substituted[bare] = f"${' $'.join(names)} is unset in the script; {new!r} used"
        out.append(f"{key}={new}")
    entry["overrides"] = out
    for field in ("config_path", "config_name"):
        if UNSET_RE.search(entry.get(field, "")):
            raise SystemExit(f"{field}={entry[field]!r} holds an unset variable")
    if substituted:
        entry["substituted"] = substituted


def config_file_of(git_dir: str, ref: str, script: str, entry: dict) -> str | None:
    """The verl path of the yaml a launch composes when it is one of verl's examples (not the trainer's own)."""
    module = entry["entrypoint"]
    if module.endswith(".py"):  # a script's own main: its @hydra.main(config_path=..., config_name=...)
        main_py = f"{os.path.dirname(script)}/{module}"
        source = git(git_dir, "show", f"{ref}:{main_py}")
        found = re.search(r"@hydra\.main\(\s*config_path=\"([^\"]+)\",\s*config_name=\"([^\"]+)\"", source)
        return os.path.normpath(f"{os.path.dirname(main_py)}/{found[1]}/{found[2]}.yaml")
    path = entry.get("config_path", "")
    if not path.startswith("{verl}/"):
        return None  # relative to verl/trainer (Hydra's rule for a module's main): the trainer's own config
    name = entry["config_name"]
    return f"{path[len('{verl}/'):]}/{name if name.endswith('.yaml') else name + '.yaml'}"


def as_data(value, where: str, substituted: list):
    """A parsed yaml without prose: ``description`` texts dropped, long strings (chat templates) replaced."""
    if isinstance(value, dict):
        return {k: as_data(v, f"{where}.{k}" if where else k, substituted) for k, v in value.items()
                if k != "description"}
    if isinstance(value, list):
        return [as_data(v, f"{where}[{i}]", substituted) for i, v in enumerate(value)]
    if isinstance(value, str) and len(value) > LONG_STRING:
        substituted.append(f"{where}: a {len(value)}-character string (a chat template) -> a one-line template")
        return PLACEHOLDER_TEMPLATE
    return value


def stored_file(git_dir: str, ref: str, path: str) -> dict:
    import yaml

    substituted: list = []
    content = as_data(yaml.safe_load(git(git_dir, "show", f"{ref}:{path}")), "", substituted)
    return {"content": content, **({"substituted": substituted} if substituted else {})}


_RELATIVE_FILE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+\.(ya?ml|json|py)$")


def missing_in_tree(git_dir: str, ref: str, entry: dict) -> list[str]:
    """Relative file paths the launch's overrides name (a script runs from the root of a verl checkout) that verl's
    tree at ``ref`` does not have: verl's own run cannot find them either."""
    tree = set(git(git_dir, "ls-tree", "-r", "--name-only", ref).split())
    out = []
    for token in entry["overrides"]:
        value = token.partition("=")[2].strip("'\"")
        if _RELATIVE_FILE.match(value) and value not in tree and value not in out:
            out.append(value)
    return out


def files_read_by(git_dir: str, ref: str, entry: dict) -> list[str]:
    """verl paths (yaml/json) that the launch's path overrides name."""
    tree = set(git(git_dir, "ls-tree", "-r", "--name-only", ref).split())
    out = []
    for token in entry["overrides"]:
        value = token.partition("=")[2].strip("'\"")
        value = value[len("{verl}/"):] if value.startswith("{verl}/") else value
        if value in tree and value.endswith((".yaml", ".yml", ".json")):
            out.append(value)
    return out


# verl's composed trainer configs (the files verl generates from its config groups and keeps in its tree): the sweep
# applies each launch's overrides to them with Hydra's own rules, so a command line that verl itself refuses (a key
# its config lacks set without '+', a '+' on a key it already has) is told apart from a refusal of this library
VERL_CONFIGS = {
    "ppo_trainer": "verl/trainer/config/_generated_ppo_trainer.yaml",
    "ppo_megatron_trainer": "verl/trainer/config/_generated_ppo_megatron_trainer.yaml",
}


def verl_configs(git_dir: str, ref: str) -> dict:
    return {name: stored_file(git_dir, ref, path)["content"] for name, path in VERL_CONFIGS.items()}


def extract(git_dir: str, ref: str) -> tuple[dict, dict]:
    scripts = [p for p in git(git_dir, "ls-tree", "-r", "--name-only", ref, "examples/").split() if p.endswith(".sh")]
    result, files = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "verl"
        (root / "empty-bin").mkdir(parents=True)
        for rel in scripts:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(git(git_dir, "show", f"{ref}:{rel}"))
        for rel in sorted(scripts):
            text = (root / rel).read_text()
            launches = [launch for argv in run_script(root, rel, text) if (launch := launch_of(argv))]
            if not launches:
                print(f"{rel}: no launch of a verl entry point", file=sys.stderr)
            for n, (module, launcher, args) in enumerate(launches, start=1):
                entry = {"entrypoint": module, **({"launcher": launcher} if launcher else {}), **split_args(args, root)}
                if re.search(r'"\$#"\s+-lt', text):
                    entry["substituted"] = {"positional arguments": " ".join(f"{k}={v}" for k, v in
                                                                            POSITIONAL_ARGS.items())}
                substituted = entry.pop("substituted", {})
                substitute_unset(entry)
                entry["substituted"] = {**substituted, **entry.get("substituted", {})}
                if not entry["substituted"]:
                    del entry["substituted"]
                missing = missing_in_tree(git_dir, ref, entry)
                if missing:
                    entry["missing_in_verl"] = missing
                config_file = config_file_of(git_dir, ref, rel, entry)
                if config_file:
                    entry["config_file"] = config_file
                for path in [config_file] * bool(config_file) + files_read_by(git_dir, ref, entry):
                    files.setdefault(path, stored_file(git_dir, ref, path))
                result[rel if n == 1 else f"{rel}#{n}"] = entry
    return result, dict(sorted(files.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git-dir", required=True, help="a clone of github.com/volcengine/verl (bare is fine)")
    parser.add_argument("--ref", default="v0.7.0")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    scripts, files = extract(args.git_dir, args.ref)
    data = {"source": {"repository": "https://github.com/volcengine/verl", "ref": args.ref,
                       "commit": git(args.git_dir, "rev-parse", f"{args.ref}^{{commit}}").strip()},
            "scripts": scripts, "files": files, "verl_configs": verl_configs(args.git_dir, args.ref)}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['scripts'])} launches -> {args.out}")


if __name__ == "__main__":
    main()
