"""The bench page with a two-arm daemon: the joint table and the traces show the two arms side
by side, each named, each with its own values (twelve per vector, left arm first, as LeRobot's
bi_so_follower orders them).

The daemon's side is a stand-in on the real wire (tests/support/standin.py: hilrec's own
telemetry publisher and control server, on the ports of a daemon config): it publishes ticks of
twelve known values and answers status, so what each cell must show is known; the page, the ui
server and its bridge are real, in Debian's Chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from _daemon import Daemon, sim_config
from _ui import ARTIFACTS, CHROMIUM_ARGS, TOKEN, Ui, chromium
from playwright.sync_api import expect, sync_playwright
from support.standin import ACTION, STATE, two_arm_wire

from hilrec.daemon.so101 import JOINT_NAMES

pytestmark = pytest.mark.slow

WAIT_MS = 60_000


@pytest.fixture
def two_arm_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon config's ports served by the stand-in: status, and a tick every 40 ms."""
    daemon = Daemon(tmp_path, sim_config(tmp_path / "ds"))
    with two_arm_wire(daemon.config_path):
        yield daemon


def test_the_page_shows_both_arms_side_by_side_each_named(
    two_arm_daemon: Daemon, tmp_path: Path, uis
) -> None:
    ui = uis(Ui(two_arm_daemon.config_path, tmp_path, token=TOKEN))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)
        page.goto(ui.printed_url())
        expect(page.locator("#link")).to_have_text(re.compile(r"^daemon live"))
        for k, side in enumerate(("left", "right")):
            for j, joint in enumerate(JOINT_NAMES):
                cell = f'td[data-joint="{side}_{joint}"][data-series='
                i = 6 * k + j
                expect(page.locator(cell + '"state"]')).to_have_text(f"{STATE[i]:.1f}")
                expect(page.locator(cell + '"action"]')).to_have_text(f"{ACTION[i]:.1f}")
        assert page.locator("#joint-table th.arm").all_text_contents() == ["left arm", "right arm"]
        # One row per joint holds both arms: the left arm's cells come first, then the right's.
        row = page.locator("#joint-table tbody tr").nth(2)
        assert row.locator("th").inner_text() == "elbow_flex"
        assert row.locator("td").all_inner_texts()[0::4] == ["21.0", "81.0"]
        expect(page.locator("#joints")).not_to_have_class(re.compile("stale"))
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator("#joints").screenshot(path=str(ARTIFACTS / "two-arms.png"))
        browser.close()
    assert not errors, errors
