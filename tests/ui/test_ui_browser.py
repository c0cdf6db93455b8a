"""The bench page in a real browser (Debian's Chromium, driven by Playwright) against a real
emulated daemon: previews and joints move, the buttons record a take that passes ``hilrec
check``, the take opens its replay report, a stopped daemon is shown as stopped (nothing stale
looks live), and after a restart a vanished servo port appears as a fault."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _daemon import Daemon, check_passes, emulated_config
from _ui import ARTIFACTS, CHROMIUM_ARGS, TOKEN, Ui, chromium, on_the_same_ports
from playwright.sync_api import Page, expect, sync_playwright
from support.verdicts import lift_verdict_worker

from hilrec.daemon.dataset.format.reader import load_episodes

pytestmark = pytest.mark.slow

# A camera worth looking at: the mirroring twin, filmed at 320x240; previews at 5 Hz.
CAMERAS = """
[cameras.front]
source = "twin"
height = 240
width = 320
fps = 10
stall_ms = 3000
"""
WAIT_MS = 60_000  # every wait on the page is bounded by this
# Counts, in the page, each redraw of the traces canvas (each takes its 2-d context), each of them
# that drew the stale notice ("no new joint data ...", redrawn as its age changes: a loaded
# machine may hold a tick back past a second) and each tick that reached the page: any other
# redraw is owed to a new tick.
COUNT_REDRAWS = """
window.redraws = 0;
window.noticeRedraws = 0;
const getContext = HTMLCanvasElement.prototype.getContext;
HTMLCanvasElement.prototype.getContext = function (...args) {
  if (this.id === "traces") window.redraws += 1;
  return getContext.apply(this, args);
};
const fillText = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (text, ...args) {
  if (this.canvas.id === "traces" && String(text).startsWith("no ")) window.noticeRedraws += 1;
  return fillText.call(this, text, ...args);
};
"""
COUNT_TICKS = """() => {
  window.ticks = 0;
  const onTickShown = window.onTick;
  window.onTick = (t) => { window.ticks += 1; onTickShown(t); };
}"""


def config(root: Path, faults: str = "") -> str:
    text = emulated_config(root, cameras=CAMERAS, faults=faults)
    return text.replace("preview_hz = 0.0", "preview_hz = 5.0\npreview_width = 320")


def frames(page: Page) -> int:
    text = page.locator("#frames").inner_text()
    return int(text) if text.isdigit() else -1


def test_the_page_shows_the_bench_records_a_take_and_shows_a_stopped_daemon_and_a_fault(
    tmp_path: Path, daemons, uis
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    root = tmp_path / "ds"
    first_config = config(root)
    daemon = daemons(Daemon(tmp_path, first_config))
    ui = uis(Ui(daemon.config_path, tmp_path, token=TOKEN))
    assert daemon.process is not None

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.add_init_script(COUNT_REDRAWS)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)
        # The first load carries the token; the page then lives on its cookie (WebSocket included).
        page.goto(ui.printed_url())  # as a person opens it, from what hilrec ui printed
        assert "token" not in page.url
        expect(page.locator("#link")).to_have_text(re.compile(r"^daemon live"))

        # The camera preview changes, and the joints move.
        preview = page.locator('img.preview[data-camera="front"]')
        expect(preview).to_have_attribute("src", re.compile(r"^data:image/jpeg;base64,"))
        first_src = preview.get_attribute("src")
        page.wait_for_function(
            "src => document.querySelector('img.preview[data-camera=front]').src !== src", arg=first_src
        )
        follower = 'td[data-joint="shoulder_lift"][data-series="state"]'
        expect(page.locator(follower)).to_have_text(re.compile(r"^-?\d+\.\d$"))
        first_joints = page.locator('td[data-series="state"]').all_inner_texts()
        page.wait_for_function(
            "old => [...document.querySelectorAll('td[data-series=state]')]"
            ".map(td => td.textContent).join() !== old.join()",
            arg=first_joints,
        )
        expect(page.locator("#state")).to_have_text("idle")
        expect(page.locator("#joints")).not_to_have_class(re.compile("stale"))
        # The traces are redrawn for each tick that arrived, not at the display's frame rate
        # (which kept Chromium's renderer busy for nothing between two ticks).
        page.evaluate(COUNT_TICKS)
        counted = "() => [window.redraws - window.noticeRedraws, window.ticks]"
        redraws_before, _ = page.evaluate(counted)
        page.wait_for_function("() => window.ticks >= 20")
        redraws, ticks = page.evaluate(counted)
        assert 1 <= redraws - redraws_before <= ticks + 1, (redraws - redraws_before, ticks)

        # Start, 3 s of recording (75 frames at 25 fps), stop: one saved take.
        page.locator("#task").fill("Put the cube in the bin.")
        page.locator("#btn-start").click()
        expect(page.locator("#reply")).to_have_text(re.compile(r"start_episode: ok"))
        expect(page.locator("#state")).to_have_text("recording")
        # The daemon starts its verdict worker with the first take; the page is under test here,
        # not the worker's priority.
        lift_verdict_worker(daemon.process.pid)
        page.wait_for_function("() => Number(document.querySelector('#frames').textContent) >= 75")
        expect(page.locator("#take")).to_have_text("take 1")  # episode 0, numbered for the eye
        expect(page.locator("#elapsed")).to_have_text(re.compile(r"^0:0[2-9]\.\d$|^0:[1-5]\d\.\d$"))
        # Every text take 0's row shows, in order: first without a verdict, then the daemon's.
        page.evaluate(
            """() => {
              window.takeTexts = [];
              new MutationObserver(() => {
                const row = document.querySelector('#take-list tr[data-take="0"]');
                if (row) window.takeTexts.push(row.textContent);
              }).observe(document.querySelector('#take-list'), {childList: true, subtree: true});
            }"""
        )
        page.locator("#btn-stop").click()
        expect(page.locator("#reply")).to_have_text(re.compile(r"stop_episode: ok"))
        shown_frames = int(re.findall(r"frames (\d+)", page.locator("#reply").inner_text())[0])
        assert shown_frames >= 75
        take = page.locator('#take-list tr[data-take="0"]')
        expect(take.locator("td").nth(1)).to_have_text(str(shown_frames))
        expect(take).to_contain_text("Put the cube in the bin.")
        expect(page.locator("#state")).to_have_text("idle")
        # The daemon judges the take after it is saved (an episode_verdict event); until then
        # the row says it has none.
        expect(take.locator(".verdict")).to_have_text(re.compile(r"^(sound|warning|bad|not_checked)$"))
        # What the summary says depends on how the take went (a loaded machine lags the follower
        # into a warning, which names the lag, not the episode): a sound one names the episode.
        expect(take.locator(".verdict-summary")).not_to_be_empty()
        if take.locator(".verdict").inner_text() == "sound":
            expect(take.locator(".verdict-summary")).to_contain_text("episode 0")
        texts = page.evaluate("() => window.takeTexts")
        first_verdict = next(i for i, text in enumerate(texts) if "no verdict" not in text)
        assert first_verdict > 0 and all("no verdict" in text for text in texts[:first_verdict]), texts
        late = page.locator('#loop-numbers dd[data-key="late_ticks"]').inner_text()
        assert late.isdigit(), late
        # collect beside the daemon says it is in the reset after take 1 of 3: the page shows
        # that, not the daemon's idle, with the reset's countdown running.
        daemon.call("session_note", phase="reset", take=1, takes=3, seconds_left=30.0, task="Put it back.")
        expect(page.locator("#state")).to_have_text("reset")
        expect(page.locator("#take")).to_have_text("take 1 of 3")
        expect(page.locator("#left")).to_have_text(re.compile(r"^(2\d|30)\.\d s$"))
        expect(page.locator('#take-list tr[data-take="0"] td').first).to_have_text("1")
        # Nobody renews it (as when collect quits): it stops showing within the note's lifetime.
        expect(page.locator("#state")).to_have_text("idle")
        expect(page.locator("#left")).to_have_text("—")

        # A second take (Enter in the task field starts it), re-recorded with <- under the same
        # task whatever the field says now, then discarded: the dataset keeps one take.
        page.locator("#task").fill("The second take.")
        page.locator("#task").press("Enter")
        # The daemon's answer first: a refusal fails here with its reason, not as "next: take 2".
        expect(page.locator("#reply")).to_have_text(re.compile(r"start_episode: ok .*The second take"))
        expect(page.locator("#take")).to_have_text("take 2")
        page.wait_for_function("() => Number(document.querySelector('#frames').textContent) >= 10")
        page.locator("#task").fill("not this text")
        page.locator("body").click(position={"x": 5, "y": 5})
        page.keyboard.press("ArrowLeft")
        expect(page.locator("#reply")).to_have_text(re.compile(r"start_episode: ok .*The second take"))
        # The writer counts a discard once it has dropped the take's frames (bounded wait). The page
        # sends <- as two requests, discard then start, and the reply it shows reads as the first
        # start's did: so the wait is for both, the discard counted and a take open again (a status
        # read between the two requests has none open: seen on a loaded machine).
        status = daemon.wait_status(
            lambda s: s["dataset"]["discarded_this_session"] == 1 and s["episode"] is not None,
            what="one discard and the take open again",
        )
        assert status["episode"]["index"] == 1 and status["episode"]["task"] == "The second take."
        page.wait_for_function("() => Number(document.querySelector('#frames').textContent) >= 100")
        page.locator("#task").fill("The second take.")
        page.locator("#task").blur()
        page.screenshot(path=ARTIFACTS / "recording.png", full_page=True)
        page.locator("#btn-discard").click()
        expect(page.locator("#reply")).to_have_text(re.compile(r"discard_episode: ok"))
        expect(page.locator("#state")).to_have_text("idle")
        daemon.wait_status(lambda s: s["dataset"]["discarded_this_session"] == 2, what="two discards")
        # -> is stop-and-save; with no take open the daemon refuses, and the page says why.
        page.keyboard.press("ArrowRight")
        expect(page.locator("#reply")).to_have_text(re.compile(r"stop_episode refused: .*\(bad_state\)"))
        expect(page.locator("#reply")).to_have_class(re.compile("refused"))

        # Esc asks before finalizing; the answer finalizes the dataset.
        page.locator("body").click(position={"x": 5, "y": 5})
        page.keyboard.press("Escape")
        expect(page.locator("#confirm-finalize")).to_be_visible()
        page.locator("#finalize-confirm").click()
        expect(page.locator("#state")).to_have_text("finalized")
        [episode] = load_episodes(root)
        assert episode["length"] == shown_frames
        check_passes(root)

        # The replay report of the take opens from its row once `hilrec replay --report` wrote it.
        report_dir = root / "hilrec" / "replay"
        replay = subprocess.run(
            [sys.executable, "-m", "hilrec.daemon.cli", "replay", str(root), "--report", str(report_dir)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert (report_dir / "episode-000000.png").is_file(), replay.stdout + replay.stderr
        take.locator("a.report").click()
        expect(page.locator("#report")).to_be_visible()
        page.wait_for_function("() => document.querySelector('#report-image').naturalWidth > 100")
        page.screenshot(path=ARTIFACTS / "report.png")
        page.keyboard.press("Escape")
        expect(page.locator("#report")).to_be_hidden()

        # The daemon stops: the page says since when, and greys out what it last knew.
        assert daemon.shutdown() == 0
        expect(page.locator("#link")).to_have_text(re.compile(r"daemon not answering since \d\d:\d\d:\d\d"))
        for panel in ("#session", "#joints", "#cameras", "#faults", "#takes"):
            expect(page.locator(panel)).to_have_class(re.compile("stale"))
        expect(page.locator("#session h2 .age")).to_have_text(re.compile(r"\(\d+(\.\d)? s old\)"))
        page.screenshot(path=ARTIFACTS / "daemon-stopped.png", full_page=True)

        # A new daemon on the same sockets: the page reconnects; its follower's port vanishes.
        second_config = config(tmp_path / "ds2", faults='follower_faults = ["vanish:after_s=12"]')
        daemons(on_the_same_ports(daemon, first_config, tmp_path, second_config))
        expect(page.locator("#link")).to_have_text(re.compile(r"^daemon live"))
        expect(page.locator("#session")).not_to_have_class(re.compile("stale"))
        fault = page.locator("#fault-list li.fault")
        expect(fault).to_contain_text("follower")
        expect(fault).to_contain_text("port")
        expect(page.locator("#fault-log li.fault").first).to_contain_text("follower")
        page.screenshot(path=ARTIFACTS / "fault.png", full_page=True)
        assert not errors, errors
        browser.close()
