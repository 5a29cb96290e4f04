"""The playground page in headless Chromium: list voices, press Speak, receive and schedule streamed audio.

Needs Debian's `chromium` and `chromium-driver` and the `selenium` package (dev extra); skipped
when the browser is not installed.
"""

from __future__ import annotations

import shutil

import pytest
from test_server_helpers import API_KEY, running_server, sine_config

selenium = pytest.importorskip("selenium")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="apt-get install chromium chromium-driver")


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--autoplay-policy=no-user-gesture-required",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def test_playground_streams_audio_with_a_key(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with running_server(sine_config(tmp_path, api_keys=(API_KEY,))) as (url, _):
        browser.get(url + "/")
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: "API key" in d.find_element(By.ID, "status").text)  # /voices needs the key
        key = browser.find_element(By.ID, "key")
        key.send_keys(API_KEY)
        browser.execute_script("arguments[0].dispatchEvent(new Event('change'))", key)
        wait.until(lambda d: d.find_element(By.ID, "status").text == "ready")
        assert [o.text for o in Select(browser.find_element(By.ID, "voice")).options] == ["sine (sine)"]
        text = browser.find_element(By.ID, "text")
        text.clear()
        text.send_keys("one two three four five")
        browser.find_element(By.ID, "speak").click()
        wait.until(
            lambda d: d.execute_script("return window.voicehub.done || window.voicehub.error !== null")
        )
        state = browser.execute_script("return window.voicehub")
        assert state["error"] is None
        assert state["samples"] == 5 * 2205  # five words of the sine model, every sample received
        assert state["firstAudioMs"] is not None and state["chunks"] >= 1
        assert "done" in browser.find_element(By.ID, "status").text
