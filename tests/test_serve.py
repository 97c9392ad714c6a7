"""``vla serve``: openpi's protocol (driven by openpi's own client), batching, errors, limits, keys, load, the executor.

Servers run in a background thread of the test process and bind to 127.0.0.1 on a free port. The policy is a ``micro``
random-weight ``VLAPolicy`` built here (greedy, so its answers are reproducible), or, where timing is the point, a stub
with the same interface whose actions encode the request (so every reply can be matched to its request).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import action_tokenizers as at
import numpy as np
import pytest
import torch
from action_tokenizers.synthetic import smooth_chunks
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as _connect

from vla.serve import ChunkExecutor, PolicyClient, Rate, ServerError, action_jerk, packb, unpackb
from vla.serve.client import _CONNECT_EXTRAS
from vla.serve.codec import DecodeError
from vla.serve.server import PolicyServer, ServeConfig

# openpi's client calls websockets' connect() the pre-17 way, which websockets 17 warns about (not ours to change)
pytestmark = [
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]

T, D, S = 6, 3, 5
CAM = "observation.images.front"
TASK = "push the puck"


@pytest.fixture(scope="module")
def policy():
    """A micro VLAPolicy with one camera and random weights (the real decoding path, a few ms a chunk)."""
    from vla.policy import VLAPolicy

    chunks = smooth_chunks(200, T, D, seed=0)
    states = np.random.default_rng(0).standard_normal((200, S))
    config = VLAPolicy.config_class(
        preset="micro", time_horizon=T, n_action_steps=3, image_keys=[CAM], device="cpu", init_seed=0
    )
    return VLAPolicy(
        config,
        action_tokenizer=at.FASTTokenizer.fit(chunks, vocab_size=256),
        action_normalizer=at.Normalizer.fit(2.0 * chunks + 1.0),
        state_normalizer=at.Normalizer.fit(states),
    ).eval()


class StubPolicy:
    """``predict_action_chunk`` answering ``actions[b, t, :] = state[b, 0] + t`` after ``delay_s``; records batches."""

    def __init__(self, delay_s: float = 0.0, state_dim: int = S):
        self.config = SimpleNamespace(
            time_horizon=T, n_action_steps=T, action_dim=D, state_dim=state_dim, image_keys=[], image_size=None
        )
        self.delay_s = delay_s
        self.batch_sizes: list[int] = []
        self.last_decode_info = None

    def predict_action_chunk(self, batch):
        self.batch_sizes.append(len(batch["task"]))
        time.sleep(self.delay_s)
        state = batch["observation.state"][:, :1]  # [B, 1]
        return (state[:, None, :] + torch.arange(T, dtype=torch.float32)[None, :, None]).expand(-1, T, D).clone()


def observation(seed: int = 0, image_size: int = 40, **extra) -> dict:
    rng = np.random.default_rng(seed)
    obs = {
        "observation/state": rng.standard_normal(S).astype(np.float32),  # openpi-style slashes are accepted
        "observation/images/front": rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8),  # HWC
        "prompt": TASK,
    }
    return obs | extra


def stub_obs(value: float, **extra) -> dict:
    return {"observation.state": np.full(S, value, np.float32), "prompt": TASK} | extra


def serve(policy, **options) -> object:
    return PolicyServer(policy, ServeConfig(port=0, **options)).start_in_thread()


def connect(uri: str, **kwargs):
    """A raw websocket connection (for messages no client would send)."""
    return _connect(uri, **(_CONNECT_EXTRAS | kwargs))


def http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


# --- the wire format ----------------------------------------------------------------------------------------------
def test_codec_round_trip_and_bytes_equal_openpis():
    obs = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.uint8(7),
        "s": "text",
        "n": [1, 2.5, None],
        "img": np.zeros((4, 4, 3), np.uint8),
        "flag": np.array([True, False]),
    }
    data = packb(obs)
    back = unpackb(data)
    assert back.keys() == obs.keys() and back["s"] == "text" and back["n"] == [1, 2.5, None]
    for key in ("a", "img", "flag"):
        assert back[key].dtype == obs[key].dtype and np.array_equal(back[key], obs[key])
    assert back["b"] == 7 and back["b"].dtype == np.uint8
    msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")
    assert data == msgpack_numpy.packb(obs)  # byte for byte what openpi's client sends
    assert np.array_equal(unpackb(msgpack_numpy.packb(obs))["a"], obs["a"])
    assert np.array_equal(msgpack_numpy.unpackb(data)["a"], obs["a"])


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ({b"__ndarray__": True, b"data": b"\x80\x04N.", b"dtype": "|O", b"shape": [1]}, "refused"),  # pickle bytes
        ({b"__ndarray__": True, b"data": b"\0" * 16, b"dtype": "<c16", b"shape": [1]}, "refused"),
        ({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|V8", b"shape": [1]}, "refused"),
        ({b"__ndarray__": True, b"data": b"\0" * 4, b"dtype": "<f4", b"shape": [1000, 1000]}, "needs 4000000 bytes"),
        ({b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [-1]}, "non-negative"),
        ({b"__npgeneric__": True, b"data": "x", b"dtype": "|O"}, "refused"),
        ({b"__npgeneric__": True, b"data": 1000, b"dtype": "|u1"}, "does not fit its dtype"),  # numpy: OverflowError
        ({b"__npgeneric__": True, b"data": -1, b"dtype": "<u8"}, "does not fit its dtype"),
    ],
)
def test_codec_refuses_what_could_run_code_or_lie_about_sizes(message, match):
    import msgpack

    with pytest.raises(DecodeError, match=match):
        unpackb(msgpack.packb({"x": message}))


def test_codec_refuses_ext_types_garbage_and_deep_nesting():
    import msgpack

    with pytest.raises(DecodeError, match="extension type"):
        unpackb(msgpack.packb(msgpack.ExtType(1, b"payload")))
    with pytest.raises(DecodeError, match="not a msgpack message"):
        unpackb(b"\xc1\xc1\xc1")
    deep: dict = {}
    for _ in range(20):
        deep = {"x": deep}
    with pytest.raises(DecodeError, match="nests deeper"):
        unpackb(msgpack.packb(deep))
    with pytest.raises(ValueError, match="unsupported dtype"):
        packb({"x": np.array([object()])})


# --- openpi's own client ------------------------------------------------------------------------------------------
def test_openpi_client_drives_the_server(policy):
    wcp = pytest.importorskip(
        "openpi_client.websocket_client_policy",
        reason="pip install --no-deps openpi-client (its numpy<2 pin conflicts with lerobot's)",
    )
    obs = observation(0)
    with torch.inference_mode():  # what the policy answers itself, given the same observation as a batch of one
        expected = policy.predict_action_chunk(
            {
                "observation.state": torch.as_tensor(obs["observation/state"])[None],
                CAM: torch.as_tensor(obs["observation/images/front"]).permute(2, 0, 1)[None],  # uint8 [1, 3, H, W]
                "task": [TASK],
            }
        )[0].numpy()
    with serve(policy) as handle:
        client = wcp.WebsocketClientPolicy("127.0.0.1", handle.port)
        meta = client.get_server_metadata()
        assert meta["policy"]["time_horizon"] == T and meta["policy"]["image_keys"] == [CAM]
        reply = client.infer(obs)
        assert reply["actions"].shape == (T, D) and reply["actions"].dtype == np.float32
        assert reply["server_timing"]["infer_ms"] > 0 and reply["valid"] is True
        np.testing.assert_allclose(reply["actions"], expected, rtol=1e-5, atol=1e-5)
        # a malformed observation: openpi's client raises on the error reply, and the same connection still works
        with pytest.raises(RuntimeError, match=r"observation.state'\] has shape \(1, 7\)"):
            client.infer(observation(1) | {"observation/state": np.zeros(S + 2, np.float32)})
        with pytest.raises(RuntimeError, match="lacks camera"):
            client.infer({"observation/state": np.zeros(S, np.float32), "prompt": TASK})
        chw = np.ascontiguousarray(obs["observation/images/front"].transpose(2, 0, 1))[None]  # [1, 3, H, W] too
        again = client.infer(obs | {"observation/images/front": chw})
        np.testing.assert_allclose(again["actions"], reply["actions"], rtol=1e-5, atol=1e-5)
        assert "prev_total_ms" in again["server_timing"]
        assert http_status(handle.port, "/healthz") == 200


def test_api_key_is_required_when_set(policy):
    key = "correct-horse-battery"
    with serve(policy, api_key=key) as handle:
        assert http_status(handle.port, "/healthz") == 200  # health checks need no key
        with pytest.raises(InvalidStatus) as err:
            connect(f"ws://127.0.0.1:{handle.port}", compression=None)
        assert err.value.response.status_code == 401
        with pytest.raises(PermissionError, match="api_key"):
            PolicyClient("127.0.0.1", handle.port, api_key="wrong-key-123", connect_timeout_s=2)
        with PolicyClient("127.0.0.1", handle.port, api_key=key) as client:
            assert client.infer(observation(0))["actions"].shape == (T, D)
        wcp = pytest.importorskip("openpi_client.websocket_client_policy")
        openpi = wcp.WebsocketClientPolicy("127.0.0.1", handle.port, api_key=key)
        assert openpi.infer(observation(0))["actions"].shape == (T, D)
        with pytest.raises(InvalidStatus):
            wcp.WebsocketClientPolicy("127.0.0.1", handle.port)


def test_malformed_messages_get_error_replies_and_the_connection_stays_usable(policy):
    with serve(policy) as handle, connect(f"ws://127.0.0.1:{handle.port}", compression=None) as ws:
        unpackb(ws.recv(timeout=10))  # metadata
        bad = [
            b"\xc1 not msgpack",
            "a text frame",
            packb([1, 2, 3]),
            packb(observation(0) | {"prompt": ""}),
            packb(observation(0) | {"observation/images/front": np.zeros((4, 4), np.uint8)}),
            packb(observation(0) | {"observation/state": np.full(S, np.nan, np.float32)}),
        ]
        for message in bad:
            ws.send(message)
            reply = ws.recv(timeout=10)
            assert isinstance(reply, str) and reply.startswith("error: "), reply
        ws.send(packb(observation(0, request_id=42)))
        reply = unpackb(ws.recv(timeout=10))
        assert reply["request_id"] == 42 and reply["actions"].shape == (T, D)


@pytest.mark.parametrize(
    ("image", "match"),
    [
        (np.full((40, 40, 3), 4000, np.uint16), r"is uint16 \(values up to 4000\); send uint8 in 0\.\.255 \(a 16-bit"),
        (
            np.full((40, 40, 3), 200.0, np.float32),
            r"is float32 with values in \[200, 200\]; float images must lie in "
            r"\[0, 1\]: send uint8 0\.\.255",
        ),
        (np.full((40, 40, 3), -0.5, np.float32), r"is float32 with values in \[-0\.5, -0\.5\]; float images must lie"),
    ],
)
def test_images_outside_the_pixel_rule_are_refused_and_never_reach_the_policy(policy, image, match):
    """Float images in 0..255 and uint16 images reached the model unscaled. The rule (docs/serving.md): uint8 in
    0..255, or float in [0, 1]."""
    with serve(policy) as handle, connect(f"ws://127.0.0.1:{handle.port}", compression=None) as ws:
        unpackb(ws.recv(timeout=10))  # metadata
        ws.send(packb(observation(0) | {"observation/images/front": image}))
        reply = ws.recv(timeout=10)
        assert isinstance(reply, str) and re.search(rf"^error: camera '{CAM}' {match}", reply), reply
        assert handle.server.stats.batches == 0  # nothing reached the policy
        uint8 = observation(0)
        as_float = uint8 | {"observation/images/front": uint8["observation/images/front"].astype(np.float32) / 255}
        replies = []
        for message in (uint8, as_float):
            ws.send(packb(message))
            replies.append(unpackb(ws.recv(timeout=10))["actions"])
        np.testing.assert_allclose(replies[0], replies[1], atol=1e-5)  # the same pixels either way


def test_oversize_messages_close_only_their_connection(policy):
    with serve(policy, max_message_bytes=64 * 1024) as handle:
        with connect(f"ws://127.0.0.1:{handle.port}", compression=None, max_size=None) as ws:
            ws.recv(timeout=10)
            ws.send(packb(observation(0, image_size=200)))  # 120 kB
            with pytest.raises(ConnectionClosed) as err:
                ws.recv(timeout=10)
            assert err.value.rcvd.code == 1009  # message too big
        with PolicyClient("127.0.0.1", handle.port) as client:
            assert client.infer(observation(0))["actions"].shape == (T, D)


# --- several robots at once ---------------------------------------------------------------------------------------
def test_concurrent_clients_are_batched_and_replies_matched():
    stub = StubPolicy(delay_s=0.05)
    n = 8
    with serve(stub, batch_window_ms=5) as handle:
        clients = [PolicyClient("127.0.0.1", handle.port) for _ in range(n)]
        barrier, replies = threading.Barrier(n), {}

        def run(i: int) -> None:
            barrier.wait()
            for r in range(3):
                value = 100 * i + r
                replies[value] = clients[i].infer(stub_obs(value, request_id=f"{i}-{r}"))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(replies) == 3 * n
        for value, reply in replies.items():
            assert reply["request_id"] == f"{value // 100}-{value % 100}"
            np.testing.assert_array_equal(reply["actions"][:, 0], value + np.arange(T))  # its own request's answer
        assert max(stub.batch_sizes) > 1 and sum(stub.batch_sizes) == 3 * n
        assert max(r["server_timing"]["batch_size"] for r in replies.values()) > 1
        for c in clients:
            c.close()


def test_a_vanished_or_idle_client_never_stalls_the_others():
    stub = StubPolicy(delay_s=0.2)
    with serve(stub) as handle:
        idle = connect(f"ws://127.0.0.1:{handle.port}", compression=None)  # connects, never reads or sends
        for _ in range(3):  # clients that send a request and vanish before the answer
            ws = connect(f"ws://127.0.0.1:{handle.port}", compression=None)
            ws.recv(timeout=10)
            ws.send(packb(stub_obs(1.0)))
            ws.socket.close()  # gone without a closing handshake
        with PolicyClient("127.0.0.1", handle.port, timeout_s=30) as client:  # a stall would end in its timeout
            for i in range(3):
                assert client.infer(stub_obs(float(i)))["actions"][0, 0] == i
        idle.close()
        assert http_status(handle.port, "/healthz") == 200


def test_request_timeout_and_full_queue_answer_errors_without_hanging():
    stub = StubPolicy(delay_s=0.5)
    with serve(stub, request_timeout_s=0.2, max_queue=1, batch_window_ms=0) as handle:
        with PolicyClient("127.0.0.1", handle.port) as client:
            with pytest.raises(ServerError, match="request timeout"):
                client.infer(stub_obs(1.0))
            time.sleep(0.6)  # let the worker finish the abandoned request
        errors, n = [], 6
        barrier = threading.Barrier(n)

        def run() -> None:
            with PolicyClient("127.0.0.1", handle.port, timeout_s=10) as c:
                barrier.wait()
                try:
                    c.infer(stub_obs(2.0))
                except ServerError as err:
                    errors.append(str(err))

        threads = [threading.Thread(target=run) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert any("busy" in e for e in errors), errors  # a bounded queue refuses at once rather than waiting
        assert all("busy" in e or "timeout" in e for e in errors)
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{handle.port}/stats", timeout=5).read())
        assert stats["busy"] >= 1 and stats["timeouts"] >= 1


def test_load_n_clients_by_m_requests_none_lost_and_healthy_after(policy):
    n, m = 8, 12
    with serve(policy, max_batch=8) as handle:
        results: dict[tuple[int, int], dict] = {}
        failures: list[str] = []

        def run(i: int) -> None:
            try:
                with PolicyClient("127.0.0.1", handle.port) as client:
                    for r in range(m):
                        reply = client.infer(observation(i * m + r, request_id=i * 1000 + r))
                        results[i, r] = reply
            except Exception as err:  # noqa: BLE001 - reported by the assertion below
                failures.append(repr(err))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures, failures
        assert len(results) == n * m  # none lost
        assert all(reply["request_id"] == i * 1000 + r for (i, r), reply in results.items())  # each matched
        assert all(r["actions"].shape == (T, D) and np.isfinite(r["actions"]).all() for r in results.values())
        assert http_status(handle.port, "/healthz") == 200
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{handle.port}/stats", timeout=5).read())
        assert stats["requests"] == n * m and stats["errors"] == 0 and stats["connections"] == 0


def test_client_reconnects_after_a_server_restart():
    stub = StubPolicy()
    handle = serve(stub)
    port = handle.port
    client = PolicyClient("127.0.0.1", port, reconnect_timeout_s=10)
    assert client.infer(stub_obs(1.0))["actions"][0, 0] == 1.0
    handle.stop()
    restarted = PolicyServer(stub, ServeConfig(port=port)).start_in_thread()
    try:
        assert client.infer(stub_obs(2.0))["actions"][0, 0] == 2.0
        assert client.reconnects == 1
    finally:
        client.close()
        restarted.stop()


def deaf_server(stop: threading.Event) -> tuple[int, threading.Thread]:
    """A websocket server that accepts one client, sends its metadata and never reads again (a stopped process
    whose socket stays open): what the client sends piles up in the kernel's buffers, then blocks."""
    import base64
    import hashlib
    import socket

    listener = socket.create_server(("127.0.0.1", 0))

    def run():
        conn, _ = listener.accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(4096)
        key = re.search(rb"Sec-WebSocket-Key: (\S+)", request, re.IGNORECASE).group(1)
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        metadata = packb({})
        conn.sendall(bytes([0x82, len(metadata)]) + metadata)  # one unmasked binary frame
        stop.wait()
        conn.close()
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def test_a_send_to_a_server_that_stopped_reading_times_out():
    """Before, the send blocked until TCP gave up (minutes); now it is bounded like the reply."""
    stop, outcome = threading.Event(), {}
    port, server = deaf_server(stop)
    client = PolicyClient("127.0.0.1", port, timeout_s=0.5)
    big = {"observation/image": np.zeros((64, 1024, 1024), np.uint8)}  # 64 MiB: more than any socket buffer

    def infer():
        try:
            client.infer(big)
        except Exception as err:  # noqa: BLE001 - what the call raised is the outcome
            outcome["error"] = err

    caller = threading.Thread(target=infer, daemon=True)
    caller.start()
    caller.join(60)  # a guard against hanging the suite, not a timing: the send is bounded by 0.5 s
    stop.set()
    assert not caller.is_alive(), "the send still blocks on a server that stopped reading"
    assert isinstance(outcome.get("error"), TimeoutError)
    assert f"could not send to ws://127.0.0.1:{port} within 0.5 s: the server takes no more data" in str(
        outcome["error"]
    )
    server.join(5)
    client.close()


# --- the robot side -----------------------------------------------------------------------------------------------
class TickPolicy:
    """A local ``infer``: the chunk for an observation taken at tick ``t`` is ``[t, t + 1, ...]`` (action ``i`` is
    meant for tick ``t + i``), after ``delay_s``. Starting at 1, a zero action would be visible."""

    def __init__(self, delay_s: float, size: int = 10):
        self.delay_s, self.size, self.calls = delay_s, size, 0
        self.fail = False

    def infer(self, obs: dict) -> dict:
        self.calls += 1
        time.sleep(self.delay_s)
        if self.fail:
            raise ConnectionError("server down")
        t = obs["tick"]
        return {"actions": (t + np.arange(self.size, dtype=np.float64))[:, None].repeat(2, axis=1)}


def run_ticks(executor: ChunkExecutor, ticks: int, hz: float = 200.0, offset: int = 1) -> np.ndarray:
    executor.reset()
    rate = Rate(hz)
    out = []
    for t in range(ticks):
        out.append(executor.act({"tick": t + offset})[0])
        rate.sleep()
    return np.asarray(out)


def test_overlapped_executor_drops_stale_actions_and_never_waits():
    inner = TickPolicy(delay_s=0.02)  # 4 ticks at 200 Hz
    executor = ChunkExecutor(inner, control_hz=200, k=6)
    actions = run_ticks(executor, 60)
    # every executed action is the one meant for its tick (stale ones dropped), or a held repeat of the last one
    fresh = actions == np.arange(1, 61)
    held = np.r_[False, actions[1:] == actions[:-1]]
    assert (fresh | held).all()
    assert fresh.sum() >= 20  # mostly fresh (how much depends on the machine's load: threads, timers)
    assert (actions != 0).all()
    s = executor.stats
    assert s.stale > 0 and s.chunks >= 5 and s.errors == 0
    assert s.held == (~fresh).sum()
    executor.close()


class Recorder:
    """A local ``infer`` that keeps every observation it is sent; a chunk of ``size`` actions ``[0, 1, ...]``, and the
    server metadata of a policy that decodes after committed actions."""

    def __init__(self, size: int = 10):
        self.size, self.sent = size, []

    def get_server_metadata(self) -> dict:
        return {"policy": {"committed_actions": True}}

    def infer(self, obs: dict) -> dict:
        self.sent.append(obs)
        return {"actions": np.arange(self.size, dtype=np.float64)[:, None].repeat(2, axis=1)}


def test_overlapped_requests_carry_the_actions_that_run_while_they_are_on_their_way():
    """A server whose policy decodes after committed actions gets, with each overlapped request, what is left of the
    current chunk (this tick's action first); a synchronous robot, or one told not to, sends none."""
    inner = Recorder()
    executor = ChunkExecutor(inner, control_hz=200, k=3)
    assert executor.commit
    for _ in range(8):
        executor.act({"observation.state": np.zeros(2, np.float32)})
    time.sleep(0.2)  # the second request leaves from the executor's thread
    executor.close()
    first, second = inner.sent[:2]
    assert "committed_actions" not in first  # the episode's first request: nothing runs meanwhile
    np.testing.assert_array_equal(second["committed_actions"][:, 0], [7, 8, 9])  # asked with 3 left, at tick 7
    for commit, mode in ((False, "overlapped"), (None, "sync")):
        inner = Recorder()
        executor = ChunkExecutor(inner, control_hz=200, k=3, commit=commit, mode=mode)
        for _ in range(12):
            executor.act({"observation.state": np.zeros(2, np.float32)})
            time.sleep(0.01)
        executor.close()
        assert len(inner.sent) >= 2 and all("committed_actions" not in o for o in inner.sent)
    for mode, every in (("sync", None), ("overlapped", 2)):  # asked for where no actions are committed: refused
        with pytest.raises(ValueError, match=f"commit=True with mode '{mode}' and every = {every}.*commit=None"):
            ChunkExecutor([Recorder()] * 2, control_hz=200, commit=True, mode=mode, every=every)


def test_a_server_refusing_the_first_request_is_asked_with_backoff_and_its_reason_is_said(monkeypatch):
    """An error reply on every request (a misnamed state key): the robot waits longer after each failure before
    asking again (the pauses it asks for are recorded; each is slept 1 ms here), and the timeout says the server's
    reason, not whether it is up."""
    import vla.serve.executor as executor_module

    real_sleep, pauses = time.sleep, []

    def recorded(seconds):
        pauses.append(seconds)
        real_sleep(0.001)

    def refusing(obs):
        raise ServerError("the observation lacks 'observation.state'")

    monkeypatch.setattr(executor_module.time, "sleep", recorded)
    executor = ChunkExecutor(refusing, control_hz=200, first_chunk_timeout_s=1.0)
    with pytest.raises(TimeoutError, match="no first chunk within 1.0 s .*lacks 'observation.state'"):
        executor.act({"state": np.zeros(2, np.float32)})
    executor.close()
    assert pauses[:5] == [0.05, 0.1, 0.2, 0.4, 0.8]  # doubling after each failure
    assert max(pauses) <= 1.0  # up to 1 s (or what is left of the wait)


def test_executor_asking_every_k_ticks_keeps_several_requests_on_their_way():
    """Every 2 ticks a request leaves on a free connection while earlier ones are still on their way (a 4-tick round
    trip): about one request per 2 ticks, the actions run are the ones meant for their ticks (stale ones dropped),
    and a chunk of 8 (the round trip plus 2, with room) leaves the robot holding only at the start."""
    inner = TickPolicy(delay_s=0.02, size=8)  # 4 ticks at 200 Hz
    executor = ChunkExecutor([inner] * 4, control_hz=200, every=2)
    actions = run_ticks(executor, 60)
    fresh = actions == np.arange(1, 61)
    held = np.r_[False, actions[1:] == actions[:-1]]
    assert (fresh | held).all() and (actions != 0).all()
    s = executor.stats
    assert 20 <= s.requests <= 31 and s.chunks >= 15 and s.errors == 0  # 60 ticks / 2, less the first chunk's wait
    assert fresh.sum() >= 30  # mostly fresh (how much depends on the machine's load: threads, timers)
    executor.close()


class SlowFirst(TickPolicy):
    """The first request of an episode takes ``slow_s``, the others ``delay_s``: its reply lands after later ones."""

    def __init__(self, delay_s: float, slow_s: float, size: int = 10):
        super().__init__(delay_s, size)
        self.slow_s = slow_s

    def infer(self, obs: dict) -> dict:
        if obs["tick"] != 3:
            return super().infer(obs)
        time.sleep(self.slow_s)
        return {"actions": np.full((self.size, 2), -1.0)}  # marked: never meant to run


def test_a_reply_that_lands_after_a_later_requests_is_dropped():
    inner = SlowFirst(delay_s=0.005, slow_s=0.1, size=40)
    executor = ChunkExecutor([inner] * 4, control_hz=200, every=2)
    actions = run_ticks(executor, 50)
    # the reply asked at tick 3 lands ~20 ticks late, after the replies asked after it: never adopted
    assert (actions > 0).all() and executor.stats.requests >= 15
    executor.close()


class ChangeOfPlan(TickPolicy):
    """Chunks of zeros for the first 4 requests, then chunks of ones."""

    def infer(self, obs: dict) -> dict:
        self.calls += 1
        time.sleep(self.delay_s)
        return {"actions": np.full((self.size, 2), float(self.calls > 4))}


def test_an_ensembling_executor_blends_each_reply_with_the_chunks_still_running():
    # Chunks that agree on each tick's action ([t, t + 1, ...] from tick t) blend to that action: still the fresh one.
    executor = ChunkExecutor([TickPolicy(delay_s=0.01, size=12)] * 4, control_hz=200, every=2, ensemble=0.01)
    actions = run_ticks(executor, 40)
    fresh = np.isclose(actions, np.arange(1, 41))
    held = np.r_[False, actions[1:] == actions[:-1]]
    assert (fresh | held).all() and fresh.sum() >= 20 and executor.stats.chunks >= 8
    executor.close()
    # A change of plan reaches the robot through blends (between 0 and 1), not as one jump; replaced, it jumps.
    for ensemble in (0.0, None):
        executor = ChunkExecutor([ChangeOfPlan(delay_s=0.005, size=12)] * 4, control_hz=200, every=1, ensemble=ensemble)
        actions = run_ticks(executor, 40)
        executor.close()
        between = ((actions > 0) & (actions < 1)).sum()
        assert actions[-1] == 1.0 and (between >= 2 if ensemble is not None else between == 0)
    with pytest.raises(ValueError, match="every=K"):
        ChunkExecutor([Recorder()], control_hz=200, ensemble=0.01)


def test_replies_landing_within_one_tick_all_join_the_blend_and_only_the_newest_replaces():
    for ensemble, blended in ((0.01, 2), (None, 0)):
        executor = ChunkExecutor([Recorder(size=6)] * 2, control_hz=200, every=1, ensemble=ensemble)
        executor.reset()
        for number in (2, 1):  # landed out of order, before the robot's next tick
            executor._fetch({"tick": 0}, ran=0, epoch=executor._epoch, number=number)
        executor._adopt(fresh_start=True)
        assert len(executor._blend) == blended and executor.stats.chunks == max(blended, 1)
        executor.close()


def test_every_needs_the_overlapped_mode_and_refuses_committed_actions():
    with pytest.raises(ValueError, match="overlapped mode"):
        ChunkExecutor([Recorder()], control_hz=200, every=2, mode="sync")
    with pytest.raises(ValueError, match="overlapped mode"):
        ChunkExecutor([], control_hz=200, every=2)
    executor = ChunkExecutor([Recorder(), Recorder()], control_hz=200, every=2)
    assert not executor.commit  # which actions run before a reply lands is not known when it is asked
    executor.close()


def test_sync_executor_holds_while_waiting_and_restarts_chunks():
    inner = TickPolicy(delay_s=0.02, size=5)
    executor = ChunkExecutor(inner, control_hz=200, mode="sync")
    actions = run_ticks(executor, 40)
    assert executor.stats.held > 0 and executor.stats.stale == 0  # waited each time, executed each chunk from its start
    assert (actions != 0).all()
    assert action_jerk(actions[:, None]) >= 0
    executor.close()


def test_executor_holds_the_last_action_while_the_server_is_down_and_recovers():
    inner = TickPolicy(delay_s=0.001, size=4)
    executor = ChunkExecutor(inner, control_hz=200, k=1)
    executor.reset()
    rate = Rate(200)
    out = []
    for t in range(60):
        inner.fail = 15 <= t < 35
        out.append(executor.act({"tick": t + 1})[0])
        rate.sleep()
    out = np.asarray(out)
    assert executor.stats.errors > 0 and executor.stats.held > 10
    assert (out != 0).all()  # held, never zeros
    assert out[-1] == 60 or out[-1] == out[-2]  # fresh chunks again once the server is back
    assert out[45:].max() > out[30]
    executor.close()


def test_auto_k_follows_the_round_trip():
    inner = TickPolicy(delay_s=0.03, size=20)
    executor = ChunkExecutor(inner, control_hz=200, k=None)
    run_ticks(executor, 40)
    rtt_ms = float(np.median(executor._recent_rtt))
    assert rtt_ms >= 30 and executor._k() == min(int(np.ceil(rtt_ms * 200 / 1000)) + 1, 19)  # 30 ms >= 6 ticks, + 1
    assert executor._k() >= 7
    executor.close()


def test_serve_cli_defaults_bind_localhost():
    import argparse

    from vla.serve.cli import add_cli

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--policy", "p"])
    assert args.host == "127.0.0.1" and args.port == 8000
    with pytest.raises(ValueError, match="ServeConfig.api_key"):
        ServeConfig(api_key="short")


def test_realtime_robot_episode_against_the_server():
    """Meta-World stepped at its control rate by ``vla.serve.robot``, a (stub) policy served over the websocket."""
    from vla.serve.robot import run_realtime_episode
    from vla.sim.metaworld_env import MetaWorldEnv

    stub = StubPolicy(delay_s=0.01, state_dim=39)
    stub.config.action_dim = 4

    def zero_ish(batch):  # small constant pushes: a valid 4-D action chunk whatever the state
        b = len(batch["task"])
        return torch.full((b, T, 4), 0.1)

    stub.predict_action_chunk = zero_ish
    with serve(stub) as handle, PolicyClient("127.0.0.1", handle.port) as client:
        env = MetaWorldEnv("push-v3", max_steps=20)
        executor = ChunkExecutor(client, control_hz=env.fps, horizon=T)
        try:
            result = run_realtime_episode(env, executor, seed=1_000_000, max_steps=20)
        finally:
            executor.close()
            env.close()
    assert result["length"] == 20 and result["chunks"] >= 2 and result["errors"] == 0
    assert executor.stats.ticks == 20 and len(executor.executed_actions) == 20


def test_committed_actions_in_a_request_begin_the_chunk_and_old_requests_are_answered_as_before(policy):
    """``committed_actions`` (the protocol's optional field): a binning policy's reply begins with them (within half
    a bin) and the rest is decoded after them; the same request without them is answered as before; a policy whose
    ids mix the chunk's steps (FAST) searches its decoded chunks for them, and with ``commit_search`` 0 refuses the
    field with an error reply, and says so in its metadata."""
    from vla.policy import VLAPolicy

    chunks = smooth_chunks(200, T, D, seed=0)
    normalizer = at.Normalizer.fit(2.0 * chunks + 1.0)
    config = VLAPolicy.config_class(
        preset="micro", time_horizon=T, n_action_steps=3, image_keys=[CAM], device="cpu", init_seed=0
    )
    binned = VLAPolicy(
        config,
        action_tokenizer=at.BinningTokenizer.fit(chunks, n_bins=64),
        action_normalizer=normalizer,
        state_normalizer=at.Normalizer.fit(np.random.default_rng(0).standard_normal((200, S))),
    ).eval()
    committed = normalizer.unnormalize(np.random.default_rng(1).uniform(-0.8, 0.8, (2, D))).astype(np.float32)
    half_bin = np.abs(normalizer.scale) / 64 + 1e-5
    with serve(binned) as handle, PolicyClient("127.0.0.1", handle.port) as client:
        assert client.metadata["policy"]["committed_actions"] is True
        plain = client.infer(observation(0))["actions"]
        reply = client.infer(observation(0, committed_actions=committed))["actions"]
        assert np.all(np.abs(reply[:2] - committed) <= half_bin) and not np.all(
            np.abs(plain[:2] - committed) <= half_bin
        )
        np.testing.assert_array_equal(client.infer(observation(0))["actions"], plain)  # no field: as before
        with pytest.raises(ServerError, match="committed_actions' has shape"):
            client.infer(observation(0, committed_actions=np.zeros((T + 1, D), np.float32)))
    with serve(policy) as handle, PolicyClient("127.0.0.1", handle.port) as client:
        assert client.metadata["policy"]["committed_actions"] is True  # FAST: a search
        assert client.infer(observation(0, committed_actions=committed))["actions"].shape == (T, D)
    policy.config.commit_search = 0
    try:
        with serve(policy) as handle, PolicyClient("127.0.0.1", handle.port) as client:
            assert client.metadata["policy"]["committed_actions"] is False
            with pytest.raises(ServerError, match="commit_search is 0"):
                client.infer(observation(0, committed_actions=committed))
    finally:
        policy.config.commit_search = 8
