"""The server on loopback and a robot in real time: round trips for many clients, sync vs overlapped execution.

    python scripts/bench_serve.py --policy outputs/train/fast/policy [MORE_POLICIES ...] --out results/serve
        [--episodes 20] [--clients 1 4 16] [--requests 40] [--delays-ms 0 50 150] [--server-threads 2]

Everything runs on 127.0.0.1. The server is ``vla serve`` in its own process. Two measurements:

1. ``round_trip`` (the first policy): N clients (threads, one ``PolicyClient`` each) send M observations back to
   back, all at once; per request the wall time from send to reply, p50/p95, the throughput, and the batch sizes the
   server reports.
2. ``closed_loop`` (every policy, so chunks of several lengths): Meta-World push-v3 stepped in real time at its
   control rate (80 Hz, ``vla.serve.Rate``), the
   policy behind a TCP proxy (another process) that delays every byte by ``delay`` ms in each direction. For each delay,
   ``sync`` (ask when the chunk's ``n_action_steps`` are used up, hold the last action while waiting, run the new chunk
   from its start: openpi's ``ActionChunkBroker`` in a world that does not wait) against ``overlapped``
   (``ChunkExecutor``: ask while ``k`` actions are left, ``k`` from the measured round trip; drop stale actions; hold
   when late). Per episode: success, length, action jerk (RMS second difference of the executed actions, per step),
   ticks holding the last action, actions dropped as stale. The world waits only for an episode's first chunk.

Writes ``bench_serve.json``, ``bench_serve.md`` and ``bench_serve.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


# --- processes ----------------------------------------------------------------------------------------------------
def wait_healthy(port: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the server on port {port} did not become healthy within {timeout_s} s")


def start_server(policy: Path, port: int, threads: int, extra: list[str] = ()) -> subprocess.Popen:
    """``vla serve`` in its own process (through ``vla.serve.cli.main``, the same parser as the command)."""
    cmd = [
        sys.executable,
        "-c",
        "import sys; from vla.serve.cli import main; sys.exit(main())",
        "--policy",
        str(policy),
        "--port",
        str(port),
        "--threads",
        str(threads),
        *extra,
    ]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_healthy(port)
    return proc


def start_proxy(listen: int, target: int, delay_ms: float) -> subprocess.Popen:
    cmd = [
        sys.executable,
        __file__,
        "proxy",
        "--listen",
        str(listen),
        "--target",
        str(target),
        "--delay-ms",
        str(delay_ms),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


async def _proxy(listen: int, target: int, delay_s: float) -> None:
    """A TCP proxy that delivers every chunk of bytes ``delay_s`` after it arrived, in order, in both directions."""

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        task = asyncio.create_task(deliver())
        try:
            while data := await reader.read(1 << 16):
                queue.put_nowait((time.monotonic() + delay_s, data))
        except ConnectionError:
            pass
        queue.put_nowait((0.0, None))
        await task

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pump(client_r, server_w), pump(server_r, client_w), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


# --- 1. round trips -----------------------------------------------------------------------------------------------
def observation(meta: dict, rng: np.random.Generator, task: str) -> dict:
    p = meta["policy"]
    obs = {"observation.state": rng.uniform(-1, 1, p["state_dim"]).astype(np.float32), "prompt": task}
    for key in p["image_keys"]:
        obs[key] = rng.integers(0, 256, (p["image_size"] or 64, p["image_size"] or 64, 3), dtype=np.uint8)
    return obs


def round_trips(port: int, clients: int, requests: int, task: str) -> dict:
    from vla.serve import PolicyClient

    conns = [PolicyClient("127.0.0.1", port) for _ in range(clients)]
    for c in conns:  # warm-up, not timed
        c.infer(observation(c.metadata, np.random.default_rng(0), task))
    barrier = threading.Barrier(clients)
    times: list[list[float]] = [[] for _ in range(clients)]
    batch: list[int] = []
    infer_ms: list[float] = []
    lost = []

    def run(i: int) -> None:
        rng = np.random.default_rng(i)
        barrier.wait()
        for r in range(requests):
            obs = observation(conns[i].metadata, rng, task) | {"request_id": i * 100_000 + r}
            start = time.perf_counter()
            reply = conns[i].infer(obs)
            times[i].append((time.perf_counter() - start) * 1000)
            if reply.get("request_id") != i * 100_000 + r:
                lost.append((i, r))
            batch.append(reply["server_timing"]["batch_size"])
            infer_ms.append(reply["server_timing"]["infer_ms"])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    for c in conns:
        c.close()
    flat = np.concatenate([np.asarray(t) for t in times])
    return {
        "clients": clients,
        "requests_per_client": requests,
        "replies": int(len(flat)),
        "unmatched": len(lost),
        "round_trip_ms_p50": round(float(np.percentile(flat, 50)), 2),
        "round_trip_ms_p95": round(float(np.percentile(flat, 95)), 2),
        "server_infer_ms_p50": round(float(np.percentile(infer_ms, 50)), 2),
        "batch_size_mean": round(float(np.mean(batch)), 2),
        "batch_size_max": int(np.max(batch)),
        "throughput_chunks_per_s": round(len(flat) / wall, 1),
    }


# --- 2. closed loop -----------------------------------------------------------------------------------------------
def closed_loop(
    server_port: int, proxy_port: int, delays: list[float], episodes: int, max_steps: int, seed_start: int
) -> list[dict]:
    from vla.serve import ChunkExecutor, PolicyClient
    from vla.serve.robot import run_realtime_episode
    from vla.sim.metaworld_env import MetaWorldEnv

    env = MetaWorldEnv("push-v3", max_steps=max_steps)
    fps = env.fps
    rows = []
    for delay in delays:
        proxy = start_proxy(proxy_port, server_port, delay)
        try:
            client = PolicyClient("127.0.0.1", proxy_port, timeout_s=30)
            p = client.metadata["policy"]
            for mode in ("sync", "overlapped"):
                horizon = p["n_action_steps"] if mode == "sync" else p["time_horizon"]
                print(f"T={p['time_horizon']} delay {delay} ms {mode}: {episodes} episodes", file=sys.stderr)
                executor = ChunkExecutor(client, control_hz=fps, mode=mode, horizon=horizon, k=None)
                results = [run_realtime_episode(env, executor, seed_start + e, max_steps) for e in range(episodes)]
                executor.close()
                s = executor.stats.as_dict()
                row = {
                    "time_horizon": p["time_horizon"],
                    "chunk_ms": round(1000 * p["time_horizon"] / fps, 1),
                    "delay_ms_each_way": delay,
                    "mode": mode,
                    "horizon": horizon,
                    "episodes": episodes,
                    "success_rate": float(np.mean([r["success"] for r in results])),
                    "mean_length": float(np.mean([r["length"] for r in results])),
                    "jerk": float(np.mean([r["jerk"] for r in results])),
                    "held_fraction": float(sum(r["held"] for r in results) / sum(r["length"] for r in results)),
                    # actions dropped per chunk received (used or, when every action was stale, wasted)
                    "stale_per_chunk": sum(r["stale"] for r in results)
                    / max(sum(r["chunks"] + r["wasted_chunks"] for r in results), 1),
                    "wasted_chunks": int(sum(r["wasted_chunks"] for r in results)),
                    "errors": int(sum(r["errors"] for r in results)),
                    "round_trip_ms_p50": round(s["round_trip_ms_p50"], 1),
                    "round_trip_ms_p95": round(s["round_trip_ms_p95"], 1),
                    "overrun_ticks": int(sum(r["overruns"] for r in results)),
                    "per_episode": results,
                }
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "per_episode"}), flush=True)
            client.close()
        finally:
            stop(proxy)
    env.close()
    return rows


# --- report -------------------------------------------------------------------------------------------------------
def markdown(result: dict) -> str:
    lines = [
        "## Round trip on loopback",
        "",
        "| clients | p50 ms | p95 ms | server decode p50 ms | mean batch | chunks/s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["round_trip"]:
        lines.append(
            f"| {r['clients']} | {r['round_trip_ms_p50']:.1f} | {r['round_trip_ms_p95']:.1f} | "
            f"{r['server_infer_ms_p50']:.1f} | {r['batch_size_mean']:.1f} | "
            f"{r['throughput_chunks_per_s']:.1f} |"
        )
    if result.get("closed_loop"):
        lines += [
            "",
            "## Real-time Meta-World push-v3 (80 Hz), sync vs overlapped",
            "",
            "| chunk | delay each way | mode | success | jerk | held ticks | stale per chunk | wasted chunks | "
            "round trip p50 / p95 ms |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in result["closed_loop"]:
            lines.append(
                f"| T={r['time_horizon']} ({r['chunk_ms']:.0f} ms) | {r['delay_ms_each_way']:.0f} ms | "
                f"{r['mode']} | {r['success_rate']:.0%} | "
                f"{r['jerk']:.3f} | "
                f"{r['held_fraction']:.0%} | {r['stale_per_chunk']:.1f} | {r['wasted_chunks']} | "
                f"{r['round_trip_ms_p50']:.0f} / {r['round_trip_ms_p95']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vla.io import save_figure

    panels = 3 if result.get("closed_loop") else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4))
    axes = np.atleast_1d(axes)
    rt = result["round_trip"]
    n = [r["clients"] for r in rt]
    axes[0].plot(n, [r["round_trip_ms_p50"] for r in rt], "o-", label="p50")
    axes[0].plot(n, [r["round_trip_ms_p95"] for r in rt], "s--", label="p95")
    axes[0].set(xscale="log", xlabel="concurrent clients", ylabel="round trip (ms)", title="loopback round trip")
    axes[0].set_xticks(n, [str(x) for x in n])
    axes[0].legend()
    if panels == 3:
        cl = result["closed_loop"]
        delays = sorted({r["delay_ms_each_way"] for r in cl})
        series = list(dict.fromkeys((r["time_horizon"], r["mode"]) for r in cl))
        x, width = np.arange(len(delays)), 0.8 / len(series)
        for j, (t, mode) in enumerate(series):
            rows = {r["delay_ms_each_way"]: r for r in cl if (r["time_horizon"], r["mode"]) == (t, mode)}
            offset = x + (j - (len(series) - 1) / 2) * width
            label = f"T={t} {mode}"
            axes[1].bar(offset, [rows[d]["success_rate"] for d in delays], width, label=label)
            axes[2].bar(offset, [rows[d]["jerk"] for d in delays], width, label=label)
        for ax, title in ((axes[1], "success (push-v3, 80 Hz)"), (axes[2], "action jerk (RMS 2nd difference)")):
            ax.set_xticks(x, [f"{d:.0f} ms" for d in delays])
            ax.set(xlabel="injected delay each way", title=title)
            ax.legend()
        axes[1].set_ylim(0, 1.05)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    from vla.sim import EVAL_SEED_START

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    px = sub.add_parser("proxy")
    px.add_argument("--listen", type=int, required=True)
    px.add_argument("--target", type=int, required=True)
    px.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--policy", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "serve")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--proxy-port", type=int, default=8766)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=40, help="requests per client in the round-trip test")
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[0, 50, 150])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--max-steps", type=int, default=150, help="episode limit (twice the longest expert episode)")
    parser.add_argument("--seed-start", type=int, default=EVAL_SEED_START, help="evaluation seeds")
    parser.add_argument("--server-threads", type=int, default=2)
    parser.add_argument("--skip-closed-loop", action="store_true")
    parser.add_argument("--allow-loaded", action="store_true", help="write to --out even when the machine was loaded")
    args = parser.parse_args(argv)
    if args.command == "proxy":
        asyncio.run(_proxy(args.listen, args.target, args.delay_ms / 1000))
        return
    if args.policy is None:
        parser.error("--policy is required")
    from vla.sim.metaworld_env import task_text

    task = task_text("push-v3")
    rows, loop = [], []
    load = os.getloadavg()[0]
    for k, policy in enumerate(args.policy):
        server = start_server(policy, args.port, args.server_threads)
        try:
            if k == 0:
                rows = [round_trips(args.port, n, args.requests, task) for n in args.clients]
                for r in rows:
                    print(json.dumps(r), flush=True)
            if not args.skip_closed_loop:
                loop += closed_loop(
                    args.port, args.proxy_port, args.delays_ms, args.episodes, args.max_steps, args.seed_start
                )
        finally:
            stop(server)
    result = {
        "meta": {
            "policies": [str(p) for p in args.policy],
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_average_at_end": os.getloadavg(),
            "server_threads": args.server_threads,
            "requests_per_client": args.requests,
            "episodes": args.episodes,
            "max_steps": args.max_steps,
            "seed_start": args.seed_start,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
        "round_trip": rows,
        "closed_loop": loop,
    }
    from vla.provenance import headline_path, provenance, quiet_machine

    result["meta"]["machine_load"] = quiet_machine([load, os.getloadavg()[0]], threads=args.server_threads)
    settings = {
        k: [str(x) for x in v] if isinstance(v, list) else str(v) if isinstance(v, Path) else v
        for k, v in vars(args).items()
    }
    result["provenance"] = provenance(config=settings, dataset=None)
    out = headline_path(args.out, result["meta"]["machine_load"], args.allow_loaded)  # <out>.loaded when loaded
    out.mkdir(parents=True, exist_ok=True)
    from vla.io import atomic_write_text, write_json

    write_json(out / "bench_serve.json", result)
    atomic_write_text(out / "bench_serve.md", markdown(result))
    plot(result, out / "bench_serve.png")
    print(markdown(result))


if __name__ == "__main__":
    main()
