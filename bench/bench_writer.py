"""Writer benchmark: the same frames through hilrec's native writer and LeRobot 0.4.4's LeRobotDataset.

One 60 s episode at 25 fps (1500 frames) of SO-101 columns, without and with one 640x480 camera.
Reported (medians over --repeats runs):

- frames/s without video: add_frame x1500 + save_episode + finalize;
- frames/s with one camera, frames fed as fast as each writer takes them, to a saved episode
  (hilrec's encoder queue is sized to hold the whole episode for this measurement; with the
  encoder processes, the default, frames the ring cannot hold go to the episode's spill, and a
  saved episode whose video is not encoded yet is durable through it);
- save_episode() latency for a 60 s one-camera episode recorded in real time. For hilrec the frames
  are fed, then the benchmark waits until the encoder has caught up (as it does at 25 fps, since it
  encodes faster than that), then times save_episode(), which returns when the episode is durable
  (fsynced and committed). LeRobot's save_episode() encodes the PNGs it staged; its files are only
  complete (parquet footers) after finalize(), so that time is shown too;
- bytes on disk after finalize (hilrec's include its journal copy of the rows and its sidecars).

``--smoke`` runs 10 frames of a 64x48 camera once each, to show the benchmark runs.

LeRobot runs its default (non-streaming) path: PNG staging with 4 writer threads per camera, as
``lerobot-record`` does, and libsvtav1 encoding at save time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.dataset.writer.episode import OpenEpisode
from hilrec.daemon.so101 import so101_features

FPS = 25
FRAMES = 1500  # --smoke: SMOKE_FRAMES
SMOKE_FRAMES = 10
H, W = 480, 640  # --smoke: SMOKE_SIZE
SMOKE_SIZE = (48, 64)
CAM = "observation.images.front"


def make_frames(with_camera: bool, count: int = FRAMES) -> list[dict]:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:H, 0:W]
    images = []
    if with_camera:
        for k in range(50):
            # A moving gradient with mild noise: compresses like a camera image, not like noise.
            base = ((xx + 4 * k) % 256 + (yy // 2)) % 256
            img = np.stack([base, (base + 85) % 256, (base + 170) % 256], axis=-1).astype(np.int16)
            img += rng.integers(-6, 7, size=img.shape, dtype=np.int16)
            images.append(np.clip(img, 0, 255).astype(np.uint8))
    frames = []
    for i in range(count):
        frame = {
            "action": rng.normal(size=6).astype(np.float32),
            "observation.state": rng.normal(size=6).astype(np.float32),
            "task": "pick the cube",
        }
        if with_camera:
            frame[CAM] = images[i % len(images)]
        frames.append(frame)
    return frames


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def wait_caught_up(episode: OpenEpisode) -> None:
    """Until the camera's encoder has every frame fed so far: as it is at 25 fps in real time.

    A benchmark-only peek at the open episode: its encoder process (the default, libsvtav1's
    ``HILREC_VIDEO_ENCODER``) or, with ``HILREC_VIDEO_ENCODER=thread``, its in-process encoder.
    """
    if CAM in episode.workers:
        worker = episode.workers[CAM]
        while worker.backlog_frames:
            time.sleep(0.01)
        return
    encoder = episode.encoders[CAM]
    while encoder.frames_encoded < encoder.frames_in:
        time.sleep(0.01)


def run_hilrec(
    root: Path,
    frames: list[dict],
    with_camera: bool,
    wait_for_encoder: bool,
) -> dict[str, float]:
    features = so101_features({"front": (H, W)} if with_camera else None)
    queue_bytes = (len(frames) + 10) * H * W * 3
    start = time.perf_counter()
    writer = DatasetWriter.create(
        root, fps=FPS, features=features, robot_type="so_follower", max_video_queue_bytes=queue_bytes
    )
    for frame in frames:
        writer.add_frame(frame)
    fed = time.perf_counter()
    if wait_for_encoder and with_camera:
        assert writer._episode is not None  # frames were added: an episode is open
        wait_caught_up(writer._episode)
    before_save = time.perf_counter()
    writer.save_episode()
    saved = time.perf_counter()
    writer.finalize()
    done = time.perf_counter()
    return {
        "add_s": fed - start,
        "save_s": saved - before_save,
        "to_saved_s": saved - start,
        "total_s": done - start,
        "bytes": dir_bytes(root),
    }


def run_lerobot(root: Path, frames: list[dict], with_camera: bool) -> dict[str, float]:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        k: {**v, "shape": tuple(v["shape"])}
        for k, v in so101_features({"front": (H, W)} if with_camera else None).items()
    }
    start = time.perf_counter()
    dataset = LeRobotDataset.create(
        "bench/lerobot",
        fps=FPS,
        features=features,
        root=root,
        robot_type="so_follower",
        use_videos=with_camera,
        image_writer_threads=4 if with_camera else 0,
    )
    for frame in frames:
        dataset.add_frame(dict(frame))
    fed = time.perf_counter()
    dataset.save_episode()
    saved = time.perf_counter()
    dataset.finalize()
    done = time.perf_counter()
    if dataset.image_writer is not None:
        dataset.stop_image_writer()
    return {
        "add_s": fed - start,
        "save_s": saved - fed,
        "to_saved_s": saved - start,
        "total_s": done - start,
        "bytes": dir_bytes(root),
        "save_finalize_s": done - fed,
    }


def median_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def repeat(fn: Callable[[Path], dict[str, float]], repeats: int) -> list[dict[str, float]]:
    runs = []
    for _ in range(repeats):
        tmp = Path(tempfile.mkdtemp(prefix="bench-writer-"))
        try:
            runs.append(fn(tmp / "ds"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--video-repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="10 frames, 64x48, one run each")
    args = parser.parse_args(argv)
    frames = SMOKE_FRAMES if args.smoke else FRAMES
    if args.smoke:
        global H, W  # the whole benchmark at the smallest camera
        args.repeats = args.video_repeats = 1
        H, W = SMOKE_SIZE

    plain = make_frames(False, frames)
    camera = make_frames(True, frames)
    ours_plain = repeat(lambda r: run_hilrec(r, plain, False, False), args.repeats)
    theirs_plain = repeat(lambda r: run_lerobot(r, plain, False), args.repeats)
    ours_video = repeat(lambda r: run_hilrec(r, camera, True, False), args.video_repeats)
    ours_realtime = repeat(lambda r: run_hilrec(r, camera, True, True), args.video_repeats)
    theirs_video = repeat(lambda r: run_lerobot(r, camera, True), args.video_repeats)

    fps_ours_plain = frames / median_of(ours_plain, "total_s")
    fps_theirs_plain = frames / median_of(theirs_plain, "total_s")
    fps_ours_video = frames / median_of(ours_video, "to_saved_s")
    fps_theirs_video = frames / median_of(theirs_video, "to_saved_s")
    save_ours = median_of(ours_realtime, "save_s")
    save_theirs = median_of(theirs_video, "save_s")
    save_fin_theirs = median_of(theirs_video, "save_finalize_s")

    print(
        f"# bench_writer: {frames} frames ({frames / FPS:g} s at {FPS} fps), SO-101 columns, "
        f"camera {W}x{H}; medians of {args.repeats} (no video) / {args.video_repeats} (video) runs\n"
    )
    print("| measure | hilrec native | LeRobot 0.4.4 | hilrec / LeRobot |")
    print("|---|---:|---:|---:|")
    print(
        f"| frames/s, no video (add + save + finalize) | {fps_ours_plain:,.0f} | "
        f"{fps_theirs_plain:,.0f} | {fps_ours_plain / fps_theirs_plain:.1f}x |"
    )
    print(
        f"| frames/s, one {W}x{H} camera (to saved episode) | {fps_ours_video:,.1f} | "
        f"{fps_theirs_video:,.1f} | {fps_ours_video / fps_theirs_video:.1f}x |"
    )
    print(
        f"| save_episode() s, {frames / FPS:g} s episode, one camera | {save_ours:.3f} (durable) | "
        f"{save_theirs:.3f} (not durable) | {save_theirs / save_ours:.0f}x faster |"
    )
    print(
        f"| save_episode() + finalize() s, one camera | "
        f"{save_ours + median_of(ours_realtime, 'total_s') - median_of(ours_realtime, 'to_saved_s'):.3f}"
        f" | {save_fin_theirs:.3f} | |"
    )
    print(
        f"| bytes on disk, no video | {median_of(ours_plain, 'bytes'):,.0f} | "
        f"{median_of(theirs_plain, 'bytes'):,.0f} | "
        f"{median_of(ours_plain, 'bytes') / median_of(theirs_plain, 'bytes'):.2f} |"
    )
    print(
        f"| bytes on disk, one camera | {median_of(ours_video, 'bytes'):,.0f} | "
        f"{median_of(theirs_video, 'bytes'):,.0f} | "
        f"{median_of(ours_video, 'bytes') / median_of(theirs_video, 'bytes'):.2f} |"
    )
    target_ok = fps_ours_plain >= 5 * fps_theirs_plain and save_ours <= 0.5
    print(
        f"\ntargets (>= 5x LeRobot without video; save_episode <= 0.5 s): {'met' if target_ok else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
