"""Handover micro-benchmark: what the writer thread pays per 640x480 frame to give it to the encoder.

Measured on the calling thread, per frame (median, p99, max in microseconds), for
``--frames`` frames of camera-like content:

- ``thread``: the in-process encoder's ``EpisodeVideoEncoder.put`` (a copy into a queue);
- ``ring``: ``EncoderProcess.offer`` (a copy into a shared-memory slot + a slot index on the
  sender queue), while the worker process encodes (``--codec``): the encoder keeping up, what
  ``OpenEpisode.add`` pays per frame then;
- ``spilling``: the worker frozen (SIGSTOP), so the ring is full and every frame goes to the spill
  (``SpillFile.write_at``, one ``pwrite`` into the page cache, + ``send_spilled``): what
  ``OpenEpisode.add`` pays per frame while the encoder is behind;
- ``ring + spill tee``: both for every frame, what the writer paid per frame before frames
  spilled only while the encoder was behind.

The frames are handed over at ``--fps`` (paced), as the writer thread would; the load average is
printed, the machine being shared.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hilrec.daemon.dataset.video.codec import EpisodeVideoEncoder, VideoSettings
from hilrec.daemon.dataset.video.encoder_process import EncoderProcess
from hilrec.daemon.dataset.video.spill import SpillFile

H, W = 480, 640


def frames(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:H, 0:W]
    out = []
    for k in range(min(count, 50)):
        base = ((xx + 5 * k) % 256 + (yy // 2)) % 256
        img = np.stack([base, (base + 85) % 256, (base + 170) % 256], axis=-1).astype(np.int16)
        img += rng.integers(-6, 7, size=img.shape, dtype=np.int16)
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return [out[k % len(out)] for k in range(count)]


def timed(images: list[np.ndarray], fps: float, step) -> np.ndarray:
    costs = np.empty(len(images))
    period = 1.0 / fps
    next_t = time.perf_counter()
    for k, image in enumerate(images):
        t0 = time.perf_counter()
        step(k, image)
        costs[k] = time.perf_counter() - t0
        next_t += period
        delay = next_t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    return costs * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=250)
    parser.add_argument("--fps", type=float, default=25.0)
    parser.add_argument("--codec", default="libsvtav1")
    parser.add_argument("--smoke", action="store_true", help="10 frames")
    args = parser.parse_args(argv)
    if args.smoke:
        args.frames = 10
    images = frames(args.frames)
    settings = VideoSettings(codec=args.codec)
    results: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory(prefix="bench-handover-") as tmp:
        work = Path(tmp)
        encoder = EpisodeVideoEncoder(
            work / "thread.mp4", key="cam", episode_index=0, fps=25, height=H, width=W, settings=settings
        )
        results["thread (EpisodeVideoEncoder.put)"] = timed(images, args.fps, lambda k, im: encoder.put(im))
        encoder.abort()

        episode = work / "episode"
        episode.mkdir()
        worker = EncoderProcess("cam", fps=25, height=H, width=W, settings=settings)
        spill = SpillFile(episode / "cam.spill", H * W * 3)
        future = worker.begin(0, episode / "ring.mp4", spill.path)
        behind = 0

        def offer(k: int, im: np.ndarray) -> None:
            nonlocal behind
            if worker.offer(0, k, im) < 0:
                spill.write_at(k, im)
                worker.send_spilled(0, k)
                behind += 1

        results["ring (EncoderProcess.offer, encoder keeping up)"] = timed(images, args.fps, offer)
        kept_up = len(images) - behind
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            # Fill the ring first: from then on every frame spills.
            for k in range(worker.slots):
                offer(len(images) + k, images[k % len(images)])
            first = len(images) + worker.slots

            def spilling(k: int, im: np.ndarray) -> None:
                spill.write_at(first + k, im)
                worker.send_spilled(0, first + k)

            results["spilling (SpillFile.write_at + send_spilled, encoder behind)"] = timed(
                images, args.fps, spilling
            )
            tee = first + len(images)

            def both(k: int, im: np.ndarray) -> None:
                spill.write_at(tee + k, im)
                worker.offer(0, tee + k, im)

            results["ring + spill tee (every frame, as before)"] = timed(images, args.fps, both)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        worker.abort(0)
        with contextlib.suppress(Exception):  # the abort resolves it with an error, by design
            future.result(120)
        priority = worker.priority
        worker.close()
        spill.close()
    load = os.getloadavg()
    print(
        f"# bench_handover: {args.frames} frames of {W}x{H} at {args.fps:g} Hz, worker {args.codec} "
        f"at {priority} ({kept_up} of {args.frames} frames through the ring while it kept up); "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)"
    )
    print("| handover | median, us | p99, us | max, us |")
    print("|---|---:|---:|---:|")
    for name, costs in results.items():
        print(f"| {name} | {np.median(costs):.0f} | {np.percentile(costs, 99):.0f} | {costs.max():.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
