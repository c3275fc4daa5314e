"""Torch wrappers around upstream's flow and HiFT modules, exported to the engine's ONNX interfaces.

Each wrapper calls upstream's own submodules and changes only what a batched, streaming ONNX graph needs:
- flow encoder: rows of different lengths in one batch; the pre-lookahead `context` tokens follow each
  row's tokens (upstream passes them separately); per-row `streaming` selects upstream's static chunk
  attention masks; the relative position table is computed, not a 5000-position constant.
- estimator: upstream's CausalConditionalDecoder, with per-row `streaming` choosing the chunk mask it
  builds internally (upstream's own export bakes `streaming=False`).
- HiFT: the source module's Gaussian noise is an input (upstream draws it inside); STFT and iSTFT are
  windowed-DFT convolutions (torch.stft/istft do not export); `cache_source` replaces the head of the
  source signal as in `HiFTGenerator.inference`, and the source comes back for the next chunk.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

OPSET = 18


def rel_pos_table(top: torch.Tensor, rows: torch.Tensor, d_model: int) -> torch.Tensor:
    """EspnetRelPositionalEncoding's rows for relative positions top, top-1, .., top-rows+1: [1, rows, d]."""
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
    pos = (top - torch.arange(0, rows)).to(torch.float32).unsqueeze(1)
    angle = pos * div
    return torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).reshape(1, -1, d_model)


def _rel_pos(size: torch.Tensor, d_model: int) -> torch.Tensor:
    """EspnetRelPositionalEncoding's table for `size` frames: [1, 2*size-1, d] for positions size-1 .. -(size-1)."""
    return rel_pos_table(size - 1, 2 * size - 1, d_model)


def _repeat(x: torch.Tensor, times: int) -> torch.Tensor:
    """Nearest-neighbour upsampling of x[B,C,T] to [B,C,T*times]."""
    return x.unsqueeze(-1).expand(-1, -1, -1, times).reshape(x.size(0), x.size(1), -1)


def _chunk_mask(valid: torch.Tensor, streaming: torch.Tensor, chunk: int) -> torch.Tensor:
    """[B,T] key validity + per-row streaming flag -> [B,T,T] attention mask (upstream's
    `add_optional_chunk_mask` with `static_chunk_size` for streaming rows, full context otherwise; a chunk
    of 0 is full context for every row, as upstream's encoder with `static_chunk_size: 0`)."""
    t = valid.size(1)
    pos = torch.arange(t)
    if chunk > 0:
        block = (torch.div(pos, chunk, rounding_mode="trunc") + 1) * chunk
        within = pos.unsqueeze(0) < block.unsqueeze(1)  # [T,T]
    else:  # the same expression, so the graph keeps its `streaming` input
        within = (pos.unsqueeze(0) >= 0) & (pos.unsqueeze(1) >= 0)
    return valid.unsqueeze(1) & (within.unsqueeze(0) | (streaming == 0).view(-1, 1, 1))


class FlowEncoder(nn.Module):
    """token[B,N] (prompt + tokens + context), token_len[B] (without context), context_len[B],
    streaming[B], embedding[B,192] -> mu[B,80,2N] (zero past 2*token_len), spks[B,80]."""

    def __init__(self, flow: nn.Module) -> None:
        super().__init__()
        self.flow = flow
        enc = flow.encoder
        self.chunk = int(enc.static_chunk_size)
        self.stride = int(enc.up_layer.stride)
        self.d = int(enc.output_size())

    def forward(self, token, token_len, context_len, streaming, embedding):
        flow, enc = self.flow, self.flow.encoder
        n = token.size(1)
        idx = torch.arange(n).unsqueeze(0)
        with_ctx = idx < (token_len + context_len).unsqueeze(1)
        x = flow.input_embedding(torch.clamp(token, min=0)) * with_ctx.unsqueeze(-1).to(torch.float32)
        # The input layer works per position, so the context goes through it like the tokens before it;
        # past each row's context, zeros as PreLookaheadLayer pads them.
        x = enc.embed.out(x) * enc.embed.pos_enc.xscale * with_ctx.unsqueeze(-1).to(torch.float32)
        # Rows keep the batch's full length (N = longest prompt + tokens + context): past a row's tokens
        # the attention masks hide positions, and every convolution is causal or looks only at the context.
        t = n
        pre = enc.pre_lookahead_layer
        h = F.pad(x.transpose(1, 2), (0, pre.pre_lookahead_len))
        h = F.leaky_relu(pre.conv1(h))
        h = pre.conv2(F.pad(h, (pre.conv2.kernel_size[0] - 1, 0)))
        xs = h.transpose(1, 2) + x
        valid = torch.arange(t).unsqueeze(0) < token_len.unsqueeze(1)
        masks = _chunk_mask(valid, streaming, self.chunk)
        pos_emb = _rel_pos(t, self.d)
        for layer in enc.encoders:
            xs, masks, _, _ = layer(xs, masks, pos_emb, valid.unsqueeze(1))
        # Upsample1D: nearest x stride (as a repeat: no Resize, whose scales fp16 conversion breaks), causal conv
        xs = _repeat(xs.transpose(1, 2), self.stride)
        xs = enc.up_layer.conv(F.pad(xs, (self.stride * 2, 0)))
        up_len = token_len * self.stride
        xs = enc.up_embed.out(xs.transpose(1, 2)) * enc.up_embed.pos_enc.xscale
        t2 = t * self.stride
        valid2 = torch.arange(t2).unsqueeze(0) < up_len.unsqueeze(1)
        masks2 = _chunk_mask(valid2, streaming, self.chunk * self.stride)
        pos_emb2 = _rel_pos(t2, self.d)
        for layer in enc.up_encoders:
            xs, masks2, _, _ = layer(xs, masks2, pos_emb2, valid2.unsqueeze(1))
        xs = enc.after_norm(xs)
        mu = flow.encoder_proj(xs).transpose(1, 2) * valid2.unsqueeze(1).to(torch.float32)
        spks = flow.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        return mu, spks


class Estimator(nn.Module):
    """x, mask, mu, t, spks, cond, streaming[B] -> estimator_out (upstream's export names plus `streaming`)."""

    def __init__(self, estimator: nn.Module) -> None:
        super().__init__()
        self.estimator = estimator

    def forward(self, x, mask, mu, t, spks, cond, streaming):
        def chunk_mask(xs, masks, _dynamic, _dynamic_left, _decoding, static_chunk_size, _left):
            return _chunk_mask(masks[:, 0, :], streaming, static_chunk_size)

        with mock.patch("cosyvoice.flow.decoder.add_optional_chunk_mask", chunk_mask):
            return self.estimator(x, mask, mu, t, spks, cond, streaming=True)


def _dft_kernels(n_fft: int, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.arange(n_fft // 2 + 1, dtype=torch.float64).unsqueeze(1)
    ang = 2 * math.pi * k * n / n_fft
    w = window.to(torch.float64)
    fwd = torch.cat([torch.cos(ang) * w, -torch.sin(ang) * w]).unsqueeze(1)  # [2F,1,n_fft]
    scale = torch.full((n_fft // 2 + 1, 1), 2.0, dtype=torch.float64)
    scale[0] = scale[-1] = 1.0
    inv = torch.cat([torch.cos(ang) * scale, -torch.sin(ang) * scale]) * w / n_fft
    return fwd.to(torch.float32), inv.unsqueeze(1).to(torch.float32)


class HiFT(nn.Module):
    """speech_feat[B,80,T], noise[B,T*480,harmonics+1], cache_source[B,1,C] -> waveform[B,T*480], source[B,1,T*480]."""

    def __init__(self, hift: nn.Module) -> None:
        super().__init__()
        self.hift = hift
        gen = hift.m_source.l_sin_gen
        self.upsample = int(gen.upsample_scale)
        self.n_fft = int(hift.istft_params["n_fft"])
        self.hop = int(hift.istft_params["hop_len"])
        fwd, inv = _dft_kernels(self.n_fft, hift.stft_window)
        self.register_buffer("fwd", fwd)
        self.register_buffer("inv", inv)
        self.register_buffer("win_sq", (hift.stft_window.to(torch.float32) ** 2).view(1, 1, -1))
        self.register_buffer("harmonics", torch.arange(1, gen.harmonic_num + 2, dtype=torch.float32).view(1, 1, -1))

    def _upsample_linear(self, x: torch.Tensor) -> torch.Tensor:
        """F.interpolate(x[B,C,T], scale_factor=upsample, mode='linear') with torch's float32 index math."""
        t = x.size(2)
        dst = torch.arange(t * self.upsample).to(torch.float32)
        src = torch.clamp((dst + 0.5) * torch.tensor(1.0 / self.upsample, dtype=torch.float32) - 0.5, min=0.0)
        i0 = src.to(torch.int64)
        lam = torch.clamp(src - i0.to(torch.float32), 0.0, 1.0)
        i1 = torch.clamp(i0 + 1, max=t - 1)
        return x[:, :, i0] * (1.0 - lam) + x[:, :, i1] * lam

    def _source(self, f0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """SourceModuleHnNSF2 over f0[B,T] (frame rate). SineGen2's random initial phase lands on sample 0,
        which its linear downsampling never reads, so it has no effect and is not an input."""
        m = self.hift.m_source
        gen = m.l_sin_gen
        # Per-frame phase increments: upstream upsamples f0 (nearest) then linearly downsamples the
        # increments again; inside a frame they are constant, so the frame value is exact.
        rad = (f0.unsqueeze(-1) * self.harmonics / gen.sampling_rate) % 1  # [B,T,H]
        phase = torch.cumsum(rad, dim=1) * 2 * np.pi
        phase = self._upsample_linear(phase.transpose(1, 2) * self.upsample).transpose(1, 2)  # [B,L,H]
        sines = torch.sin(phase) * gen.sine_amp
        f0_up = _repeat(f0.unsqueeze(1), self.upsample).transpose(1, 2)  # [B,L,1], as f0_upsamp (nearest)
        uv = (f0_up > gen.voiced_threshold).to(torch.float32)
        noise_amp = uv * gen.noise_std + (1 - uv) * gen.sine_amp / 3
        sine_waves = sines * uv + noise_amp * noise
        return m.l_tanh(m.l_linear(sine_waves)).transpose(1, 2)  # [B,1,L]

    def _stft(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pad = self.n_fft // 2
        spec = F.conv1d(F.pad(x.unsqueeze(1), (pad, pad), mode="reflect"), self.fwd, stride=self.hop)
        bins = self.n_fft // 2 + 1
        return spec[:, :bins], spec[:, bins:]

    def _istft(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        magnitude = torch.clip(magnitude, max=1e2)
        spec = torch.cat([magnitude * torch.cos(phase), magnitude * torch.sin(phase)], dim=1)
        y = F.conv_transpose1d(spec, self.inv, stride=self.hop)
        ones = torch.ones_like(spec[:, :1])
        env = F.conv_transpose1d(ones, self.win_sq, stride=self.hop)
        pad = self.n_fft // 2
        return (y / env)[:, 0, pad:-pad]

    def forward(self, speech_feat, noise, cache_source):
        hift = self.hift
        f0 = hift.f0_predictor(speech_feat)
        s = self._source(f0, noise)
        s = torch.cat([cache_source, s[:, :, cache_source.size(2):]], dim=2)
        with mock.patch.object(hift, "_stft", self._stft), mock.patch.object(hift, "_istft", self._istft):
            wav = hift.decode(x=speech_feat, s=s)
        return wav, s


@contextmanager
def _quiet():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def export(module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str], dynamic: dict) -> None:
    module.eval()
    with torch.no_grad(), _quiet():
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=dynamic,
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)


def export_flow_encoder(flow: nn.Module, path: Path) -> None:
    tok = torch.randint(0, 100, (2, 40), dtype=torch.int64)
    args = (tok, torch.tensor([37, 30]), torch.tensor([3, 0]), torch.tensor([1, 0]), torch.randn(2, 192))
    export(FlowEncoder(flow), args, path, ["token", "token_len", "context_len", "streaming", "embedding"], ["mu", "spks"],
           {"token": {0: "batch", 1: "tokens"}, "token_len": {0: "batch"}, "context_len": {0: "batch"},
            "streaming": {0: "batch"}, "embedding": {0: "batch"}, "mu": {0: "batch", 2: "frames"}, "spks": {0: "batch"}})


def export_estimator(estimator: nn.Module, path: Path, mel_bins: int, spk_bins: int) -> None:
    b, t = 2, 74
    args = (torch.randn(b, mel_bins, t), torch.ones(b, 1, t), torch.randn(b, mel_bins, t), torch.rand(b),
            torch.randn(b, spk_bins), torch.randn(b, mel_bins, t), torch.tensor([1, 0]))
    frames = {0: "batch", 2: "frames"}
    export(Estimator(estimator), args, path, ["x", "mask", "mu", "t", "spks", "cond", "streaming"], ["estimator_out"],
           {"x": frames, "mask": frames, "mu": frames, "t": {0: "batch"}, "spks": {0: "batch"}, "cond": frames,
            "streaming": {0: "batch"}, "estimator_out": frames})


def export_hift(hift: nn.Module, path: Path, hop_samples: int) -> None:
    wrapper = HiFT(hift)
    if wrapper.upsample != hop_samples:
        raise ValueError(f"hift upsamples by {wrapper.upsample}, the model's mel hop is {hop_samples}")
    t, harmonics = 12, int(wrapper.harmonics.shape[-1])
    args = (torch.randn(2, 80, t), torch.randn(2, t * hop_samples, harmonics), torch.randn(2, 1, hop_samples * 3))
    export(wrapper, args, path, ["speech_feat", "noise", "cache_source"], ["waveform", "source"],
           {"speech_feat": {0: "batch", 2: "frames"}, "noise": {0: "batch", 1: "samples"},
            "cache_source": {0: "batch", 2: "cached"}, "waveform": {0: "batch", 1: "samples"},
            "source": {0: "batch", 2: "samples"}})
