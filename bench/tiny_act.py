"""A tiny LeRobot 0.4.4 ACT, trained a few steps on synthetic frames, saved as a pretrained
directory with its processors: what ``bench_rollout`` and the rollout test hand to ``--policy``.

Synthetic data, no dataset on disk: a state, a camera image and the chunk of goals that holds
the state (the arm stays where it is), normalised with the frames' own statistics. It is about
timing and plumbing, not skill: a real checkpoint has the same inputs, outputs and processors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHUNK = 10
STATE_KEY = "observation.state"
ACTION_KEY = "action"


def train_tiny_act(
    directory: Path, *, camera: str = "front", image_size: tuple[int, int] = (48, 64), steps: int = 3
) -> Path:
    """Train and save the tiny ACT into ``directory``; returns it."""
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    torch.manual_seed(0)
    height, width = image_size
    image_key = f"observation.images.{camera}"
    config = ACTConfig(
        input_features={
            STATE_KEY: PolicyFeature(type=FeatureType.STATE, shape=(6,)),
            image_key: PolicyFeature(type=FeatureType.VISUAL, shape=(3, height, width)),
        },
        output_features={ACTION_KEY: PolicyFeature(type=FeatureType.ACTION, shape=(6,))},
        device="cpu",
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        dim_model=32,
        n_heads=2,
        dim_feedforward=64,
        n_encoder_layers=1,
        n_decoder_layers=1,
        use_vae=False,
        pretrained_backbone_weights=None,  # nothing downloads
    )
    rng = np.random.default_rng(0)
    batch_size = 8
    states = rng.normal(0.0, 20.0, size=(batch_size, 6)).astype(np.float32)
    states[:, 5] = rng.uniform(0, 100, size=batch_size)
    images = rng.uniform(0, 1, size=(batch_size, 3, height, width)).astype(np.float32)
    actions = np.repeat(states[:, None, :], CHUNK, axis=1)
    stats = {
        STATE_KEY: _stats(states),
        ACTION_KEY: _stats(actions.reshape(-1, 6)),
        image_key: {
            "mean": np.full((3, 1, 1), 0.5, np.float32),
            "std": np.full((3, 1, 1), 0.29, np.float32),
            "min": np.zeros((3, 1, 1), np.float32),
            "max": np.ones((3, 1, 1), np.float32),
        },
    }
    policy = ACTPolicy(config)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    batch = {
        STATE_KEY: torch.from_numpy(states),
        image_key: torch.from_numpy(images),
        ACTION_KEY: torch.from_numpy(actions),
        "action_is_pad": torch.zeros(batch_size, CHUNK, dtype=torch.bool),
    }
    optimizer = torch.optim.AdamW(policy.get_optim_params(), lr=1e-4)
    policy.train()
    for _ in range(steps):
        loss, _ = policy.forward(preprocessor(dict(batch)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    directory.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(directory)
    preprocessor.save_pretrained(directory)
    postprocessor.save_pretrained(directory)
    return directory


def _stats(values: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "mean": values.mean(axis=0).astype(np.float32),
        "std": (values.std(axis=0) + 1e-3).astype(np.float32),
        "min": values.min(axis=0).astype(np.float32),
        "max": values.max(axis=0).astype(np.float32),
    }
