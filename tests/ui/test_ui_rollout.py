"""The page's Take over / Hand back buttons (a policy drives: ``[policy]``) in Debian's Chromium:
they send the requests ``hilrec ctl takeover`` / ``handback`` send, the page shows who has the
arm, and the take records both switches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _daemon import Daemon, emulated_config
from _ui import CHROMIUM_ARGS, TOKEN, Ui, chromium
from playwright.sync_api import expect, sync_playwright

from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

pytestmark = pytest.mark.slow

POLICIES = Path(__file__).resolve().parents[1] / "policy" / "_policies.py"
WAIT_MS = 60_000


def test_take_over_and_hand_back_from_the_page(tmp_path: Path, daemons, uis) -> None:
    policy = f'[policy]\nspec = "{POLICIES}:hold_still"\ntakeover = "key"\n'
    daemon = daemons(Daemon(tmp_path, emulated_config(tmp_path / "ds", extra=policy)))
    ui = uis(Ui(daemon.config_path, tmp_path, token=TOKEN))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)
        page.goto(f"{ui.url}/?token={TOKEN}")
        expect(page.locator("#rollout")).to_be_visible()
        expect(page.locator("#control")).to_contain_text("the human has the arm")  # between takes
        page.locator("#task").fill("Put the cube in the bin.")
        page.locator("#btn-start").click()
        expect(page.locator("#reply")).to_have_text(re.compile(r"start_episode: ok"))
        expect(page.locator("#control")).to_contain_text("the policy has the arm")
        page.locator("#btn-takeover").click()
        expect(page.locator("#reply")).to_have_text(re.compile(r"takeover: ok \(control human"))
        expect(page.locator("#control")).to_contain_text("the human has the arm")
        assert daemon.call("status")["leader"]["control"] == "human"
        page.locator("#btn-handback").click()
        expect(page.locator("#reply")).to_have_text(re.compile(r"handback: ok \(control policy"))
        expect(page.locator("#control")).to_contain_text("the policy has the arm")
        page.locator("#btn-stop").click()
        expect(page.locator("#reply")).to_have_text(re.compile(r"stop_episode: ok"))
        browser.close()
    daemon.wait_saved(1)
    daemon.shutdown()
    meta, _ = load_episode_sidecar(tmp_path / "ds", 0)
    assert meta is not None and meta["rollout"]["takeovers"] == 1 and meta["rollout"]["handbacks"] == 1
