"""What a sim dataset must say about the world that made it, and how to rebuild that world.

Written once per dataset into ``hilrec/dataset.json`` under ``"sim"`` (plus the units mapping
under ``"units"``, the key the daemon's sim rig uses too): the MuJoCo version; sha256 of the
packaged MJCF, of every mesh, and of our scene's MJCF; the scene configuration itself, so a
replay compiles the very same scene (at the recorded timestep, the one the twin chose or was
given); the operator's source hash and settings; timestep, substeps and fps.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import mujoco

from hilrec.daemon.errors import ReplayError, SimError
from hilrec.sim import bimanual_operator, ik, operator
from hilrec.sim.bimanual_scene import BimanualSceneConfig
from hilrec.sim.model import model_provenance, sha256_text
from hilrec.sim.scene import SUCCESS_CRITERION, SceneConfig, scene_xml
from hilrec.sim.twin import timestep_for
from hilrec.sim.units import units_mapping

SIDECAR_KEY = "sim"
FORMAT = "hilrec.sim/1"


def operator_source(*, arms: int = 1) -> dict[str, Any]:
    """sha256 of the code that turns a seed into a leader path (operator + its IK; with two
    arms, the two-arm operator too)."""
    modules = (operator, ik) if arms == 1 else (operator, ik, bimanual_operator)
    files = {path.name: path.read_bytes() for path in (_source_file(module) for module in modules)}
    combined = hashlib.sha256()
    for name in sorted(files):
        combined.update(name.encode() + b"\0" + files[name])
    return {
        "sha256": combined.hexdigest(),
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    }


def _source_file(module: ModuleType) -> Path:
    if module.__file__ is None:
        raise SimError(f"{module.__name__} has no source file to hash")
    return Path(module.__file__)


def dataset_provenance(
    *,
    scene: SceneConfig,
    physics: Mapping[str, Any],
    operator_config: operator.OperatorConfig | None,
    cameras: Mapping[str, tuple[int, int]],
    render_quality: str,
    push_rate: float,
) -> dict[str, Any]:
    """The per-dataset sidecar fields of a sim recording (merge into hilrec/dataset.json).

    A scene that left its timestep to the twin is recorded with the one the twin chose
    (``physics["timestep"]``), so the config and the scene hash say the step that ran."""
    if scene.timestep is None:
        scene = dataclasses.replace(scene, timestep=float(physics["timestep"]))
    xml = scene_xml(scene)
    sim: dict[str, Any] = {
        "format": FORMAT,
        "mujoco_version": mujoco.__version__,
        "model": model_provenance(),
        "scene": {
            "sha256": sha256_text(xml),
            "config": dataclasses.asdict(scene),
            "success_criterion": SUCCESS_CRITERION,
        },
        "physics": dict(physics),
        "cameras": {name: list(size) for name, size in cameras.items()},
        "render_quality": render_quality,
        "push_rate_hz": push_rate,
    }
    if operator_config is not None:
        sim["operator"] = {
            "name": "hilrec.sim.operator.ScriptedOperator"
            if scene.arms == 1
            else "hilrec.sim.bimanual_operator.BimanualOperator",
            "source": operator_source(arms=scene.arms),
            "config": dataclasses.asdict(operator_config),
        }
    units = units_mapping()
    if scene.arms > 1:  # every arm converts alike; its columns carry its prefix
        units["arm_prefixes"] = list(scene.arm_prefixes)
    return {SIDECAR_KEY: sim, "units": units}


def scene_from_sidecar(dataset_sidecar: Mapping[str, Any] | None, root: Path) -> SceneConfig:
    """The SceneConfig a dataset was recorded with, at its recorded timestep; the default scene
    when it names none, with the recorded timestep if there is one (``sim.physics`` or
    ``twin``), else none (the twin then chooses it for the dataset's fps as the recorder did)."""
    sim = (dataset_sidecar or {}).get(SIDECAR_KEY) or {}
    config = (sim.get("scene") or {}).get("config")
    timestep = _recorded_timestep(dataset_sidecar)
    if config is None:
        return SceneConfig() if timestep is None else SceneConfig(timestep=timestep)
    # A two-arm scene is the one whose config has the two-arm layout (arm_spacing...).
    one_arm = {f.name for f in dataclasses.fields(SceneConfig)}
    kind = BimanualSceneConfig if set(config) - one_arm else SceneConfig
    fields = {f.name: f for f in dataclasses.fields(kind)}
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise ReplayError(
            f"{root}: hilrec/dataset.json sim.scene.config has keys this hilrec does "
            f"not know ({', '.join(unknown)}); it was recorded by another version"
        )
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
    if values.get("timestep") is None and timestep is not None:
        values["timestep"] = timestep
    try:
        return kind(**values)
    except (TypeError, ValueError) as exc:
        raise ReplayError(f"{root}: hilrec/dataset.json sim.scene.config is invalid: {exc}") from exc


def _recorded_timestep(dataset_sidecar: Mapping[str, Any] | None) -> float | None:
    sidecar = dataset_sidecar or {}
    for holder in ((sidecar.get(SIDECAR_KEY) or {}).get("physics"), sidecar.get("twin")):
        if isinstance(holder, Mapping) and isinstance(holder.get("timestep"), (int, float)):
            return float(holder["timestep"])
    return None


def check_same_world(dataset_sidecar: Mapping[str, Any] | None, scene: SceneConfig) -> list[str]:
    """Differences between the recorded world and this installation (empty when identical).

    A ``scene`` that leaves its timestep to the twin is compared at the step the twin would
    choose for the recorded fps (so a dataset recorded with another step differs)."""
    sim = (dataset_sidecar or {}).get(SIDECAR_KEY)
    if not sim:
        return []
    fps = (sim.get("physics") or {}).get("fps")
    if scene.timestep is None and isinstance(fps, int) and fps > 0:
        scene = dataclasses.replace(scene, timestep=timestep_for(fps))
    problems = []
    if sim.get("mujoco_version") != mujoco.__version__:
        problems.append(
            f"recorded with MuJoCo {sim.get('mujoco_version')}, replaying with {mujoco.__version__}"
        )
    recorded_model = sim.get("model") or {}
    here = model_provenance()
    if (recorded_model.get("xml") or {}).get("sha256") != here["xml"]["sha256"]:
        problems.append("the SO-101 MJCF differs from the recorded one (sha256)")
    changed = sorted(
        name
        for name, digest in (recorded_model.get("assets") or {}).items()
        if here["assets"].get(name) != digest
    )
    if changed:
        problems.append(f"meshes differ from the recorded ones: {', '.join(changed)}")
    scene_sha = (sim.get("scene") or {}).get("sha256")
    if scene_sha is not None and scene_sha != sha256_text(scene_xml(scene)):
        problems.append("the scene MJCF this hilrec builds differs from the recorded one (sha256)")
    return problems
