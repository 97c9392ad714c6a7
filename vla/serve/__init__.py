"""Serving a policy to robots: ``vla serve`` (openpi's websocket protocol, batched clients) and the robot side.

    # on the machine with the policy
    vla serve --policy outputs/train/fast/policy --port 8000

    # on the robot
    from vla.serve import ChunkExecutor, PolicyClient, Rate
    client = PolicyClient("127.0.0.1", 8000)
    executor = ChunkExecutor(client, control_hz=80)      # asks for the next chunk while k actions remain
    rate = Rate(80)
    while True:
        robot.apply(executor.act(robot.observe()))       # observation: state, uint8 HWC images, "prompt"
        rate.sleep()

Modules: ``codec`` (openpi's msgpack-numpy format, safe to read from strangers), ``server`` (``PolicyServer``,
``ServeConfig``), ``client`` (``PolicyClient``, ``ChunkExecutor``, ``Rate``, ``action_jerk``), ``cli`` (``vla serve``),
``robot`` (Meta-World in real time as a robot: ``python -m vla.serve.robot --port 8000``).
The robot side needs only numpy, msgpack and websockets: the server's names (which bring torch) load on first use.
The protocol, the state history of an ``n_obs_steps`` policy, the limits and the faults: ``docs/serving.md``.
"""

from .client import PolicyClient, ServerError
from .codec import DecodeError, packb, unpackb
from .executor import ChunkExecutor, ExecutorStats, Rate, action_jerk

_SERVER_NAMES = ("PolicyServer", "ServeConfig", "ServerHandle")


def __getattr__(name: str):
    if name in _SERVER_NAMES:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module 'vla.serve' has no attribute {name!r}")


__all__ = [
    "ChunkExecutor",
    "DecodeError",
    "ExecutorStats",
    "PolicyClient",
    "PolicyServer",
    "Rate",
    "ServeConfig",
    "ServerError",
    "ServerHandle",
    "action_jerk",
    "packb",
    "unpackb",
]
