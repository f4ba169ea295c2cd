"""The app served on localhost and loaded in headless Chromium: the pages show the store's data."""

import asyncio
import base64
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import websockets
from PIL import Image

from store import open_reader
from tests.app_fixture import REPO, AppStore, app_store

__all__ = ["app_store"]

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium on PATH (apt-get install -y chromium)"
)
# Dark pixels (text, table rules, chart marks) in a page showing a table: about 1-2%; a blank
# page or the loading skeleton (light grey bars) has none.
MIN_INK = 0.003
START_TIMEOUT_S = 60
PAGE_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_url(url: str, process: subprocess.Popen, what: str) -> bytes:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.read()
        except OSError as err:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                output = process.communicate()[0] or ""
                raise RuntimeError(f"{what} did not start:\n{output}") from err
            time.sleep(0.2)


@pytest.fixture(scope="module")
def server(app_store: AppStore):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false", "--", "--db", str(app_store.path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    assert wait_for_url(f"{url}/_stcore/health", process, "streamlit") == b"ok"
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    """Headless Chromium driven over the DevTools protocol; its page's websocket address.

    `--screenshot` with `--virtual-time-budget` fast-forwards the page's clock without waiting
    for the app's websocket, so it captures the loading skeleton; instead each page is polled
    in real time until its text shows the data, then captured.
    """
    port = free_port()
    process = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
         "--window-size=1400,1000", f"--remote-debugging-port={port}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    targets = json.loads(wait_for_url(f"http://127.0.0.1:{port}/json", process, "chromium"))
    try:
        yield next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
    finally:
        process.terminate()
        process.wait(timeout=30)


async def _load(devtools: str, url: str, expected: tuple[str, ...], shot: Path) -> str:
    async with websockets.connect(devtools, max_size=2**26) as connection:
        serial = 0

        async def call(method: str, **params: object) -> dict:
            nonlocal serial
            serial += 1
            await connection.send(json.dumps({"id": serial, "method": method, "params": params}))
            while True:
                message = json.loads(await connection.recv())
                if message.get("id") == serial:
                    return message["result"]

        await call("Page.navigate", url=url)
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        text = ""
        while not all(e in text for e in expected) and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            reply = await call("Runtime.evaluate", expression="document.body.innerText")
            text = reply["result"].get("value", "")
        # Charts and code highlighting draw just after the text arrives.
        await asyncio.sleep(1.0)
        shot.write_bytes(base64.b64decode((await call("Page.captureScreenshot"))["data"]))
        return text


def load(devtools: str, url: str, expected: tuple[str, ...], shot: Path) -> tuple[float, str]:
    """The page's text once it shows every `expected` string (or the timeout passed), and its
    share of ink."""
    text = asyncio.run(_load(devtools, url, expected, shot))
    image = Image.open(shot).convert("L")
    dark = sum(count for count, level in image.getcolors(256) if level < 128)
    return dark / (image.width * image.height), text


def test_overview_shows_the_run(server, browser, app_store, tmp_path):
    share, text = load(
        browser, server, ("Kiln runs", "mlp_block_small.py"), tmp_path / "overview.png"
    )
    assert "Kiln runs" in text
    assert "mlp_block_small.py" in text
    assert share > MIN_INK, f"the Overview screenshot is nearly blank ({share:.2%} ink)"


def test_kernel_page_shows_the_kernel(server, browser, app_store, tmp_path):
    child = next(iter(app_store.parents))
    with open_reader(app_store.path) as reader:
        kernel = reader.candidate(child)
    share, text = load(
        browser,
        f"{server}/kernel?id={child}",
        (f"Kernel {child}", kernel.summary.site_key, kernel.summary.rationale, "Lineage"),
        tmp_path / "kernel.png",
    )
    assert f"Kernel {child}" in text
    assert kernel.summary.site_key in text
    assert kernel.summary.rationale in text
    assert share > MIN_INK, f"the Kernel screenshot is nearly blank ({share:.2%} ink)"
