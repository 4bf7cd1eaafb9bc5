"""Headless Chromium driven over WebDriver (Debian's ``chromium`` and ``chromium-driver``), no extra packages.

``Browser()`` starts ``chromedriver`` on a free loopback port and one session
of Chromium with the flags the project uses for headless tests (a fresh
``--user-data-dir``, no sync, no background networking, no component
updates), so the browser talks to nothing but the page under test.
``open(url)``, ``script(js)``, ``wait(js)`` and ``screenshot(path)`` are the
few WebDriver calls the dashboard's tests need; ``close()`` ends both
processes and removes the profile.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from up.uplab import wait_for
from viz.promlab import free_port

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1100"]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Browser:
    def __init__(self) -> None:
        assert CHROMIUM and CHROMEDRIVER, "needs Debian's chromium and chromium-driver (dev/setup.sh)"
        self.profile = tempfile.mkdtemp(prefix="viz-chromium-")
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.driver = subprocess.Popen([CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        wait_for("chromedriver", self._driver_up, timeout=30)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM, "args": [*FLAGS, f"--user-data-dir={self.profile}"]}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _driver_up(self) -> bool:
        try:
            return bool(self._call("GET", "/status")["ready"])
        except OSError:
            return False

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with _OPENER.open(request, timeout=60) as response:
            doc = json.loads(response.read() or b"{}")
        value = doc.get("value", doc)
        if isinstance(value, dict) and "error" in value:
            raise AssertionError(f"webdriver {method} {path}: {value}")
        return value

    def open(self, url: str) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": url})

    def script(self, js: str, *args: Any) -> Any:
        return self._call("POST", f"/session/{self.session}/execute/sync", {"script": js, "args": list(args)})

    def wait(self, what: str, js: str, timeout: float = 30.0) -> Any:
        return wait_for(what, lambda: self.script(js), timeout=timeout)

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self._call("GET", f"/session/{self.session}/screenshot")))
        return path

    def close(self) -> None:
        try:
            self._call("DELETE", f"/session/{self.session}")
        except OSError:
            pass
        self.driver.terminate()
        try:
            self.driver.wait(10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
