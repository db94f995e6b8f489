"""A real Prometheus for the tests (Debian's package): started on loopback in a temp dir with
migd's rule files, queried over its HTTP API, stopped afterwards."""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import free_port
from tests.helpers import REPO, required_tool

RULES = [REPO / "prometheus" / "migd.rules.yml", REPO / "prometheus" / "migd.alerts.yml"]


def binary() -> str:
    return required_tool("prometheus", "MIGD_REQUIRE_PROMETHEUS", "apt-get install prometheus")


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def query(port: int, q: str, **params: str) -> list[dict[str, Any]]:
    """An instant query (or a range query, given start, end and step)."""
    path = "query_range" if "step" in params else "query"
    res = get(f"http://127.0.0.1:{port}/api/v1/{path}?" + urllib.parse.urlencode({"query": q, **params}))
    assert res["status"] == "success", res
    return list(res["data"]["result"])


@contextlib.contextmanager
def prometheus(tmp: Path, targets: dict[str, int], interval: str = "1s") -> Iterator[int]:
    """Prometheus scraping ``targets`` (job -> port) every ``interval`` with migd's rules; yields its
    port once every target has been scraped (service discovery takes about 5 s)."""
    prom, port = binary(), free_port()
    jobs = "".join(f"  - job_name: {job}\n    static_configs: [{{targets: ['127.0.0.1:{p}']}}]\n"
                   for job, p in targets.items())
    (tmp / "prometheus.yml").write_text(f"global: {{scrape_interval: {interval}, evaluation_interval: {interval}}}\n"
                                        f"rule_files: [{', '.join(str(r) for r in RULES)}]\n"
                                        f"scrape_configs:\n{jobs}")
    with open(tmp / "prom.log", "w") as log:
        proc = subprocess.Popen([prom, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if len(query(port, "up == 1")) == len(targets):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("prometheus did not scrape its targets: " + (tmp / "prom.log").read_text()[-2000:])
            time.sleep(0.3)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.contextmanager
def served(path: Path) -> Iterator[int]:
    """A file served as /metrics (a recorded exporter's exposition)."""
    body = path.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
