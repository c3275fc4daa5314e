"""The browser playground (GET /playground): off by default; when on, the page driven in headless Chromium against
a real server with the bundled model. One server and one browser serve every check: voices listed, a sentence
spoken over HTTP and over the WebSocket with its audio received and played, clips registered (from a file and from
the microphone) and used, the server's refusals shown in its own words, and no request anywhere but the server."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from cosyvoice_server import playground
from cosyvoice_server.app import create_app
from cosyvoice_server.config import Settings
from cosyvoice_server.origins import is_own_origin
from tools import browser

sys.path.insert(0, str(Path(__file__).parents[1] / "voices"))
from clips import wav  # noqa: E402
from voicekit import ADMIN, API_KEY, REGISTRATION_KEY, registering_server  # noqa: E402

PLAYGROUND_DIR = Path(playground.__file__).parent
SENTENCE = "Hello from the playground."


def test_off_by_default_nothing_is_served_and_the_root_is_as_before() -> None:
    assert Settings().playground is False
    client = TestClient(create_app(Settings(device="cpu")))  # no lifespan: no model load
    for path in ("/", "/playground", "/playground/playground.js"):
        r = client.get(path, follow_redirects=False)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", path


def test_on_the_root_redirects_and_the_files_come_with_a_policy_that_keeps_them_to_this_server() -> None:
    client = TestClient(create_app(Settings(device="cpu", playground=True)))
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "playground"
    for path, media_type in [("/playground", "text/html"), *((f"/playground/{name}", kind)
                                                             for name, kind in playground.ASSETS.items())]:
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(media_type), path
        assert "connect-src 'self'" in r.headers["content-security-policy"]
        assert "default-src 'none'" in r.headers["content-security-policy"]
    assert client.get("/playground/").status_code == 404
    assert client.get("/playground/app.py").status_code == 404


def test_the_files_name_no_other_host() -> None:
    for path in PLAYGROUND_DIR.iterdir():
        if path.suffix in (".html", ".css", ".js"):
            assert not re.search(r"(https?:)?//[\w.-]+\.\w", path.read_text()), path.name


@pytest.mark.parametrize("origin, host, own", [
    ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
    ("http://LOCALHOST:8080", "localhost:8080", True),
    ("https://tts.example.com", "tts.example.com", True),
    ("https://tts.example.com", "tts.example.com:443", True),  # the default port written out
    ("http://[::1]:8000", "[::1]:8000", True),
    ("http://127.0.0.1:8001", "127.0.0.1:8000", False),  # another port is another origin
    ("http://evil.example", "127.0.0.1:8000", False),
    ("null", "127.0.0.1:8000", False),
    ("http://127.0.0.1:8000", None, False),
])
def test_own_origin_is_the_host_the_handshake_was_sent_to(origin: str, host: str | None, own: bool) -> None:
    assert is_own_origin([origin], host) is own
    assert is_own_origin([origin, origin], host) is False  # no browser sends two


# --- one server with the page on, registration and keys, for the browser ----------------------------------------
@pytest.fixture(scope="module")
def server(server_process, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("playground")
    s = registering_server(server_process, tmp, tmp / "voices", "--playground").wait_ready()
    yield s
    s.stop()


def test_pages_elsewhere_are_still_refused_by_the_origin_policy(server) -> None:
    url = server.url.replace("http", "ws") + "/v1/audio/speech/stream"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, origin="http://evil.example", additional_headers={"Authorization": f"Bearer {API_KEY}"})
    assert refused.value.response.status_code == 403
    with connect(url, origin=server.url, additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"


class Page:
    """The playground in the browser: its controls, and the state it keeps in data-* attributes."""

    def __init__(self, driver, url: str) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select, WebDriverWait

        self.driver, self.url, self.by, self.select, self.waiter = driver, url, By, Select, WebDriverWait

    def el(self, id_: str):
        return self.driver.find_element(self.by.ID, id_)

    def data(self, id_: str, name: str) -> str | None:
        return self.el(id_).get_attribute(f"data-{name}")

    def wait(self, condition, what: str, timeout: float = 30) -> None:
        self.waiter(self.driver, timeout).until(lambda _: condition(), what)

    def voices(self) -> list[str]:
        return self.driver.execute_script("return [...document.getElementById('voice').options].map(o => o.value)")

    def use_key(self, key: str) -> None:
        self.el("key").clear()
        self.el("key").send_keys(key)
        self.el("key-use").click()

    def start(self, via: str, fmt: str, text: str) -> None:
        self.driver.find_element(self.by.CSS_SELECTOR, f'input[name="transport"][value="{via}"]').click()
        self.select(self.el("format")).select_by_value(fmt)
        self.el("text").clear()
        self.el("text").send_keys(text)
        self.el("speak-button").click()

    def finished(self) -> dict[str, str]:
        self.wait(lambda: self.data("speak", "state") in ("done", "error", "stopped"), "the synthesis to end")
        return self.stats()

    def stats(self) -> dict[str, str]:
        return self.driver.execute_script("return {...document.getElementById('speak').dataset}")

    def played_whole(self) -> dict[str, str]:
        """Waits for the playback to end; the stats then."""
        self.wait(lambda: self.data("speak", "playback") == "ended", "the audio to play to its end")
        return self.stats()

    def requested(self) -> list[str]:
        """Every URL the page requested or opened a socket to since the last call (the DevTools network log)."""
        urls = []
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                urls.append(message["params"]["request"]["url"])
            elif message["method"] == "Network.webSocketCreated":
                urls.append(message["params"]["url"])
        return urls


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    if (why := browser.missing()) is not None:
        pytest.skip(why)
    mic = tmp_path_factory.mktemp("mic") / "speech.wav"
    mic.write_bytes(wav(4.0, 48000))  # what the fake microphone hears, looped
    d = browser.chromium(1280, 900, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                         f"--use-file-for-fake-audio-capture={mic}")
    yield d
    d.quit()


@pytest.fixture
def page(driver, server):
    """The page loaded afresh with the registration key in use (it may also synthesize)."""
    p = Page(driver, server.url)
    driver.get(server.url + "/playground")
    p.wait(lambda: p.data("key-form", "needed") == "true", "the page to ask for a key")
    p.use_key(REGISTRATION_KEY)
    p.wait(lambda: p.data("voices", "count"), "the voices to be listed")
    yield p
    assert_only_the_server(p, server)


def assert_only_the_server(p: Page, server) -> None:
    """The page reached nothing but the server (its own URLs, sockets and the blob: and data: URLs it made), and
    tried nothing else: a connection its Content-Security-Policy stops is never sent, but the console names it."""
    origins = (server.url + "/", server.url.replace("http", "ws", 1) + "/", "blob:" + server.url + "/", "data:")
    requested = p.requested()
    assert requested and [u for u in requested if not u.startswith(origins)] == []
    assert [e["message"] for e in p.driver.get_log("browser") if "Content Security Policy" in e["message"]] == []


def server_message(r: httpx.Response) -> str:
    return r.json()["error"]["message"]


def test_the_root_leads_to_the_page_which_asks_for_a_key_and_shows_the_servers_refusal(driver, server) -> None:
    p = Page(driver, server.url)
    driver.get(server.url + "/")
    assert driver.current_url == server.url + "/playground"
    p.wait(lambda: p.data("key-form", "needed") == "true", "the page to ask for a key")
    missing = server_message(httpx.get(server.url + "/v1/models"))
    assert missing in p.el("key-error").text and p.data("key-error", "code") == "invalid_api_key"
    p.use_key("not-the-key")
    p.wait(lambda: p.data("key-error", "status") == "401", "the bad key's refusal")
    assert server_message(httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer not-the-key"})) \
        in p.el("key-error").text
    p.use_key(API_KEY)
    p.wait(lambda: p.data("voices", "count"), "the voices to be listed")
    assert p.data("key-form", "needed") == "false" and p.el("key-error").get_attribute("hidden")
    listed = [v["id"] for v in httpx.get(server.url + "/v1/audio/voices", headers=ADMIN).json()["voices"]]
    assert p.voices() == listed and len(listed) >= 3
    assert_only_the_server(p, server)


@pytest.mark.parametrize("via, fmt", [("http", "wav"), ("ws", "mp3"), ("live", "pcm")])
def test_a_sentence_is_spoken_and_played_as_it_streams(page, via: str, fmt: str) -> None:
    page.start(via, fmt, "" if via == "live" else SENTENCE)
    if via == "live":  # the text goes as it is typed, a character per append
        page.wait(lambda: page.data("speak", "state") == "streaming", "the session to open")
        page.el("text").send_keys(SENTENCE)
        page.el("flush").click()  # the end of a thought: a segment of its own
        page.el("text").send_keys(" And on")
        page.el("end").click()
    stats = page.finished()
    assert stats["state"] == "done", page.el("speak-error").text
    assert int(stats["bytes"]) > 1000 and float(stats["audioSeconds"]) > 0.5
    assert 0 < float(stats["ttfaMs"]) < 1000  # the first audio within a second on the bundled model
    played = page.played_whole()
    # pcm and wav are played chunk by chunk as they arrive, the others by the page's <audio> once complete
    assert float(played["playedSeconds"]) == pytest.approx(float(stats["audioSeconds"]),
                                                           abs=0.01 if fmt in ("pcm", "wav") else 0.05)
    if via == "live":
        assert stats["rtf"] == "" and int(stats["segments"]) == 2  # speech.segment.done for each segment
    else:
        assert 0 < float(stats["rtf"]) < 1
    assert page.el("download").get_attribute("download") == f"speech.{fmt}"


def test_stop_ends_a_session(page) -> None:
    page.start("live", "pcm", "")
    page.wait(lambda: page.data("speak", "state") == "streaming", "the session to open")
    page.el("stop").click()
    assert page.finished()["state"] == "stopped"
    assert page.el("speak-button").is_enabled() and not page.el("end").is_displayed()


def test_the_servers_refusals_are_shown_in_its_words(page, server) -> None:
    page.el("speed").clear()
    page.el("speed").send_keys("9")
    page.start("http", "wav", SENTENCE)
    assert page.finished()["state"] == "error"
    refused = httpx.post(server.url + "/v1/audio/speech", headers=ADMIN,
                         json={"model": "tts-1", "input": SENTENCE, "speed": 9, "stream_format": "sse"})
    assert refused.status_code == 400 and server_message(refused) in page.el("speak-error").text
    page.start("http", "wav", "   ")
    assert page.el("speak-error").text == "Type the text to speak."
    # a WebSocket handshake's refusal is not shown to pages: the page asks the server over HTTP why
    page.use_key("not-the-key")
    page.start("ws", "pcm", SENTENCE)
    assert page.finished()["state"] == "error"
    assert "Missing or incorrect API key" in page.el("speak-error").text
    assert page.data("speak-error", "code") == "invalid_api_key"


def test_clips_from_a_file_and_the_microphone_become_voices_that_speak_and_are_deleted(page, server,
                                                                                     tmp_path) -> None:
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav(3.0, 24000))
    page.el("clone-name").send_keys("from-file")
    page.el("clone-file").send_keys(str(clip))
    page.el("clone-transcript").send_keys("Hello, this is my voice.")
    page.el("register").click()
    page.wait(lambda: page.data("clone", "state") in ("registered", "error"), "the registration")
    assert page.data("clone", "voice") == "from-file", page.el("clone-error").text
    assert page.el("voice").get_attribute("value") == "from-file"  # selected for Speak
    page.start("http", "wav", SENTENCE)
    stats = page.finished()
    assert stats["state"] == "done" and int(stats["bytes"]) > 1000

    page.el("register").click()  # the same name again: the server's 409, in its words
    page.wait(lambda: page.data("clone", "state") == "error", "the refusal")
    assert "already registered" in page.el("clone-error").text and page.data("clone-error", "code") == "voice_exists"

    page.el("record").click()
    page.wait(lambda: page.data("clone", "recording") == "true", "the microphone to record")
    page.wait(lambda: float(page.el("record-status").text.split()[1]) >= 1.5, "1.5 s of recording", timeout=10)
    page.el("record").click()
    assert page.data("clone", "clip") == "recording.wav"
    page.el("clone-name").clear()
    page.el("clone-name").send_keys("from-mic")
    page.el("clone-transcript").clear()
    page.el("register").click()
    page.wait(lambda: page.data("clone", "voice") == "from-mic" or page.data("clone", "state") == "error",
              "the registration")
    assert page.data("clone", "state") == "registered", page.el("clone-error").text
    card = httpx.get(server.url + "/v1/audio/voices/from-mic", headers=ADMIN).json()
    assert card["mode"] == "cross_lingual" and card["duration_seconds"] >= 1.5

    for name in ("from-mic", "from-file"):
        page.driver.find_element(page.by.CSS_SELECTOR, f'tr[data-voice="{name}"] button.delete').click()
        page.driver.switch_to.alert.accept()
        page.wait(lambda: page.data("voices", "deleted") == name and name not in page.voices(), f"{name} deleted")
    names = [v["id"] for v in httpx.get(server.url + "/v1/audio/voices", headers=ADMIN).json()["voices"]]
    assert "from-file" not in names and "from-mic" not in names
