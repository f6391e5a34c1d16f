"""docs/config_reference.md is generated from the schema; this test fails when the two disagree."""

from pathlib import Path

from verl.trainer.config_schema.catalog import SHIPPED
from verl.trainer.config_schema.reference import render
from verl.trainer.config_schema.spec import specs

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "config_reference.md"


def test_committed_reference_matches_the_schema():
    assert REFERENCE.exists(), "run: python -m verl.trainer.config_schema.reference > docs/config_reference.md"
    assert REFERENCE.read_text() == render(), (
        "docs/config_reference.md is out of date with the config schema; regenerate it with "
        "python -m verl.trainer.config_schema.reference > docs/config_reference.md")


def test_reference_lists_every_ppo_key_with_its_default_and_status():
    text = render()
    for shipped in SHIPPED:
        assert f"## {shipped.name}.yaml" in text
    for path, spec in specs(SHIPPED[0].schema).items():
        if "megatron" in path:
            continue
        row = next((line for line in text.splitlines() if line.startswith(f"| `{path}` |")), None)
        assert row is not None, f"{path} missing from the reference"
        if spec.follows:
            assert f"follows `{spec.follows}`" in row, row
        elif isinstance(spec.default, (bool, int, float)) and not isinstance(spec.default, bool):
            assert f"`{spec.default}`" in row, row
        assert ("honoured" if spec.honoured else "no effect" if spec.inert else "some values" if spec.ok
                else "default only") in row
