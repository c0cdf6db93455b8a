"""hilrec.sim: the MuJoCo twin of an SO-101, its scripted operator, sim recording and replay.

MuJoCo renders offscreen through EGL (Mesa's llvmpipe on a machine without a GPU) unless the
environment chooses otherwise; ``mujoco`` reads ``MUJOCO_GL`` when it is imported, so it is set
here, before any module of this package imports it.
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
