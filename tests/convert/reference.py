"""Upstream CosyVoice2 inference on a checkpoint directory, as the parity reference.

Models are upstream's own classes (`cosyvoice-minicpmo`, built from the checkpoint's cosyvoice2.yaml
and state dicts): Qwen2LM.inference, CausalMaskedDiffWithXvec.inference, HiFTGenerator.inference and
utils.common.fade_in_out. The package's CosyVoice2Model/CosyVoice2 classes are a trimmed snapshot (no
LLM, no hop growth) and its frontend needs whisper, so `tts` below restates upstream main's
`CosyVoice2Model.tts`/`token2wav` loop (cli/model.py) around those calls. Where the snapshot differs
from main it follows main:
- `sampling_ids`: main masks the eos logit while under min_len (the snapshot resamples up to 100 times);
- streaming hop: token_hop_len 25, doubled after every chunk up to token_max_hop_len 100 (per request
  here; main keeps it on the shared model object, its issue #1798).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cosyvoice_server.convert import upstream
from cosyvoice_server.convert.miniature import upstream_modules

MEL_CACHE, HOP, TOKEN_HOP, MAX_HOP, SCALE = 8, 480, 25, 100, 2


def _main_sampling_ids(self, weighted_scores, decoded_tokens, sampling, ignore_eos=True):
    if ignore_eos:
        weighted_scores[self.speech_token_size] = -float("inf")
    return self.sampling(weighted_scores, decoded_tokens, sampling)


@dataclass
class Reference:
    llm: torch.nn.Module
    flow: torch.nn.Module
    hift: torch.nn.Module
    spk2info: dict

    @classmethod
    def load(cls, ckpt: Path, greedy: bool = True) -> Reference:
        upstream.load()

        from cosyvoice.llm.llm import Qwen2LM
        from cosyvoice.utils.common import ras_sampling

        configs = upstream_modules((ckpt / "cosyvoice2.yaml").read_text(), ckpt / "CosyVoice-BlankEN")
        llm, flow, hift = configs["llm"], configs["flow"], configs["hift"]
        for module, name in ((llm, "llm.pt"), (flow, "flow.pt"), (hift, "hift.pt")):
            module.load_state_dict(torch.load(ckpt / name, map_location="cpu", weights_only=True), strict=True)
            module.eval()
        Qwen2LM.sampling_ids = _main_sampling_ids
        if greedy:  # top-1, and a repetition threshold (10 x 100) the window can never reach
            llm.sampling = functools.partial(ras_sampling, top_p=0.8, top_k=1, win_size=10, tau_r=100.0)
        return cls(llm, flow, hift, torch.load(ckpt / "spk2info.pt", weights_only=True))

    # LLM --------------------------------------------------------------------------------------------
    def speaker(self, name: str) -> dict:
        s = self.spk2info[name]
        empty_tok, empty_feat = torch.zeros(1, 0, dtype=torch.int32), torch.zeros(1, 0, 80)
        return {
            "embedding": s["flow_embedding"] if "flow_embedding" in s else s["embedding"],
            "prompt_text": s.get("prompt_text", empty_tok),
            "prompt_token": s.get("flow_prompt_speech_token", empty_tok),
            "prompt_feat": s.get("prompt_speech_feat", empty_feat),
        }

    def lm_input(self, text: list[int], spk: dict) -> torch.Tensor:
        llm = self.llm
        t = torch.tensor([list(spk["prompt_text"].reshape(-1).tolist()) + text])
        parts = [llm.llm_embedding.weight[llm.sos_eos].reshape(1, 1, -1), llm.llm.model.model.embed_tokens(t),
                 llm.llm_embedding.weight[llm.task_id].reshape(1, 1, -1)]
        llm_tok = spk.get("llm_prompt_token", spk["prompt_token"])
        if llm_tok.shape[1]:
            parts.append(llm.speech_embedding(llm_tok.long()))
        return torch.concat(parts, dim=1)

    @torch.no_grad()
    def teacher_forced_logits(self, text: list[int], spk: dict, tokens: list[int]) -> np.ndarray:
        """llm_decoder logits before each of `tokens` (and after the last), one forward_one_step at a time."""
        lm_input, cache, out = self.lm_input(text, spk), None, []
        for tok in [None, *tokens]:
            if tok is not None:
                lm_input = self.llm.speech_embedding.weight[tok].reshape(1, 1, -1)
            mask = torch.tril(torch.ones((1, lm_input.shape[1], lm_input.shape[1]))).to(torch.bool)
            y, cache = self.llm.llm.forward_one_step(lm_input, masks=mask, cache=cache)
            out.append(self.llm.llm_decoder(y[:, -1])[0].numpy())
        return np.stack(out)

    @torch.no_grad()
    def tokens(self, text: list[int], spk: dict) -> list[int]:
        """Qwen2LM.inference; `llm_prompt_token` (upstream's llm_prompt_speech_token) defaults to the flow's."""
        t = torch.tensor([text], dtype=torch.int32)
        llm_tok = spk.get("llm_prompt_token", spk["prompt_token"])
        return [int(x) for x in self.llm.inference(
            text=t, text_len=torch.tensor([t.shape[1]], dtype=torch.int32),
            prompt_text=spk["prompt_text"], prompt_text_len=torch.tensor([spk["prompt_text"].shape[1]], dtype=torch.int32),
            prompt_speech_token=llm_tok, prompt_speech_token_len=torch.tensor([llm_tok.shape[1]], dtype=torch.int32),
            embedding=spk["embedding"])]

    # Flow and HiFT ---------------------------------------------------------------------------------
    @torch.no_grad()
    def flow_mel(self, tokens: list[int], spk: dict, streaming: bool, finalize: bool) -> np.ndarray:
        tok = torch.tensor([tokens], dtype=torch.int32)
        pt, pf = spk["prompt_token"], spk["prompt_feat"]
        mel, _ = self.flow.inference(token=tok, token_len=torch.tensor([tok.shape[1]], dtype=torch.int32),
                                     prompt_token=pt, prompt_token_len=torch.tensor([pt.shape[1]], dtype=torch.int32),
                                     prompt_feat=pf, prompt_feat_len=torch.tensor([pf.shape[1]], dtype=torch.int32),
                                     embedding=spk["embedding"], streaming=streaming, finalize=finalize)
        return mel[0].numpy()

    @torch.no_grad()
    def hift_run(self, mel: np.ndarray, cache_source: np.ndarray, noise: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """HiFTGenerator.inference; `noise` pins the source module's Gaussian draw (else upstream draws it)."""
        with pinned_noise(noise):
            wav, src = self.hift.inference(speech_feat=torch.from_numpy(mel)[None],
                                           cache_source=torch.from_numpy(cache_source).reshape(1, 1, -1))
        return wav[0].numpy(), src[0, 0].numpy()

    def tts(self, tokens: list[int], spk: dict, stream: bool, noise_for=None, speed: float = 1.0) -> list[np.ndarray]:
        """Main's CosyVoice2Model.tts after the LLM: the audio chunks it yields for one text segment.
        `noise_for(samples)` pins each HiFT call's source noise."""
        from cosyvoice.utils.common import fade_in_out

        window = np.hamming(2 * MEL_CACHE * HOP)
        cache: dict | None = None
        out = []

        def token2wav(toks, offset, streaming, finalize):
            nonlocal cache
            mel = self.flow_mel(toks, spk, streaming, finalize)[:, offset * 2:]
            src_cache = np.zeros(0, np.float32)
            if cache is not None:
                mel, src_cache = np.concatenate([cache["mel"], mel], axis=1), cache["source"]
            elif finalize and speed != 1.0:
                mel = torch.nn.functional.interpolate(torch.from_numpy(mel)[None], size=int(mel.shape[1] / speed),
                                                      mode="linear")[0].numpy()
            wav, src = self.hift_run(mel, src_cache, noise_for(mel.shape[1] * HOP) if noise_for is not None else None)
            speech = torch.from_numpy(wav)[None]
            if cache is not None:
                speech = fade_in_out(speech, torch.from_numpy(cache["speech"])[None], window)
            speech = speech[0].numpy()
            if finalize:
                return speech
            cache = {"mel": mel[:, -MEL_CACHE:], "source": src[-MEL_CACHE * HOP:], "speech": speech[-MEL_CACHE * HOP:]}
            return speech[: -MEL_CACHE * HOP]

        if not stream:
            return [token2wav(tokens, 0, False, True)]
        offset, hop = 0, TOKEN_HOP
        p = spk["prompt_token"].shape[1]
        pad = int(np.ceil(p / hop) * hop - p)
        while True:
            this_hop = hop + pad if offset == 0 else hop
            if len(tokens) - offset < this_hop + 3:
                break
            out.append(token2wav(tokens[: offset + this_hop + 3], offset, True, False))
            offset += this_hop
            hop = min(MAX_HOP, hop * SCALE)
        out.append(token2wav(tokens, offset, False, True))
        return out


@contextmanager
def pinned_noise(noise: np.ndarray | None):
    """Makes SineGen2's `torch.randn_like(sine_waves)` return `noise` [L, harmonics]."""
    if noise is None:
        yield
        return
    real = torch.randn_like

    def fake(x, *args, **kwargs):
        if x.dim() == 3 and x.shape[1:] == noise.shape:
            return torch.from_numpy(noise)[None].to(x.dtype)
        return real(x, *args, **kwargs)

    torch.randn_like = fake
    try:
        yield
    finally:
        torch.randn_like = real


def log_mel(wav: np.ndarray, sr: int = 24000, n_fft: int = 1920, hop: int = 480, bins: int = 80) -> np.ndarray:
    """log of an 80-bin mel magnitude spectrogram (CosyVoice2's n_fft, hop and bins; triangular HTK
    filters up to 8 kHz), for spectral distances between two renderings."""
    pad = np.pad(wav.astype(np.float64), (n_fft // 2, n_fft // 2), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(pad, n_fft)[::hop] * np.hanning(n_fft)
    mag = np.abs(np.fft.rfft(frames, axis=1))
    hz = np.fft.rfftfreq(n_fft, 1 / sr)
    mel = lambda f: 2595 * np.log10(1 + f / 700)  # noqa: E731
    edges = 700 * (10 ** (np.linspace(mel(0), mel(8000), bins + 2) / 2595) - 1)
    fb = np.maximum(0, np.minimum((hz[None] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None]),
                                  (edges[2:, None] - hz[None]) / (edges[2:, None] - edges[1:-1, None])))
    return np.log(np.maximum(mag @ fb.T, 1e-5))
