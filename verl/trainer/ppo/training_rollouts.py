"""The training batches' rollouts: in step with the updates, or one update ahead (``rollout.staleness``).

With ``actor_rollout_ref.rollout.staleness=1`` the rollout of step k+1 starts as soon as step k's
batch is taken, on the weights before step k's update, so on the Ray backend it runs in the rollout
workers while step k computes its log-probs and updates; the update's weight push waits for it
(the workers' engine lock). Step k+1 then trains on a batch sampled one update earlier, which the
truncated importance weights against the rollout's own log-probs correct (the decoupled PPO
objective: Hilton et al. 2022, "Batch size-invariance for policy optimization"; the one-step
off-policy pipelines of AReaL and veRL's one_step_off_policy recipe).
"""

from __future__ import annotations

from typing import Any, Callable


class TrainingRollouts:
    """Draws each step's prompts and rolls them out, in step or one step ahead.

    Args:
        loader: the training batches (``next_batch()``, ``state_dict()``).
        start: ``prompts -> pending`` (``get()`` gives the rolled-out batch): starts one rollout.
        staleness: 0 (each step's rollout when the step asks for it) or 1 (the next step's rollout
            started before this step's is returned).
    """

    def __init__(self, loader, start: Callable[[Any], Any], staleness: int) -> None:
        if staleness not in (0, 1):
            raise ValueError(f"staleness must be 0 or 1, got {staleness}")
        self.loader, self.start, self.staleness = loader, start, staleness
        self.pending = None  # the started rollout not yet taken
        self._position_before_pending: dict | None = None

    def next(self, more: bool):
        """This step's rolled-out batch, waiting for it; with ``staleness=1`` and ``more`` (another
        step follows), the next step's rollout is started before this returns."""
        if self.pending is None:
            self.pending = self._start()
        batch = self.pending.get()
        self.pending = self._start() if self.staleness and more else None
        return batch

    def settle(self) -> None:
        """Wait for the rollout in flight, if any, keeping its batch for :meth:`next` (split pools push
        weights only to engines that are not generating: the push's collectives then never wait on a
        rollout)."""
        if self.pending is not None and not isinstance(self.pending, _Finished):
            self.pending = _Finished(self.pending.get())

    def _start(self):
        self._position_before_pending = self.loader.state_dict()
        return self.start(self.loader.next_batch())

    def state_dict(self) -> dict:
        """The data position a checkpoint keeps: the prompts of a rollout started for a step not yet
        trained are not counted, so a resume draws them again."""
        return self._position_before_pending if self.pending is not None else self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's data position (any started rollout is dropped)."""
        self.pending = None
        self.loader.load_state_dict(state)


class _Finished:
    """A rollout already waited for: ``get()`` gives its batch."""

    def __init__(self, batch) -> None:
        self.batch = batch

    def get(self):
        return self.batch
