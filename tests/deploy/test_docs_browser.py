"""/docs and /redoc in a real browser: headless Chromium driven by Selenium with the system chromedriver.

The page must render from assets the service serves itself (no CDN: the browser here has no internet),
list every endpoint, and Swagger UI's "Try it out" on /classify with the schema's example must show a
200 answer with a label. Screenshots go to .cache/test-artifacts/docs-browser/ (or $TEST_ARTIFACTS_DIR).
Skipped, saying what is missing, without selenium, Chromium or chromedriver.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.deploy.files import ROOT

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (dev extra)")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR", ROOT / ".cache" / "test-artifacts")) / "docs-browser"
RENDER_TIMEOUT_S = 30
# ReDoc's sidebar credits Redocly with a logo from its CDN; the <img> removes itself when the logo
# cannot load, and the page needs nothing else from outside. Its failed load is the one tolerated.
REDOC_ATTRIBUTION_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def find_binary(names: tuple[str, ...]) -> str | None:
    return next((path for name in names if (path := shutil.which(name))), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    binary = find_binary(BROWSERS)
    driver_path = find_binary(("chromedriver",))
    if binary is None or driver_path is None:
        missing = " and ".join(n for n, p in (("Chromium", binary), ("chromedriver", driver_path)) if not p)
        pytest.skip(f"{missing} not installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager (which would download a driver) is never asked.
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def operations(url: str) -> set[tuple[str, str]]:
    spec = httpx.get(f"{url}/openapi.json", timeout=10).json()
    return {(method.upper(), path) for path, item in spec["paths"].items() for method in item}


def screenshot(driver: webdriver.Chrome, name: str, element=None) -> Path:
    """The whole page, or one element of it."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    if element is not None:
        element.screenshot(str(path))
        return path
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(height, 800), 8000))
    driver.save_screenshot(str(path))
    return path


def assert_everything_local(driver: webdriver.Chrome, url: str) -> None:
    """Every script, stylesheet and fetched resource came from the service, and nothing failed."""
    origin = urllib.parse.urlsplit(url)._replace(path="", query="", fragment="").geturl()
    loaded = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
        " .concat([...document.querySelectorAll('script[src]')].map(e => e.src))"
        " .concat([...document.querySelectorAll('link[href]')].map(e => e.href))"
    )
    assert loaded, "the page loaded nothing"
    foreign = [u for u in loaded if not u.startswith(origin) and u != REDOC_ATTRIBUTION_LOGO]
    assert not foreign, f"resources from elsewhere than {origin}: {foreign}"
    severe = [
        e["message"]
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and REDOC_ATTRIBUTION_LOGO not in e["message"]
    ]
    assert not severe, severe


def test_swagger_ui_lists_every_endpoint_and_try_it_out_works(browser, keyless_live):
    wait = WebDriverWait(browser, RENDER_TIMEOUT_S)
    browser.get(f"{keyless_live.url}/docs")
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, ".opblock-summary-path")))
    shown = {
        (
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text.strip().upper(),
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"),
        )
        for block in browser.find_elements(By.CSS_SELECTOR, ".opblock")
    }
    assert shown == operations(keyless_live.url)
    screenshot(browser, "swagger-ui")

    classify = browser.find_element(By.CSS_SELECTOR, ".opblock-post:has([data-path='/classify'])")
    classify.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    wait.until(lambda _: classify.find_element(By.CSS_SELECTOR, ".try-out__btn")).click()
    body = wait.until(lambda _: classify.find_element(By.CSS_SELECTOR, "textarea.body-param__text"))
    example = json.loads(body.get_attribute("value"))
    assert example.get("text") or example.get("inputs"), example  # the schema's example, prefilled
    classify.find_element(By.CSS_SELECTOR, "button.execute").click()
    status = wait.until(
        lambda _: classify.find_element(
            By.CSS_SELECTOR, ".live-responses-table tr.response .response-col_status"
        )
    )
    answer_text = classify.find_element(
        By.CSS_SELECTOR, ".live-responses-table tr.response .response-col_description pre"
    ).text
    request_and_answer = classify.find_element(By.CSS_SELECTOR, ".opblock-body")
    screenshot(browser, "swagger-ui-classify-try-it-out", request_and_answer)
    assert status.text.strip() == "200", answer_text
    answer = json.loads(answer_text)
    (model,) = [
        m
        for m in httpx.get(f"{keyless_live.url}/models", timeout=10).json()["models"]
        if m["task"] == "classify"
    ]
    assert answer["label"] in model["labels"], (answer, model["labels"])
    assert_everything_local(browser, keyless_live.url)


def test_redoc_renders_every_operation(browser, keyless_live):
    spec = httpx.get(f"{keyless_live.url}/openapi.json", timeout=10).json()
    summaries = {op["summary"] for item in spec["paths"].values() for op in item.values()}
    browser.get(f"{keyless_live.url}/redoc")
    WebDriverWait(browser, RENDER_TIMEOUT_S).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "[data-section-id^='operation/']")) >= len(summaries)
    )
    headings = {h.text.strip() for h in browser.find_elements(By.CSS_SELECTOR, "[data-section-id] h2")}
    assert summaries <= headings, summaries - headings
    assert spec["info"]["title"] in browser.find_element(By.TAG_NAME, "h1").text
    screenshot(browser, "redoc")
    assert_everything_local(browser, keyless_live.url)
