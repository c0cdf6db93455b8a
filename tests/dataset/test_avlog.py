"""A decode that stops early must not hang once torchvision has turned on PyAV's Python logging.

``import torchvision.io`` (LeRobot does it) installs PyAV's Python log callback; FFmpeg's decoder
threads then call into Python, and tearing a threaded decoder down mid-file deadlocked on the GIL.
The reproduction ran 200 early-stopping decodes: it hung for good on the code before the fix.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import sys, numpy as np, av
from pathlib import Path
path = Path(sys.argv[1])
with av.open(str(path), "w") as c:
    s = c.add_stream("libx264", rate=25)
    s.width, s.height, s.pix_fmt = 320, 240, "yuv420p"
    for i in range(200):
        frame = av.VideoFrame.from_ndarray(np.full((240, 320, 3), i % 255, np.uint8), format="rgb24")
        for p in s.encode(frame):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
import torchvision.io  # what LeRobot's import does to PyAV's logging
from hilrec.daemon.dataset.format.reader import decode_video
for _ in range(200):
    decode_video(path, [0.0, 0.04])  # stop early: the threaded decoder is torn down mid-file
print("done")
"""


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_early_stopping_decodes_do_not_hang_after_torchvision_is_imported(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "v.mp4")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]
