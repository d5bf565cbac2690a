"""Each mode's charts as a person sees them: a short run's logs served by TensorBoard on 127.0.0.1 and its Custom
Scalars page rendered by headless Chromium. Fails on TensorBoard's error text (a band whose value, lower and upper
tags were logged at different steps) and on a chart that draws no line. Saves a screenshot of the default rule's
layout when ``HYBRID_SCREENSHOT`` names a file."""

import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_hybrid.tensorboard import LAYOUTS
from tests.helpers import RULE_PHASES, RegressionModel, free_port, hybrid_trainer, loader

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a test dependency")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("tensorboard_page"),  # one worker builds the module's runs and page once
    pytest.mark.skipif(
        not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver (.ci/run installs them)"
    ),
]

CARDS = """
const cards = [];
function walk(node, visit) {
  visit(node);
  if (node.shadowRoot) walk(node.shadowRoot, visit);
  for (const child of node.children || []) walk(child, visit);
}
walk(document.documentElement, node => {
  const tag = (node.tagName || '').toLowerCase();
  if (!(tag.startsWith('tf-custom-scalar-') && tag.endsWith('-card'))) return;
  let lines = 0;
  const text = [];
  walk(node, inner => {
    const name = (inner.tagName || '').toLowerCase();
    if (name === 'path' && inner.classList.contains('line') && (inner.getAttribute('d') || '').length > 20) lines++;
    if (name !== 'style') for (const c of inner.childNodes || []) if (c.nodeType === 3) text.push(c.textContent.trim());
  });
  cards.push({lines: lines, text: text.filter(t => t).join(' | ')});
});
return cards;
"""


PATIENCE_S = 180  # how long the server and the page may take on a loaded machine: a hang, not slowness, fails


@contextlib.contextmanager
def served(logdir: Path) -> Iterator[str]:
    """TensorBoard on a free loopback port, stopped on exit."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(logdir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + PATIENCE_S
        while True:
            try:
                urllib.request.urlopen(f"{url}/data/plugins_listing", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"TensorBoard did not answer on 127.0.0.1 within {PATIENCE_S} s")
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


PHASE_CURVES = LAYOUTS["per-step"]
# the default rule on short cycles, judged on this regression's noisy batches: jumps kept and undone
JUMPS = {**RULE_PHASES, "predictor": "outer", "verify_window": 3, "verify_resolution": 0.5, "outer_lr": 1.6}
MODES = {"jumps": (JUMPS, 90), "per-step": (None, 60)}  # None: the helpers' per-step settings


def rendered_cards(url: str, expected: int, screenshot: str | None = None) -> list[dict]:
    """Each chart card of the Custom Scalars page: its text (TensorBoard's errors included) and drawn lines."""
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1720"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        browser.get(f"{url}/#custom_scalars")
        # the page fetches each chart's data after it renders the layout, a series at a time: read until every card
        # is drawn (or says its error) and two readings agree
        deadline, before = time.monotonic() + PATIENCE_S, None
        while True:
            cards = browser.execute_script(CARDS)
            done = len(cards) == expected and all(c["lines"] or "do not match" in c["text"] for c in cards)
            if done and cards == before:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"the page did not render {expected} cards within {PATIENCE_S} s: {cards}"[:2000])
            before = cards
            time.sleep(0.5)
        if screenshot:  # the charts alone: the sidebar shows the log folder's absolute path
            browser.save_screenshot(screenshot)
            from PIL import Image

            with Image.open(screenshot) as image:
                image.crop((int(0.255 * image.width), 60, image.width, int(0.95 * image.height))).save(screenshot)
    finally:
        browser.quit()
    return cards


@pytest.fixture(scope="module")
def both_modes(tmp_path_factory) -> list[dict]:
    """A short run of each mode, each its own TensorBoard run in one log folder, served and rendered once: the
    page then holds both modes' layouts (a server and a browser cost more than the runs)."""
    torch.set_num_threads(1)
    logs = tmp_path_factory.mktemp("tb") / "logs"
    for mode, (settings, steps) in MODES.items():
        trainer, _ = hybrid_trainer(steps, settings, logger=TensorBoardLogger(logs, name="", version=mode))
        trainer.fit(RegressionModel(), loader())
    charts = sum(len(next(iter(LAYOUTS[mode].values()))) for mode in MODES)
    with served(logs) as url:
        return rendered_cards(url, charts, os.environ.get("HYBRID_SCREENSHOT"))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_chart_of_the_modes_layout_renders_without_an_error(both_modes, mode):
    (charts,) = LAYOUTS[mode].values()
    cards = [card for card in both_modes if any(card["text"].startswith(title) for title in charts)]
    assert sorted(next(t for t in charts if card["text"].startswith(t)) for card in cards) == sorted(charts)
    for card in cards:
        title = next(t for t in charts if card["text"].startswith(t))
        assert "do not match" not in card["text"], card["text"][:400]
        assert card["lines"] > 0, f"{title!r} draws no line"
    if mode == "per-step":
        loss = next(c for c in cards if c["text"].startswith("loss: actual vs predicted"))
        # this run's lines: the loss and its prediction, not the band's edges
        series = [part for part in loss["text"].split(" | ") if part.endswith("(per-step)")]
        assert sorted(series) == ["hybrid/loss (per-step)", "hybrid/loss_predicted (per-step)"], loss["text"][:400]


def test_the_page_check_sees_the_error_of_a_band_logged_at_other_steps(tmp_path):
    """The defect this page test exists for, written on purpose: the band's edges at every fifth step only."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "logs" / "hybrid")
    writer.add_custom_scalars(PHASE_CURVES)
    for step in range(1, 20):
        for tag in ("loss", "loss_predicted", "phase", "confidence", "horizon", "rollbacks", "backward_skipped_pct"):
            writer.add_scalar(f"hybrid/{tag}", 1.0 / step, step)
        if step % 5 == 0:
            writer.add_scalar("hybrid/loss_predicted_lower", 0.5 / step, step)
            writer.add_scalar("hybrid/loss_predicted_upper", 2.0 / step, step)
    writer.close()
    with served(tmp_path / "logs") as url:
        cards = rendered_cards(url, len(PHASE_CURVES["Phase curves"]))
    band = next(c for c in cards if c["text"].startswith("predicted loss and its band"))
    assert "do not match" in band["text"] and band["lines"] == 0
