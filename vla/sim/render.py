"""Offscreen MuJoCo rendering shared by the simulators: fast settings, one clear error, renderers closed at exit.

    renderer = fast_renderer(model, size, owner=env)   # mujoco.Renderer, ~10 ms a frame at 128 px in software GL

Renderers left open are closed at exit while EGL still works; left to interpreter teardown, their ``__del__`` runs
after EGL is gone and prints EGLError tracebacks. atexit runs hooks last-registered first, and mujoco registers its
EGL teardown with its first GL context, so ours (registered after that) runs before it.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any

_OWNERS: weakref.WeakSet[Any] = weakref.WeakSet()  # envs whose close() releases a renderer
_hook_registered = False


def offscreen_error(err: Exception) -> RuntimeError:
    """The error for a renderer that cannot be made: which GL library to install, and MUJOCO_GL."""
    return RuntimeError(
        f"MuJoCo cannot render offscreen (MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}): {err}. "
        "Install a GL library (Debian: apt-get install libegl1 libgl1-mesa-dri for MUJOCO_GL=egl, "
        "or libosmesa6 for MUJOCO_GL=osmesa), and set MUJOCO_GL before mujoco is first imported."
    )


def close_at_exit(owner: Any) -> None:
    """Call ``owner.close()`` at exit (if it is still alive), before EGL goes."""
    global _hook_registered
    _OWNERS.add(owner)
    if not _hook_registered:
        atexit.register(_close_owners)
        _hook_registered = True


def fast_renderer(model: Any, size: int, owner: Any):
    """A square ``mujoco.Renderer`` without anti-aliasing, shadows or reflections (software rendering costs 75-200 ms
    a frame with them and ~10 ms without, which a policy's small image does not need); ``owner`` is closed at exit."""
    import mujoco

    model.vis.quality.offsamples = 0
    model.light_castshadow[:] = 0
    model.mat_reflectance[:] = 0
    try:
        renderer = mujoco.Renderer(model, height=size, width=size)
    except Exception as err:  # the GL library is missing or MUJOCO_GL names an unusable backend
        raise offscreen_error(err) from err
    close_at_exit(owner)
    return renderer


def checked_cameras(
    image_keys: list[str] | tuple[str, ...],
    image_size: int | None,
    default_size: int,
    example: str,
    *,
    other_keys: tuple[str, ...] = (),
) -> tuple[list[str], int | None]:
    """The cameras asked of an env, checked: dataset keys (``observation.images.<camera>``, or one of ``other_keys``),
    and their square size (``default_size`` when unset; None without cameras)."""
    from vla.data.reader import IMAGE_PREFIX

    keys = list(image_keys)
    bad = [k for k in keys if not k.startswith(IMAGE_PREFIX) and k not in other_keys]
    if bad:
        raise ValueError(f"cameras are named by their dataset key, e.g. '{IMAGE_PREFIX}{example}'; got {bad}")
    size = (image_size or default_size) if keys else None
    if size is not None and not 8 <= size <= 1024:
        raise ValueError(f"image_size must be between 8 and 1024 pixels, got {image_size}")
    return keys, size


def _close_owners() -> None:
    for owner in list(_OWNERS):
        owner.close()
