"""The collect tests drive real daemons with the helpers of tests/daemon, and judge the
hardware-like recordings of tests/replay."""

import sys
from pathlib import Path

for helpers in ("daemon", "replay"):
    path = str(Path(__file__).resolve().parents[1] / helpers)
    if path not in sys.path:
        sys.path.insert(0, path)
