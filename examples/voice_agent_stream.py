"""A voice agent's reply, spoken while it is being written: an LLM-like token stream goes into
GET /v1/audio/speech/stream and the audio comes back before the reply is complete.

    cosyvoice-server serve --device cpu &          # or a CosyVoiceService's URL
    python examples/voice_agent_stream.py --url http://127.0.0.1:8000 --out reply.wav

Saves the audio as a WAV file and plays it with the first player found (aplay, paplay, ffplay,
afplay) unless --no-play. Swap `fake_llm` for your LLM client's token stream (e.g. the text deltas
of OpenAI's chat.completions.create(stream=True)).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import time
import wave
from collections.abc import AsyncIterator

from cosyvoice_server.client import AudioChunk, SegmentDone, connect

REPLY = ("Hi! I checked your booking. Your table for four is confirmed for eight tonight. "
         "Would you like me to add a note about the birthday cake?")
SENTENCE_ENDS = (".", "!", "?")


async def fake_llm(text: str, tokens_per_s: float) -> AsyncIterator[str]:
    """Yields `text` in LLM-sized pieces (up to four characters) at about `tokens_per_s`."""
    rng = random.Random(0)
    for n, word in enumerate(text.split(" ")):
        piece = word if n == 0 else " " + word
        for i in range(0, len(piece), 4):
            await asyncio.sleep(rng.expovariate(tokens_per_s))
            yield piece[i:i + 4]


async def speak_reply(args: argparse.Namespace) -> bytes:
    async with await connect(args.url, api_key=args.api_key or os.environ.get("COSYVOICE_API_KEY"), voice=args.voice,
                             response_format="pcm", seed=args.seed) as session:
        rate = session.session["sample_rate"]
        t0 = time.monotonic()

        async def feed() -> None:
            async for token in fake_llm(args.text, args.tokens_per_s):
                await session.append(token)
                if token.rstrip().endswith(SENTENCE_ENDS):
                    await session.flush()  # the end of a thought: speak it out now
            await session.end()
            print(f"{time.monotonic() - t0:6.2f} s  the LLM finished its reply")

        feeder = asyncio.create_task(feed())
        audio = bytearray()
        async for event in session:
            if isinstance(event, AudioChunk):
                if not audio:
                    print(f"{time.monotonic() - t0:6.2f} s  first audio")
                audio += event.data
            elif isinstance(event, SegmentDone):
                print(f"{time.monotonic() - t0:6.2f} s  segment {event.segment} done: "
                      f"{event.usage['input_characters']} characters, {event.usage['audio_seconds']:.2f} s of audio")
        await feeder
        print(f"{time.monotonic() - t0:6.2f} s  all audio received: {len(audio) / 2 / rate:.2f} s")
    with wave.open(args.out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(audio))
    return bytes(audio)


def play(path: str) -> None:
    for cmd in (["aplay", "-q"], ["paplay"], ["ffplay", "-nodisp", "-autoexit", "-loglevel", "quiet"], ["afplay"]):
        if shutil.which(cmd[0]):
            subprocess.run([*cmd, path], check=False)
            return
    print("no audio player found (aplay, paplay, ffplay, afplay); open the WAV file yourself")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server (http[s]:// or ws[s]://)")
    ap.add_argument("--api-key", default=None, help="default: $COSYVOICE_API_KEY, if set")
    ap.add_argument("--voice", default=None, help="a voice or alias (GET /v1/audio/voices); the model's default if unset")
    ap.add_argument("--text", default=REPLY, help="the reply the fake LLM writes")
    ap.add_argument("--tokens-per-s", type=float, default=25.0, help="how fast the fake LLM writes")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default="reply.wav")
    ap.add_argument("--no-play", action="store_true", help="only save the WAV file")
    args = ap.parse_args()
    asyncio.run(speak_reply(args))
    print(f"wrote {args.out}")
    if not args.no_play:
        play(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
