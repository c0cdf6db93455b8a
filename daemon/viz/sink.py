"""Where a rerun recording goes: an ``.rrd`` file, a spawned viewer, or a web viewer on loopback.

rerun-sdk is an optional extra; :func:`import_rerun` says how to install it. Nothing here
downloads anything: ``--spawn`` runs the viewer binary the wheel ships, ``--serve`` runs that same
binary as a child with ``--serve-web --bind 127.0.0.1`` and the recording connects to it.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hilrec.daemon import procs
from hilrec.daemon.errors import ConfigError, FlagError

log = logging.getLogger(__name__)

APPLICATION_ID = "hilrec"
SERVE_HOST = "127.0.0.1"
SERVE_START_TIMEOUT_S = 20.0
SPAWN_PORT = 9876  # rerun's own default: a viewer already open there is reused
FLUSH_TIMEOUT_S = 20.0  # an .rrd of a long session flushes in well under this
SERVER_STOP_S = 10.0


def import_rerun() -> ModuleType:
    try:
        import rerun
    except ImportError:
        raise ConfigError(
            "rerun", "rerun-sdk is not installed: pip install 'hilrec[rerun]' (or pip install rerun-sdk)"
        ) from None
    return rerun


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--rrd", type=Path, metavar="OUT.rrd", help="write the recording to this file")
    out.add_argument("--spawn", action="store_true", help="open rerun's native viewer (shipped in the wheel)")
    out.add_argument(
        "--serve", action="store_true", help=f"serve rerun's web viewer on {SERVE_HOST} only (see --web-port)"
    )
    parser.add_argument("--web-port", type=int, default=9090, help="--serve: the web viewer's HTTP port")
    parser.add_argument("--grpc-port", type=int, default=0, help="--serve: the gRPC port (0: a free one)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((SERVE_HOST, 0))
        return int(s.getsockname()[1])


def _viewer_binary(flag: str) -> str:
    """The viewer binary the wheel ships, itself: the ``rerun`` script on PATH is a Python wrapper
    that runs it as a child, which would outlive a stopped wrapper."""
    try:
        import rerun_cli

        shipped = Path(rerun_cli.__file__).with_name("rerun")
        if shipped.is_file():
            return str(shipped)
    except ImportError:
        pass
    # Beside this Python first: .venv/bin/hilrec runs with PATH lacking .venv/bin.
    beside = Path(sys.executable).with_name("rerun")
    found = str(beside) if beside.exists() else shutil.which("rerun")
    if found is None:
        raise ConfigError(
            flag, f"the rerun viewer binary (from rerun-sdk) is neither beside {sys.executable} nor on PATH"
        )
    return found


@dataclass
class Output:
    """An open recording stream and what serves it; :meth:`close` flushes and ends both."""

    recording: Any
    command: str
    rrd: Path | None = None
    server: subprocess.Popen[bytes] | None = None
    url: str | None = None
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.recording.flush(timeout_sec=FLUSH_TIMEOUT_S)  # a stuck viewer must not hang the exit
        except Exception as exc:  # noqa: BLE001 - rerun raises its own types; said, never a traceback
            print(
                f"hilrec {self.command}: the view was not flushed within {FLUSH_TIMEOUT_S:.0f} s: {exc}",
                flush=True,
            )
        finally:
            self.recording.disconnect()
        if self.server is not None and not sys.stdin.isatty():
            # Run as a child (the daemon's [display], collect --display): nobody is there to
            # end a lingering viewer, so it ends with the display.
            procs.stop(self.server, SERVER_STOP_S)
        elif self.server is not None:
            print(
                f"rerun web viewer still serving at {self.url}; Ctrl-C to stop it",
                file=sys.stderr,
                flush=True,
            )
            # Ctrl-C or SIGTERM now ends the viewer too, rather than leaving it orphaned.
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.default_int_handler)
            try:
                self.server.wait()
            except KeyboardInterrupt:
                procs.stop(self.server, 10.0)


def check_output_flags(args: argparse.Namespace) -> None:
    """What the output flags cannot do here, said at once: before rerun imports (seconds) and
    before a spawned viewer that cannot open a window costs rerun's 20 s connect wait."""
    from hilrec.daemon.wire.display_child import no_screen

    if args.spawn and (problem := no_screen()) is not None:
        raise FlagError("--spawn", f"{problem}: write the view with --rrd OUT.rrd, or use --serve")


def open_output(args: argparse.Namespace, recording_name: str, *, command: str) -> Output:
    """A recording stream to the place the flags name (``--rrd``, ``--spawn`` or ``--serve``);
    ``command`` (view, display) names who speaks in what it prints."""
    check_output_flags(args)
    rr = import_rerun()
    recording = rr.new_recording(APPLICATION_ID, recording_id=recording_name)
    if args.rrd is not None:
        path = Path(args.rrd)
        path.parent.mkdir(parents=True, exist_ok=True)
        recording.save(str(path))
        return Output(recording, command, rrd=path)
    if args.spawn:
        return _spawn(recording, command)
    grpc_port = args.grpc_port or _free_port()
    server = procs.start(
        [
            _viewer_binary("--serve"),
            "--serve-web",
            "--bind",
            SERVE_HOST,
            "--port",
            str(grpc_port),
            "--web-viewer-port",
            str(args.web_port),
        ],
        stdin=subprocess.DEVNULL,
        first=(procs.normal_scheduling,),
    )
    _wait_listening(server, grpc_port)
    recording.connect_grpc(f"rerun+http://{SERVE_HOST}:{grpc_port}/proxy")
    url = f"http://{SERVE_HOST}:{args.web_port}/?url=rerun%2Bhttp%3A%2F%2F{SERVE_HOST}%3A{grpc_port}%2Fproxy"
    print(f"rerun web viewer: {url}", flush=True)
    return Output(recording, command, server=server, url=url)


def _spawn(recording: Any, command: str) -> Output:
    """rerun's native viewer, the binary the wheel ships (found as ``--serve`` finds it, not on
    PATH as ``RecordingStream.spawn`` looks), then the recording connected to it."""
    import rerun_bindings

    rerun_bindings.spawn(
        port=SPAWN_PORT,
        executable_path=_viewer_binary("--spawn"),
        extra_env=[("RERUN_APP_ONLY", "true")],  # what rerun's own spawn() tells the viewer
    )
    recording.connect_grpc(f"rerun+http://{SERVE_HOST}:{SPAWN_PORT}/proxy")
    return Output(recording, command)


def _wait_listening(server: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + SERVE_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise ConfigError("--serve", f"the rerun viewer exited with status {server.returncode}")
        try:
            with socket.create_connection((SERVE_HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)  # a bounded wait for a child process to listen
    procs.stop(server, SERVER_STOP_S)
    raise ConfigError("--serve", f"the rerun viewer did not listen on {SERVE_HOST}:{port} in time")
