"""Family ``aloha`` on the simulator interface (``vla.sim``): ALOHA sim's env (``vla.sim.aloha_env``) with its
scripted expert (``vla.sim.aloha_expert``), which plans from the env's own stages and gripper constants."""

from __future__ import annotations

from vla.data.reader import IMAGE_PREFIX
from vla.sim import Family, register
from vla.sim.aloha_env import DEFAULT_CAMERA, AlohaEnv, task_names
from vla.sim.aloha_expert import AlohaExpert

register(
    Family(
        name="aloha",
        tasks=task_names,
        make_env=AlohaEnv,
        make_expert=AlohaExpert,
        default_task="transfer-cube",
        default_cameras=(IMAGE_PREFIX + DEFAULT_CAMERA,),
        closed_loop_expert=False,
    )
)
