"""The quickstart's live progress: console-line parsing and the plain / terminal displays (fake clock)."""

import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "quickstart"))

from stage_progress import GRPO_PHASES, GRPO_SHOWN, SFT_SHOWN, StageProgress, parse_step_line  # noqa: E402


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_parse_console_line_behind_ray_prefix():
    line = "(TaskRunner pid=4242) step:12 - critic/score/mean:0.25 - val-core/arithmetic/reward/mean@1:0.3 - x:nan\n"
    step, metrics = parse_step_line(line)
    assert step == 12 and metrics["critic/score/mean"] == 0.25 and metrics["val-core/arithmetic/reward/mean@1"] == 0.3
    assert parse_step_line("Training Progress:  5%|#  | 10/200") is None
    assert parse_step_line("step:3 - note:abc") == (3, {})


def test_plain_lines_every_interval_with_score_and_eta():
    clock, out = Clock(), io.StringIO()
    progress = StageProgress("grpo", 10, GRPO_SHOWN, GRPO_PHASES, stream=out, interactive=False, interval=5.0,
                             clock=clock)
    clock.t += 6
    progress.feed("\x1b[36m(TaskRunner pid=7)\x1b[0m Resource pools: {'global_pool': [1]}")
    progress.tick()  # start-up: no step yet, still a line, saying what is going on
    progress.feed("step:0 - val-core/arithmetic/reward/mean@1:0.253")
    for step in (1, 2, 3):
        clock.t += 2
        progress.feed(f"(TaskRunner pid=1) step:{step} - critic/score/mean:{step / 10} - timing_s/step:2.0")
        progress.tick()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith("grpo: starting workers: model, optimizer, rollout engine, 6s so far")
    assert lines[1].endswith("grpo: step 3/10 | score 0.300 | val acc 0.253 | 2.0 s/step, about 14s left")
    clock.t += 4
    progress.tick()  # 4 s after the last line: nothing new
    assert len(out.getvalue().splitlines()) == 2
    clock.t += 1
    progress.feed("step:4 - critic/score/mean:0.5 - val-core/arithmetic/reward/mean@1:0.3")
    progress.tick()  # 5 s: another line, with the newest numbers
    assert out.getvalue().splitlines()[-1].endswith("grpo: step 4/10 | score 0.500 | val acc 0.300 | 3.0 s/step, about 18s left")
    clock.t += 5
    progress.feed("step:10 - critic/score/mean:0.6")
    progress.tick()
    assert out.getvalue().splitlines()[-1].endswith(
        "grpo: step 10/10, finishing (final validation, writing outputs) | score 0.600 | val acc 0.300 | 1.6 s/step")
    progress.close()  # nothing new since that line: no repeat
    assert len(out.getvalue().splitlines()) == 4


def test_plain_mode_shows_the_last_step_of_a_stage_faster_than_the_interval():
    clock, out = Clock(), io.StringIO()
    with StageProgress("grpo", 5, GRPO_SHOWN, GRPO_PHASES, stream=out, interactive=False, interval=5.0,
                       clock=clock) as progress:
        for step in range(1, 6):
            clock.t += 0.5
            progress.feed(f"step:{step} - critic/score/mean:{step / 10}")
            progress.tick()
        assert out.getvalue() == ""
    assert out.getvalue().splitlines()[-1].endswith(
        "grpo: step 5/5, finishing (final validation, writing outputs) | score 0.500 | 0.5 s/step")


def test_terminal_bar_shows_steps_and_numbers():
    out = io.StringIO()
    with StageProgress("sft", 4, SFT_SHOWN, stream=out, interactive=True) as progress:
        progress.feed("step:1 - train/loss:2.5")
        progress.feed("step:2 - train/loss:1.25 - val/loss:1.5")
        progress.tick()
        assert progress.bar.n == 2
    text = out.getvalue()
    assert "2/4" in text and "loss 1.250 | val loss 1.500" in text
