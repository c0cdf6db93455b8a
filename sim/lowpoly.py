"""Simplified arm meshes for fast offscreen rendering, derived in memory from the packaged STLs.

The shipped SO-101 meshes total about 320k triangles. Mesa's CPU rasteriser (llvmpipe) spends
most of a frame transforming them, so a 640x480 frame of the full arm takes ~80-150 ms whatever
the shading settings. Vertex clustering on a 1.5 mm grid keeps every visible feature of parts that
are centimetres large and leaves about 30k triangles (measured in bench/bench_sim.py).

Nothing is written anywhere: the STL files are read, clustered, and handed to ``MjSpec`` as user
vertices and faces. The meshes are used only to draw; the physics model has no arm meshes at all.
"""

from __future__ import annotations

import functools
from pathlib import Path

import mujoco
import numpy as np

from hilrec.daemon.errors import SimError
from hilrec.sim.model import ModelFiles

CLUSTER_CELL_M = 0.0015
_STL_RECORD = np.dtype([("normal", "<f4", 3), ("vertices", "<f4", (3, 3)), ("attr", "<u2")])


def read_binary_stl(path: Path) -> np.ndarray:
    """Triangle corners of a binary STL as a float64 (n_triangles * 3, 3) array."""
    raw = path.read_bytes()
    if len(raw) < 84:
        raise SimError(f"{path}: too short to be a binary STL ({len(raw)} bytes)")
    count = int(np.frombuffer(raw, dtype="<u4", count=1, offset=80)[0])
    if len(raw) < 84 + 50 * count:
        raise SimError(
            f"{path}: header says {count} triangles but the file holds fewer (ASCII STL is not supported)"
        )
    records = np.frombuffer(raw, dtype=_STL_RECORD, count=count, offset=84)
    return records["vertices"].reshape(-1, 3).astype(np.float64)


def cluster_vertices(corners: np.ndarray, cell: float) -> tuple[np.ndarray, np.ndarray]:
    """Merge the corners that fall in one grid cell into their mean; drop collapsed triangles.

    Returns (vertices (n, 3) float64, faces (m, 3) int32), faces keeping their winding.
    """
    cells = np.floor(corners / cell).astype(np.int64)
    cells -= cells.min(axis=0)
    extent = cells.max(axis=0) + 1
    keys = (cells[:, 0] * extent[1] + cells[:, 1]) * extent[2] + cells[:, 2]
    vertex_of_corner, count = _cell_ids(keys, int(np.prod(extent)))
    # bincount adds each corner in turn, as np.add.at would: the same float64 sums, bit for bit.
    sums = np.stack([np.bincount(vertex_of_corner, corners[:, k], count) for k in range(3)], axis=1)
    vertices = sums / np.bincount(vertex_of_corner, minlength=count)[:, None]
    faces = vertex_of_corner.reshape(-1, 3)
    alive = (faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 0] != faces[:, 2])
    faces = faces[alive]
    # Two triangles on the same three vertices (either winding) draw the same pixels.
    ordered = np.sort(faces, axis=1)
    n = len(vertices)
    face_keys = (ordered[:, 0] * n + ordered[:, 1]) * n + ordered[:, 2]
    _, first = np.unique(face_keys, return_index=True)
    faces = faces[np.sort(first)]
    used, remap = np.unique(faces, return_inverse=True)
    return vertices[used], remap.reshape(-1, 3).astype(np.int32)


def _cell_ids(keys: np.ndarray, cells: int) -> tuple[np.ndarray, int]:
    """Each key's rank among the distinct keys (what ``np.unique(keys, return_inverse=True)``
    gives), and how many there are. A part centimetres large spans a few hundred thousand grid
    cells, so a table of them all beats sorting the million corners (every rendering process
    simplifies the arm once)."""
    if cells > 4 * len(keys) + 1_000_000:
        unique, inverse = np.unique(keys, return_inverse=True)
        return inverse, len(unique)
    occupied = np.zeros(cells, dtype=bool)
    occupied[keys] = True
    rank = np.cumsum(occupied) - 1
    return rank[keys], int(rank[-1]) + 1


@functools.lru_cache(maxsize=32)
def simplified_mesh(path: Path, cell: float = CLUSTER_CELL_M) -> tuple[np.ndarray, np.ndarray]:
    return cluster_vertices(read_binary_stl(path), cell)


def simplify_meshes(spec: mujoco.MjSpec, files: ModelFiles, cell: float = CLUSTER_CELL_M) -> int:
    """Replace every file mesh of ``spec`` by its clustered version; returns the triangle count."""
    triangles = 0
    for mesh in spec.meshes:
        if not mesh.file:
            continue
        vertices, faces = simplified_mesh(files.mesh_path(mesh.file), cell)
        scale = np.asarray(mesh.scale, dtype=float)
        mesh.file = ""
        mesh.uservert = (vertices * scale).ravel().tolist()
        mesh.userface = faces.ravel().tolist()
        triangles += len(faces)
    return triangles
