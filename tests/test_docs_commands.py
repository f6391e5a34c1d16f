"""Every complete ``python -m verl.trainer.main_ppo ...`` command in the docs passes the driver's checks.

A user copies these command lines as they are; a key the config check requires (a micro batch size), a renamed
key or a bad value would stop them with a config error. This runs what the driver does before Ray starts (the
command-line check, Hydra composition, the config validator) on each command, without the data and model files
(those the docs' own preparation steps create)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from verl.trainer import main_ppo
from verl.trainer.config_schema import validate_ppo_config

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")
ENTRY = re.compile(r"(?:^|\s)python3? -m verl\.trainer\.main_ppo\s+(.*)$")


def _commands():
    """(doc:line, argument string) of each main_ppo command in a fenced shell block; placeholders skipped."""
    found = []
    for doc in sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")]):
        lines, in_block, start = doc.read_text().splitlines(), False, 0
        joined = ""
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith("```"):
                in_block, joined = not in_block, ""
                continue
            if not in_block:
                continue
            if not joined:
                start = number
            joined += line.rstrip().removesuffix("\\") + " "
            if line.rstrip().endswith("\\"):
                continue
            m = ENTRY.search(joined.split("#", 1)[0].strip())
            joined = ""
            if m is None:
                continue
            args = m.group(1)
            if "..." in args or "<" in args or "--cfg" in args:
                continue  # a fragment ("... key=value") or a placeholder, not a command to copy
            found.append((f"{doc.relative_to(REPO)}:{start}", args))
    return found


COMMANDS = _commands()


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) >= 6, COMMANDS


@pytest.mark.parametrize("where, args", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_docs_command_passes_the_config_check(where, args, tmp_path):
    text = re.sub(r"\$\{?HOME\}?", str(tmp_path), args)
    text = re.sub(r"\$\{?[A-Za-z_]+\}?", str(tmp_path / "var"), text)
    argv = shlex.split(text)
    config_name = "ppo_trainer"
    for i, a in enumerate(argv):
        if a.startswith("--config-name"):
            config_name = a.split("=", 1)[1] if "=" in a else argv[i + 1]
    main_ppo.precheck_cli(argv)  # exits 2 with the config error on a bad override
    overrides = [a for i, a in enumerate(argv) if not a.startswith("--") and not (i and argv[i - 1] == "--config-name")]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    main_ppo.refuse_dynamic_sampling(cfg)
    validate_ppo_config(cfg, check_files=False)
