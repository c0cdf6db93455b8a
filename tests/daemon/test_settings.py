"""Daemon configs: the shipped ones load; a bad one is refused at start, naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hilrec.daemon.errors import ConfigError
from hilrec.daemon.wire.security import is_loopback
from hilrec.daemon.wire.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
MINIMAL = """
mode = "sim"
[dataset]
root = "data/x"
[leader]
source = "scripted"
"""


@pytest.mark.parametrize("mode", ["sim", "hil", "emulated"])
def test_shipped_configs_load(mode: str) -> None:
    settings = load_settings(REPO / "configs" / f"{mode}.toml")
    assert settings.mode == mode and settings.fps == 25
    assert settings.zmq.host == "127.0.0.1"
    assert (settings.zmq.control_port, settings.zmq.telemetry_port, settings.zmq.leader_port) == (
        5555,
        5556,
        5557,
    )


def test_root_flag_overrides_the_config(tmp_path: Path) -> None:
    path = tmp_path / "d.toml"
    path.write_text(MINIMAL)
    assert load_settings(path, root=tmp_path / "elsewhere").dataset.root == tmp_path / "elsewhere"


@pytest.mark.parametrize(
    ("extra", "key", "fragment"),
    [
        ("fps = 0\n", "fps", "1..1000"),
        ("colour = 1\n", "colour", "unknown key"),
        ("[zmq]\ncontrol_port = 70000\n", "zmq.control_port", "TCP port"),
        ("[zmq]\ncontrol_port = 5556\n", "zmq.leader_port", "must differ"),
        ('[zmq]\nhost = "0.0.0.0"\n', "zmq.curve", "requires CURVE keys"),
        (
            '[cameras.front]\nsource = "opencv"\ndevice = "0"\n',
            "cameras.front.source",
            "cannot be used in sim mode",
        ),
        ('[cameras.front]\nsource = "sim"\nwidth = -2\n', "cameras.front.width", "must be positive"),
        ('[faults]\non_device_lost = "ignore"\n', "faults.on_device_lost", "one of"),
        ("[telemetry]\njpeg_quality = 0\n", "telemetry.jpeg_quality", "1..100"),
        ('[emulated]\nfollower_faults = ["explode"]\n', "emulated.follower_faults[0]", "unknown fault"),
    ],
)
def test_invalid_values_name_their_key(tmp_path: Path, extra: str, key: str, fragment: str) -> None:
    path = tmp_path / "d.toml"
    # Top-level keys must precede the tables in TOML.
    body = extra + MINIMAL if not extra.startswith("[") else MINIMAL + extra
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.key == key and fragment in info.value.problem


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('mode = "hil"\n[dataset]\nroot = "x"\n[leader]\nsource = "serial"\n', "follower.port"),
        ('mode = "emulated"\n[dataset]\nroot = "x"\n[leader]\nsource = "scripted"\n', "leader.source"),
        (
            'mode = "emulated"\n[dataset]\nroot = "x"\n[follower]\nport = "/dev/ttyACM0"\n'
            '[leader]\nsource = "serial"\n',
            "follower.port",
        ),
        (
            'mode = "hil"\n[dataset]\nroot = "x"\n[follower]\nport = "/dev/a"\n[leader]\nsource = "remote"\n'
            "[sim]\nrealtime = false\n",
            "sim.realtime",
        ),
    ],
)
def test_cross_field_rules_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "d.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.key == key


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("*") and not is_loopback("192.168.1.4")


@pytest.mark.slow
def test_daemon_command_refuses_a_bad_config_before_binding(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(MINIMAL + "[zmq]\nleader_port = 99999\n")
    result = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "daemon", "--config", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "config key 'zmq.leader_port'" in result.stderr and str(path) in result.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.slow
def test_a_busy_port_is_refused_naming_its_key(tmp_path: Path) -> None:
    import zmq

    context = zmq.Context()
    busy = context.socket(zmq.REP)
    port = busy.bind_to_random_port("tcp://127.0.0.1")
    try:
        path = tmp_path / "busy.toml"
        path.write_text(
            MINIMAL + f"[zmq]\ncontrol_port = 15991\ntelemetry_port = {port}\nleader_port = 15992\n"
        )
        result = subprocess.run(
            [sys.executable, "-m", "hilrec.daemon.cli", "daemon", "--config", str(path)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    finally:
        busy.close(linger=0)
        context.term()
    assert result.returncode == 2, result.stderr
    assert "config key 'zmq.telemetry_port'" in result.stderr and "cannot bind" in result.stderr
    assert not (tmp_path / "data").exists()


def test_a_frame_rate_a_given_timestep_cannot_step_is_refused_unless_the_mirror_is_off(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d.toml"
    five_ms = "[twin]\ntimestep = 0.005\n"
    path.write_text("fps = 30\n" + MINIMAL + five_ms)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.key in ("fps", "twin.timestep") and "valid rates near it:" in info.value.problem
    assert "20, 25, 40" in info.value.problem
    path.write_text("fps = 30\n" + MINIMAL)  # no timestep given: the twin picks one that steps 30 fps
    assert load_settings(path).fps == 30
    hil = (
        'fps = 30\nmode = "hil"\n[dataset]\nroot = "x"\n[follower]\nport = "/dev/a"\n'
        '[leader]\nsource = "serial"\nport = "/dev/b"\n'
    )
    path.write_text(hil + five_ms)
    with pytest.raises(ConfigError, match=r"twin\.mirror = false"):
        load_settings(path)
    path.write_text(hil + "[twin]\nmirror = false\ntimestep = 0.005\n")
    assert load_settings(path).fps == 30


def test_a_ui_beyond_loopback_without_a_token_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "ui.toml"
    path.write_text(MINIMAL + '[ui]\nhost = "0.0.0.0"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(path)
    assert refused.value.key == "ui.token" and "beyond loopback" in refused.value.problem
    path.write_text(MINIMAL + '[ui]\nhost = "0.0.0.0"\ntoken = "a-long-enough-token-1234"\n')
    assert load_settings(path).ui.token == "a-long-enough-token-1234"


def test_root_stands_in_for_a_missing_dataset_root(tmp_path: Path) -> None:
    path = tmp_path / "no-root.toml"
    path.write_text('mode = "sim"\n[leader]\nsource = "scripted"\n')
    with pytest.raises(ConfigError) as missing:
        load_settings(path)
    assert missing.value.key == "dataset"
    assert load_settings(path, root=tmp_path / "given").dataset.root == tmp_path / "given"


@pytest.mark.parametrize(
    ("display", "key", "words"),
    [
        ('rerun = "window"', "display.rerun", "must be one of 'rrd', 'spawn', 'serve'"),
        ('rerun = "rrd"', "display.rrd", "needs the file to write"),
        ('rerun = "spawn"\nrrd = "live.rrd"', "display.rrd", 'only with rerun = "rrd"'),
        ('rerun = "rrd"\nrrd = "{tmp}"', "display.rrd", "is a folder"),
        ('rerun = "serve"\nweb_port = 0', "display.web_port", "1..65535"),
        ('rerun = "rrd"\nrrd = "x.rrd"\nviewer = "yes"', "display.viewer", "unknown"),
    ],
)
def test_a_bad_display_section_is_refused_naming_the_key(
    tmp_path: Path, display: str, key: str, words: str
) -> None:
    path = tmp_path / "display.toml"
    path.write_text(MINIMAL + "[display]\n" + display.replace("{tmp}", str(tmp_path)) + "\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(path)
    assert refused.value.key == key and words in refused.value.problem, refused.value


@pytest.mark.slow
def test_a_display_section_loads_and_the_daemon_refuses_a_bad_one_at_start(tmp_path: Path) -> None:
    from hilrec.daemon.wire.settings import RerunViewer

    path = tmp_path / "display.toml"
    path.write_text(MINIMAL + f'[display]\nrerun = "rrd"\nrrd = "{tmp_path / "live.rrd"}"\n')
    display = load_settings(path).display
    assert display.rerun is RerunViewer.RRD and display.rrd == tmp_path / "live.rrd"
    assert load_settings(REPO / "configs" / "emulated.toml").display.rerun is None  # off by default
    path.write_text(MINIMAL.replace("data/x", str(tmp_path / "ds")) + '[display]\nrerun = "rrd"\n')
    done = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "daemon", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "config key 'display.rrd'" in done.stderr and "needs the file to write" in done.stderr
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize(
    ("line", "key", "fragment"),
    [
        ('video_encoder = "gpu"', "dataset.video_encoder", "one of"),
        ("spill_bytes_limit = 0", "dataset.spill_bytes_limit", "positive"),
    ],
)
def test_the_encoder_settings_are_checked_naming_the_key(
    tmp_path: Path, line: str, key: str, fragment: str
) -> None:
    path = tmp_path / "d.toml"
    path.write_text(MINIMAL.replace('root = "data/x"', f'root = "data/x"\n{line}'))
    with pytest.raises(ConfigError) as refused:
        load_settings(path)
    assert refused.value.key == key and fragment in refused.value.problem


def test_the_encoder_settings_load(tmp_path: Path) -> None:
    path = tmp_path / "d.toml"
    path.write_text(
        MINIMAL.replace(
            'root = "data/x"', 'root = "data/x"\nvideo_encoder = "thread"\nspill_bytes_limit = 1000'
        )
    )
    dataset = load_settings(path).dataset
    assert dataset.video_encoder == "thread" and dataset.spill_bytes_limit == 1000
    assert load_settings(REPO / "configs" / "hil.toml").dataset.video_encoder is None
