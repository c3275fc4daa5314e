"""CosyVoice3's flow and vocoder (dit_flow.py, causal_hift.py) exported to the engine's ONNX interfaces.

- flow encoder: the token embedding and the pre-lookahead layer for rows of different lengths in one batch
  (each row's context tokens follow its tokens, zeros past them, as upstream pads them), then x
  token_mel_ratio; the speaker embedding normalised and projected. It has no attention, so it takes no
  `streaming` input.
- estimator: the DiT with one `streaming` flag per row.
- vocoder: the causal HiFT's `finalize=True` run over mel and the fixed source noise (see causal_hift.py
  for why that is also what a non-final call returns, less its last frames).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .export import _repeat, export


class LookaheadEncoder(nn.Module):
    """token[B,N] (prompt + tokens + context), token_len[B] (without context), context_len[B],
    embedding[B,192] -> mu[B,80,ratio*N] (zero past ratio*token_len), spks[B,80]."""

    def __init__(self, flow: nn.Module) -> None:
        super().__init__()
        self.flow = flow
        self.ratio = int(flow.token_mel_ratio)

    def forward(self, token, token_len, context_len, embedding):
        flow, pre = self.flow, self.flow.pre_lookahead_layer
        idx = torch.arange(token.size(1)).unsqueeze(0)
        with_ctx = (idx < (token_len + context_len).unsqueeze(1)).unsqueeze(-1).to(torch.float32)
        x = flow.input_embedding(torch.clamp(token, min=0)) * with_ctx
        h = F.leaky_relu(pre.conv1(F.pad(x.transpose(1, 2), (0, pre.pre_lookahead_len))))
        h = pre.conv2(F.pad(h, (pre.conv2.kernel_size[0] - 1, 0))).transpose(1, 2) + x
        valid = (idx < token_len.unsqueeze(1)).unsqueeze(-1).to(torch.float32)
        mu = _repeat((h * valid).transpose(1, 2), self.ratio)
        spks = flow.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        return mu, spks


def export_flow_encoder(flow: nn.Module, path: Path) -> None:
    tok = torch.randint(0, 100, (2, 40), dtype=torch.int64)
    args = (tok, torch.tensor([37, 30]), torch.tensor([3, 0]), torch.randn(2, 192))
    export(LookaheadEncoder(flow), args, path, ["token", "token_len", "context_len", "embedding"], ["mu", "spks"],
           {"token": {0: "batch", 1: "tokens"}, "token_len": {0: "batch"}, "context_len": {0: "batch"},
            "embedding": {0: "batch"}, "mu": {0: "batch", 2: "frames"}, "spks": {0: "batch"}})


def export_estimator(dit: nn.Module, path: Path, mel_bins: int, spk_bins: int) -> None:
    b, t = 2, 2 * int(dit.static_chunk_size) + 11  # a partial chunk after whole ones
    args = (torch.randn(b, mel_bins, t), torch.ones(b, 1, t), torch.randn(b, mel_bins, t), torch.rand(b),
            torch.randn(b, spk_bins), torch.randn(b, mel_bins, t), torch.tensor([1, 0]))
    frames = {0: "batch", 2: "frames"}
    export(dit, args, path, ["x", "mask", "mu", "t", "spks", "cond", "streaming"], ["estimator_out"],
           {"x": frames, "mask": frames, "mu": frames, "t": {0: "batch"}, "spks": {0: "batch"}, "cond": frames,
            "streaming": {0: "batch"}, "estimator_out": frames})


def export_vocoder(hift: nn.Module, path: Path, hop_samples: int) -> None:
    if hift.upsample_scale != hop_samples:
        raise ValueError(f"hift upsamples by {hift.upsample_scale}, the model's mel hop is {hop_samples}")
    t = 12
    args = (torch.randn(2, 80, t), hift.fixed_noise(t * hop_samples).unsqueeze(0).expand(2, -1, -1).contiguous())
    export(hift, args, path, ["speech_feat", "noise"], ["waveform"],
           {"speech_feat": {0: "batch", 2: "frames"}, "noise": {0: "batch", 1: "samples"},
            "waveform": {0: "batch", 1: "samples"}})
