"""Which training steps the workers profile (``global_profiler.steps``) and the calls that tell them.

Before a listed step the trainer calls ``start_profile(profile_step=N)`` on every worker group of the run, after it
``stop_profile()``; what the workers record is up to their roles' ``profiler`` keys (verl.utils.profiler). With
``global_profiler.profile_continuous_steps=True`` a run of consecutive listed steps (e.g. 2, 3, 4) is profiled as
one: started before the first, stopped after the last.
"""

from __future__ import annotations

from verl.trainer.config_schema.profiler import GlobalProfilerConfig

__all__ = ["ProfilingMixin"]


class ProfilingMixin:
    """Trainer side of profiling; the trainer provides ``typed_config``, ``global_steps`` and its worker groups."""

    @property
    def _global_profiler(self) -> GlobalProfilerConfig:
        return self.typed_config.global_profiler

    def _profiled_steps(self) -> set[int]:
        return set(self._global_profiler.steps or ())  # null: no step is profiled

    def _profile_bounds(self) -> tuple[bool, bool]:
        """(start before this step, stop after it)."""
        steps, step = self._profiled_steps(), self.global_steps
        if step not in steps:
            return False, False
        if not self._global_profiler.profile_continuous_steps:
            return True, True
        return step - 1 not in steps, step + 1 not in steps

    def _profiled_worker_groups(self) -> list:
        """The run's worker groups (each once) whose workers can be profiled (DistProfilerExtension)."""
        unique = []
        for name in ("actor_rollout_wg", "ref_policy_wg", "critic_wg", "rm_wg"):
            wg = getattr(self, name, None)
            if wg is None or any(wg is seen for seen in unique):  # with LoRA the reference is the actor's group
                continue
            if not hasattr(wg, "start_profile"):
                print(f"warning: {name}'s worker class has no start_profile/stop_profile (mix in "
                      "verl.utils.profiler.DistProfilerExtension): its workers are not profiled", flush=True)
                continue
            unique.append(wg)
        return unique

    def _start_profiling(self, do_profile: bool) -> None:
        """Start profiling step ``global_steps`` on every worker group (verl's name)."""
        if do_profile:
            for wg in self._profiled_worker_groups():
                wg.start_profile(role="e2e", profile_step=self.global_steps)

    def _stop_profiling(self, do_profile: bool) -> None:
        """Stop profiling on every worker group (verl's name)."""
        if do_profile:
            for wg in self._profiled_worker_groups():
                wg.stop_profile()
