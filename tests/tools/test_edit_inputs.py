"""Bad input to ``hilrec edit``: overlapping split lists, ranges far beyond the dataset, a full disk.

Each is refused with exit status 2 and one line that names what is wrong and what is valid; the
source stays bit-equal. The full disk is real: a 20 MiB tmpfs (root mounts one; elsewhere the
test is skipped), filled until a few kilobytes are left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_edit import LENGTHS, make_dataset, tree_digest

from hilrec.daemon.cli import main
from hilrec.daemon.tools import edit


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("inputs") / "src")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["edit", *args])
    return code, capsys.readouterr().err


def test_split_lists_that_overlap_are_refused_naming_the_episode(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree_digest(source)
    a, b = tmp_path / "a", tmp_path / "b"
    code, err = cli(capsys, "split", str(source), "--out", str(a), str(b), "--episodes", "0-3", "3-5")
    assert code == 2, err
    assert "episode 3 is in the --episodes lists of both" in err and str(a) in err and str(b) in err, err
    assert not a.exists() and not b.exists()
    assert tree_digest(source) == before


@pytest.mark.parametrize("flag", ["0-10000000", "2,9", "10000000"])
def test_a_range_beyond_the_dataset_is_refused_naming_the_valid_one(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    out = tmp_path / "out"
    for args in (
        ["delete-episodes", str(source), "--episodes", flag, "--out", str(out)],
        ["split", str(source), "--out", str(out), str(tmp_path / "b"), "--episodes", flag, "0"],
        ["keep", str(source), "--episodes", flag, "--out", str(out)],
    ):
        code, err = cli(capsys, *args)
        assert code == 2, err
        assert len(err) < 400, err[:400]  # it was 89 MB: every number of the range
        assert f"the dataset has episodes 0-{len(LENGTHS) - 1}" in err, err
        assert not out.exists()


def test_a_backwards_range_is_refused_by_the_flag(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["edit", "delete-episodes", str(source), "--episodes", "5-3", "--out", str(tmp_path / "o")])
    assert exited.value.code == 2
    assert "'5-3'" in capsys.readouterr().err


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "disk"
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(path)]
    if os.geteuid() != 0 or subprocess.run(mount, check=False, capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs and fill it for real")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False, capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(path)], check=True)


def fill(disk: Path, leave: int) -> None:
    with open(disk / "filler.bin", "ab") as out:
        while (gap := shutil.disk_usage(disk).free - leave) > 0:
            try:
                out.write(b"\0" * min(gap, 1024 * 1024))
                out.flush()
            except OSError:
                break


@pytest.mark.slow  # a real full disk: a tmpfs mounted, filled, and an edit run three times
@pytest.mark.parametrize(
    "args",
    [
        ["delete-episodes", "{root}", "--episodes", "1"],  # in place
        ["set-task", "{root}", "--episodes", "0-2", "--task", "stack the cubes", "--out", "{out}"],
        ["merge", "{root}", "{root}", "--out", "{out}"],
    ],
)
def test_an_edit_that_fills_the_disk_says_so_exits_2_and_leaves_the_source(
    source: Path, small_disk: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    root = small_disk / "ds"
    shutil.copytree(source, root, symlinks=True)
    before = tree_digest(root)
    out = small_disk / "out"
    fill(small_disk, leave=16 * 1024)
    code, err = cli(capsys, *(a.format(root=root, out=out) for a in args))
    assert code == 2, err
    assert "Traceback" not in err and "is full" in err and "the source is unchanged" in err, err
    assert tree_digest(root) == before
    assert not edit.temp_dirs(root) and not edit.temp_dirs(out) and not out.exists()
    # With room again, the same command works.
    (small_disk / "filler.bin").unlink()
    code, err = cli(capsys, *(a.format(root=root, out=out) for a in args))
    assert code == 0, err
