"""Render docs/api.md from tests/compat/verl_v0_7_surface.json (run from the repository root:
``python tests/compat/render_api_doc.py``). The compatibility test fails when the page is stale."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).parents[2]

INTRO = """# Python API: the verl v0.7.0 surface

Code written against verl imports from the same modules here. This page lists, module by module, the public
names of verl v0.7.0 that research code uses, and what each one does in this library:

- **supported**: implemented with verl's signature, defaults, return types and errors;
- **raises**: the name imports (so a script that only imports it keeps running), and calling or instantiating
  it raises `NotImplementedError` naming the capability that is missing and, where verl has one, the config
  that would turn it on. Nothing listed here fails at import time.

*Since* is the earliest verl release known to carry the name; `<=0.7.0` means the name is in 0.7.0 and earlier
releases were not checked. Parameters are verl's leading parameters (`self` left out); our functions may add
trailing keyword arguments with defaults.

Where behaviour differs from verl on purpose:

- errors: checks that verl writes as `assert` raise `ValueError` / `TypeError` / `KeyError` with a message naming
  the key and the fix;
- `DataProto` pickles its dense CPU tensors as numpy arrays (bit-exact; raw bytes for bf16 / float8; a view ships
  only its own elements; under Ray they travel out of band); accelerator tensors keep torch's serializer (devices
  kept), nested tensors and non-tensor entries go through `serialize_tensordict`, and pickles written in the older
  torch-serialized form still load. The tuple form of
  `serialize_tensordict` additionally carries `NonTensorData` / `NonTensorStack` entries;
- `verl.utils.metric.reduce_metrics` picks max/min by substring of the name, as verl does ("max" anywhere in the
  name takes the max);
- `verl.utils.groupwise.group_mean_std` computes in the scores' dtype when it is wider than float32;
- `RayWorkerGroup(..., worker_env={...})` adds environment variables for every worker; the group's own
  variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `WG_PREFIX`,
  `WG_BACKEND`, `RAY_LOCAL_RANK`, `RAY_LOCAL_WORLD_SIZE`) cannot be replaced (`ValueError`);
- `Role` lives in `verl.trainer.ppo.utils` (as in verl); `verl.trainer.ppo.ray_trainer.Role` and
  `verl.single_controller.ray.Role` are the same enum.

Behaviour worth knowing (as in verl):

- `DataProto.padding(n)` with the default `padding_candidate=""` appends copies of the *last* row
  (`"first"` copies the first);
- `DP_COMPUTE_PROTO`-style dispatch modes (and `make_nd_compute_dataproto_dispatch_fn`) accept `TensorDict`
  arguments as well as `DataProto`: they are split per rank with `tensordict_utils.chunk_tensordict` and the
  results concatenated with `tensordict_utils.concat_tensordict` (jagged tensors and per-row objects included);
- `grpo_vectorized` / `rloo_vectorized` (`algorithm.adv_estimator`) compute the same advantages as `grpo` /
  `rloo` with scatter-adds over group ids; `rloo_vectorized` gives a prompt with a single response advantage 0.

The list is kept as data in `tests/compat/verl_v0_7_surface.json`; `tests/compat/test_surface_inventory.py`
imports every module, resolves every name and compares every signature against it.
"""


def _signature(entry: dict) -> str:
    params = entry.get("params")
    if params is None:
        return ""
    return "(" + ", ".join(params) + ")"


def render(surface: dict) -> str:
    by_module: dict[str, list[dict]] = {}
    for entry in surface["entries"]:
        by_module.setdefault(entry["module"], []).append(entry)
    lines = [INTRO]
    for module in sorted(by_module):
        entries = by_module[module]
        head = next((e for e in entries if e["kind"] == "module"), None)
        lines.append(f"## `{module}`\n")
        if head is not None:
            lines.append(f"Since {head['since']}. Source: {head['source']}.\n")
        rows = [e for e in entries if e["kind"] != "module"]
        if not rows:
            continue
        lines.append("| name | kind | status | since | notes |")
        lines.append("| --- | --- | --- | --- | --- |")
        for e in rows:
            status = "supported" if e["status"] == "supported" else f"raises: {e['capability']}"
            note = (e.get("note") or "").replace("|", "\\|")
            lines.append(f"| `{e['name']}{_signature(e)}` | {e['kind']} | {status} | {e['since']} | {note} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    surface = json.loads((ROOT / "tests" / "compat" / "verl_v0_7_surface.json").read_text())
    (ROOT / "docs" / "api.md").write_text(render(surface))


if __name__ == "__main__":
    main()
