#!/usr/bin/env bash
# make compat-latest: LeRobot 0.6.1 on Python 3.13 against hilrec, both ways.
#
#   (a) LeRobot 0.6.1 loads datasets hilrec wrote (on the host venv, Python 3.11) and returns the
#       columns and frames hilrec's own reader gives;
#   (b) `hilrec check`, installed and running on Python 3.13, accepts datasets LeRobot 0.6.1 wrote.
#
# Python 3.13 and LeRobot 0.6.1 live in a Debian trixie root (debootstrap, chroot), cached under
# build/compat-latest/ and rebuilt only when its inputs change:
#   root/            trixie minbase + python3 + python3-venv              (key: ROOT_KEY below)
#   wheels/          cp313 wheels fetched by the HOST pip (pip cannot verify certificates inside
#                    the root), then installed offline inside it     (key: pins, requirements.txt,
#                    hilrec's dependencies)
#   root/opt/v       the Python 3.13 venv                                  (key: the wheels' key)
# hilrec itself is rebuilt from the working tree and reinstalled on every run.
#
# torch: LeRobot 0.6.1's dataset stack imports torch and torchvision (io_utils imports
# torchvision.transforms) but decodes video with PyAV itself (video_backend="pyav"), so no
# torchcodec and no torchvision video decoding is needed. PyPI has no CPU-only torch for x86_64;
# torch 2.8.0 + torchvision 0.23.0 (cp313, inside LeRobot 0.6.1's pins) are the pair the host's
# compat extra already uses, so their CUDA libraries (nvidia-*-cu12, 4 GB, Python-independent)
# are hard-linked from the host venv when it holds exactly the versions torch 2.8.0 pins, and
# downloaded otherwise. triton (torch.compile only) is not installed.
#
# Needs root (debootstrap, chroot, mount). Mounts /proc and a private tmpfs on /dev/shm inside the
# root for the run only (hilrec check's worker pool needs POSIX semaphores) and unmounts them on
# exit. Concurrent runs on one cache are serialised with flock.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$REPO/tests/compat_latest
CACHE=${COMPAT_LATEST_CACHE:-$REPO/build/compat-latest}
HOST_VENV=${HOST_VENV:-$REPO/.venv}
HOST_PY=$HOST_VENV/bin/python
ROOT=$CACHE/root
WHEELS=$CACHE/wheels
VENV=/opt/v # inside the root

SUITE=trixie
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
LEROBOT=0.6.1
TORCH=2.8.0
TORCHVISION=0.23.0
ROOT_KEY="debootstrap --variant=minbase --include=python3,python3-venv $SUITE"
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64
    manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_12_x86_64 manylinux2010_x86_64
    manylinux_2_5_x86_64 manylinux1_x86_64 any)
PIP_TARGET=(--python-version 3.13 --only-binary=:all:)
for p in "${PLATFORMS[@]}"; do PIP_TARGET+=(--platform "$p"); done

START=$SECONDS
phase_start=$SECONDS
phase() { # phase NAME: prints the time the previous phase took
    echo "compat-latest: [$((SECONDS - phase_start)) s] ${1}" >&2
    phase_start=$SECONDS
}
die() { echo "compat-latest: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mount)"
[ -x "$HOST_PY" ] || die "no host venv at $HOST_VENV (make env)"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

# --- mounts: only for the tests, always undone --------------------------------------------------
MOUNTED=()
cleanup() {
    local i
    for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do umount "${MOUNTED[i]}" || umount -l "${MOUNTED[i]}" || true; done
    MOUNTED=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mount_in_root() { # mount_in_root TYPE SOURCE TARGET (one a killed run left is taken over)
    mountpoint -q "$3" || mount -t "$1" "$2" "$3"
    MOUNTED+=("$3")
}
assert_unmounted() { # never delete through a mount (ours, left by a killed run, go first)
    local m
    for m in "$ROOT/dev/shm" "$ROOT/proc"; do mountpoint -q "$m" 2> /dev/null && umount "$m"; done
    if [ -d "$ROOT" ] && grep -q " $ROOT/" /proc/self/mounts; then
        die "something is still mounted under $ROOT; unmount it first"
    fi
}
in_root() {
    env -i PATH=$VENV/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 TMPDIR=/tmp \
        HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=/compat-run/hf PYTHONDONTWRITEBYTECODE=1 SVT_LOG=1 \
        /usr/sbin/chroot "$ROOT" "$@"
}
key_of() { sha256sum | cut -c1-16; }
link_or_copy() { # hard links (no space, no time) where one file system holds both, else a copy
    cp -al "$1" "$2" 2> /dev/null || { rm -rf "$2" && cp -a "$1" "$2"; }
}

# --- 1. the trixie root ---------------------------------------------------------------------------
if [ "$(cat "$CACHE/root.key" 2>/dev/null)" != "$ROOT_KEY" ]; then
    command -v debootstrap > /dev/null || {
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap > /dev/null
    }
    assert_unmounted
    rm -rf "$ROOT" "$ROOT.new" "$CACHE/venv.key"
    debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$ROOT.new" "$MIRROR" \
        > "$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
    mv "$ROOT.new" "$ROOT"
    echo "$ROOT_KEY" > "$CACHE/root.key"
    phase "built the $SUITE root ($(in_root python3 -V))"
fi

mount_in_root proc proc "$ROOT/proc"
mount_in_root tmpfs tmpfs "$ROOT/dev/shm"

# --- 2. hilrec's wheel, from the working tree (every run) -----------------------------------------
# From a copy of the sources, so setuptools' build/ never lands in the repo.
SRC=$CACHE/src
rm -rf "$SRC" "$CACHE/hilrec-wheel"
mkdir -p "$SRC"
(cd "$REPO" && tar --exclude=__pycache__ -cf - pyproject.toml README.md daemon drivers sim) | tar -C "$SRC" -xf -
"$HOST_VENV/bin/pip" wheel --quiet --no-deps -w "$CACHE/hilrec-wheel" "$SRC" > /dev/null 2>&1 \
    || "$HOST_VENV/bin/pip" wheel --no-deps -w "$CACHE/hilrec-wheel" "$SRC"
HILREC_WHEEL=$(cd "$CACHE/hilrec-wheel" && ls hilrec-*.whl)
rm -rf "$ROOT/hilrec-wheel" && cp -a "$CACHE/hilrec-wheel" "$ROOT/hilrec-wheel"
phase "built $HILREC_WHEEL"

# --- 3. the cp313 wheels (host pip) ----------------------------------------------------------------
HILREC_DEPS=$("$HOST_PY" -c 'import sys,tomllib; print("\n".join(tomllib.load(open(sys.argv[1],"rb"))["project"]["dependencies"]))' "$REPO/pyproject.toml")
WHEELS_KEY=$(printf '%s\n' "lerobot==$LEROBOT torch==$TORCH torchvision==$TORCHVISION" "$HILREC_DEPS" \
    "${PLATFORMS[*]}" | cat - "$HERE/requirements.txt" | key_of)
if [ "$(cat "$CACHE/wheels.key" 2>/dev/null)" != "$WHEELS_KEY" ]; then
    mkdir -p "$WHEELS"
    # -qq: not the warnings about this machine's own (file://) package indexes either
    hostpip() { python3 -m pip --disable-pip-version-check -qq "$@"; }
    hostpip download --quiet --no-deps "${PIP_TARGET[@]}" -d "$WHEELS" \
        "lerobot==$LEROBOT" "torch==$TORCH" "torchvision==$TORCHVISION"
    # hilrec (for its dependencies) and the rest, resolved together for Python 3.13.
    # feetech-servo-sdk is published as an sdist only: build its (pure Python) wheel here.
    hostpip wheel --quiet --no-deps -w "$WHEELS" "feetech-servo-sdk>=1.0,<2" > /dev/null
    hostpip download --quiet "${PIP_TARGET[@]}" -d "$WHEELS" --find-links "$WHEELS" \
        --find-links "$CACHE/hilrec-wheel" "$CACHE/hilrec-wheel/$HILREC_WHEEL" -r "$HERE/requirements.txt"
    rm -f "$WHEELS"/hilrec-*.whl
    echo "$WHEELS_KEY" > "$CACHE/wheels.key"
    phase "downloaded $(ls "$WHEELS" | wc -l) wheels ($(du -sh "$WHEELS" | cut -f1))"
fi

# --- 4. the Python 3.13 venv inside the root -----------------------------------------------------
if [ "$(cat "$CACHE/venv.key" 2>/dev/null)" != "$WHEELS_KEY" ]; then
    rm -rf "$ROOT$VENV" "$ROOT/wheels"
    link_or_copy "$WHEELS" "$ROOT/wheels"
    in_root python3 -m venv "$VENV"
    RPIP=(in_root "$VENV/bin/pip" --disable-pip-version-check install --quiet --no-index --find-links /wheels)
    cp "$HERE/requirements.txt" "$ROOT/wheels/requirements.txt"
    "${RPIP[@]}" -r /wheels/requirements.txt "/hilrec-wheel/$HILREC_WHEEL"
    # last and without their declared dependencies (pip then reports no conflict for what
    # is left out on purpose: torchcodec, triton, cmake and LeRobot's training stack)
    "${RPIP[@]}" --no-deps "lerobot==$LEROBOT" "torch==$TORCH" "torchvision==$TORCHVISION"
    # torch's CUDA libraries: exactly the nvidia-* versions its wheel pins.
    SITE=$(in_root "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    NVIDIA_PINS=$(in_root "$VENV/bin/python" -c '
import importlib.metadata as m, re
for r in m.requires("torch") or []:
    hit = re.match(r"(nvidia-[a-z0-9-]+)==([0-9.]+)", r)
    if hit and "x86_64" in r: print(f"{hit[1]}=={hit[2]}")')
    HOST_SITE=$("$HOST_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    host_has_all=1
    for pin in $NVIDIA_PINS; do
        dist=${pin%%==*}
        [ -d "$HOST_SITE/${dist//-/_}-${pin##*==}.dist-info" ] || { host_has_all=0; break; }
    done
    if [ "$host_has_all" = 1 ] && [ "${COMPAT_LATEST_CUDA:-}" != download ]; then
        link_or_copy "$HOST_SITE/nvidia" "$ROOT$SITE/nvidia"
        for pin in $NVIDIA_PINS; do
            dist=${pin%%==*}
            link_or_copy "$HOST_SITE/${dist//-/_}-${pin##*==}.dist-info" "$ROOT$SITE/${dist//-/_}-${pin##*==}.dist-info"
        done
        CUDA_FROM="hard-linked from $HOST_VENV"
    else
        rm -rf "$ROOT$SITE/nvidia" "$ROOT/cuda-wheels"
        # shellcheck disable=SC2086
        python3 -m pip --disable-pip-version-check -qq download --no-deps \
            "${PIP_TARGET[@]}" -d "$CACHE/cuda-wheels" $NVIDIA_PINS
        link_or_copy "$CACHE/cuda-wheels" "$ROOT/cuda-wheels"
        # shellcheck disable=SC2086
        "${RPIP[@]}" --no-deps --find-links /cuda-wheels $NVIDIA_PINS
        CUDA_FROM="downloaded"
    fi
    in_root "$VENV/bin/python" -c 'import torch, torchvision, lerobot.datasets'
    echo "$WHEELS_KEY" > "$CACHE/venv.key"
    phase "built the Python 3.13 venv (torch $TORCH, CUDA libraries $CUDA_FROM)"
else
    # --- 5. or only this working tree's hilrec into it (its dependencies are in the key) --------
    in_root "$VENV/bin/pip" --disable-pip-version-check install --quiet --no-index --force-reinstall \
        --no-deps "/hilrec-wheel/$HILREC_WHEEL"
    phase "installed hilrec into the root"
fi

# --- 6. the tests -----------------------------------------------------------------------------------
RUN=$ROOT/compat-run
rm -rf "$RUN"
mkdir -p "$RUN/scripts" "$RUN/hilrec" "$RUN/lerobot"
cp "$HERE"/*.py "$REPO/tests/dataset/_frames.py" "$RUN/scripts/"
status=0
echo "== (a) hilrec writes (host, $("$HOST_PY" -V)), LeRobot $LEROBOT loads (root, $(in_root python3 -V))"
MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} TQDM_DISABLE=1 \
    "$HOST_PY" "$HERE/host_write.py" "$RUN/hilrec" || die "hilrec could not write the datasets"
phase "hilrec wrote its datasets"
in_root "$VENV/bin/python" /compat-run/scripts/root_load.py /compat-run/hilrec || status=1
phase "(a) done"
echo "== (b) LeRobot $LEROBOT writes, hilrec check (Python 3.13, in the root) checks"
in_root "$VENV/bin/python" /compat-run/scripts/root_write.py /compat-run/lerobot /compat-run/hilrec || status=1
phase "(b) done"
cleanup
echo "compat-latest: $([ $status = 0 ] && echo PASSED || echo FAILED) in $((SECONDS - START)) s"
exit $status
