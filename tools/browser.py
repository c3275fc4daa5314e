"""Headless Chromium driven by Selenium, from Debian's `chromium` and `chromium-driver` packages (`make
system-deps` installs them): the playground's browser test and its screenshots."""

from __future__ import annotations

import shutil

# The browser plays audio without a click on the page, as after a user's first click.
FLAGS = ("--headless=new", "--autoplay-policy=no-user-gesture-required", "--disable-dev-shm-usage",
         "--no-sandbox")  # as root (CI, containers) Chromium's sandbox cannot start


def missing() -> str | None:
    """Why headless Chromium cannot be driven here, in one line; None when it can."""
    absent = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if absent:
        return f"no {' or '.join(absent)} on PATH (Debian packages chromium and chromium-driver: make system-deps)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (requirements-test.txt)"
    return None


def chromium(width: int = 1280, height: int = 900, *flags: str):
    """A headless Chromium session whose performance log records the page's network events, and whose browser log
    its console."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in (*FLAGS, f"--window-size={width},{height}", *flags):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
