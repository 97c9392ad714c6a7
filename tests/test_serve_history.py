"""Serving a policy that reads a state history (``n_obs_steps`` = 3): the server keeps each connection's last states,
or the client sends ``[n, S]``; ``ChunkExecutor`` and ``vla.serve.robot`` keep it at the control rate.

The policies: a ``micro`` random-weight ``VLAPolicy`` with ``n_obs_steps=3`` (the real path: its own shape checks and
decoding), wrapped so that the states it is shown are recorded; and a stub whose actions spell out the history it was
given (``actions[b, t, 0]`` = frame ``min(t, n - 1)``'s first value), so that every reply shows which states it saw.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import action_tokenizers as at
import numpy as np
import pytest
import torch
from action_tokenizers.synthetic import smooth_chunks

from vla.serve import ChunkExecutor, PolicyClient, Rate
from vla.serve.server import PolicyServer, ServeConfig

pytestmark = [
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]
wcp = pytest.importorskip("openpi_client.websocket_client_policy")

T, D, S, N = 6, 3, 5, 3
TASK = "push the puck"


def micro_history_policy(state_dim: int = S, action_dim: int = D):
    from vla.policy import VLAPolicy

    chunks = smooth_chunks(200, T, action_dim, seed=0)
    states = np.random.default_rng(0).standard_normal((200, state_dim))
    config = VLAPolicy.config_class(
        preset="micro", time_horizon=T, n_action_steps=3, n_obs_steps=N, image_keys=[], device="cpu", init_seed=0
    )
    return VLAPolicy(
        config,
        action_tokenizer=at.FASTTokenizer.fit(chunks, vocab_size=256),
        action_normalizer=at.Normalizer.fit(chunks),
        state_normalizer=at.Normalizer.fit(states),
    ).eval()


class Recording:
    """``policy`` with every state batch it is shown kept in ``seen`` (float [B, n, S] each)."""

    def __init__(self, policy):
        self.policy, self.config, self.seen = policy, policy.config, []

    def predict_action_chunk(self, batch):
        self.seen.append(torch.as_tensor(batch["observation.state"]).clone())
        return self.policy.predict_action_chunk(batch)


class HistoryStub:
    """Actions that spell out the history: ``actions[b, t, :] = state[b, min(t, n - 1), 0]``."""

    def __init__(self, state_dim: int = S):
        self.config = SimpleNamespace(
            time_horizon=T,
            n_action_steps=T,
            action_dim=D,
            state_dim=state_dim,
            image_keys=[],
            image_size=None,
            n_obs_steps=N,
        )
        self.last_decode_info = None

    def predict_action_chunk(self, batch):
        state = batch["observation.state"]  # [B, n, S]
        assert state.shape[1:] == (N, self.config.state_dim), state.shape
        frames = state[:, [min(t, N - 1) for t in range(T)], 0]  # [B, T]
        return frames[:, :, None].expand(-1, T, D).clone()


def serve(policy, **options):
    return PolicyServer(policy, ServeConfig(port=0, **options)).start_in_thread()


def seen_history(reply) -> list[float]:
    """The first value of each of the n frames the stub was shown, oldest first."""
    return reply["actions"][:N, 0].tolist()


def state(value: float) -> np.ndarray:
    return np.full(S, value, np.float32)


# --- the server keeps the history ---------------------------------------------------------------------------------
def test_metadata_says_how_to_send_the_history_and_openpis_client_gets_the_policys_own_answers():
    policy = Recording(micro_history_policy())
    states = np.random.default_rng(1).standard_normal((4, S)).astype(np.float32)
    with serve(policy) as handle:
        client = wcp.WebsocketClientPolicy("127.0.0.1", handle.port)
        meta = client.get_server_metadata()
        assert meta["policy"]["n_obs_steps"] == N
        assert meta["history"]["state_shapes"] == [[S], [N, S]] and meta["history"]["reset_key"] == "reset"
        assert meta["history"]["reset_after_idle_s"] == ServeConfig().history_reset_s
        assert f"[{N}, {S}]" in meta["observation"]["observation.state"]
        replies = [client.infer({"observation/state": states[k], "prompt": TASK, "reset": k == 0}) for k in range(4)]
        assert [r["history_frames"] for r in replies] == [1, 2, 3, 3]
        # the policy was shown the episode's last three states, the first repeated before it starts
        for k, rows in enumerate([[0, 0, 0], [0, 0, 1], [0, 1, 2], [1, 2, 3]]):
            np.testing.assert_array_equal(policy.seen[k][0].numpy(), states[rows])
        with torch.inference_mode():  # and the reply is what the policy answers for that history itself
            expected = policy.policy.predict_action_chunk(
                {"observation.state": torch.as_tensor(states[[1, 2, 3]])[None], "task": [TASK]}
            )[0].numpy()
        np.testing.assert_allclose(replies[3]["actions"], expected, rtol=1e-5, atol=1e-5)
        # the client's own history [n, S] in one message is read as it is
        own = client.infer({"observation/state": states[[3, 2, 1]], "prompt": TASK})
        np.testing.assert_array_equal(policy.seen[-1][0].numpy(), states[[3, 2, 1]])
        assert "history_frames" not in own and own["actions"].shape == (T, D)
        # any other number of states is refused with both shapes that work; the connection stays usable
        with pytest.raises(RuntimeError, match=rf"has shape \[2, {S}\]; send float \[{S}\].*or float \[{N}, {S}\]"):
            client.infer({"observation/state": states[:2], "prompt": TASK})
        with pytest.raises(RuntimeError, match="'reset' must be true or false"):
            client.infer({"observation/state": states[0], "prompt": TASK, "reset": "yes"})
        assert client.infer({"observation/state": states[0], "prompt": TASK})["history_frames"] == 3  # not reset


def test_two_connections_keep_separate_histories_and_reset_starts_one_again():
    with serve(HistoryStub()) as handle:
        a = wcp.WebsocketClientPolicy("127.0.0.1", handle.port)
        b = wcp.WebsocketClientPolicy("127.0.0.1", handle.port)

        def ask(client, value, **extra):
            return seen_history(client.infer({"observation.state": state(value), "prompt": TASK} | extra))

        assert ask(a, 1) == [1, 1, 1]
        assert ask(a, 2) == [1, 1, 2]
        assert ask(b, 10) == [10, 10, 10]  # b's episode starts with its own first state, not a's
        assert ask(a, 3) == [1, 2, 3]
        assert ask(b, 11) == [10, 10, 11]
        assert ask(a, 4) == [2, 3, 4]
        assert ask(a, 7, reset=True) == [7, 7, 7]  # a new episode on a
        assert ask(b, 12) == [10, 11, 12]  # b untouched by a's reset


def test_concurrent_connections_in_one_batch_keep_their_own_histories():
    n, m = 6, 5
    with serve(HistoryStub(), batch_window_ms=5) as handle:
        clients = [PolicyClient("127.0.0.1", handle.port) for _ in range(n)]
        barrier, seen, failures = threading.Barrier(n), {}, []

        def run(i: int) -> None:
            try:
                barrier.wait()
                for r in range(m):
                    seen[i, r] = seen_history(
                        clients[i].infer({"observation.state": state(100 * i + r), "prompt": TASK, "reset": r == 0})
                    )
            except Exception as err:  # noqa: BLE001 - reported by the assertion below
                failures.append(repr(err))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for c in clients:
            c.close()
    assert not failures, failures
    for (i, r), history in seen.items():
        assert history == [100 * i + max(r - k, 0) for k in (2, 1, 0)], (i, r, history)


def test_a_quiet_gap_starts_the_history_again():
    with serve(HistoryStub(), history_reset_s=0.3) as handle, PolicyClient("127.0.0.1", handle.port) as client:
        client.infer({"observation.state": state(1), "prompt": TASK})
        reply = client.infer({"observation.state": state(2), "prompt": TASK})
        assert seen_history(reply) == [1, 1, 2] and reply["history_frames"] == 2
        time.sleep(0.8)  # longer than history_reset_s: the robot paused between episodes
        reply = client.infer({"observation.state": state(3), "prompt": TASK})
        assert seen_history(reply) == [3, 3, 3] and reply["history_frames"] == 1


def test_a_one_frame_policy_still_refuses_several_states():
    stub = HistoryStub()
    stub.config.n_obs_steps = 1
    stub.predict_action_chunk = lambda batch: torch.zeros(len(batch["task"]), T, D)
    with serve(stub) as handle, PolicyClient("127.0.0.1", handle.port) as client:
        assert client.metadata["history"]["state_shapes"] == [[S]]
        with pytest.raises(Exception, match="holds 3 states; send one observation per message"):
            client.infer({"observation.state": np.zeros((3, S), np.float32), "prompt": TASK})
        assert "history_frames" not in client.infer({"observation.state": state(0), "prompt": TASK})


# --- the robot keeps the history ----------------------------------------------------------------------------------
class TickHistory:
    """A local ``infer`` whose server says ``n_obs_steps = 3``; it records the states each request carried."""

    def __init__(self):
        self.states: list[np.ndarray] = []
        self.ticks: list[int] = []

    def get_server_metadata(self) -> dict:
        return {"policy": {"n_obs_steps": N}}

    def infer(self, obs: dict) -> dict:
        self.states.append(np.array(obs["observation/state"]))
        self.ticks.append(obs["tick"])
        t = obs["tick"]
        return {"actions": (t + np.arange(4, dtype=np.float64))[:, None]}


def test_executor_sends_the_last_n_states_of_every_tick_oldest_first():
    inner = TickHistory()
    executor = ChunkExecutor(inner, control_hz=200, k=1)  # n_obs_steps from the metadata
    assert executor.n_obs_steps == N
    for episode in range(2):
        executor.reset()
        rate = Rate(200)
        for t in range(20):
            executor.act({"observation/state": np.array([100.0 * episode + t, -1.0]), "tick": t})
            rate.sleep()
    executor.close()  # waits for the request in flight
    episodes = [int(sent[-1, 0] // 100) for sent in inner.states]
    assert episodes.count(0) >= 3 and episodes.count(1) >= 3  # several requests an episode, most between chunks
    for sent, tick, episode in zip(inner.states, inner.ticks, episodes):
        # the states of the three ticks up to the request's (every tick pushed, asked or not), oldest first, the
        # episode's first repeated before it starts (never the previous episode's)
        assert sent.shape == (N, 2)
        np.testing.assert_array_equal(sent[:, 0], [100.0 * episode + max(tick - k, 0) for k in (2, 1, 0)])
    stateless = ChunkExecutor(inner, control_hz=200)
    with pytest.raises(ValueError, match="has none of observation.state"):
        stateless.act({"tick": 0})
    stateless.close()


def test_realtime_robot_episode_with_a_history_policy():
    """Meta-World in real time (``vla.serve.robot``) against a served ``n_obs_steps=3`` micro policy: the executor
    learns n from the metadata and every request the policy reads is the [3, 39] history."""
    from vla.serve.robot import run_realtime_episode
    from vla.sim.metaworld_env import MetaWorldEnv

    policy = Recording(micro_history_policy(state_dim=39, action_dim=4))
    with serve(policy) as handle, PolicyClient("127.0.0.1", handle.port) as client:
        env = MetaWorldEnv("push-v3", max_steps=20)
        executor = ChunkExecutor(client, control_hz=env.fps, horizon=T)
        try:
            result = run_realtime_episode(env, executor, seed=1_000_000, max_steps=20)
        finally:
            executor.close()
            env.close()
        stats = handle.server.stats
    assert executor.n_obs_steps == N
    assert result["length"] == 20 and result["chunks"] >= 1 and result["errors"] == 0
    assert stats.errors == 0 and len(policy.seen) == result["requests"]  # every request reached the policy
    assert all(s.shape[1:] == (N, 39) for s in policy.seen)
    first = policy.seen[0][0]
    torch.testing.assert_close(first[0], first[2])  # the episode's first state, repeated
