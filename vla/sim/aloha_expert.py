"""The scripted ALOHA expert: a waypoint plan run in end-effector space, replayed as joint actions.

The recipe is ACT's (Zhao et al., 2023, "Learning Fine-Grained Bimanual Manipulation with Low-Cost Hardware"; the
scripted policies of its simulated tasks); the code is ours, on the plain ``mujoco`` bindings:

1. ``reset(seed)`` draws the episode's object pose(s) exactly as the env does (``aloha_env.sample_objects``).
2. From them it builds, per arm, a piecewise-linear plan over the episode's 400 steps: waypoints of the grasp point
   (xyz), its orientation (a quaternion, slerped between waypoints) and the gripper (0 closed .. 1 open), for
   approach, descend, grasp, meet, hand over or insert (``transfer_plan``, ``insertion_plan``).
3. It runs that plan in the task's end-effector model, where a mocap body welded to each gripper drags the arm to
   the planned pose, and records after every step the 12 arm joint positions the arms reached and the 2 gripper
   commands: one joint-space action per step.
4. ``expert(obs)`` then hands those actions out one per call: replayed in the joint-space env (``AlohaEnv``) from the
   same start, they redo the motion there. The plan is open loop (it never reads the observations beyond a check
   that the env shows the poses it planned for).

The mocap target is the grasp point between the fingertips (the weld holds the gripper link 0.135 m behind it, along
the gripper), which is why the plan's offsets are given relative to the objects themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from lerobot.utils.constants import OBS_STATE

from vla.names import check_name
from vla.sim.aloha_env import (
    CONTROL_DT,
    DEFAULT_MAX_STEPS,
    GRIPPER_CLOSED_M,
    MAX_REWARD,
    Stages,
    advance,
    load_model,
    reset_scene,
    sample_objects,
    task_names,
    unnormalize_gripper,
)

IDENTITY = np.array([1.0, 0.0, 0.0, 0.0])


def axis_angle(axis: tuple[float, float, float], degrees: float) -> np.ndarray:
    """The unit quaternion (w, x, y, z) of a rotation by ``degrees`` about ``axis``."""
    axis = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    half = np.deg2rad(degrees) / 2
    return np.concatenate([[np.cos(half)], np.sin(half) * axis])


def slerp(q0: np.ndarray, q1: np.ndarray, frac: float) -> np.ndarray:
    """The rotation ``frac`` of the way from ``q0`` to ``q1`` along the shorter arc (unit quaternions)."""
    dot = float(np.dot(q0, q1))
    if dot < 0.0:  # q and -q are the same rotation: take the nearer one
        q1, dot = -q1, -dot
    if dot > 0.9995:  # nearly equal: linear interpolation is exact enough and avoids dividing by sin(0)
        q = q0 + frac * (q1 - q0)
        return q / np.linalg.norm(q)
    angle = np.arccos(dot)
    return (np.sin((1 - frac) * angle) * q0 + np.sin(frac * angle) * q1) / np.sin(angle)


class Plan:
    """One arm's waypoints: at step ``t`` the grasp point is at ``xyz`` with orientation ``quat`` and gripper
    ``gripper``; in between, positions and the gripper are linear in time and the orientation is slerped."""

    def __init__(self, waypoints: list[tuple[int, Any, Any, float]]):
        self.steps = np.array([w[0] for w in waypoints])
        assert self.steps[0] == 0 and np.all(np.diff(self.steps) > 0), "waypoints must start at 0 and move forward"
        self.xyz = np.array([w[1] for w in waypoints], dtype=np.float64)
        self.quat = np.array([w[2] for w in waypoints], dtype=np.float64)
        self.gripper = np.array([w[3] for w in waypoints], dtype=np.float64)

    def __call__(self, t: float) -> tuple[np.ndarray, np.ndarray, float]:
        t = float(np.clip(t, 0, self.steps[-1]))
        k = min(int(np.searchsorted(self.steps, t, side="right")) - 1, len(self.steps) - 2)
        frac = (t - self.steps[k]) / (self.steps[k + 1] - self.steps[k])
        xyz = self.xyz[k] + frac * (self.xyz[k + 1] - self.xyz[k])
        gripper = self.gripper[k] + frac * (self.gripper[k + 1] - self.gripper[k])
        return xyz, slerp(self.quat[k], self.quat[k + 1], frac), float(gripper)


def transfer_plan(objects: np.ndarray, start: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, Plan]:
    """transfer-cube: the right gripper, tilted 60 degrees down, picks the cube and carries it to a meeting point in
    the middle; the left gripper, turned 90 degrees about its axis, comes from the left, closes on the cube while the
    right one opens, and pulls it away. Times and offsets follow ACT's scripted policy."""
    cube = objects[:3]
    meet = np.array([0.0, 0.5, 0.25])
    # Where the left grasp point aims: at the cube's centre as it hangs in the right gripper, 5 mm below the right
    # grasp point. (ACT aims 20 mm below, tuned on MuJoCo 2's soft welds; here its upper finger then grazes the cube
    # on the way in and knocks it out of the right gripper in most episodes.)
    hold = meet + [0.0, 0.0, -0.005]
    pick = axis_angle((0, 1, 0), -60)  # the right gripper pointing 60 degrees below the horizontal
    across = axis_angle((1, 0, 0), 90)  # the left gripper's fingers one above the other
    right = [
        (0, *start["right"], 0.0),
        (90, cube + [0, 0, 0.08], pick, 1.0),  # above the cube, open
        (130, cube + [0, 0, -0.015], pick, 1.0),  # around it
        (170, cube + [0, 0, -0.015], pick, 0.0),  # closed on it
        (200, meet + [0.05, 0, 0], pick, 0.0),  # lifted, towards the middle
        (220, meet, pick, 0.0),  # at the meeting point
        (310, meet, pick, 1.0),  # let go (the left gripper closes meanwhile)
        (360, meet + [0.1, 0, 0], pick, 1.0),  # back off to the right
        (DEFAULT_MAX_STEPS, meet + [0.1, 0, 0], pick, 1.0),
    ]
    left = [
        (0, *start["left"], 0.0),
        (100, hold + [-0.1, 0, 0], across, 1.0),  # waiting left of the meeting point, open
        (260, hold + [0.02, 0, 0], across, 1.0),  # around the cube
        (310, hold + [0.02, 0, 0], across, 0.0),  # closed on it
        (360, hold + [-0.1, 0, 0], IDENTITY, 0.0),  # pulled away to the left
        (DEFAULT_MAX_STEPS, hold + [-0.1, 0, 0], IDENTITY, 0.0),
    ]
    return {"left": Plan(left), "right": Plan(right)}


def insertion_plan(objects: np.ndarray, start: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, Plan]:
    """insertion: each gripper, tilted 60 degrees down, grasps its object (right: the peg; left: the socket) at the
    same time, lifts it to either side of a meeting point, and the two close in until the peg enters the socket.
    Times and offsets follow ACT's scripted policy (the right hand held 7 mm higher, so the peg meets the hole)."""
    peg, socket = objects[:3], objects[7:10]
    meet = np.array([0.0, 0.5, 0.15])
    lift = np.array([0.0, 0.0, 0.00715])
    down_right, down_left = axis_angle((0, 1, 0), -60), axis_angle((0, 1, 0), 60)

    def arm(obj: np.ndarray, quat: np.ndarray, side: float, rise: np.ndarray, first) -> Plan:
        return Plan(
            [
                (0, *first, 0.0),
                (120, obj + [0, 0, 0.08], quat, 1.0),  # above the object, open
                (170, obj + [0, 0, -0.03], quat, 1.0),  # around it
                (220, obj + [0, 0, -0.03], quat, 0.0),  # closed on it
                (285, meet + [side * 0.1, 0, 0] + rise, quat, 0.0),  # lifted beside the meeting point
                (340, meet + [side * 0.05, 0, 0] + rise, quat, 0.0),  # pushed together: the peg into the socket
                (DEFAULT_MAX_STEPS, meet + [side * 0.05, 0, 0] + rise, quat, 0.0),
            ]
        )

    return {
        "left": arm(socket, down_left, -1.0, np.zeros(3), start["left"]),
        "right": arm(peg, down_right, 1.0, lift, start["right"]),
    }


PLANS = {"transfer-cube": transfer_plan, "insertion": insertion_plan}


class AlohaExpert:
    """The scripted expert of an ALOHA task (module docstring): ``reset(seed)`` plans the episode, then each call
    ``expert(obs)`` returns the next joint-space action, float32 [1, 14] (the last one again past the plan's end).

    ``planned_success`` says whether the plan succeeded in the end-effector model (the replay in the joint-space env
    is what an episode's success counts)."""

    def __init__(self, task: str):
        import mujoco

        self.task = check_name("ALOHA task", task, task_names())
        self.model = load_model(self.task, end_effector=True)
        self.data = mujoco.MjData(self.model)
        self._substeps = round(CONTROL_DT / self.model.opt.timestep)
        self._stages = Stages(self.model, self.task)
        body = {
            side: mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, f"vx300s_{side}/gripper_link")
            for side in ("left", "right")
        }
        # The weld that drags each gripper, found by its body: (mocap index, gripper body, weld row).
        self._welds = {}
        for side in ("left", "right"):
            row = int(np.flatnonzero(self.model.eq_obj2id == body[side])[0])
            self._welds[side] = (int(self.model.body_mocapid[self.model.eq_obj1id[row]]), body[side], row)
        self.objects: np.ndarray | None = None
        self.actions: np.ndarray | None = None  # float32 [400, 14], the episode's joint-space actions
        self.planned_success = False
        self._t = 0

    def reset(self, seed: int) -> None:
        """Plan the episode on ``seed``: draw its object pose(s), run the plan in the end-effector model."""
        self.objects = sample_objects(self.task, int(seed))
        self.actions, self.planned_success = self.rollout(self.objects)
        self._t = 0

    def __call__(self, obs: dict[str, Any]) -> np.ndarray:
        if self.actions is None:
            raise RuntimeError("the ALOHA expert plans per episode: call reset(seed) with the env's seed first")
        if self._t == 0:
            self._check(obs)
        action = self.actions[min(self._t, len(self.actions) - 1)]
        self._t += 1
        return action[None].copy()

    def rollout(self, objects: np.ndarray) -> tuple[np.ndarray, bool]:
        """The joint-space actions [400, 14] of the plan for ``objects``, and whether the plan reached the task's last
        stage in the end-effector model."""
        import mujoco

        model, data = self.model, self.data
        reset_scene(model, data, self.task, objects)
        data.ctrl[:] = [GRIPPER_CLOSED_M, -GRIPPER_CLOSED_M] * 2  # the four finger actuators: closed
        mujoco.mj_forward(model, data)
        plans = PLANS[self.task](objects, {side: self._grasp_pose(side) for side in ("left", "right")})
        actions = np.zeros((DEFAULT_MAX_STEPS, 14), dtype=np.float32)
        success = False
        for t in range(DEFAULT_MAX_STEPS):
            grippers = []
            for side in ("left", "right"):
                xyz, quat, gripper = plans[side](t)
                mocap = self._welds[side][0]
                data.mocap_pos[mocap], data.mocap_quat[mocap] = xyz, quat
                grippers.append(gripper)
            left, right = unnormalize_gripper(grippers[0]), unnormalize_gripper(grippers[1])
            data.ctrl[:] = [left, -left, right, -right]
            advance(model, data, self._substeps)
            # The joint targets of step t: where the arms got to under the plan, and the planned grippers.
            actions[t] = np.concatenate([data.qpos[0:6], [grippers[0]], data.qpos[8:14], [grippers[1]]])
            success = success or self._stages(data) == MAX_REWARD
        return actions, success

    def _grasp_pose(self, side: str) -> tuple[np.ndarray, np.ndarray]:
        """The mocap pose (xyz, quaternion) that the weld of ``side`` holds still with the arm where it is now: the
        gripper link's pose composed with the inverse of the weld's relative pose (MuJoCo's ``eq_data``)."""
        import mujoco

        _, body, row = self._welds[side]
        rel_pos, rel_quat = self.model.eq_data[row, 3:6], self.model.eq_data[row, 6:10]
        inv = np.zeros(4)
        mujoco.mju_negQuat(inv, rel_quat)
        quat = np.zeros(4)
        mujoco.mju_mulQuat(quat, self.data.xquat[body], inv)  # body = mocap * rel  =>  mocap = body * rel^-1
        offset = np.zeros(3)
        mujoco.mju_rotVecQuat(offset, rel_pos, quat)
        return self.data.xpos[body] - offset, quat

    def _check(self, obs: dict[str, Any]) -> None:
        """The env's first observation must show the object poses this plan is for (the same seed on both)."""
        state = np.asarray(obs.get(OBS_STATE, ()), dtype=np.float64).reshape(-1)
        shown = state[14 : 14 + len(self.objects)]
        if len(shown) == len(self.objects) and not np.allclose(shown, self.objects, atol=1e-4):
            raise ValueError(
                f"the ALOHA expert planned for the object pose(s) {np.round(self.objects, 4).tolist()} but the env "
                f"shows {np.round(shown, 4).tolist()}: reset the expert and the env with the same seed"
            )
