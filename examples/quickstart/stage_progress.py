"""Live progress for the quickstart's stages, read from each stage's own console output.

Every trainer the quickstart runs prints verl's per-step console line, ``step:12 - critic/score/mean:0.25 - ...``.
``StageProgress`` is fed the stage's output line by line (the full output still goes to the stage's log file)
and shows where the stage is:

- on a terminal, a tqdm bar per stage (steps done, elapsed, rate, remaining) with the latest numbers
  (training score and validation accuracy for GRPO, losses for SFT), redrawn every second, so the clock keeps
  moving through start-up and validation too;
- otherwise (piped to a file, CI), one plain line at most every ``interval`` seconds and at least that often
  while the stage runs, e.g. ``[quickstart 12:00:31] grpo: step 12/200 | score 0.250 | val acc 0.253 | 1.5 s/step,
  about 4m 42s left``.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Callable, TextIO

from tqdm import tqdm

__all__ = ["StageProgress", "parse_step_line", "stamp", "fmt_duration"]

STEP_LINE = re.compile(r"\bstep:(\d+) - (.*)$")


def stamp(msg: str) -> str:
    return f"[quickstart {time.strftime('%H:%M:%S')}] {msg}"


def fmt_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    minutes, secs = divmod(seconds, 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def parse_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {metric: value})`` from a console-logger line (also behind a Ray ``(TaskRunner pid=..)`` prefix)."""
    match = STEP_LINE.search(line.rstrip())
    if match is None:
        return None
    metrics = {}
    for part in match.group(2).split(" - "):
        key, sep, value = part.rpartition(":")
        if not sep:
            continue
        try:
            metrics[key.strip()] = float(value)
        except ValueError:
            continue
    return int(match.group(1)), metrics


def _first_match(metrics: dict[str, float], pattern: re.Pattern) -> float | None:
    for key, value in metrics.items():
        if pattern.search(key):
            return value
    return None


# label -> how to find it in a step's metrics (exact name, or a pattern for names that embed the data source)
Shown = dict[str, "str | re.Pattern"]
GRPO_SHOWN: Shown = {"score": "critic/score/mean", "val acc": re.compile(r"^val-core/.+/reward/mean@\d+$")}
SFT_SHOWN: Shown = {"loss": "train/loss", "val loss": "val/loss"}
# what the stage is doing before its first step: (a line that marks the start of a phase, the phase)
Phases = list[tuple[re.Pattern, str]]
GRPO_PHASES: Phases = [
    (re.compile(r"Started a local Ray instance"), "Ray started"),
    (re.compile(r"TaskRunner on "), "loading tokenizer, data and reward"),
    (re.compile(r"Resource pools: "), "starting workers: model, optimizer, rollout engine"),
    (re.compile(r"Initial validation metrics"), "validated the start model; first step"),
]
SFT_PHASES: Phases = [
    (re.compile(r"^SFT: \d+ train rows"), "loading the model"),
    (re.compile(r"contains [\d.]+[KMB]? parameters"), "first step"),
]


class StageProgress:
    """Progress of one stage; call ``feed(line)`` for each output line and ``tick()`` about once a second."""

    def __init__(self, name: str, total_steps: int | None = None, shown: Shown | None = None,
                 phases: Phases | None = None, stream: TextIO | None = None, interactive: bool | None = None,
                 interval: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.name, self.total, self.shown = name, total_steps, dict(shown or {})
        self.phases, self.phase = list(phases or []), "starting"
        self.stream = stream if stream is not None else sys.stdout
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.interval, self.clock = interval, clock
        self.start = self.last_print = clock()
        self.step = 0
        self.latest: dict[str, float] = {}  # label -> latest value seen
        self.first_step_at: tuple[int, float] | None = None
        self.last_step_at: tuple[int, float] | None = None
        self.bar = None
        self.printed_step = 0  # the step the last plain line showed
        if self.interactive:
            self.bar = tqdm(total=total_steps, desc=f"{name} (starting)", unit="step", file=self.stream,
                            dynamic_ncols=True, mininterval=0.5)

    # ---------------------------------------------------------------------------------------------- input
    def feed(self, line: str) -> None:
        parsed = parse_step_line(line)
        if parsed is None:
            for pattern, phase in self.phases:
                if pattern.search(line):
                    self.phase = phase
                    if self.bar is not None and self.step == 0:
                        self.bar.set_description(f"{self.name} ({phase})")
            return
        step, metrics = parsed
        for label, key in self.shown.items():
            value = metrics.get(key) if isinstance(key, str) else _first_match(metrics, key)
            if value is not None:
                self.latest[label] = value
        if step <= 0:  # e.g. validation before the first training step
            return
        now = self.clock()
        if self.first_step_at is None:
            self.first_step_at = (step, now)
        self.last_step_at = (step, now)
        if self.bar is not None:
            self.bar.set_description(self.name)
            self.bar.update(max(step - self.step, 0))
            self.bar.set_postfix_str(self._numbers(), refresh=False)
        self.step = max(self.step, step)

    # --------------------------------------------------------------------------------------------- output
    def _numbers(self) -> str:
        return " | ".join(f"{label} {self.latest[label]:.3f}" for label in self.shown if label in self.latest)

    def seconds_per_step(self) -> float | None:
        if self.first_step_at is None or self.last_step_at is None:
            return None
        (s0, t0), (s1, t1) = self.first_step_at, self.last_step_at
        return (t1 - t0) / (s1 - s0) if s1 > s0 else None

    def status_line(self) -> str:
        elapsed = self.clock() - self.start
        if self.step == 0:
            where = f"{self.phase}, {fmt_duration(elapsed)} so far" if self.total else f"running, {fmt_duration(elapsed)}"
            parts = [where]
        elif self.total and self.step >= self.total:
            parts = [f"step {self.step}/{self.total}, finishing (final validation, writing outputs)"]
        else:
            parts = [f"step {self.step}/{self.total}" if self.total else f"step {self.step}"]
        if self.latest:
            parts.append(self._numbers())
        rate = self.seconds_per_step()
        if rate is not None:
            timing = f"{rate:.1f} s/step"
            if self.total and self.step < self.total:
                timing += f", about {fmt_duration(rate * (self.total - self.step))} left"
            parts.append(timing)
        return f"{self.name}: " + " | ".join(parts)

    def tick(self) -> None:
        now = self.clock()
        if self.bar is not None:
            self.bar.refresh()
            return
        if now - self.last_print >= self.interval:
            self._print_line(now)

    def _print_line(self, now: float) -> None:
        print(stamp(self.status_line()), file=self.stream, flush=True)
        self.last_print, self.printed_step = now, self.step

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.step > self.printed_step:  # steps finished since the last line (a fast stage): show where it ended
            self._print_line(self.clock())

    def __enter__(self) -> "StageProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
