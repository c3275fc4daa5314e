"""Bistream sessions on the converted miniature against upstream main's `inference_bistream` (greedy):
the same speech tokens for the same text whatever its chunking, and the same audio as upstream's
streaming token2wav loop over those tokens (seeded vocoder noise drawn the same way). Measured errors
are printed as PARITY lines (`pytest -s`)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from bistream_reference import bistream_tokens
from sessions import Session, feed, speak

from cosyvoice_server.frontend import normalize as clean
from cosyvoice_server.scheduling.request import Outcome, request_rngs

TOL = 1e-4  # the float parity tolerance of tests/convert
TEXT = "Hello world, this is a small test of speech synthesis, fed the way a language model writes it."


def chunkings(text: str) -> dict[str, list[str]]:
    rng = np.random.default_rng(3)
    cuts = sorted(rng.choice(np.arange(1, len(text)), 9, replace=False))
    words = text.split(" ")
    return {
        "whole": [text],
        "words": [w + " " for w in words[:-1]] + [words[-1]],
        "characters": list(text),
        "random splits (mid-word)": [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])],
    }


def report(what: str, err: float) -> None:
    print(f"\nPARITY bistream {what}: max abs {err:.2e}")


def upstream_audio(reference, segments_tokens: list[list[int]], voice: str, seed: int) -> np.ndarray:
    """Upstream's streaming token2wav loop per segment, one request's vocoder noise across them."""
    spk = reference.speaker(voice)
    noise = request_rngs(seed)[1]
    out = []
    for tokens in segments_tokens:
        out += reference.tts(tokens, spk, True, lambda n: noise.standard_normal((n, 9), np.float32))
    return np.concatenate(out)


@pytest.mark.parametrize("voice", ["spk_a", "spk_b"])  # SFT (no prompt), zero-shot prompt (interleaved prompt)
async def test_speech_tokens_equal_upstream_for_every_chunking(mini, serve, reference, voice):
    state = serve(mini)
    text_ids = mini.frontend.encode(clean(TEXT))
    want = bistream_tokens(reference, text_ids, reference.speaker(voice))
    want_audio = upstream_audio(reference, [want], voice, seed=5)
    assert len(want) > 3 * 15  # several text groups and fills, then the final decode
    for name, parts in chunkings(TEXT).items():
        s = await speak(state, parts, voice, seed=5, pause_s=0.002)
        assert s.done.outcome == Outcome.OK, s.done
        assert s.req.tokens == want, name
        assert len(s.segments) == 1 and s.segments[0].text_tokens == len(text_ids)
        assert s.segments[0].speech_tokens == len(want)
        assert s.audio.shape == want_audio.shape, name
        err = float(np.abs(s.audio - want_audio).max())
        report(f"{voice} {name} ({len(parts)} deltas, {len(want)} tokens) audio", err)
        assert err <= TOL


async def test_each_flushed_segment_is_an_upstream_bistream_call(mini, serve, reference):
    state = serve(mini)
    first, second = "Short thought one, spoken now.", "And then the second one follows it."
    s = await speak(state, [first[:7], first[7:], None, second[:11], second[11:]], "spk_b", seed=9, pause_s=0.002)
    assert s.done.outcome == Outcome.OK
    spk = reference.speaker("spk_b")
    want = [bistream_tokens(reference, mini.frontend.encode(t), spk) for t in (first, second)]
    assert [seg.speech_tokens for seg in s.segments] == [len(w) for w in want]
    assert s.req.tokens == want[0] + want[1]
    want_audio = upstream_audio(reference, want, "spk_b", seed=9)
    err = float(np.abs(s.audio - want_audio).max())
    report("two flushed segments audio", err)
    assert err <= TOL


async def test_sessions_batched_together_match_upstream_alone(mini, serve, reference):
    """Six sessions, different texts and voices, fed concurrently: each as upstream one by one."""
    state = serve(mini, max_batch_size=4)  # fewer slots than sessions: parked ones make room
    words = TEXT.split(" ")
    cases = [(" ".join(words[i:i + 6 + i]), ["spk_a", "spk_b"][i % 2]) for i in range(6)]
    sessions = await asyncio.gather(*[speak(state, [w + " " for w in text.split(" ")], voice, seed=i, pause_s=0.003)
                                      for i, (text, voice) in enumerate(cases)])
    for (text, voice), s in zip(cases, sessions):
        assert s.done.outcome == Outcome.OK
        assert s.req.tokens == bistream_tokens(reference, mini.frontend.encode(clean(text)), reference.speaker(voice))


@pytest.mark.parametrize("mode", ["instructed", "cross-lingual"])
async def test_instructed_and_cross_lingual_sessions_match_upstream(mini, serve, reference, mode):
    """instruct2 (the instruction as the LLM's prompt text, no LLM prompt speech) and a cross-lingual voice
    (no LLM prompt at all), both with spk_b's flow prompt, as upstream runs them on streamed text."""
    import dataclasses

    import torch

    state = serve(mini)
    spk = reference.speaker("spk_b")
    empty = torch.zeros(1, 0, dtype=torch.int32)
    if mode == "instructed":
        instructions = "Speak slowly, in a warm voice."
        req_args = {"voice": "spk_b", "instructions": instructions}
        prompt_text = torch.tensor([mini.frontend.instruction_tokens(instructions)], dtype=torch.int32)
    else:
        v = mini.voices["spk_b"]  # as a clip without transcript gives it: no prompt text, no LLM prompt speech
        req_args = {"voice": dataclasses.replace(v, cross_lingual=True, prompt_text_tokens=v.prompt_text_tokens[:0])}
        prompt_text = empty
    want = bistream_tokens(reference, mini.frontend.encode(clean(TEXT)), {**spk, "prompt_text": prompt_text,
                                                                           "prompt_token": empty})
    want_audio = upstream_audio(reference, [want], "spk_b", seed=2)
    for name, parts in list(chunkings(TEXT).items())[1:3]:
        req = state.new_bistream_request(seed=2, **req_args)
        state.scheduler.submit(req)
        s = Session(req)
        collecting = asyncio.create_task(s.collect())
        await feed(req, parts, 0.002)
        await collecting
        assert s.done.outcome == Outcome.OK
        assert req.tokens == want, name
        err = float(np.abs(s.audio - want_audio).max())
        report(f"{mode} {name} audio", err)
        assert s.audio.shape == want_audio.shape and err <= TOL
