"""Screenshots of the playground for the docs: a server with the bundled model and the page on, a sentence spoken over
the WebSocket so the figures and its segment show, the whole page at a desktop and at a phone width.

    python -m tools.playground_screenshots      # writes docs/playground/desktop.png and docs/playground/phone.png
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tools import browser

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "playground"
WIDTHS = {"desktop": 1280, "phone": 390}
TEXT = "Hello! This is CosyVoice, speaking from your own server as the audio streams in."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(store: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cosyvoice_server.cli", "serve", "--host", "127.0.0.1", "--port",
                             str(port), "--device", "cpu", "--playground", "--voice-store-dir", str(store),
                             "--allow-voice-registration"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not become ready")


def _whole_page(driver, width: int, path: Path) -> None:
    metrics = {"width": width, "deviceScaleFactor": 1, "mobile": width < 600}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "height": 800})
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "height": height})
    driver.save_screenshot(str(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if (why := browser.missing()) is not None:
        raise SystemExit(why)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as store:
        proc, url = _serve(Path(store))
        driver = browser.chromium(WIDTHS["desktop"], 900)
        try:
            driver.get(url + "/playground")
            wait = WebDriverWait(driver, 30)
            wait.until(lambda d: d.find_element(By.ID, "voices").get_attribute("data-count"))
            driver.find_element(By.CSS_SELECTOR, 'input[name="transport"][value="ws"]').click()
            driver.find_element(By.ID, "text").clear()
            driver.find_element(By.ID, "text").send_keys(TEXT)
            driver.find_element(By.ID, "speak-button").click()
            wait.until(lambda d: d.find_element(By.ID, "speak").get_attribute("data-state") == "done")
            for name, width in WIDTHS.items():
                _whole_page(driver, width, args.out / f"{name}.png")
                print(f"wrote {args.out / f'{name}.png'}")
        finally:
            driver.quit()
            proc.terminate()
            proc.wait(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
