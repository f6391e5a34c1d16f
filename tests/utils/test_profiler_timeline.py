"""verl.utils.profiler.timeline: nesting depths and range totals on a hand-written trace; the CLI's picture and
its errors."""

import gzip
import json

import pytest

from verl.utils.profiler.timeline import load_slices, longest_ranges, main


def _trace(path, events):
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return str(path)


def _x(name, ts, dur, cat="cpu_op", tid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 7, "tid": tid}


EVENTS = [
    {"ph": "X", "name": "PyTorch Profiler (0)", "ts": 0, "dur": 1000, "cat": "Trace", "pid": "Spans", "tid": 0},
    _x("update_actor", 0, 1000, "user_annotation"),
    _x("aten::mm", 10, 100),
    _x("aten::addmm", 10, 50),  # same start, shorter: nested in aten::mm
    _x("Optimizer.step#AdamW.step", 800, 150, "user_annotation"),
    _x("aten::add_", 810, 20),
    _x("aten::add_", 900, 20),  # after the first add_ ended: a sibling, not nested
    _x("other thread", 0, 5, tid=2),
]


def test_depths_follow_nesting_on_the_busiest_thread(tmp_path):
    slices = load_slices(_trace(tmp_path / "t.json.gz", EVENTS))
    assert [(e["name"], e["depth"]) for e in slices] == [
        ("update_actor", 0), ("aten::mm", 1), ("aten::addmm", 2), ("Optimizer.step#AdamW.step", 1),
        ("aten::add_", 2), ("aten::add_", 2)]
    assert longest_ranges(slices) == [("update_actor", 1.0, 1), ("Optimizer.step#AdamW.step", 0.15, 1)]


def test_cli_writes_a_png_and_prints_the_ranges(tmp_path, capsys):
    out = tmp_path / "pic.png"
    assert main([_trace(tmp_path / "t.json.gz", EVENTS), "--out", str(out), "--depth", "3"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp.png"))
    printed = capsys.readouterr().out
    assert "update_actor" in printed and "100.0%" in printed and "Optimizer.step#AdamW.step" in printed


@pytest.mark.parametrize("case", ["missing", "not_a_trace", "not_json", "depth"])
def test_cli_errors_name_the_file_and_write_nothing(tmp_path, capsys, case):
    path = tmp_path / "t.json.gz"
    args = [str(path), "--out", str(tmp_path / "pic.png")]
    if case == "not_a_trace":
        _trace(path, [{"ph": "M", "name": "process_name"}])
    elif case == "not_json":
        path.write_text("{not json")
    elif case == "depth":
        _trace(path, EVENTS)
        args += ["--depth", "0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert ("--depth=0" in err) if case == "depth" else (str(path) in err)
    assert not (tmp_path / "pic.png").exists()
