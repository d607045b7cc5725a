"""The live console in a real browser: Debian's headless Chromium driven by Selenium (chromium and
chromium-driver from ``scripts/setup-system.sh``; skipped when they are missing).

The proxy runs in-process (trio) with an ACL file; the blocking browser and paho code runs in worker
threads. Checked: an admin's page loads and goes live over the event stream, the open-connection count
and the connection table change when a paho client connects, the client's id (an HTML injection attempt)
shows as text and runs nothing, and a non-admin account is refused without data. Screenshots are kept in
the test's tmp dir (``console-*.png``); with ``MQTEST_CONSOLE_PNG=<path>`` the live one is also copied
there (how ``docs/console.png`` is made).
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mqproxy.server import ServerHandle
from mqproxy.settings import Settings

from ..conftest import wait_until_sync  # type: ignore[import-not-found]
from ..proxy.conftest import running_server  # type: ignore[import-not-found]
from .paho_driver import V5, PahoClient  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ACL = """\
accounts:
  - accessKey: root
    secretKey: root-secret-1
    admin: true
  - accessKey: meter
    secretKey: meter-secret-1
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""
#: A client id that would run script if the page ever inserted it as markup.
INJECTED = '"><img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
#: Chromium flags for a closed network and a root user (the machine probe's set).
CHROMIUM_ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip("Debian chromium + chromium-driver not installed (scripts/setup-system.sh)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in CHROMIUM_ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    driver.execute_cdp_cmd("Network.enable", {})
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
async def server(log_sink: Any, tmp_path: Path) -> AsyncIterator[ServerHandle]:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL, encoding="utf-8")
    settings = Settings.for_tests(acl={"file": str(path)}, metrics={"lag_refresh_s": 0.5})
    async with running_server(settings) as handle:
        yield handle


def _login(driver: Any, authorization: str) -> None:
    """Send these credentials with every request of the page (the document and its event stream)."""
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": authorization}})


def _live(driver: Any, name: str) -> str:
    text: str = driver.execute_script(
        "return document.querySelector('[data-live=\"' + arguments[0] + '\"]').textContent", name
    )
    return text


def _cells(driver: Any, body_id: str) -> list[list[str]]:
    rows: list[list[str]] = driver.execute_script(
        "return Array.from(document.getElementById(arguments[0]).rows)"
        ".map(r => Array.from(r.cells).map(c => c.textContent))",
        body_id,
    )
    return rows


def _until(predicate: Callable[[], bool]) -> None:
    wait_until_sync(predicate, 20)


async def _step(fn: Callable[[], Any]) -> Any:
    return await trio.to_thread.run_sync(fn)


async def test_console_in_chromium(server: ServerHandle, browser: Any, tmp_path: Path) -> None:
    base = f"http://127.0.0.1:{server.address[1]}"
    port = server.address[1]
    broker = server.state.broker
    assert broker is not None

    def open_as_admin() -> int:
        _login(browser, _basic("root", "root-secret-1"))
        browser.get(base + "/console")
        assert browser.title == "mqproxy console"
        _until(lambda: browser.find_element("id", "status").text.startswith("live"))
        browser.save_screenshot(str(tmp_path / "console-1-loaded.png"))
        return int(_live(browser, "open_connections"))

    before = await _step(open_as_admin)
    # a device connects (its id is an injection attempt), publishes, and a group falls behind on its topic
    device = await _step(lambda: PahoClient(port, INJECTED, V5, credentials=("meter", "meter-secret-1")))
    assert device.rc == 0

    def publish() -> None:
        for i in range(5):
            device.publish(f"readings/meter-{i}", b"42", qos=1)

    await _step(publish)
    await broker.commit_consumer_offset("dashboard-readers", "readings", 0, 0)
    intruder = await _step(
        lambda: PahoClient(port, "guesser", V5, credentials=("meter", "wrong"), reconnect=False)
    )
    assert intruder.rc != 0

    def sees_the_device() -> None:
        _until(lambda: int(_live(browser, "open_connections")) > before)
        _until(lambda: any(row[1] == INJECTED for row in _cells(browser, "connections")))
        row = next(row for row in _cells(browser, "connections") if row[1] == INJECTED)
        assert row[0] == "mqtt"
        assert row[2].startswith("127.0.0.1:")
        _until(lambda: any(row[0] == "dashboard-readers" for row in _cells(browser, "lag_groups")))
        _until(lambda: ["readings"] in _cells(browser, "topic_names"))
        _until(lambda: any(row[4] == "bad_signature" for row in _cells(browser, "rejections")))
        assert browser.execute_script("return window.__pwned === undefined")
        assert browser.execute_script("return document.querySelectorAll('img').length") == 0
        assert browser.execute_script("return document.scripts.length") == 1
        browser.save_screenshot(str(tmp_path / "console-2-live.png"))

    await _step(sees_the_device)
    await _step(device.close)
    await _step(lambda: _until(lambda: all(row[1] != INJECTED for row in _cells(browser, "connections"))))

    def refused_as_non_admin() -> None:
        _login(browser, _basic("meter", "meter-secret-1"))
        browser.get(base + "/console")
        body = browser.find_element("tag name", "body").text
        assert "admin accounts only" in body
        assert browser.execute_script("return document.getElementsByTagName('table').length") == 0
        browser.save_screenshot(str(tmp_path / "console-3-refused.png"))

    await _step(refused_as_non_admin)

    def keep_screenshots() -> None:
        shots = sorted(p.name for p in tmp_path.glob("console-*.png"))
        assert shots == ["console-1-loaded.png", "console-2-live.png", "console-3-refused.png"]
        target = os.environ.get("MQTEST_CONSOLE_PNG")
        if target:
            shutil.copyfile(tmp_path / "console-2-live.png", target)

    await _step(keep_screenshots)
