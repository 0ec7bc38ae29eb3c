"""Each step's rollout in step with the updates or one update ahead (``rollout.staleness``): which
prompts start when, and the data position a checkpoint keeps while a rollout is in flight. The
whole run with the overlap (Ray workers, vLLM) is in tests/rollout/test_async_workers.py."""

from __future__ import annotations

import pytest

from verl.single_controller.base.worker_group import PendingCall
from verl.trainer.ppo.data_loading import BatchLoader, ResumableBatchSampler
from verl.trainer.ppo.training_rollouts import TrainingRollouts


def make(staleness: int, log: list):
    """A loader over rows 0..5 in order (batches of 2) and a start that logs each start and get."""
    loader = BatchLoader(list(range(6)), lambda rows: {"row": rows},
                         ResumableBatchSampler(6, 2, shuffle=False))

    def start(batch):
        rows = [int(r) for r in batch.non_tensor_batch["row"]]
        log.append(("start", rows))
        return PendingCall(lambda: rows, lambda got: log.append(("get", got)) or got)

    return TrainingRollouts(loader, start, staleness)


def test_staleness_0_starts_each_rollout_when_its_step_asks():
    log = []
    rollouts = make(0, log)
    assert rollouts.next(more=True) == [0, 1] and rollouts.pending is None
    assert rollouts.next(more=True) == [2, 3]
    assert log == [("start", [0, 1]), ("get", [0, 1]), ("start", [2, 3]), ("get", [2, 3])]
    assert rollouts.state_dict() == {"epoch": 0, "position": 2}


def test_staleness_1_starts_the_next_rollout_before_this_one_trains():
    log = []
    rollouts = make(1, log)
    assert rollouts.next(more=True) == [0, 1]
    assert log == [("start", [0, 1]), ("get", [0, 1]), ("start", [2, 3])]  # started before step 1 trains
    # a checkpoint of step 1 does not count the prompts in flight: a resume draws them again
    assert rollouts.state_dict() == {"epoch": 0, "position": 1}
    assert rollouts.next(more=False) == [2, 3] and rollouts.pending is None  # no step follows: none started
    assert log[-1] == ("get", [2, 3]) and rollouts.state_dict() == {"epoch": 0, "position": 2}


def test_resume_drops_the_rollout_in_flight_and_draws_its_prompts_again():
    log = []
    rollouts = make(1, log)
    rollouts.next(more=True)
    saved = rollouts.state_dict()
    resumed = make(1, log)
    resumed.next(more=True)  # a run that went on further
    resumed.load_state_dict(saved)
    assert resumed.pending is None and resumed.next(more=True) == [2, 3]


def test_staleness_other_than_0_or_1_is_refused():
    with pytest.raises(ValueError, match="staleness must be 0 or 1, got 2"):
        make(2, [])


def test_settle_waits_for_the_rollout_in_flight_and_keeps_its_batch():
    """Split pools push weights only once the rollout in flight ended: ``settle`` waits for it (one
    get), the next step takes that batch without waiting again, and a checkpoint meanwhile still keeps
    the position before its prompts."""
    log = []
    rollouts = make(1, log)
    rollouts.next(more=True)
    rollouts.settle()
    rollouts.settle()  # nothing more in flight: no second get
    assert log == [("start", [0, 1]), ("get", [0, 1]), ("start", [2, 3]), ("get", [2, 3])]
    assert rollouts.state_dict() == {"epoch": 0, "position": 1}  # before the second batch's prompts
    assert rollouts.next(more=True) == [2, 3]
    assert log[4:] == [("start", [4, 5])]  # its batch taken without another get
    make(0, []).settle()  # staleness 0: nothing in flight between steps
