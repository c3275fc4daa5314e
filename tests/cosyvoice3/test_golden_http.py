"""The converted CosyVoice3 miniature served by `cosyvoice-server serve` against the audio upstream's
`CosyVoice3.inference_zero_shot` yielded for the same requests: whole, streamed (chunk by chunk), four at once,
and text streamed in over the WebSocket (upstream's `inference_bistream`). Lengths are exact; the audio is within
the int16 step of PCM, far inside the golden README's log-mel budget (0.002). Measured errors print as PARITY
lines (`pytest -s`)."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import numpy as np
import pytest

from cosyvoice_server.client.speech_stream import AudioChunk, connect, speak
from cosyvoice_server.engine.pipeline import load_voice
from cosyvoice_server.model.manifest import load_manifest
from cosyvoice_server.voices import spectral

API_KEY, REGISTRATION_KEY = "cv3-synthesis-key", "cv3-registration-key"
SYNTH = {"Authorization": f"Bearer {API_KEY}"}

PCM_TOL = 1.5 / 32768 + 2e-5  # the int16 step, and the float parity of the stages
LOG_MEL_BUDGET = 0.002  # the golden README: what a correct server lands within (the nearest wrong variant: 0.009)
STREAMED = ("river_stream", "lamp_stream", "market_stream")
WHOLE = ("river_whole", "lamp_whole", "short_whole")


PHONES = ('<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="x-cmu">'
          '<lexeme><grapheme>minute</grapheme><phoneme>M AY1 N UW1 T</phoneme></lexeme></lexicon>')


@pytest.fixture(scope="module")
def served(cv3_model, server_process, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cv3-server")
    (tmp / "lexicons" / "phones").mkdir(parents=True)
    (tmp / "lexicons" / "phones" / "phones.pls").write_text(PHONES)
    s = server_process(tmp, "--model-dir", str(cv3_model), "--voice-store-dir", str(tmp / "store"),
                       "--allow-voice-registration", "--lexicon-dir", str(tmp / "lexicons"),
                       env={"COSYVOICE_API_KEY": API_KEY, "COSYVOICE_VOICE_REGISTRATION_KEY": REGISTRATION_KEY}).wait_ready()
    s.store = tmp / "store"
    yield s
    s.stop()


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768


def compare(what: str, audio: np.ndarray, want: np.ndarray) -> None:
    assert len(audio) == len(want), what
    err = float(np.abs(audio - want).max())
    dist = float(np.abs(spectral.prompt_mel(audio) - spectral.prompt_mel(want)).mean())
    print(f"\nPARITY cosyvoice3 HTTP {what}: max abs {err:.2e}, log-mel L1 {dist:.2e}")
    assert err < PCM_TOL, what
    assert dist < LOG_MEL_BUDGET, what


def body(case: dict, **extra) -> dict:
    return {"model": "tts-1", "input": case["text"], "voice": case["voice"], "response_format": "pcm",
            "stream": case["stream"]} | extra


@pytest.mark.parametrize("name", [*WHOLE, *STREAMED])
def test_each_request_sounds_as_upstream(name, cases, served):
    c = cases[name]
    r = httpx.post(served.url + "/v1/audio/speech", json=body(c), headers=SYNTH, timeout=120)
    assert r.status_code == 200, r.text
    compare(name, pcm(r.content), c["arrays"]["audio"].ravel())


@pytest.mark.parametrize("name", STREAMED)
def test_streamed_chunks_are_upstreams_chunks(name, cases, served):
    """Hop 25 with the prompt pad, then 50 and 100 tokens; each chunk's audio held back by the vocoder's
    look-right: the chunk sizes upstream yields, one server-sent event each."""
    c = cases[name]
    sizes = []
    with httpx.stream("POST", served.url + "/v1/audio/speech", json=body(c, stream_format="sse"), headers=SYNTH,
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] == "speech.audio.delta":
                    sizes.append(len(base64.b64decode(event["audio"])) // 2)
    assert sizes == c["chunks"]


def test_four_at_once_each_as_alone(cases, served):
    names = ["lamp_stream", "river_whole", "market_stream", "short_whole"]

    async def run():
        async with httpx.AsyncClient(timeout=120, headers=SYNTH) as client:
            return await asyncio.gather(*(client.post(served.url + "/v1/audio/speech", json=body(cases[n]))
                                          for n in names))

    for name, r in zip(names, asyncio.run(run())):
        assert r.status_code == 200, r.text
        compare(f"{name} (4 at once)", pcm(r.content), cases[name]["arrays"]["audio"].ravel())


def test_text_streamed_in_sounds_as_upstreams_bistream(cases, served):
    c = cases["river_bistream"]

    async def run() -> bytes:
        async with await connect(served.url, voice=c["voice"], response_format="pcm", api_key=API_KEY) as stream:
            result = await speak(stream, c["text_pieces"])
        return result.audio

    compare("river_bistream (WebSocket)", pcm(asyncio.run(run())), c["arrays"]["audio"].ravel())


def test_the_model_card_names_the_family_and_its_markup(served):
    card = httpx.get(served.url + "/v1/models/tts-1", headers=SYNTH, timeout=10).json()
    caps = card["capabilities"]
    assert caps["family"] == "CosyVoice3"
    assert {"[breath]", "[laughter]", "<strong>"} <= set(caps["tags"])
    assert {"x-cmu", "x-pinyin"} <= set(caps["phone_alphabets"])
    assert caps["instructions"] is True


def test_audio_chunks_arrive_as_the_client_reads_them(cases, served):
    """The WebSocket's audio frames carry the chunks of the session (one per chunk the engine made)."""
    c = cases["river_bistream"]

    async def run() -> list[int]:
        async with await connect(served.url, voice=c["voice"], response_format="pcm", api_key=API_KEY) as stream:
            for piece in c["text_pieces"]:
                await stream.append(piece)
            await stream.end()
            return [len(e.data) // 2 async for e in stream if isinstance(e, AudioChunk)]

    assert asyncio.run(run()) == c["chunks"]


def test_a_voice_registered_from_a_clip_is_prompted_as_cosyvoice3(golden, cv3_model, served):
    """The transcript follows the system prompt in the LLM's prompt text, the prompt mel is CosyVoice3's (the
    whole band: feat_extractor's fmax null), and the voice speaks."""
    import io

    import soundfile as sf

    with np.load(golden / "feat.npz") as f:
        clip, feat = f["clip_24k"].ravel(), f["speech_feat"].reshape(-1, 80)
    buf = io.BytesIO()
    sf.write(buf, clip, 24000, format="WAV", subtype="FLOAT")
    r = httpx.post(served.url + "/v1/audio/voices", data={"name": "rita", "transcript": "A clip of my voice."},
                   files={"audio": ("clip.wav", buf.getvalue())},
                   headers={"Authorization": f"Bearer {REGISTRATION_KEY}"}, timeout=60)
    assert r.status_code == 201, r.text
    m = load_manifest(cv3_model)
    voice = load_voice(served.store / "voices" / "rita" / "voice.npz", m)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(cv3_model / "tokenizer.json"))
    want = tok.encode("You are a helpful assistant.<|endofprompt|>A clip of my voice.", add_special_tokens=False).ids
    assert list(voice.prompt_text_tokens) == want
    n = len(voice.prompt_speech_tokens)
    assert 0 < n and voice.prompt_mel.shape == (2 * n, 80)
    assert np.abs(voice.prompt_mel - feat[: 2 * n]).max() < 1e-4
    r = httpx.post(served.url + "/v1/audio/speech", headers=SYNTH, timeout=120,
                   json={"model": "tts-1", "input": "Hello from a new voice.", "voice": "rita", "response_format": "pcm"})
    assert r.status_code == 200 and len(r.content) > 0


def test_instructions_are_followed_in_cosyvoice3s_format(served):
    r = httpx.post(served.url + "/v1/audio/speech", headers=SYNTH, timeout=120,
                   json={"model": "tts-1", "input": "good night.", "voice": "erin", "response_format": "pcm",
                         "instructions": "Please speak slowly and warmly."})
    assert r.status_code == 200 and len(r.content) > 0


def test_a_lexicons_phoneme_rule_speaks_cosyvoice3s_phone_markup(served):
    """A PLS rule with CMU phones says the word as the same text with CosyVoice3's phone tokens would: the same
    audio, sample for sample (greedy decoding)."""
    def say(text: str, **extra) -> bytes:
        r = httpx.post(served.url + "/v1/audio/speech", headers=SYNTH, timeout=120,
                       json={"model": "tts-1", "input": text, "voice": "dave", "response_format": "pcm"} | extra)
        assert r.status_code == 200, r.text
        return r.content

    ruled = say("say minute please.", lexicons=["phones"])
    assert ruled == say("say [M][AY1][N][UW1][T] please.")
    assert ruled != say("say minute please.", lexicons=[])
