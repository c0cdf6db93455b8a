"""The rerun tests start real daemons with the daemon tests' helper (tests/daemon/_daemon.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
