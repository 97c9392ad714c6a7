"""``vla serve`` under faults: silent clients holding the slots, one address taking them all, a string state, garbage
bytes, many short connections; each answered with what was wrong and what to do, and the server still serving.

Servers run in a background thread of the test process (a stub policy whose chunk repeats the state's first value),
except the last tests, which start ``vla serve`` itself in a subprocess on a saved ``micro`` policy.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import action_tokenizers as at
import numpy as np
import pytest
import torch
from action_tokenizers.synthetic import smooth_chunks
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as _connect

from vla.serve import PolicyClient, ServerError, packb, unpackb
from vla.serve.client import _CONNECT_EXTRAS
from vla.serve.server import PolicyServer, ServeConfig

pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

T, D, S = 6, 3, 5
TASK = "push the puck"
KEY = "correct-horse-battery"


class Stub:
    """``actions[b, t, :] = state[b, 0]``, at once."""

    def __init__(self):
        self.config = SimpleNamespace(
            time_horizon=T, n_action_steps=T, action_dim=D, state_dim=S, image_keys=[], image_size=None
        )
        self.last_decode_info = None

    def predict_action_chunk(self, batch):
        return batch["observation.state"][:, None, :1].expand(-1, T, D).clone()


def serve(**options):
    return PolicyServer(Stub(), ServeConfig(port=0, **options)).start_in_thread()


def connect(port: int, source: str = "127.0.0.1", key: str | None = None, **kwargs):
    """A raw websocket from ``source`` (any 127.x.y.z is this host's loopback), metadata read."""
    headers = {"Authorization": f"Api-Key {key}"} if key else None
    ws = _connect(
        f"ws://127.0.0.1:{port}",
        compression=None,
        additional_headers=headers,
        source_address=(source, 0),
        **(_CONNECT_EXTRAS | kwargs),
    )
    assert unpackb(ws.recv(timeout=10))["server"] == "vla serve"
    return ws


def refusal(port: int, **kwargs) -> tuple[int, str]:
    with pytest.raises(InvalidStatus) as err:
        connect(port, **kwargs)
    return err.value.response.status_code, err.value.response.body.decode()


def stats(port: int, key: str | None = None) -> dict:
    headers = {"Authorization": f"Api-Key {key}"} if key else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/stats", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def obs(value, **extra) -> dict:
    return {"observation/state": value, "prompt": TASK} | extra


# --- the slots ----------------------------------------------------------------------------------------------------
def test_silent_clients_are_closed_after_the_idle_timeout_and_their_slots_freed():
    with serve(api_key=KEY, max_clients=4, max_clients_per_ip=4, idle_timeout_s=2.0) as handle:
        with PolicyClient("127.0.0.1", handle.port, api_key=KEY) as client:
            assert client.metadata["limits"]["idle_timeout_s"] == 2.0
        assert wait_until(lambda: stats(handle.port, KEY)["connections"] == 0)
        silent = [connect(handle.port, key=KEY) for _ in range(4)]  # authenticated, never send
        status, body = refusal(handle.port, key=KEY)
        assert status == 503 and "limit of 4 clients" in body and "closed after 2 s" in body
        for ws in silent:  # the server closes each one, saying why
            with pytest.raises(ConnectionClosed) as err:
                ws.recv(timeout=20)
            assert err.value.rcvd.code == 1008 and "idle for 2 s" in err.value.rcvd.reason
        with PolicyClient("127.0.0.1", handle.port, api_key=KEY) as client:  # a new client gets a slot
            assert client.infer(obs(np.full(S, 3.0, np.float32)))["actions"][0, 0] == 3.0
            time.sleep(3.0)  # longer than the idle timeout: closed, and the client reconnects on its next request
            assert client.infer(obs(np.full(S, 4.0, np.float32)))["actions"][0, 0] == 4.0
            assert client.reconnects == 1
        s = stats(handle.port, KEY)
        assert s["idle_closed"] >= 5 and s["refused"] >= 1


def test_one_address_cannot_hold_every_slot():
    with serve(api_key=KEY, max_clients=4) as handle:  # the default share: half the slots
        first = [connect(handle.port, key=KEY) for _ in range(2)]
        status, body = refusal(handle.port, key=KEY)
        assert status == 503 and "127.0.0.1 holds its share of 2 of the 4 client slots" in body
        assert "--max-clients-per-ip" in body
        with pytest.raises(ConnectionError, match="answered HTTP 503: 127.0.0.1 holds its share"):
            PolicyClient("127.0.0.1", handle.port, api_key=KEY, connect_timeout_s=1)
        other = connect(handle.port, source="127.0.0.2", key=KEY)  # another address still gets in
        other.send(packb(obs(np.full(S, 5.0, np.float32))))
        assert unpackb(other.recv(timeout=10))["actions"][0, 0] == 5.0
        first[0].close()
        assert wait_until(lambda: stats(handle.port, KEY)["connections"] == 2)
        connect(handle.port, key=KEY).close()  # a freed share is taken again
        assert stats(handle.port, KEY)["refused"] >= 2
        for ws in [*first, other]:
            ws.close()
    with pytest.raises(ValueError, match="max_clients_per_ip = 5 is invalid: use 1..max_clients"):
        ServeConfig(max_clients=4, max_clients_per_ip=5)


def test_many_short_connections_leave_no_slot_taken():
    with serve(max_clients=4) as handle:
        for i in range(40):
            ws = connect(handle.port)
            if i % 2:
                ws.socket.close()  # gone without a closing handshake
            else:
                ws.close()
        deadline = time.monotonic() + 10
        while stats(handle.port)["connections"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stats(handle.port)["connections"] == 0 and not handle.server._per_ip
        clients = [PolicyClient("127.0.0.1", handle.port) for _ in range(2)]  # the full share is there again
        assert all(c.infer(obs(np.full(S, 1.0, np.float32)))["actions"][0, 0] == 1.0 for c in clients)
        for c in clients:
            c.close()


# --- what a message can hold --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("state", "match"),
    [
        (
            "0.1 0.2 0.3 0.4 0.5",
            r"'observation/state' is a str \('0.1 0.2 0.3 0.4 0.5'\); send the robot state as "
            r"float \[5\]",
        ),
        (np.array(["0.1"] * S), r"'observation/state': dtype '<U3' is refused: send bool, integer or float arrays"),
        ([0.1, None, 0.3, 0.4, 0.5], r"'observation/state' holds mixed values .*\(dtype \|O\); send the robot state"),
        ([[1.0, 2.0], [3.0]], r"'observation/state' is a ragged list .*; send the robot state as float \[5\]"),
        (b"\x00" * 20, r"'observation/state' is a bytes .*; send the robot state as float \[5\]"),
    ],
)
def test_a_state_that_is_not_numbers_is_answered_with_its_key_what_came_and_what_to_send(state, match):
    wcp = pytest.importorskip("openpi_client.websocket_client_policy")
    with serve() as handle:
        client = wcp.WebsocketClientPolicy("127.0.0.1", handle.port)
        with pytest.raises(RuntimeError, match=match) as err:
            client.infer(obs(state))
        assert "could not convert" not in str(err.value)
        assert client.infer(obs(np.full(S, 2.0, np.float32)))["actions"][0, 0] == 2.0  # the connection still works


def test_garbage_is_answered_with_what_arrived_and_what_to_send():
    with serve() as handle:
        ws = connect(handle.port)
        for message, match in [
            (
                b"\xc1 not msgpack",
                r"not a msgpack message \(malformed msgpack\): received 13 bytes starting "
                r"b'\\xc1 not msgpack'; send an observation map packed with msgpack-numpy",
            ),
            (b"", r"received an empty message \(0 bytes\)"),
            (bytes(range(100)), r"received 100 bytes starting b'\\x00\\x01.*'\.\.\.; send"),
            ("hello server", r"received a text frame \(12 characters: 'hello server'\); send observations as binary"),
        ]:
            ws.send(message)
            reply = ws.recv(timeout=10)
            assert isinstance(reply, str) and re.search(match, reply), reply
        ws.send(packb(obs(np.full(S, 6.0, np.float32))))
        assert unpackb(ws.recv(timeout=10))["actions"][0, 0] == 6.0
        ws.close()


# --- one client's message cannot stall the others -----------------------------------------------------------------
def test_an_observation_no_check_foresaw_is_answered_and_the_connection_kept(monkeypatch):
    """A reader failure of a kind no check names (here a KeyError planted in the reader) is an error reply naming
    it, never a dropped connection; the next observation is answered."""
    server = PolicyServer(Stub(), ServeConfig(port=0))
    real = server._read

    def failing(message, history):
        if unpackb(message)["prompt"] == "fail":
            raise KeyError("planted")
        return real(message, history)

    monkeypatch.setattr(server, "_read", failing)
    with server.start_in_thread() as handle:
        ws = connect(handle.port)
        ws.send(packb(obs(np.zeros(S, np.float32), prompt="fail")))
        reply = ws.recv(timeout=10)
        assert isinstance(reply, str) and "the observation could not be read (KeyError: 'planted')" in reply
        ws.send(packb(obs(np.full(S, 3.0, np.float32))))
        assert unpackb(ws.recv(timeout=10))["actions"][0, 0] == 3.0
        ws.close()


def test_a_map_of_600000_keys_is_refused_at_its_header_and_the_other_client_is_answered():
    """600,000 keys in 7.5 MB (under the 8 MiB limit) took the event loop 0.8 s a message: an 80 Hz robot's p50
    went from 8 ms to 790 ms. The map's size is refused from its header, before any key is read."""
    huge = packb({f"k{i:06d}": i for i in range(600_000)})
    assert 7 * 2**20 < len(huge) < ServeConfig().max_message_bytes
    with serve() as handle:
        flooder, robot = connect(handle.port), connect(handle.port, source="127.0.0.2")
        for _ in range(3):
            flooder.send(huge)
        robot.send(packb(obs(np.full(S, 7.0, np.float32))))
        assert unpackb(robot.recv(timeout=10))["actions"][0, 0] == 7.0
        for _ in range(3):
            reply = flooder.recv(timeout=10)
            expected = "error: the message holds a map of 600000 keys; a map may hold at most 256: send an observation"
            assert isinstance(reply, str) and reply.startswith(expected), reply
        s = stats(handle.port)
        assert s["errors"] == 3 and s["requests"] == 1 and handle.server.stats.batch_sizes == {1: 1}  # none decoded
        flooder.send(packb(obs(np.full(S, 8.0, np.float32))))  # its connection still serves
        assert unpackb(flooder.recv(timeout=10))["actions"][0, 0] == 8.0
        for ws in (flooder, robot):
            ws.close()


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ([0] * 5000, r"a list of 5000 values; a list may hold at most 4096: send arrays as numpy arrays"),
        ([[0] * 4000] * 20, r"more than 65536 values in its maps and lists; send arrays as numpy arrays"),
        (b"\x91" * 2000 + b"\x90", r"nests deeper than 8 levels; send a flat map of arrays and strings"),
    ],
)
def test_long_lists_many_values_and_deep_nesting_are_refused_as_they_are_read(message, match):
    import msgpack

    data = message if isinstance(message, bytes) else msgpack.packb(obs(message))
    with serve() as handle:
        ws = connect(handle.port)
        ws.send(data)
        reply = ws.recv(timeout=10)
        assert isinstance(reply, str) and re.search(match, reply), reply
        assert handle.server.stats.batches == 0  # nothing reached the policy
        ws.close()


def test_reading_a_message_runs_off_the_event_loop_so_a_slow_one_holds_up_only_its_own_connection():
    """A message held in reading (a large camera image being resized) until the other client has its reply: were it
    read on the event loop, the other client would wait for it, and both would time out."""
    release = threading.Event()

    class HeldReader:
        """The server's reader, holding a message whose prompt is "held" until ``release`` is set."""

        def __init__(self, reader):
            self.reader = reader

        def __getattr__(self, name):
            return getattr(self.reader, name)

        def __call__(self, message):
            if message.get("prompt") == "held":
                assert release.wait(10), "the other client was never answered while this message was read"
            return self.reader(message)

    with serve() as handle:
        handle.server.reader = HeldReader(handle.server.reader)
        held, other = connect(handle.port), connect(handle.port, source="127.0.0.2")
        held.send(packb(obs(np.full(S, 1.0, np.float32), prompt="held")))
        time.sleep(0.2)  # the held message is in its reader
        other.send(packb(obs(np.full(S, 2.0, np.float32))))
        assert unpackb(other.recv(timeout=5))["actions"][0, 0] == 2.0  # answered while the first is still read
        release.set()
        assert unpackb(held.recv(timeout=10))["actions"][0, 0] == 1.0
        for ws in (held, other):
            ws.close()


# --- what the server sends ----------------------------------------------------------------------------------------
def test_a_chunk_holding_nan_is_never_sent_and_the_batchs_other_chunks_are():
    """``valid: true`` with NaN actions reached the robot (the policy's normaliser held a NaN)."""

    class NanStub(Stub):
        """The stub, answering NaN for a state whose first value is 99 (as a NaN in a normaliser's scale does)."""

        def predict_action_chunk(self, batch):
            chunks = super().predict_action_chunk(batch)
            return chunks.masked_fill(chunks == 99.0, float("nan"))

    server = PolicyServer(NanStub(), ServeConfig(port=0, batch_window_ms=200))  # the two requests: one batch
    with server.start_in_thread() as handle:
        bad, good = connect(handle.port), connect(handle.port, source="127.0.0.2")
        bad.send(packb(obs(np.full(S, 99.0, np.float32))))
        good.send(packb(obs(np.full(S, 3.0, np.float32))))
        reply = bad.recv(timeout=10)
        expected = (
            "error: the policy produced 18 NaN or inf values in this chunk; none was sent: check the policy's saved "
            "normaliser statistics, or serve another checkpoint"
        )
        assert reply == expected
        assert unpackb(good.recv(timeout=10))["actions"][0, 0] == 3.0
        assert handle.server.stats.batch_sizes == {2: 1}
        s = stats(handle.port)
        assert s["nonfinite"] == 1 and s["errors"] == 1 and s["requests"] == 1
        for ws in (bad, good):
            ws.close()


# --- through `vla serve` ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_history_policy(tmp_path_factory) -> Path:
    """A ``micro`` policy reading the last 3 states, saved as a training run saves it."""
    from vla.policy import VLAPolicy

    torch.manual_seed(0)
    chunks = smooth_chunks(200, T, D, seed=0)
    states = np.random.default_rng(0).standard_normal((200, S))
    config = VLAPolicy.config_class(
        preset="micro", time_horizon=T, n_action_steps=3, n_obs_steps=3, image_keys=[], device="cpu", init_seed=0
    )
    policy = VLAPolicy(
        config,
        action_tokenizer=at.FASTTokenizer.fit(chunks, vocab_size=256),
        action_normalizer=at.Normalizer.fit(chunks),
        state_normalizer=at.Normalizer.fit(states),
    )
    path = tmp_path_factory.mktemp("served") / "policy"
    policy.save_pretrained(path)
    return path


def test_vla_serve_answers_a_history_policys_faults(saved_history_policy):
    """``vla serve`` in its own process: the limits and the history in the metadata, a string state, garbage, silent
    clients at ``--max-clients 2`` closed after ``--idle-timeout``, and one state a message kept per connection."""
    cmd = [
        sys.executable,
        "-m",
        "vla.cli",
        "serve",
        "--policy",
        str(saved_history_policy),
        "--port",
        "0",
        "--max-clients",
        "2",
        "--idle-timeout",
        "3",
        "--threads",
        "1",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()  # drained
        port, deadline, log = None, time.monotonic() + 180, []
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                log.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            if m := re.search(r"serving on ws://127\.0\.0\.1:(\d+)", log[-1]):  # the log line with the port
                port = int(m.group(1))
        assert port is not None, "".join(log)
        silent = connect(port, source="127.0.0.3")  # one of the two slots (each address's share: one)
        with PolicyClient("127.0.0.1", port, connect_timeout_s=30) as client:
            meta = client.metadata
            assert meta["limits"]["max_clients"] == 2 and meta["limits"]["max_clients_per_ip"] == 1
            assert meta["limits"]["idle_timeout_s"] == 3.0 and meta["history"]["n_obs_steps"] == 3
            assert meta["history"]["state_shapes"] == [[S], [3, S]]
            status, body = refusal(port, source="127.0.0.4")
            assert status == 503 and "limit of 2 clients" in body
            with pytest.raises(ServerError, match=r"'observation/state' is a str \('abc'\); send the robot state"):
                client.infer(obs("abc"))
            replies = [client.infer(obs(np.full(S, float(k), np.float32), reset=k == 0)) for k in range(4)]
            assert [r["history_frames"] for r in replies] == [1, 2, 3, 3]
            assert replies[0]["actions"].shape == (T, D)
            assert client.infer(obs(np.zeros((3, S), np.float32)))["actions"].shape == (T, D)
            with pytest.raises(ConnectionClosed) as err:  # the silent one, closed after three seconds
                silent.recv(timeout=20)
            assert err.value.rcvd.code == 1008
        raw = connect(port, source="127.0.0.3")  # its slot is free again
        raw.send(b"\xc1\xc1")
        assert raw.recv(timeout=20).startswith("error: not a msgpack message (malformed msgpack): received 2 bytes")
        raw.close()
    finally:
        proc.terminate()
        proc.wait(30)


def test_vla_serve_refuses_a_share_larger_than_the_slots(tmp_path, capsys):
    from vla.cli import main

    folder = tmp_path / "policy"
    folder.mkdir()
    assert main(["serve", "--policy", str(folder), "--max-clients", "4", "--max-clients-per-ip", "9"]) == 1
    err = capsys.readouterr().err
    assert "vla serve: error: ServeConfig.max_clients_per_ip = 9 is invalid: use 1..max_clients (4)" in err
    assert list(folder.iterdir()) == []  # nothing written


def test_vla_serve_given_a_training_runs_folder_names_the_policy_inside_it(saved_history_policy, capsys):
    from vla.cli import main

    run = saved_history_policy.parent  # the folder a training run writes its policy/ into
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert main(["serve", "--policy", str(run), "--port", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    expected = f"{run} is a training run's folder, not a policy; did you mean --policy {saved_history_policy}?"
    assert err == [f"vla serve: error: {expected}"]
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing written, nothing served
    empty = run / "empty"
    empty.mkdir()
    assert main(["serve", "--policy", str(empty), "--port", "0"]) == 1
    expected = f"{empty} holds no saved policy (no config.json); pass the folder a training run wrote"
    assert expected in capsys.readouterr().err
    empty.rmdir()
