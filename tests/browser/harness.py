"""What the browser tests drive: Debian's Chromium through Playwright (its protocol client from PyPI,
no downloaded browser), a static web site on a second origin serving the test pages, the CometD
client from npm (tests/node) and the live example page, and the server as users run it."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
PAGES = Path(__file__).parent / "pages"
NODE_DIR = ROOT / "tests" / "node"
COMETD = NODE_DIR / "node_modules" / "cometd"
EXAMPLE = ROOT / "examples" / "browser"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
# Flags for a headless browser in a container with no network beyond loopback.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

browser_tests = pytest.mark.skipif(
    CHROMIUM is None
    or importlib.util.find_spec("playwright") is None
    or shutil.which("node") is None
    or not COMETD.is_dir(),
    reason="needs Debian's chromium, playwright (pip) and `npm ci --prefix tests/node` (CI has all three)",
)


class _Handler(SimpleHTTPRequestHandler):
    """The site: the test pages at /, the CometD client at /cometd/, the live example at /example/."""

    def translate_path(self, path: str) -> str:
        clean = path.split("?", 1)[0].split("#", 1)[0]
        for prefix, base in (("/cometd/", COMETD), ("/example/", EXAMPLE)):
            if clean.startswith(prefix):
                return str(base / clean[len(prefix) :])
        return str(PAGES / clean.lstrip("/"))

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: pytest shows failures, not every request


@contextmanager
def site() -> Iterator[int]:
    """The static site on 127.0.0.1 (any free port), until the block ends; yields the port."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


class Server:
    """`streaming-server` in a child process with its HTTP client port fixed (a page keeps its URL
    across a restart) and the site's origin allowed."""

    def __init__(self, directory: Path, allowed_origin: str) -> None:
        self.api_port = free_port()
        self.nats_port = free_port()
        self.directory = directory
        args = ["-p", str(self.nats_port), "--dir", str(directory), "--http_api_port", str(self.api_port)]
        self.process = ServerProcess([*args, "--http_api_allow_origins", allowed_origin])

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start(self) -> Server:
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.stop()

    def log(self) -> str:
        return "\n".join(self.process.log)


def node_publish(server: Server, channel: str, start: int, end: int) -> None:
    """node-nats-streaming publishes {"n": start} .. {"n": end - 1}, each once stored."""
    env = {**os.environ, "FROM": str(start), "TO": str(end)}
    argv = ["node", str(NODE_DIR / "driver.js"), "publish_range", str(server.nats_port), channel]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"], result


def wait_until(check: Callable[[], Any], within: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.05)
