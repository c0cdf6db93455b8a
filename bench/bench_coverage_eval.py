"""Benchmark: does coverage, or validation loss, predict closed-loop success? (issue 15, item 5)

Run: MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_coverage_eval.py
         [--episodes 24] [--steps 400] [--checkpoints 100,200,300,400] [--eval-seeds 12]
         [--pushes 1.0] [--max-seconds 10] [--out DIR] [--smoke]
Tens of minutes on two cores; not part of make test.

1. Two training datasets of the same size, recorded with the scripted operator
   (``hilrec.sim.recorder.record``): *narrow* (cube placed in a 2 x 2 cm square, nearly square to
   the arm, no pushes) and *broad* (the scene's full placement ranges, with random pushes). Beside
   them, held-out expert episodes: a narrow validation set, and a test-distribution set (broad
   placements with pushes, seeds neither dataset has).
2. Their coverage (``hilrec.daemon.tools.coverage.measure``) against the held-out test states:
   scripted roll-outs of the evaluation seeds, broad placements, with pushes.
3. A behaviour clone trained with LeRobot on each: ACT (``lerobot.policies.act``), made small
   enough to train on these CPUs (dim_model 64, one decoder and two encoder layers, no VAE,
   chunk 10), fed ``observation.state`` and a 64x48 front image, ResNet-18 from scratch (no
   download); LeRobot's processors normalise with each dataset's own stats. The frames are
   decoded once into memory and batched here (the chunk targets padded as LeRobot pads them).
4. At each checkpoint (``save_pretrained`` with the processors): validation loss (ACT's L1 on the
   normalised action chunk) on its own held-out set and on the test-distribution set, and the
   closed-loop success with pushes on held-out seeds, through ``hilrec eval``'s own code
   (``load_policy`` of the checkpoint directory + ``evaluate``), with its 95% Wilson interval.
5. Spearman's rank correlation (scipy) of validation loss against closed-loop success across the
   checkpoints, both clones pooled, and the same for coverage across the two datasets.

Prints the table and writes it with every number to ``OUT/results.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np

from hilrec.daemon.dataset.format.reader import load_episodes, read_episode, read_episode_frames
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.so101 import ACTION_KEY, IMAGE_PREFIX, STATE_KEY
from hilrec.daemon.tools.coverage import dataset_states, measure, rollout_states
from hilrec.daemon.tools.evaluate import EvalConfig, evaluate
from hilrec.daemon.tools.policies import load_policy
from hilrec.sim.recorder import DEFAULT_TASK, RecordConfig, record
from hilrec.sim.scene import SceneConfig

CAMERA = "front"
IMAGE_KEY = IMAGE_PREFIX + CAMERA
SIZE = (48, 64)  # (height, width)
CHUNK = 10
NARROW = SceneConfig(cube_x_range=(0.19, 0.21), cube_y_range=(0.03, 0.05), cube_yaw_range=(-0.1, 0.1))
BROAD = SceneConfig()
SEEDS = {"narrow": 0, "broad": 1000, "narrow_val": 2000, "test_val": 3000, "eval": 9000}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def record_set(root: Path, *, episodes: int, seed: int, scene: SceneConfig, pushes: float) -> dict[str, Any]:
    began = time.perf_counter()
    summary = record(
        RecordConfig(
            root=root,
            episodes=episodes,
            seed=seed,
            scene=scene,
            push_rate=pushes,
            cameras=(CAMERA,),
            image_size=SIZE,
            video_codec="libx264",
        ),
        progress=False,
    )
    log(f"recorded {root.name}: {summary.line()}")
    return {
        "episodes": len(summary.episodes),
        "frames": summary.frames,
        "expert_successes": summary.successes,
        "seconds": time.perf_counter() - began,
    }


@dataclass
class Arrays:
    """A dataset in memory: per-frame state, image and the action chunk that starts there."""

    state: np.ndarray  # float32 (n, 6)
    image: np.ndarray  # uint8 (n, H, W, 3)
    chunk: np.ndarray  # float32 (n, CHUNK, 6)
    pad: np.ndarray  # bool (n, CHUNK): past the episode's end (LeRobot's action_is_pad)


def load_arrays(root: Path) -> Arrays:
    states, images, chunks, pads = [], [], [], []
    for row in load_episodes(root):
        index = int(row["episode_index"])
        columns = read_episode(root, index, [STATE_KEY, ACTION_KEY])
        actions = columns[ACTION_KEY]
        n = len(actions)
        ahead = np.arange(n)[:, None] + np.arange(CHUNK)[None, :]
        states.append(columns[STATE_KEY])
        images.append(read_episode_frames(root, index, IMAGE_KEY))
        chunks.append(actions[np.minimum(ahead, n - 1)])  # LeRobot clamps to the episode, and pads
        pads.append(ahead >= n)
    return Arrays(
        state=np.concatenate(states).astype(np.float32),
        image=np.concatenate(images),
        chunk=np.concatenate(chunks).astype(np.float32),
        pad=np.concatenate(pads),
    )


def batch_of(data: Arrays, rows: np.ndarray) -> dict[str, Any]:
    import torch

    return {
        STATE_KEY: torch.from_numpy(data.state[rows]),
        IMAGE_KEY: torch.from_numpy(data.image[rows]).permute(0, 3, 1, 2).float() / 255,
        ACTION_KEY: torch.from_numpy(data.chunk[rows]),
        "action_is_pad": torch.from_numpy(data.pad[rows]),
        "task": [DEFAULT_TASK] * len(rows),
    }


def validation_loss(policy: Any, preprocessor: Any, data: Arrays, batch_size: int = 128) -> float:
    import torch

    policy.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for first in range(0, len(data.state), batch_size):
            rows = np.arange(first, min(first + batch_size, len(data.state)))
            loss, _ = policy.forward(preprocessor(batch_of(data, rows)))
            total += float(loss) * len(rows)
            count += len(rows)
    policy.train()
    return total / count


def train_and_evaluate(
    name: str, root: Path, data: Arrays, vals: dict[str, Arrays], out: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    import torch
    from lerobot.configs.types import FeatureType
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
    from lerobot.datasets.utils import dataset_to_policy_features
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    # torchvision.io (imported by LeRobot) installs PyAV's Python log callback; with it, closing a
    # threaded decoder early (hilrec's reader does, after the last wanted frame) deadlocks on the
    # GIL. The frames are decoded before LeRobot is imported, and PyAV's default is restored.
    av.logging.set_level(None)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    meta = LeRobotDatasetMetadata(f"hilrec/bench-{name}", root=root)
    features = dataset_to_policy_features(meta.features)
    outputs = {k: f for k, f in features.items() if f.type is FeatureType.ACTION}
    inputs = {k: f for k, f in features.items() if k not in outputs}
    config = ACTConfig(
        input_features=inputs,
        output_features=outputs,
        device="cpu",
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        dim_model=64,
        n_heads=4,
        dim_feedforward=256,
        n_encoder_layers=2,
        n_decoder_layers=1,
        use_vae=False,
        pretrained_backbone_weights=None,
    )
    policy = ACTPolicy(config)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=meta.stats)
    optimizer = torch.optim.AdamW(policy.get_optim_params(), lr=args.lr, weight_decay=1e-4)
    checkpoints = sorted(args.checkpoints)
    rows: list[dict[str, Any]] = []
    policy.train()
    began = time.perf_counter()
    train_losses: list[float] = []
    for step in range(1, checkpoints[-1] + 1):
        picks = rng.integers(0, len(data.state), args.batch)
        loss, _ = policy.forward(preprocessor(batch_of(data, picks)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_losses.append(loss.item())
        if step not in checkpoints:
            continue
        train_seconds = time.perf_counter() - began
        directory = out / "checkpoints" / name / f"step-{step:05d}"
        policy.save_pretrained(directory)
        preprocessor.save_pretrained(directory)
        postprocessor.save_pretrained(directory)
        losses = {key: validation_loss(policy, preprocessor, val) for key, val in vals.items()}
        eval_began = time.perf_counter()
        report = evaluate(
            EvalConfig(
                seeds=tuple(range(SEEDS["eval"], SEEDS["eval"] + args.eval_seeds)),
                push_rate=args.pushes,
                max_seconds=args.max_seconds,
                cameras=(CAMERA,),
                image_size=SIZE,
            ),
            load_policy(directory),
        )
        low, high = report.interval
        row = {
            "dataset": name,
            "step": step,
            "train_loss": float(np.mean(train_losses[-20:])),
            **{f"val_loss_{key}": value for key, value in losses.items()},
            "successes": report.successes,
            "episodes": len(report.episodes),
            "success_rate": report.success_rate,
            "ci95": [low, high],
            "failures": report.failures(),
            "mean_episode_seconds": report.mean_seconds,
            "train_seconds": train_seconds,
            "eval_seconds": time.perf_counter() - eval_began,
        }
        rows.append(row)
        log(
            f"{name} step {step}: train {row['train_loss']:.3f}, "
            + ", ".join(f"val {k} {v:.3f}" for k, v in losses.items())
            + f", success {report.successes}/{len(report.episodes)} [{low:.2f}, {high:.2f}] "
            f"{report.failures()} (eval {row['eval_seconds']:.0f} s)"
        )
        began = time.perf_counter() - train_seconds  # training time only, not the evaluation's
    return rows


def spearman(x: list[float], y: list[float]) -> dict[str, float | None]:
    from scipy.stats import spearmanr

    if len(set(x)) < 2 or len(set(y)) < 2:
        return {"rho": None, "p": None}  # a constant column has no rank correlation
    result = spearmanr(x, y)
    rho, p = float(result.statistic), float(result.pvalue)
    return {"rho": None if math.isnan(rho) else rho, "p": None if math.isnan(p) else p}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=24, help="episodes in each training dataset")
    parser.add_argument("--val-episodes", type=int, default=6, help="held-out expert episodes per set")
    parser.add_argument("--eval-seeds", type=int, default=12, help="closed-loop episodes per checkpoint")
    parser.add_argument("--steps", type=int, default=None, help="(the last checkpoint)")
    parser.add_argument("--checkpoints", default="100,200,300,400", help="optimizer steps to evaluate at")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--pushes", type=float, default=1.0, help="pushes per second (broad data, test)")
    parser.add_argument("--max-seconds", type=float, default=10.0, help="closed-loop episode limit")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_coverage_eval"))
    parser.add_argument(
        "--smoke", action="store_true", help="2 episodes a set, 1 held out, 1 step, 1 s closed loop"
    )
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.val_episodes, args.eval_seeds, args.checkpoints = 2, 1, 1, "1"
        args.batch, args.max_seconds = 4, 1.0
        args.out = args.out.with_name(args.out.name + "_smoke")
    args.checkpoints = [int(s) for s in args.checkpoints.split(",")]
    if args.steps is not None:
        args.checkpoints = [s for s in args.checkpoints if s < args.steps] + [args.steps]
    import torch

    torch.set_num_threads(2)
    began = time.perf_counter()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    roots = {name: out / name for name in ("narrow", "broad", "narrow_val", "test_val")}
    recorded = {
        "narrow": record_set(
            roots["narrow"], episodes=args.episodes, seed=SEEDS["narrow"], scene=NARROW, pushes=0.0
        ),
        "broad": record_set(
            roots["broad"], episodes=args.episodes, seed=SEEDS["broad"], scene=BROAD, pushes=args.pushes
        ),
        "narrow_val": record_set(
            roots["narrow_val"],
            episodes=args.val_episodes,
            seed=SEEDS["narrow_val"],
            scene=NARROW,
            pushes=0.0,
        ),
        "test_val": record_set(
            roots["test_val"],
            episodes=args.val_episodes,
            seed=SEEDS["test_val"],
            scene=BROAD,
            pushes=args.pushes,
        ),
    }
    eval_seeds = range(SEEDS["eval"], SEEDS["eval"] + args.eval_seeds)
    test = rollout_states(eval_seeds, push_rate=args.pushes)
    coverage = {}
    for name in ("narrow", "broad"):
        result = measure(dataset_states(roots[name]), name, test=test)
        coverage[name] = result.to_dict()
        log(f"coverage {name}: {result.format_text()}")
    expert_test = [
        bool((load_episode_sidecar(roots["test_val"], i)[0] or {}).get("success"))
        for i in range(args.val_episodes)
    ]
    log(f"expert on the test distribution: {sum(expert_test)}/{len(expert_test)} successes")
    arrays = {name: load_arrays(root) for name, root in roots.items()}  # before LeRobot is imported
    narrow_vals = {"own": arrays["narrow_val"], "test": arrays["test_val"]}
    broad_vals = {"own": arrays["test_val"], "test": arrays["test_val"]}  # its own = the test's
    rows = train_and_evaluate("narrow", roots["narrow"], arrays["narrow"], narrow_vals, out, args)
    rows += train_and_evaluate("broad", roots["broad"], arrays["broad"], broad_vals, out, args)

    correlations = {
        key: spearman([r[key] for r in rows], [r["success_rate"] for r in rows])
        for key in ("val_loss_own", "val_loss_test", "train_loss")
    }
    per_dataset = {
        name: spearman(
            [r["val_loss_test"] for r in rows if r["dataset"] == name],
            [r["success_rate"] for r in rows if r["dataset"] == name],
        )
        for name in ("narrow", "broad")
    }
    results = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "recorded": recorded,
        "coverage": coverage,
        "checkpoints": rows,
        "spearman_vs_success": correlations,
        "spearman_val_loss_test_vs_success_per_dataset": per_dataset,
        "wall_seconds": time.perf_counter() - began,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))

    print("\ncoverage against the held-out test states (broad placements, pushes):")
    for name in ("narrow", "broad"):
        c = coverage[name]
        print(
            f"  {name:6s}: test coverage {c['test']['coverage']:.1%}, grid {c['grid']['share']:.1%} "
            f"of cells, {c['cube_cells_occupied']} cube cells, pushed episodes "
            f"{c['disturbed_episode_share']:.0%}, expert successes {recorded[name]['expert_successes']}"
            f"/{recorded[name]['episodes']}"
        )
    print("\n| dataset | step | train loss | val loss (own) | val loss (test) | success (pushes) | 95% CI |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['dataset']} | {r['step']} | {r['train_loss']:.3f} | {r['val_loss_own']:.3f} | "
            f"{r['val_loss_test']:.3f} | {r['successes']}/{r['episodes']} | "
            f"{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f} |"
        )
    print("\nSpearman rank correlation with closed-loop success, all checkpoints:")
    for key, value in correlations.items():
        print(f"  {key}: rho {value['rho']}, p {value['p']}")
    print(f"  val_loss_test within each dataset: {per_dataset}")
    print(f"\nwall time {results['wall_seconds']:.0f} s; results in {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
