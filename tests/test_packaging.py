"""pyproject.toml as setuptools (>= 77) reads it without a warning box: ``project.license`` an SPDX
string with its ``license-files``, and every folder with files under a declared package itself
declared (a data-only folder such as the ui's ``static/`` is otherwise "absent from packages").
Checked from the file, offline; ``pip install -e .`` in a scratch venv showed the same."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_license_is_an_spdx_string_with_its_file() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] and all(list(ROOT.glob(g)) for g in project["license-files"])
    assert "Apache License" in (ROOT / "LICENSE").read_text()


def test_every_folder_with_files_under_a_package_is_declared() -> None:
    setup = PYPROJECT["tool"]["setuptools"]
    packages = set(setup["packages"])
    dirs = {name: ROOT / path for name, path in setup["package-dir"].items()}
    declared = set(dirs.values())
    undeclared = []
    for name, path in dirs.items():
        for folder in path.rglob("*"):
            if (
                not folder.is_dir()
                or "__pycache__" in folder.parts
                or not any(f.is_file() for f in folder.iterdir())
            ):
                continue
            if folder not in declared:
                undeclared.append(".".join([name, *folder.relative_to(path).parts]))
    assert not undeclared, f"folders setuptools would warn about: {undeclared}"
    for name in setup.get("package-data", {}):
        assert name in packages, name
