"""``vla serve``: serve a trained policy to robots over websockets (openpi's protocol, batched clients).

    vla serve --policy outputs/train/fast/policy [--host 127.0.0.1] [--port 8000] [--api-key KEY]

Binds to localhost unless ``--host`` says otherwise; with ``--api-key`` (or ``VLA_SERVE_API_KEY``) connections without
``Authorization: Api-Key <key>`` are refused. ``GET /healthz`` answers 200. A robot connects with
``vla.serve.PolicyClient`` or openpi's ``WebsocketClientPolicy``.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from .server import PolicyServer, ServeConfig


def _key_map(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        client, sep, policy = item.partition("=")
        if not sep or not client or not policy:
            raise ValueError(
                f"--key {item!r}: write CLIENT_KEY=POLICY_KEY, e.g. observation/image=observation.images.corner2"
            )
        out[client] = policy
    return out


def add_cli(subparsers) -> None:
    d = ServeConfig()
    p = subparsers.add_parser(
        "serve",
        help="serve a policy to robots over websockets",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--policy", type=Path, required=True, help="a policy folder (outputs/train/NAME/policy)")
    p.add_argument("--host", default=d.host, help="address to bind (default: localhost only)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument(
        "--api-key",
        default=os.environ.get("VLA_SERVE_API_KEY"),
        help="require this key from clients (default: $VLA_SERVE_API_KEY, else none)",
    )
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="most observations decoded in one call")
    p.add_argument(
        "--batch-window-ms",
        type=float,
        default=d.batch_window_ms,
        help="wait this long after a request for others arriving together",
    )
    p.add_argument("--max-queue", type=int, default=d.max_queue, help="requests waiting; more are answered 'busy'")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s, help="seconds per request")
    p.add_argument("--max-message-mb", type=float, default=d.max_message_bytes / 2**20, help="message size limit")
    p.add_argument("--max-clients", type=int, default=d.max_clients, help="connections beyond this get HTTP 503")
    p.add_argument(
        "--max-clients-per-ip",
        type=int,
        default=None,
        help="connections one address may hold (default: half of --max-clients); robots behind one NAT or "
        "proxy share an address: raise it to --max-clients",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=d.idle_timeout_s,
        help="seconds a connection may send nothing before it is closed (its slot freed)",
    )
    p.add_argument(
        "--history-reset",
        type=float,
        default=d.history_reset_s,
        help="n_obs_steps > 1, one state a message: a longer gap between a connection's messages starts "
        "its state history again",
    )
    p.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="CLIENT=POLICY",
        help="rename an observation key the robot sends to the policy's (repeatable)",
    )
    p.add_argument("--device", default=None, help="torch device for the policy (default: the saved config's)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import torch

    from vla.policy import VLAPolicy

    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.policy.is_dir():
        raise ValueError(
            f"no policy at {args.policy}; pass the folder a training run wrote (outputs/train/NAME/policy)"
        )
    config = ServeConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        max_batch=args.max_batch,
        batch_window_ms=args.batch_window_ms,
        max_queue=args.max_queue,
        request_timeout_s=args.request_timeout,
        max_message_bytes=int(args.max_message_mb * 2**20),
        max_clients=args.max_clients,
        max_clients_per_ip=args.max_clients_per_ip,
        idle_timeout_s=args.idle_timeout,
        history_reset_s=args.history_reset,
        keys=_key_map(args.key),
    )
    from vla.policy.saved_config import check_policy_folder

    check_policy_folder(args.policy)
    # once the settings hold; force: an import above installs a WARNING-level handler, which would hide
    # "serving on ws://HOST:PORT" (the port chosen for --port 0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    policy = VLAPolicy.from_pretrained(args.policy)
    if args.device:
        policy.to(args.device)
    policy.eval()
    if config.host not in ("127.0.0.1", "localhost", "::1") and config.api_key is None:
        logging.getLogger(__name__).warning(
            "serving on %s without an API key: anyone who can reach it can drive the policy (pass --api-key)",
            config.host,
        )
    print(f"vla serve: {args.policy} on ws://{config.host}:{config.port} (GET /healthz); Ctrl-C stops", flush=True)
    if policy.config.n_obs_steps > 1:
        n, s = policy.config.n_obs_steps, policy.config.state_dim
        print(
            f"vla serve: the policy reads the last {n} states: send [{n}, {s}] oldest first, or [{s}] a message with "
            f"'reset': true on an episode's first (the server keeps each connection's last {n})",
            flush=True,
        )
    PolicyServer(policy, config).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m vla.serve.cli ...``: the same as ``vla serve ...`` before the command is registered in vla.cli."""
    import sys

    parser = argparse.ArgumentParser(prog="vla")
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"vla serve: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
