"""What users read -- README, docs, shipped yaml, example and setup scripts, --help texts and log lines in the
package -- speaks of the product, not of how it was planned or built: no design-folder paths or design-doc
names, section signs pointing into them, issue numbers, work sessions, waves or team process."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# (pattern, why it is internal)
PROCESS = [
    (re.compile(r"shared/design"), "design-folder path"),
    (re.compile(r"\b(ARCHITECTURE|ENVIRONMENT|CONFIG_KEYS(_WAVE2)?|STYLE)\.md\b|\bARCHITECTURE\b"), "design document"),
    (re.compile(r"\bissues?\s*#\s*\d+|\bissue\s+\d+\b", re.I), "issue number"),
    (re.compile(r"\bsessions?\s+\d+\b|\b(this|that|next|later|previous|earlier|each|every|one) session\b", re.I),
     "work session"),
    (re.compile(r"\bwave\s*\d*\b", re.I), "planning wave"),
    (re.compile(r"\bhelper (agent|session)s?\b|\bthe team\b|\bour own work\b", re.I), "team process"),
]
SECTION_SIGN = (re.compile("§"), "section sign (a pointer into a design document)")

# every file a user reads as a document, config, script or --help text
DOCUMENT_GLOBS = ["README.md", "docs/**/*.md", "verl/trainer/config/**/*.yaml", "examples/**/*.sh",
                  "examples/**/*.md", "examples/**/*.py", "examples/**/*.yaml", "scripts/*.sh", "benchmarks/**/*.md",
                  "benchmarks/**/*.py", "recipe/**/*.md", "recipe/**/*.yaml", "recipe/**/*.sh", "setup.py",
                  "requirements*.txt"]
# package source: docstrings become --help texts and API docs, strings become log lines and errors. A "§" here
# may cite a paper's section, so only the process words are checked.
SOURCE_GLOBS = ["verl/**/*.py", "recipe/**/*.py"]


def _files(globs):
    seen = set()
    for pattern in globs:
        for path in sorted(REPO.glob(pattern)):
            if path.is_file() and ".venv" not in path.parts and path not in seen:
                seen.add(path)
                yield path


def _hits(paths, checks):
    hits = []
    for path in paths:
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for pattern, why in checks:
                if pattern.search(line):
                    hits.append(f"{path.relative_to(REPO)}:{lineno}: {why}: {line.strip()[:120]}")
    return hits


def test_documents_scripts_and_configs_speak_of_the_product():
    files = list(_files(DOCUMENT_GLOBS))
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".yaml" for p in files)
    hits = _hits(files, PROCESS + [SECTION_SIGN])
    assert not hits, "internal wording in user-facing files:\n" + "\n".join(hits)


def test_package_strings_speak_of_the_product():
    files = list(_files(SOURCE_GLOBS))
    assert len(files) > 50
    hits = _hits(files, PROCESS)
    assert not hits, "internal wording in package source (docstrings, --help, log lines):\n" + "\n".join(hits)


@pytest.mark.parametrize("line, internal", [
    ("see shared/design/ARCHITECTURE.md", True), ("the step of ARCHITECTURE §3", True),
    ("measured 2026-11-22 (session 3)", True), ("fixed in issue #12", True), ("the wave 2 seams", True),
    ("Ray writes logs under /tmp/ray/session_latest/logs", False), ("a helper function", False),
    ("one wavelength", False),
])
def test_patterns(line, internal):
    assert bool(_hits_line(line)) is internal


def _hits_line(line):
    return [why for pattern, why in PROCESS + [SECTION_SIGN] if pattern.search(line)]
