"""A page rendered in headless Chromium, read the way a person would see it.

Chromium is started on loopback with the DevTools protocol on a port it picks itself (read from
its DevToolsActivePort file) and a profile folder of its own; the page is loaded from a file://
URL with the network of the page turned off, so a report that needs anything outside its own
folder shows up as an image that did not load. Returns what the page showed: every image with
whether it loaded and its natural size, an element's text, and a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

IMAGES_JS = ("Array.from(document.images).map(i => ({src: i.getAttribute('src'), "
             "complete: i.complete, width: i.naturalWidth, height: i.naturalHeight}))")


@dataclass(frozen=True)
class Rendered:
    images: list[dict[str, Any]]
    text: str  # innerText of the element asked for ("" when absent)
    title: str
    screenshot_png: bytes


class _Devtools:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mine = self.next_id
        await self.ws.send_str(json.dumps({"id": mine, "method": method, "params": params}))
        while True:
            message = json.loads((await self.ws.receive(timeout=30)).data)
            if message.get("id") == mine:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    async def wait_event(self, method: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        if any(e.get("method") == method for e in self.events):
            return
        while time.monotonic() < deadline:
            message = json.loads((await self.ws.receive(timeout=seconds)).data)
            if message.get("method") == method:
                return
        raise TimeoutError(f"{method} not seen within {seconds} s")

    async def value(self, expression: str) -> Any:
        done = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return done["result"].get("value")


async def _render(port: int, url: str, selector: str, width: int) -> Rendered:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            pages = [t for t in await resp.json() if t.get("type") == "page"]
        async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=64 << 20) as ws:
            dev = _Devtools(ws)
            await dev.call("Page.enable")
            await dev.call("Network.enable")
            await dev.call("Network.emulateNetworkConditions", offline=True, latency=0,
                           downloadThroughput=-1, uploadThroughput=-1)
            await dev.call("Emulation.setDeviceMetricsOverride", width=width, height=900,
                           deviceScaleFactor=1, mobile=False)
            await dev.call("Page.navigate", url=url)
            await dev.wait_event("Page.loadEventFired", 30)
            images = await dev.value(IMAGES_JS)
            text = await dev.value(
                f"(document.querySelector({json.dumps(selector)}) || {{innerText: ''}}).innerText")
            title = await dev.value("document.title")
            shot = await dev.call("Page.captureScreenshot", format="png",
                                  captureBeyondViewport=True)
            return Rendered(list(images or []), str(text or ""), str(title or ""),
                            base64.b64decode(shot["data"]))


def render(page: Path, selector: str = "body", width: int = 1200) -> Rendered:
    """Load `page` in headless Chromium and return what it showed."""
    if CHROMIUM is None:
        raise RuntimeError("chromium is not installed (scripts/apt-packages.txt installs it)")
    # Chromium's helpers can still be writing the profile when it has exited: the folder's
    # removal must not fail the check
    with tempfile.TemporaryDirectory(prefix="narwhal-chromium-",
                                     ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--disable-background-networking",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            active = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (active.exists() and active.read_text().strip()):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.1)
            port = int(active.read_text().splitlines()[0])
            return asyncio.run(_render(port, page.resolve().as_uri(), selector, width))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
