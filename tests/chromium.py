"""Headless Chromium driven over the Chrome DevTools Protocol, for rendering checks.

:class:`ChromiumProcess` starts the browser (and always ends it: :meth:`stop`);
:class:`DevTools` speaks CDP to it over a websocket (aiohttp) and opens pages;
:class:`Page` navigates, evaluates JavaScript and collects what the page reported
as an error (uncaught exceptions, ``console.error``, browser log errors) and
every URL it requested.

The browser's port is never guessed: it is started with ``--remote-debugging-port=0``
and writes the port it took to ``<profile>/DevToolsActivePort``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0")


def find_chromium() -> str | None:
    """The Chromium executable on this machine, or None."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


class ChromiumProcess:
    """A Chromium this test started, with its own profile directory."""

    def __init__(self, executable: str, profile: Path) -> None:
        self.profile = profile
        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def websocket_url(self, timeout: float = 30.0) -> str:
        """The browser's CDP endpoint, once it has written ``DevToolsActivePort``."""
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while True:
            if marker.is_file():
                lines = marker.read_text().split()
                if len(lines) >= 2:
                    return f"ws://127.0.0.1:{int(lines[0])}{lines[1]}"
            if self.process.poll() is not None:
                stderr = self.process.stderr.read().decode("utf-8", "replace") if self.process.stderr else ""
                raise RuntimeError(f"chromium exited with {self.process.returncode}: {stderr[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium wrote no {marker} within {timeout} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """End the browser: terminate, then kill if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stderr is not None:
            self.process.stderr.close()


class DevTools:
    """One CDP connection to the browser; commands are awaited, events collected."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self._waiters: list[tuple[str, str | None, asyncio.Future[dict[str, Any]]]] = []

    async def __aenter__(self) -> DevTools:
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(self.url, max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._reader.cancel()
        await self._ws.close()
        await self._http.close()

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            self.events.append(data)
            for waiter in list(self._waiters):
                method, session, future = waiter
                if data.get("method") == method and session in (None, data.get("sessionId")):
                    self._waiters.remove(waiter)
                    if not future.done():
                        future.set_result(data)

    async def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
                   timeout: float = 30.0) -> dict[str, Any]:
        """Send one command and return its ``result``; a CDP error is a RuntimeError."""
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self._ws.send_str(json.dumps(message))
        answer = await asyncio.wait_for(future, timeout)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def expect(self, method: str, session: str | None = None) -> asyncio.Future[dict[str, Any]]:
        """A future for the next event ``method`` (of ``session``); ask before causing it."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters.append((method, session, future))
        return future

    async def new_page(self) -> Page:
        """A new tab, attached, with Runtime, Log, Network and Page events enabled."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        for domain in ("Runtime", "Log", "Network", "Page"):
            await page.send(f"{domain}.enable")
        return page


class Page:
    """One tab."""

    def __init__(self, tools: DevTools, session: str) -> None:
        self.tools, self.session = tools, session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.tools.send(method, params, session=self.session)

    async def navigate(self, url: str, timeout: float = 30.0) -> None:
        """Open ``url`` and wait for its load event."""
        loaded = self.tools.expect("Page.loadEventFired", self.session)
        answer = await self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise RuntimeError(f"navigating to {url}: {answer['errorText']}")
        await asyncio.wait_for(loaded, timeout)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression; an exception in it is a RuntimeError."""
        answer = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                      "awaitPromise": True})
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression[:80]}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def click(self, selector: str) -> None:
        """A real mouse click (press and release) in the middle of the element ``selector``."""
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            f" e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();"
            f" return [r.left + r.width / 2, r.top + r.height / 2]; }})()")
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1],
                                                          "button": "left", "clickCount": 1})

    async def screenshot(self, selector_js: str) -> bytes:
        """A PNG of the page's region that ``selector_js`` (a JavaScript expression giving
        ``{x, y, width, height}`` in page coordinates) names, beyond the viewport too."""
        clip = await self.evaluate(selector_js)
        answer = await self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                            "clip": {**clip, "scale": 1}})
        return base64.b64decode(answer["data"])

    def _own(self) -> list[dict[str, Any]]:
        return [event for event in self.tools.events if event.get("sessionId") == self.session]

    def errors(self) -> list[str]:
        """Uncaught exceptions, console errors and browser log errors, as text."""
        found = []
        for event in self._own():
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                found.append(f"exception: {details.get('text')} {details.get('exception', {}).get('description')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        return found

    def requested(self) -> list[str]:
        """Every URL the page asked for."""
        return [event["params"]["request"]["url"] for event in self._own()
                if event.get("method") == "Network.requestWillBeSent"]
