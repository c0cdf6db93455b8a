"""The arm's simplified meshes are what the plain algorithm gives, bit for bit: the same vertices
(each the mean of the corners in its grid cell) and the same faces, for every packaged mesh and
for corners spread too widely for the table of cells."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hilrec.sim.lowpoly import CLUSTER_CELL_M, cluster_vertices, read_binary_stl
from hilrec.sim.model import locate_model


def plain_clustering(corners: np.ndarray, cell: float) -> tuple[np.ndarray, np.ndarray]:
    """Sort the cell keys, sum with np.add.at: the reference the fast path must equal."""
    cells = np.floor(corners / cell).astype(np.int64)
    cells -= cells.min(axis=0)
    extent = cells.max(axis=0) + 1
    keys = (cells[:, 0] * extent[1] + cells[:, 1]) * extent[2] + cells[:, 2]
    unique_keys, vertex_of_corner = np.unique(keys, return_inverse=True)
    sums = np.zeros((len(unique_keys), 3))
    np.add.at(sums, vertex_of_corner, corners)
    vertices = sums / np.bincount(vertex_of_corner)[:, None]
    faces = vertex_of_corner.reshape(-1, 3)
    faces = faces[(faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 0] != faces[:, 2])]
    ordered = np.sort(faces, axis=1)
    n = len(vertices)
    _, first = np.unique((ordered[:, 0] * n + ordered[:, 1]) * n + ordered[:, 2], return_index=True)
    faces = faces[np.sort(first)]
    used, remap = np.unique(faces, return_inverse=True)
    return vertices[used], remap.reshape(-1, 3).astype(np.int32)


def assert_same(corners: np.ndarray, cell: float) -> None:
    vertices, faces = cluster_vertices(corners, cell)
    want_vertices, want_faces = plain_clustering(corners, cell)
    assert vertices.dtype == want_vertices.dtype and faces.dtype == want_faces.dtype
    np.testing.assert_array_equal(vertices, want_vertices)
    np.testing.assert_array_equal(faces, want_faces)


@pytest.mark.parametrize("mesh", [path.name for path in locate_model().meshes])
def test_every_packaged_mesh_is_simplified_as_the_plain_algorithm_does(mesh: str) -> None:
    files = locate_model()
    [path] = [p for p in files.meshes if p.name == mesh]
    assert_same(read_binary_stl(path), CLUSTER_CELL_M)


corner = st.floats(-0.25, 0.25, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 40).map(lambda t: 3 * t), st.just(3)), elements=corner),
    st.sampled_from([CLUSTER_CELL_M, 0.01, 0.05, 1e-6]),
)
def test_generated_corners_are_clustered_as_the_plain_algorithm_does(
    corners: np.ndarray, cell: float
) -> None:
    # 1e-6 m cells over 0.5 m: more cells than the table holds, the sorting path.
    assert_same(corners, cell)
