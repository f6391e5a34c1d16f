"""Write ``docs/config_reference.md`` from the schema: ``python -m verl.trainer.config_schema.reference``.

Every key of every shipped yaml, its default, its valid values, what it does and whether it works on CPU, GPU
and NPU. ``tests/trainer/test_config_reference.py`` fails when the committed file and this output differ.
"""

from __future__ import annotations

import sys

from verl.trainer.config_schema.catalog import SHIPPED
from verl.trainer.config_schema.spec import KeySpec, expectation, specs

HEADER = """# Config reference

Generated from the config schema (`verl/trainer/config_schema/`) by
`python -m verl.trainer.config_schema.reference > docs/config_reference.md`; do not edit by hand.

Every key of every shipped yaml is listed with its default, the values it accepts and what it does. **Status**:
*honoured* keys change what runs; *default only* keys name a feature that is not available in this build: the
key is accepted at its default (so verl command lines compose) and any other value is refused before workers
start, with a message that names the key and says what is supported; *some values* keys run with the values the
message does not name and refuse the others the same way. Keys marked *optional* are not in the
yaml; add them with `+key=value`. Support: CPU is what the test suite runs; GPU and NPU columns say
"not verified on hardware" unless a run on that hardware verified the key.
"""


def _value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return str(value)


def _default(spec: KeySpec, override=None) -> str:
    if override is not None:
        return f"`{_value(override)}`"
    if spec.default == "???":
        return "required"
    if spec.follows:
        return f"follows `{spec.follows}` (else `{_value(spec.default)}`)"
    return f"`{_value(spec.default)}`"


def _accepts(spec: KeySpec) -> str:
    text = expectation(spec)
    if spec.choices is not None:
        text = " \\| ".join(_value(c) for c in spec.choices)
    elif spec.items is not None:
        text = "list of: " + " \\| ".join(spec.items)
    if spec.nullable and spec.choices is None:
        text += ", or null"
    return text


def _status(spec: KeySpec) -> str:
    status = ("honoured" if spec.honoured else f"no effect: {spec.inert}" if spec.inert is not None
              else f"some values: {spec.unsupported}" if spec.ok else f"default only: {spec.unsupported}")
    return status + (" (optional)" if spec.optional else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") if "\\|" not in text else text.replace("\n", " ")


def render() -> str:
    out = [HEADER]
    for yaml in SHIPPED:
        table = specs(yaml.schema)
        out.append(f"\n## {yaml.name}.yaml\n\n`{yaml.command}`\n")
        if yaml.defaults:
            out.append("Same keys as ppo_trainer.yaml; this file changes these defaults: "
                       + ", ".join(f"`{k}={_value(v)}`" for k, v in yaml.defaults.items())
                       + ". The Megatron keys below (`*.megatron.*`) are only in this file.\n")
            table = {p: s for p, s in table.items() if p in yaml.defaults or "megatron" in p}
        out.append("| key | default | accepts | what it does | status | CPU | GPU | NPU |")
        out.append("|---|---|---|---|---|---|---|---|")
        for path, spec in table.items():
            if spec.optional and "megatron" in path and not yaml.defaults:
                continue  # megatron keys are documented under ppo_megatron_trainer.yaml
            refused = "no effect" if spec.inert is not None else "refused unless default"
            runs = spec.honoured or spec.ok is not None  # honoured, or for the values ``ok`` accepts
            cpu = spec.cpu if runs or spec.cpu != "yes" else refused
            gpu = spec.gpu if runs or spec.gpu != "not verified on hardware" else refused
            npu = spec.npu if runs or spec.npu != "not verified on hardware" else refused
            row = [f"`{path}`", _default(spec, yaml.defaults.get(path)), _accepts(spec), spec.doc, _status(spec), cpu,
                   gpu, npu]
            out.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
