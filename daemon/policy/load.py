"""The policies ``hilrec eval``, ``record --sim --policy`` and the daemon's rollouts run, behind one
small interface.

A policy is fed what a real SO-101 measures, as the dataset stores it, and nothing else::

    {"observation.state": float32 (6,),                    # LeRobot units, as twin.observe()
     "observation.images.<camera>": uint8 (H, W, 3),       # one per requested camera, as twin.render()
     "task": str}

and answers with an action: 6 numbers in LeRobot units (the follower's goal, clamped by the
twin as every goal is). No oracle state (cube pose, seed, simulator state) is ever passed. The
arrays are read-only: a policy keeps copies of what it wants to keep.

Two kinds load from the ``--policy`` text (:func:`load_policy`):

- a LeRobot pretrained policy directory (``config.json``, ``model.safetensors`` and the
  processors ``save_pretrained`` writes): loaded with its class's ``from_pretrained`` and
  ``make_pre_post_processors(config, pretrained_path=DIR)``, and asked through LeRobot's own
  record-loop step (``lerobot.utils.control_utils.predict_action``: float32 tensors, images CHW
  in [0, 1], batch dimension, ``task``); ``select_action`` keeps its action queue (chunking as the
  policy does it) and ``reset()`` empties it at every episode start;
- a Python entry point ``module:function``, ``module:Class`` (instantiated once, without
  arguments) or ``path/to/file.py:name``: a callable taking the observation dict and returning
  the action (an object without ``__call__`` may offer ``act(observation)`` instead). If it has
  ``reset()``, that is called at each episode start.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hilrec.daemon.errors import ConfigError
from hilrec.daemon.so101 import ARM_SIDES, IMAGE_PREFIX, NUM_JOINTS, STATE_KEY, robot_type

TASK_KEY = "task"
Observation = Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class Wants:
    """What a policy must be fed: its cameras and their (height, width); None: no preference."""

    cameras: tuple[str, ...] | None = None
    image_size: tuple[int, int] | None = None
    arms: int | None = None  # 1 (six joints) or 2 (bi_so_follower's twelve)


class EvalPolicy(Protocol):
    """What the evaluator asks of a policy."""

    name: str
    wants: Wants

    def reset(self) -> None: ...

    def act(self, observation: Observation) -> Any: ...


class CallablePolicy:
    """A Python object: called with the observation (or its ``act``); ``reset()`` if it has one."""

    def __init__(self, target: Any, *, name: str) -> None:
        if callable(target):
            self._act: Callable[[Observation], Any] = target
        elif callable(getattr(target, "act", None)):
            self._act = target.act
        else:
            raise ConfigError(
                "policy",
                f"{name} is neither callable nor has act(observation): a policy takes the "
                "observation dict and returns 6 numbers",
            )
        reset = getattr(target, "reset", None)
        self._reset: Callable[[], Any] | None = reset if callable(reset) else None
        self.target = target
        self.name = name
        self.wants = Wants()

    def reset(self) -> None:
        if self._reset is not None:
            self._reset()

    def act(self, observation: Observation) -> Any:
        return self._act(observation)


@contextlib.contextmanager
def _temp_files_removed_after() -> Iterator[None]:
    """Python's temporary files pointed at a private folder, removed after.

    LeRobot's ``PreTrainedConfig.from_pretrained`` writes the config, less its ``type``, to a
    ``NamedTemporaryFile(delete=False)`` and never removes it: every rollout's policy load left
    a file in /tmp. A load runs in the policy's own process or in ``hilrec eval`` before its
    episodes, so nothing else is creating temporary files meanwhile."""
    with tempfile.TemporaryDirectory(prefix="hilrec-policy-load-") as private:
        saved, tempfile.tempdir = tempfile.tempdir, private
        try:
            yield
        finally:
            tempfile.tempdir = saved


class LeRobotPolicy:
    """A LeRobot ``PreTrainedPolicy`` with its pre- and post-processors, asked frame by frame."""

    def __init__(self, policy: Any, preprocessor: Any, postprocessor: Any, *, name: str) -> None:
        self.policy = policy
        self.preprocessor = preprocessor
        self.postprocessor = postprocessor
        self.name = name
        self.wants = _lerobot_wants(policy.config, name)
        import torch

        self._device = torch.device(policy.config.device or "cpu")

    @classmethod
    def load(cls, directory: Path, *, device: str = "cpu") -> LeRobotPolicy:
        try:
            # LeRobot prints ("Loading weights from local directory") where --json writes.
            with contextlib.redirect_stdout(sys.stderr):
                from lerobot.configs.policies import PreTrainedConfig
                from lerobot.policies.factory import get_policy_class, make_pre_post_processors
        except ImportError as exc:
            raise ConfigError(
                "policy",
                f"{directory} is a LeRobot policy, and LeRobot's policies do not import here ({exc}); "
                "install the compat extra (requirements-compat.txt and lerobot)",
            ) from None
        if not (directory / "config.json").is_file():
            raise ConfigError("policy", f"{directory} has no config.json: not a LeRobot pretrained policy")
        with contextlib.redirect_stdout(sys.stderr), _temp_files_removed_after():
            config = PreTrainedConfig.from_pretrained(directory)
            config.device = device
            policy = get_policy_class(config.type).from_pretrained(directory, config=config)
            try:
                preprocessor, postprocessor = make_pre_post_processors(
                    policy.config,
                    pretrained_path=str(directory),
                    preprocessor_overrides={"device_processor": {"device": device}},
                )
            except FileNotFoundError as exc:
                raise ConfigError(
                    "policy",
                    f"{directory}: its processors are missing ({exc}); save the policy's pre- and "
                    "post-processors beside it (save_pretrained), they hold the normalisation stats",
                ) from None
        policy.eval()
        return cls(policy, preprocessor, postprocessor, name=str(directory))

    def reset(self) -> None:
        self.policy.reset()  # empties the action queue
        self.preprocessor.reset()
        self.postprocessor.reset()

    def act(self, observation: Observation) -> np.ndarray:
        from lerobot.utils.control_utils import predict_action

        # Copies: LeRobot turns the arrays into tensors in place of the dict's values.
        frame = {key: np.array(value) for key, value in observation.items() if key != TASK_KEY}
        action = predict_action(
            observation=frame,
            policy=self.policy,
            device=self._device,
            preprocessor=self.preprocessor,
            postprocessor=self.postprocessor,
            use_amp=False,
            task=observation.get(TASK_KEY),
            robot_type=robot_type(self.wants.arms or 1),
        )
        return np.asarray(action.squeeze(0).to("cpu").numpy(), dtype=np.float32)

    def act_chunk(self, observation: Observation) -> np.ndarray:
        """The policy's whole chunk for this observation, float32 (k, 6): its first
        ``n_action_steps`` goals (all it predicts when it has no such setting), un-normalised."""
        import torch
        from lerobot.policies.utils import prepare_observation_for_inference

        frame = {key: np.array(value) for key, value in observation.items() if key != TASK_KEY}
        with torch.inference_mode():
            batch = prepare_observation_for_inference(
                frame, self._device, observation.get(TASK_KEY), robot_type(self.wants.arms or 1)
            )
            chunk = self.policy.predict_action_chunk(self.preprocessor(batch))
            steps = getattr(self.policy.config, "n_action_steps", None) or chunk.shape[1]
            actions = self.postprocessor(chunk[:, :steps])
        return np.asarray(actions.squeeze(0).to("cpu").numpy(), dtype=np.float32)


def _lerobot_wants(config: Any, name: str) -> Wants:
    """The cameras and image size a LeRobot policy was trained on; ConfigError for an input no
    SO-101 measures or an action that is not six joint goals."""
    cameras: list[str] = []
    sizes: set[tuple[int, int]] = set()
    arms = 1
    shapes = {(NUM_JOINTS * k,): k for k in (1, len(ARM_SIDES))}
    for key, feature in config.input_features.items():
        shape = tuple(int(s) for s in feature.shape)
        if key == STATE_KEY:
            if shape not in shapes:
                raise ConfigError(
                    "policy",
                    f"{name} wants {key} of shape {shape}; the SO-101's is ({NUM_JOINTS},), "
                    f"two arms' ({NUM_JOINTS * len(ARM_SIDES)},)",
                )
            arms = shapes[shape]
        elif key.startswith(IMAGE_PREFIX) and len(shape) == 3 and shape[0] == 3:
            cameras.append(key[len(IMAGE_PREFIX) :])
            sizes.add((shape[1], shape[2]))
        else:
            raise ConfigError(
                "policy",
                f"{name} wants the input {key} {shape}, which a real SO-101 does not measure: hilrec "
                f"eval feeds only {STATE_KEY} (6,) and {IMAGE_PREFIX}<camera> (3, H, W)",
            )
    if len(sizes) > 1:
        raise ConfigError(
            "policy", f"{name} wants images of several sizes {sorted(sizes)}; the twin renders one size"
        )
    action = config.output_features.get("action")
    if action is None or tuple(int(s) for s in action.shape) != (NUM_JOINTS * arms,):
        raise ConfigError("policy", f"{name} does not output an action of {NUM_JOINTS * arms} joint goals")
    return Wants(cameras=tuple(cameras), image_size=next(iter(sizes)) if sizes else None, arms=arms)


def load_policy(spec: str | Path, *, device: str = "cpu") -> EvalPolicy:
    """The policy named by ``--policy``: a LeRobot pretrained directory or a Python entry point."""
    text = str(spec)
    if Path(text).is_dir():
        return LeRobotPolicy.load(Path(text), device=device)
    module_name, sep, attribute = text.rpartition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(
            "policy",
            f"{text!r} is neither a LeRobot pretrained policy directory nor an entry point "
            "module:function, module:Class or path/to/file.py:name",
        )
    module = _import(module_name, text)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError("policy", f"{module_name} has no attribute {attribute!r}")
        target = getattr(target, part)
    if isinstance(target, type):
        target = target()  # a class: one instance for the whole evaluation
    return as_policy(target, name=text)


def as_policy(target: Any, *, name: str | None = None) -> EvalPolicy:
    """An EvalPolicy as it is, else a Python object wrapped as one (:class:`CallablePolicy`)."""
    if isinstance(target, (CallablePolicy, LeRobotPolicy)):
        return target
    return CallablePolicy(target, name=name or str(getattr(target, "__name__", type(target).__name__)))


def _import(module_name: str, spec: str) -> Any:
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ConfigError("policy", f"{spec}: no file {path}")
        loaded = importlib.util.spec_from_file_location(f"hilrec_eval_policy_{path.stem}", path)
        if loaded is None or loaded.loader is None:
            raise ConfigError("policy", f"{spec}: {path} cannot be imported")
        module = importlib.util.module_from_spec(loaded)
        sys.modules[loaded.name] = module
        loaded.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError("policy", f"{spec}: cannot import {module_name} ({exc})") from None


def act_chunk(policy: EvalPolicy, observation: Observation) -> Any:
    """A chunk of goals (k, 6), or one goal (6,), for ``observation``: a LeRobot policy's whole
    predicted chunk, a Python policy's answer as it gives it (either shape)."""
    if isinstance(policy, LeRobotPolicy):
        return policy.act_chunk(observation)
    return policy.act(observation)
