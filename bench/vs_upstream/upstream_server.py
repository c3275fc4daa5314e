"""Upstream CosyVoice2's own PyTorch inference behind the speech API, run the way upstream's FastAPI server
runs it: one model object shared by every request, a thread per request (Starlette iterates the sync
generator in its thread pool), the LLM of each request in a thread of its own.

The models are upstream's classes (`cosyvoice-minicpmo`) built from the checkpoint's cosyvoice2.yaml with its
state dicts. The package's CosyVoice2Model is a trimmed snapshot, so `tts` restates upstream main's
`CosyVoice2Model.tts`/`token2wav` loop (cli/model.py) around upstream's calls: the LLM appends tokens as it
samples them; every 0.1 s the request's thread checks for hop + 3 look-ahead tokens (hop 25 plus the
prompt's pad, doubling to 100) and runs `flow.inference` over all tokens so far (streaming masks), then
`hift.inference` with the mel and source caches and upstream's Hamming cross-fade; the last chunk runs the
flow unmasked (finalize). Text goes through the converted model's tokenizer (the same Qwen2 vocabulary
upstream's frontend uses); upstream's text normalisation is not part of what is timed.

    python -m bench.vs_upstream.upstream_server --checkpoint CKPT --model-dir CONVERTED --port 8100 [--threads 2]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from cosyvoice_server.convert import upstream
from cosyvoice_server.convert.miniature import upstream_modules
from cosyvoice_server.frontend import TextFrontend
from cosyvoice_server.model.manifest import load_manifest

MEL_CACHE, HOP, TOKEN_HOP, MAX_HOP, SCALE, LOOKAHEAD = 8, 480, 25, 100, 2, 3


class Speech(BaseModel):
    input: str
    voice: str | None = None
    stream: bool = False
    model: str | None = None
    response_format: str = "pcm"
    seed: int | None = None


class Upstream:
    def __init__(self, ckpt: Path, model_dir: Path) -> None:
        upstream.load()
        from cosyvoice.llm.llm import Qwen2LM

        configs = upstream_modules((ckpt / "cosyvoice2.yaml").read_text(), ckpt / "CosyVoice-BlankEN")
        self.llm, self.flow, self.hift = configs["llm"], configs["flow"], configs["hift"]
        for module, name in ((self.llm, "llm.pt"), (self.flow, "flow.pt"), (self.hift, "hift.pt")):
            module.load_state_dict(torch.load(ckpt / name, map_location="cpu", weights_only=True), strict=True)
            module.eval()

        def sampling_ids(self, weighted_scores, decoded_tokens, sampling, ignore_eos=True):  # main's: eos masked
            if ignore_eos:
                weighted_scores[self.speech_token_size] = -float("inf")
            return self.sampling(weighted_scores, decoded_tokens, sampling)

        Qwen2LM.sampling_ids = sampling_ids
        self.spk2info = torch.load(ckpt / "spk2info.pt", weights_only=True)
        m = load_manifest(model_dir)
        self.frontend = TextFrontend.of_model(model_dir, m.frontend)
        self.default_voice = m.voices.default
        self.window = np.hamming(2 * MEL_CACHE * HOP)
        self.seconds: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    def _timed(self, stage: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            with self._lock:
                self.seconds[stage] += time.perf_counter() - t0

    def speaker(self, name: str) -> dict:
        s = self.spk2info[name]
        empty_tok, empty_feat = torch.zeros(1, 0, dtype=torch.int32), torch.zeros(1, 0, 80)
        return {"embedding": s["flow_embedding"] if "flow_embedding" in s else s["embedding"], "prompt_text": s.get("prompt_text", empty_tok),
                "prompt_token": s.get("flow_prompt_speech_token", empty_tok),
                "llm_prompt_token": s.get("llm_prompt_speech_token", empty_tok),
                "prompt_feat": s.get("prompt_speech_feat", empty_feat)}

    @torch.inference_mode()
    def _llm_job(self, text: list[int], spk: dict, out: list[int], done: threading.Event) -> None:
        t = torch.tensor([text], dtype=torch.int32)
        pt = spk["llm_prompt_token"]
        gen = self.llm.inference(text=t, text_len=torch.tensor([t.shape[1]], dtype=torch.int32),
                                 prompt_text=spk["prompt_text"],
                                 prompt_text_len=torch.tensor([spk["prompt_text"].shape[1]], dtype=torch.int32),
                                 prompt_speech_token=pt, prompt_speech_token_len=torch.tensor([pt.shape[1]], dtype=torch.int32),
                                 embedding=spk["embedding"])
        try:
            while True:
                tok = self._timed("llm", next, gen, None)
                if tok is None:
                    break
                out.append(int(tok))
        finally:
            done.set()

    @torch.inference_mode()
    def _token2wav(self, tokens: list[int], spk: dict, offset: int, finalize: bool, cache: dict) -> np.ndarray:
        from cosyvoice.utils.common import fade_in_out

        tok = torch.tensor([tokens], dtype=torch.int32)
        pt, pf = spk["prompt_token"], spk["prompt_feat"]
        mel, _ = self._timed("flow", self.flow.inference, token=tok, token_len=torch.tensor([tok.shape[1]], dtype=torch.int32),
                             prompt_token=pt, prompt_token_len=torch.tensor([pt.shape[1]], dtype=torch.int32),
                             prompt_feat=pf, prompt_feat_len=torch.tensor([pf.shape[1]], dtype=torch.int32),
                             embedding=spk["embedding"], streaming=not finalize, finalize=finalize)
        mel = mel[:, :, offset * 2:]
        t0 = time.perf_counter()
        source = torch.zeros(1, 1, 0)
        if "mel" in cache:
            mel, source = torch.concat([cache["mel"], mel], dim=2), cache["source"]
        speech, source = self.hift.inference(speech_feat=mel, cache_source=source)
        if "speech" in cache:
            speech = fade_in_out(speech, cache["speech"], self.window)
        if not finalize:
            cache.update(mel=mel[:, :, -MEL_CACHE:], source=source[:, :, -MEL_CACHE * HOP:],
                         speech=speech[:, -MEL_CACHE * HOP:])
            speech = speech[:, : -MEL_CACHE * HOP]
        with self._lock:
            self.seconds["vocoder"] += time.perf_counter() - t0
        return speech[0].numpy()

    def tts(self, text: list[int], voice: str, stream: bool):
        spk = self.speaker(voice)
        tokens: list[int] = []
        done = threading.Event()
        threading.Thread(target=self._llm_job, args=(text, spk, tokens, done), daemon=True).start()
        cache: dict = {}
        offset, hop = 0, TOKEN_HOP
        p = spk["prompt_token"].shape[1]
        pad = int(np.ceil(p / hop) * hop - p)
        while stream:
            time.sleep(0.1)
            this_hop = hop + pad if offset == 0 else hop
            if len(tokens) - offset >= this_hop + LOOKAHEAD:
                yield self._token2wav(tokens[: offset + this_hop + LOOKAHEAD], spk, offset, False, cache)
                offset += this_hop
                hop = min(MAX_HOP, hop * SCALE)
            if done.is_set() and len(tokens) - offset < this_hop + LOOKAHEAD:
                break
        done.wait()
        yield self._token2wav(list(tokens), spk, offset, True, cache)


def app(up) -> FastAPI:
    """The speech API over an upstream model wrapper (this module's Upstream, or upstream3_server's): its
    frontend, default voice, `tts` generator of float audio, and stage seconds."""
    api = FastAPI()

    @api.post("/v1/audio/speech")
    def speech(body: Speech):
        voice = body.voice or up.default_voice
        segments = [s.tolist() for s in up.frontend.segments(body.input)]

        def pcm():
            for seg in segments:
                for audio in up.tts(seg, voice, body.stream):
                    yield (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()

        return StreamingResponse(pcm(), media_type="audio/pcm")

    @api.get("/stats")
    def stats():
        with up._lock:
            return dict(up.seconds)

    @api.get("/readyz")
    def ready():
        return {"ok": True}

    return api


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default, every core)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    uvicorn.run(app(Upstream(args.checkpoint, args.model_dir)), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
