"""The page at ``GET /``: what it draws from a real sampler snapshot, that it needs nothing
from outside the node, and that a real browser renders it (Debian's chromium, headless)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from migd.metrics.page import Page, render_page
from migd.metrics.share import DayShare
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, REPO, Migctl, sampled


class Blocks(HTMLParser):
    """The page's GPU sections and, per GPU, its instance blocks' (profile, owner, start, size)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpus: dict[int, list[tuple[str, str, int, int]]] = {}
        self.free: dict[int, int] = {}
        self.unusable: dict[int, list[int]] = {}  # per GPU, the memory slices no instance can be made on now
        self._gpu = -1
        self.external: list[str] = []
        self.today: list[str] = []  # owners with a share of today's slices

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in ("script", "link", "img", "iframe") or any(v and "//" in v for k, v in attrs if k in ("src", "href")):
            self.external.append(tag)
        cls = a.get("class") or ""
        if tag == "section" and "gpu" in cls.split():
            self._gpu = int(a["data-gpu"] or -1)
            self.gpus[self._gpu] = []
        elif tag == "div" and cls == "gi":
            self.gpus[self._gpu].append((a["data-profile"] or "", a["data-owner"] or "", int(a["data-start"] or 0),
                                         int(a["data-size"] or 0)))
        elif tag == "div" and cls == "free":
            self.free[self._gpu] = self.free.get(self._gpu, 0) + 1
        elif tag == "div" and cls == "unusable":
            self.unusable.setdefault(self._gpu, []).append(int(a["data-slice"] or -1))
        elif tag == "span" and cls == "share-today":
            self.today.append(a["data-owner"] or "")


def parse(text: str) -> Blocks:
    b = Blocks()
    b.feed(text)
    return b


def test_the_page_draws_each_gpu_and_instance_where_it_sits(tmp_path: Path) -> None:
    snap = sampled(Migctl(tmp_path, "dgx-h100"), "day")
    text = render_page(snap, {"active": {"profile": "day", "reason": "schedule"}, "gpus": {}, "unhealthy": {}}, 15)
    page = parse(text.decode())
    assert sorted(page.gpus) == list(range(8)) and page.external == []
    for blocks in page.gpus.values():  # H100: 7 x 1g.10gb at memory slices 0..6; the 8th no instance can use
        assert blocks == [("1g.10gb", "notebooks", s, 1) for s in range(7)]
    assert page.free == {} and page.unusable == {i: [7] for i in range(8)}
    assert b"notebooks: 56/56 slices (100%)" in text and b"active profile: <b>day</b> (schedule)" in text
    assert b"http://" not in text and b"https://" not in text and b'http-equiv="refresh" content="15"' in text


def test_a_waiting_gpu_is_said_once_and_without_its_pids_repeated(tmp_path: Path) -> None:
    """The wait line read ``GPU 2: waiting: GPU 2: destroy CI ... [busy: pids 7]``: the GPU twice."""
    snap = sampled(Migctl(tmp_path, "dgx-h100"), "day")
    status = {"active": {"profile": "night", "reason": "schedule"}, "unhealthy": {},
              "gpus": {"2": {"state": "waiting", "reason": "GPU 2: destroy GI 7 [busy: pids 7]"}}}
    text = render_page(snap, status, 15).decode()
    assert '<p class="warn">GPU 2: waiting: destroy GI 7</p>' in text, text


def chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.environ.get("MIGD_REQUIRE_CHROMIUM") == "1":
        pytest.fail("chromium is required here (MIGD_REQUIRE_CHROMIUM=1) and is not installed")
    return found


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, "dgx-h100")
    yield m
    m.close()


def browse(browser: str, url: str, profile: Path, *args: str) -> str:
    """Headless Chromium on ``url`` (``--dump-dom`` prints the DOM as the browser built it); as root it
    needs --no-sandbox; ``profile``: a user-data dir of the test's own."""
    p = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={profile}", *args, url],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


@pytest.mark.integration
def test_a_browser_renders_the_page_before_and_after_a_transition(migd: MigdProcess, tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium)")
    migd.start(now="2026-11-23T10:00:00")  # Monday morning: day
    migd.wait_ready()
    url = f"http://127.0.0.1:{migd.port}/"
    profile_dir = tmp_path / "chromium"

    def dom() -> Blocks:
        return parse(browse(browser, url, profile_dir, "--dump-dom"))
    day = dom()
    assert sorted(day.gpus) == list(range(8)) and all(len(b) == 7 for b in day.gpus.values()), day.gpus
    assert all(o == "notebooks" and size == 1 for b in day.gpus.values() for _, o, _, size in b)
    assert day.today in ([], ["notebooks"]), day.today  # today: day's owner alone so far
    assert migd.migctl("apply", str(PROFILES / "night.yaml")).code == 0  # through migd
    deadline = time.monotonic() + 30
    while True:  # the page follows the next sampling cycle (1 s here)
        night = dom()
        if all(b == [("7g.80gb", "training", 0, 8)] for b in night.gpus.values()) and len(night.gpus) == 8 \
                and "training" in night.today:
            break
        assert time.monotonic() < deadline, night.gpus
        time.sleep(1)
    assert night.today == ["notebooks", "training"]  # today held both layouts
    art = Path(os.environ.get("MIGD_ARTIFACTS", REPO / "artifacts"))
    art.mkdir(parents=True, exist_ok=True)
    browse(browser, url, profile_dir, f"--screenshot={art / 'page-night.png'}", "--window-size=1200,1400")
    assert (art / "page-night.png").stat().st_size > 10_000
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"] == "text/html; charset=utf-8"


def test_the_page_shows_each_owners_share_over_today(tmp_path: Path) -> None:
    """An hour of day (notebooks) then three of night (training): 25% and 75% of today's slices; at
    local midnight the count starts again."""
    m = Migctl(tmp_path, "dgx-h100")
    snaps = []
    for profile in ("day", "night"):
        snaps.append(sampled(m, profile))
    seoul = ZoneInfo("Asia/Seoul")
    at = datetime(2026, 11, 23, 8, 0, tzinfo=seoul).timestamp()
    share = DayShare(lambda: seoul)
    for offset, snap in ((0, snaps[0]), (3600, snaps[1]), (4 * 3600, snaps[1])):
        share.observe(replace(snap, taken_at=at + offset))
    assert share.today() == {"notebooks": 0.25, "training": 0.75}
    text = render_page(snaps[1], {"active": None, "gpus": {}, "unhealthy": {}, "timezone": "Asia/Seoul"}, 15,
                       share.today()).decode()
    assert "share of the slices today (Asia/Seoul): " in text and ">notebooks: 25%<" in text, text
    midnight = datetime(2026, 11, 24, 0, 0, 5, tzinfo=seoul).timestamp()
    share.observe(replace(snaps[0], taken_at=midnight))
    assert share.today() == {}  # a new day: nothing counted yet
    share.observe(replace(snaps[0], taken_at=midnight + 60))
    assert share.today() == {"notebooks": 1.0}


def test_the_page_looks_at_the_status_at_most_once_a_second() -> None:
    """Serving the page must stay cheap beside /metrics: for the same snapshot the daemon's status is
    read again only after a second, and a change in it then shows."""
    now = [100.0]
    looked: list[int] = []
    status = {"active": {"profile": "day", "reason": "schedule"}, "gpus": {}, "unhealthy": {}}

    def read_status() -> dict[str, object]:
        looked.append(1)
        return status
    page = Page(lambda: None, read_status, 15, clock=lambda: now[0])
    assert b"<b>day</b>" in page.body() and len(looked) == 1
    status = {**status, "active": {"profile": "night", "reason": "manual"}}
    for _ in range(50):
        assert b"<b>day</b>" in page.body()
    assert len(looked) == 1
    now[0] += 1.0
    assert b"<b>night</b> (manual)" in page.body() and len(looked) == 2
