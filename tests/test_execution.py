"""Chunk execution: the queue and ACT's temporal ensemble (vla.execution), alone and inside the rollout loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla.execution import ChunkQueue, DelayedQueue, TemporalEnsemble, executor
from vla.sim.rollout import run_episodes

T, D = 4, 2


def chunk(start: float) -> np.ndarray:
    """[T, D]: step t holds start + t in every dimension."""
    return np.repeat((start + np.arange(T, dtype=np.float64))[:, None], D, axis=1)


def test_queue_runs_the_first_n_actions_then_wants_a_chunk():
    q = ChunkQueue(3)
    assert q.needs_chunk()
    q.add(chunk(0.0))
    assert [q.pop()[0] for _ in range(3)] == [0.0, 1.0, 2.0] and q.needs_chunk()
    with pytest.raises(RuntimeError, match="add a chunk first"):
        q.pop()
    whole = ChunkQueue(None)
    whole.add(chunk(10.0))
    assert [whole.pop()[0] for _ in range(T)] == [10.0, 11.0, 12.0, 13.0] and whole.needs_chunk()


def test_ensemble_averages_every_chunk_covering_the_step_oldest_weighted_most():
    k = 0.5
    ens = TemporalEnsemble(k, every=1)
    chunks = [chunk(10.0 * i) for i in range(6)]
    executed = []
    for c in chunks:
        assert ens.needs_chunk()
        ens.add(c)
        executed.append(ens.pop()[0])
    for step, got in enumerate(executed):  # chunk i was predicted at step i and covers steps i .. i + T - 1
        covering = [i for i in range(len(chunks)) if i <= step < i + T]
        values = [chunks[i][step - i, 0] for i in covering]
        w = np.exp(-k * np.arange(len(covering)))
        assert got == pytest.approx(float(np.dot(w, values) / w.sum()))
    assert executed[1] != pytest.approx(chunks[1][0, 0])  # not the newest chunk's action: an average


def test_ensemble_every_n_steps_and_zero_coefficient_is_a_plain_mean():
    ens = TemporalEnsemble(0.0, every=2)
    ens.add(chunk(0.0))
    assert ens.pop()[0] == 0.0 and not ens.needs_chunk()
    assert ens.pop()[0] == 1.0 and ens.needs_chunk()
    ens.add(chunk(100.0))
    assert ens.pop()[0] == pytest.approx((2.0 + 100.0) / 2)


def test_ensemble_works_on_torch_batches():
    ens = executor(1, 0.01)
    batch = torch.stack([torch.as_tensor(chunk(0.0)), torch.as_tensor(chunk(5.0))])  # [B=2, T, D]
    ens.add(batch)
    first = ens.pop()
    assert isinstance(first, torch.Tensor) and first.shape == (2, D)
    torch.testing.assert_close(first[:, 0], torch.tensor([0.0, 5.0], dtype=torch.float64))


@pytest.mark.parametrize("coeff", [-0.1, float("nan"), float("inf")])
def test_bad_coefficients_are_refused(coeff):
    with pytest.raises(ValueError, match="coefficient"):
        TemporalEnsemble(coeff)
    with pytest.raises(ValueError, match="n_action_steps"):
        executor(0, None)


class CountingEnv:
    """A 1-D integrator: the state is the sum of the actions; done after 12 steps; success if it ends near 12."""

    name, action_dim, max_steps = "count/up", 1, 12

    def reset(self, seed):
        self.x, self.t = 0.0, 0
        return {"observation.state": np.array([self.x])}

    def step(self, action, render=True):
        self.x += float(action[0])
        self.t += 1
        done = self.t >= self.max_steps
        return {"observation.state": np.array([self.x])}, 0.0, done, {"success": done and abs(self.x - 12) < 1e-6}

    def close(self):
        pass


def test_rollout_with_an_ensemble_asks_every_step_and_runs_the_averages():
    calls = []

    def policy(observations):  # each chunk: [1, 1, 1, 1] (one unit a step): averages of ones are ones
        calls.append(len(observations))
        return np.ones((len(observations), T, 1))

    [queued] = run_episodes([CountingEnv()], policy, [0], n_action_steps=None)
    assert len(calls) == 3 and queued.success  # 12 steps, whole chunks of 4
    calls.clear()
    [ensembled] = run_episodes([CountingEnv()], policy, [0], n_action_steps=1, ensemble=0.01)
    assert len(calls) == 12 and ensembled.success and ensembled.length == 12
    with pytest.raises(ValueError, match="coefficient"):
        run_episodes([CountingEnv()], policy, [0], ensemble=-1.0)


def _trace(queue, steps, chunk_len=6):
    """What a queue runs over ``steps`` steps when each request at step s is answered by a chunk whose action i is
    the number 100 * s + i (so an action names the step it was asked at and its index): None for a hold."""
    ran = []
    for s in range(steps):
        if queue.needs_chunk():
            queue.add(np.array([[100.0 * s + i] for i in range(chunk_len)]))
        action = queue.pop()
        ran.append(None if action is None else int(action[0]))
    return ran


def test_a_delayed_queue_without_delay_is_the_chunk_queue():
    assert (
        _trace(DelayedQueue(4, 0), 11) == _trace(ChunkQueue(4), 11) == [0, 1, 2, 3, 400, 401, 402, 403, 800, 801, 802]
    )


def test_a_synchronous_robot_holds_until_the_reply_and_runs_it_from_its_start():
    # Asked at step 4 when the 4 actions ran out; the reply lands 2 steps later; the robot held meanwhile.
    assert _trace(DelayedQueue(4, 2), 14) == [0, 1, 2, 3, None, None, 400, 401, 402, 403, None, None, 1000, 1001]


def test_a_request_sent_ahead_lands_as_the_chunk_ends_and_skips_what_ran_meanwhile():
    # Asked at step 2 (2 actions left), delivered at step 4, its first 2 actions (for steps 2, 3) skipped: no hold.
    queue = DelayedQueue(4, 2, ahead=True)
    ran = _trace(queue, 10)
    assert ran == [0, 1, 2, 3, 202, 203, 204, 205, 602, 603]


def test_a_late_reply_ahead_is_waited_for_with_the_rest_of_the_chunk_then_a_hold():
    # 2 actions a chunk, a 5-step delay, chunks of 6: asked again at step 1, the reply lands at step 6 with its first
    # 5 actions skipped; meanwhile the first chunk runs on to its end (2..5). The next reply is late again: the robot
    # holds 4 steps after its one action (105) ran, and that reply skips only the 1 action that ran, not 5.
    ran = _trace(DelayedQueue(2, 5, ahead=True), 13)
    assert ran == [0, 1, 2, 3, 4, 5, 105, None, None, None, None, 601, 602]


def test_rollout_behind_a_delay_holds_and_counts_it():
    def policy(observations):  # one unit a step: the counting env succeeds only if all 12 steps move
        return np.ones((len(observations), T, 1))

    [now] = run_episodes([CountingEnv()], policy, [0], n_action_steps=None)
    [zero] = run_episodes([CountingEnv()], policy, [0], n_action_steps=None, delay_steps=0)
    assert now == zero and now.success and now.held == 0
    [late] = run_episodes([CountingEnv()], policy, [0], n_action_steps=None, delay_steps=2)
    # Chunks of 4, a 2-step hold after each (CountingEnv has no hold_action: the last action, 1, runs again).
    assert late.held == 4 and late.length == 12
    [ahead] = run_episodes([CountingEnv()], policy, [0], n_action_steps=2, delay_steps=2, ahead=True)
    assert ahead.held == 0 and ahead.success


def test_the_jump_at_the_hand_over_is_measured_against_what_ran_before():
    calls = []

    def policy(observations):  # the k-th chunk holds k + 1 in every step: a jump of 1 at each hand-over
        calls.append(1)
        return np.full((len(observations), T, 1), float(len(calls)))

    [result] = run_episodes([CountingEnv()], policy, [0], n_action_steps=None)
    assert result.switch_jump == 1.0 and result.step_change == 0.0 and len(calls) == 3
    calls.clear()
    [late] = run_episodes([CountingEnv()], policy, [0], n_action_steps=None, delay_steps=2)
    # CountingEnv holds by running its last action again: the hand-over after a hold still jumps by 1
    assert late.held > 0 and late.switch_jump == 1.0


def test_an_ensemble_behind_a_delay_spreads_a_change_of_plan_over_the_chunks_it_blends():
    def policy(observations):  # the plan changes once: chunks of zeros, then from the 4th request on chunks of ones
        calls.append(1)
        return np.full((len(observations), T, 1), float(len(calls) >= 4))

    # Asked every step behind a 1-step delay, chunks of 4 (3 left when they land): replaced, the action jumps from 0
    # to 1 in one step; blended with the chunks still running, it climbs by a third a step.
    for ensemble, biggest in ((None, 1.0), (0.0, 1 / 3)):
        calls, actions = [], []
        kwargs = dict(n_action_steps=None, delay_steps=1, ahead=True, every=1, ensemble=ensemble)
        [run] = run_episodes([CountingEnv()], policy, [0], on_step=lambda k, o, a: actions.append(a[0]), **kwargs)
        assert run.held == 0 and run.length == 12 and len(calls) == 12
        assert np.max(np.abs(np.diff(actions))) == pytest.approx(biggest) and actions[-1] == 1.0


def test_a_delayed_queue_names_the_actions_that_run_while_a_reply_is_on_its_way():
    """With ``ahead``, the request leaves with the running chunk's next ``delay`` actions, and exactly those run
    before the reply lands; a synchronous robot (or one that has no chunk yet) commits none."""
    chunk = np.arange(8, dtype=np.float64)[:, None]  # [8, 1]
    queue = DelayedQueue(None, delay_steps=3, ahead=True)
    assert queue.committed() is None  # before the first chunk
    queue.add(chunk)  # the first arrives at once
    ran = [float(queue.pop()[0]) for _ in range(5)]
    assert ran == [0, 1, 2, 3, 4] and queue.needs_chunk()  # 3 actions left: ask now
    committed = queue.committed()
    np.testing.assert_array_equal(committed, chunk[5:8])
    queue.add(chunk + 100)  # lands 3 steps from now, its first 3 actions skipped
    assert [float(queue.pop()[0]) for _ in range(4)] == [5, 6, 7, 103]  # the committed actions, then the reply's
    sync = DelayedQueue(None, delay_steps=3, ahead=False)
    sync.add(chunk)
    assert sync.committed() is None


def test_requests_every_k_steps_keep_several_on_their_way_and_each_skips_what_ran_meanwhile():
    # A 3-step delay, a request every 2 steps, chunks of 6: after the first chunk (at once), replies asked at steps
    # 2, 4, 6, ... land at 5, 7, 9, ..., each skipping the 3 actions that ran while it was on its way; no hold, and
    # every action runs 3-4 steps after the observation it was predicted from (one reply at a time: up to 2 x 3).
    ran = _trace(DelayedQueue(None, 3, ahead=True, every=2), 12)
    assert ran == [0, 1, 2, 3, 4, 203, 204, 403, 404, 603, 604, 803]


def test_requests_every_k_steps_without_delay_is_a_queue_of_k_actions():
    assert _trace(DelayedQueue(None, 0, ahead=True, every=3), 10) == _trace(ChunkQueue(3), 10)


def test_requests_every_k_steps_hold_when_a_chunk_is_short_of_the_delay_plus_k():
    # A 4-step delay, every 3 steps, chunks of 6 (< 4 + 3): the first chunk ends a step before the reply asked at
    # step 3 lands (step 7); the robot holds once, and that reply skips only the 3 actions that ran (it goes on from
    # where the robot stopped), so later replies land in time.
    ran = _trace(DelayedQueue(None, 4, ahead=True, every=3), 13)
    assert ran == [0, 1, 2, 3, 4, 5, None, 303, 304, 305, 603, 604, 605]


def test_every_k_steps_needs_ahead_and_k_of_one_or_more():
    for kwargs in ({"ahead": False, "every": 2}, {"ahead": True, "every": 0}):
        with pytest.raises(ValueError, match="every"):
            DelayedQueue(None, 3, **kwargs)


def test_committed_actions_with_several_replies_on_their_way_stop_where_the_next_lands():
    chunk = np.arange(10, dtype=np.float64)[:, None]
    queue = DelayedQueue(None, delay_steps=4, ahead=True, every=2)
    queue.add(chunk)
    queue.pop(), queue.pop()
    assert queue.needs_chunk()
    np.testing.assert_array_equal(queue.committed(), chunk[2:6])  # nothing on its way: the next 4 run
    queue.add(chunk + 100)  # lands in 4 steps
    queue.pop(), queue.pop()
    assert queue.needs_chunk()
    np.testing.assert_array_equal(queue.committed(), chunk[4:6])  # the reply on its way lands after 2 of them


def test_an_ensemble_behind_a_delay_blends_each_landing_reply_with_the_chunks_still_running():
    # The trace of test_requests_every_k_steps_keep_several_on_their_way..., chunks of 8: each reply lands (its 3
    # stale actions skipped) while the older chunks still have actions, and each step runs the plain mean (coefficient
    # 0) of what every running chunk planned for it: 5 and 203 -> 104 at step 5, three chunks at step 7.
    ran = _trace(DelayedQueue(None, 3, ahead=True, every=2, ensemble=0.0), 10, chunk_len=8)
    assert ran[:5] == [0, 1, 2, 3, 4]
    assert ran[5:] == [104, 105, (7 + 205 + 403) // 3, (206 + 404) // 2, (207 + 405 + 603) // 3]
    # Without the ensemble the same requests replace each other: the jump the blend smooths.
    assert _trace(DelayedQueue(None, 3, ahead=True, every=2), 10, chunk_len=8)[5:] == [203, 204, 403, 404, 603]


def test_an_ensemble_behind_a_delay_weights_the_oldest_most_and_holds_only_when_all_ran_out():
    queue = DelayedQueue(None, 2, ahead=True, every=1, ensemble=1.0)
    queue.add(np.zeros((6, 1)))
    assert queue.pop()[0] == 0.0 and queue.switched
    queue.add(np.ones((6, 1)))  # lands after 2 steps, its first 2 actions (for the steps that ran meanwhile) skipped
    queue.pop()
    queue.pop()
    blended = queue.pop()[0]  # the zeros (oldest, weight 1) with the ones (weight e^-1) and nothing newer yet
    assert blended == pytest.approx(np.exp(-1.0) / (1 + np.exp(-1.0))) and queue.switched
    # Chunks of 2 with a delay of 4: the first runs out before any reply lands, and the robot holds.
    short = _trace(DelayedQueue(None, 4, ahead=True, every=2, ensemble=0.01), 6, chunk_len=2)
    assert short[:2] == [0, 1] and short[2:4] == [None, None]


def test_a_blended_reply_whose_every_action_is_stale_changes_nothing():
    # A first chunk of 10, then replies of 3 behind a 4-step delay: each lands after 4 actions ran, all of its own
    # stale, so the first chunk runs on alone, and no step counts as a hand-over.
    queue = DelayedQueue(None, 4, ahead=True, every=1, ensemble=0.01)
    ran, switched = [], []
    for s in range(10):
        if queue.needs_chunk():
            queue.add(np.arange(10.0)[:, None] if s == 0 else np.full((3, 1), -1.0))
        ran.append(float(queue.pop()[0]))
        switched.append(queue.switched)
    assert ran == list(np.arange(10.0)) and switched == [True] + [False] * 9
    assert queue.committed() is None  # blended actions are no one chunk's: none to send


def test_an_ensemble_behind_a_delay_needs_requests_every_k_steps():
    with pytest.raises(ValueError, match="every"):
        DelayedQueue(None, 3, ahead=True, ensemble=0.01)
    for ahead in (False, True):
        with pytest.raises(ValueError, match="--every"):
            executor(1, 0.01, delay_steps=3, ahead=ahead)
    with pytest.raises(ValueError, match="finite"):
        DelayedQueue(None, 3, ahead=True, every=2, ensemble=float("nan"))
    assert isinstance(executor(None, 0.01, delay_steps=3, ahead=True, every=2), DelayedQueue)
