"""CosyVoice3's flow and vocoder (dit_flow.py, causal_hift.py) exported to the engine's ONNX interfaces.

- flow encoder: the token embedding and the pre-lookahead layer for rows of different lengths in one batch
  (each row's context tokens follow its tokens, zeros past them, as upstream pads them), then x
  token_mel_ratio; the speaker embedding normalised and projected. It has no attention, so it takes no
  `streaming` input.
- estimator: the DiT with one `streaming` flag per row.
- incremental estimator: the DiT over a streamed segment's new frames only (IncrementalDiT).
- vocoder: the causal HiFT's `finalize=True` run over mel and the fixed source noise (see causal_hift.py
  for why that is also what a non-final call returns, less its last frames).
"""

from __future__ import annotations

import math
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


class IncrementalDiT(nn.Module):
    """The DiT over a streamed segment's new frames, given what the earlier chunks computed (convert/incremental.py
    has the contract): x, mask, mu, cond [B,80,Tn], t [B], spks [B,80], offset [B] (frames before them), commit [B]
    (new frames whose states to return), past [B,depth,Tp,dim] (each block's normalised attention input for the
    first `offset` frames: keys and values are recomputed from it), conv_state [B,2,dim,K-1] (the positional
    convolutions' last inputs) -> estimator_out [B,80,Tn], new_past [B,depth,Tn,dim], new_conv_state.

    Under the streaming chunk mask a frame attends to frames of its own and earlier chunks, the positional
    convolutions are causal and everything else works per frame, so a frame of a complete chunk comes out the same
    in every later masked run (the noise is fixed and indexed from frame 0)."""

    def __init__(self, dit: nn.Module) -> None:
        super().__init__()
        reason = not_chunk_causal(dit)
        if reason:
            raise ValueError(reason)
        self.dit = dit
        self.chunk = int(dit.static_chunk_size)
        pos = dit.input_embed.conv_pos_embed
        self.convs = [pos.conv1[0], pos.conv2[0]]
        self.conv_frames = pos.kernel_size - 1
        self.width = int(dit.dim)

    def forward(self, x, mask, mu, t, spks, cond, offset, commit, past, conv_state):
        from .dit_flow import apply_rotary
        from .incremental import before_commit, sight

        dit = self.dit
        b, n = x.size(0), x.size(2)
        states: list[torch.Tensor] = []
        hidden: list[torch.Tensor] = []

        def conv(module: nn.Conv1d, h: torch.Tensor) -> torch.Tensor:
            seq = torch.cat([conv_state[:, len(states)], h], dim=2)  # [B,dim,K-1+Tn]
            states.append(before_commit(seq, commit, self.conv_frames))
            return F.mish(F.conv1d(seq, module.weight, module.bias, groups=module.groups))

        temb = dit.time_embed(t)
        ie = dit.input_embed
        parts = [x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2)]
        if ie.spk_dim > 0:
            parts.append(spks.unsqueeze(1).expand(-1, n, -1))
        h = ie.proj(torch.cat(parts, dim=-1))
        h = conv(self.convs[1], conv(self.convs[0], h.transpose(1, 2))).transpose(1, 2) + h
        residual = h

        frames = offset.view(-1, 1) + torch.arange(n).view(1, -1)  # [B,Tn] absolute positions
        valid = mask[:, 0, :] > 0
        sees = sight(mask, offset, past.size(2), n, self.chunk)
        inv = dit.rotary_embed.inv_freq
        key_pos = torch.cat([torch.arange(past.size(2)).view(1, -1).expand(b, -1), frames], dim=1).to(inv.dtype)

        def rope(pos: torch.Tensor) -> torch.Tensor:
            f = pos.unsqueeze(-1) * inv.view(1, 1, -1)
            return torch.stack((f, f), dim=-1).reshape(pos.size(0), pos.size(1), -1)

        rope_q, rope_k = rope(frames.to(inv.dtype)), rope(key_pos)
        for i, block in enumerate(dit.transformer_blocks):
            norm, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.attn_norm(h, temb)
            hidden.append(norm)
            attn = block.attn
            keys = torch.cat([past[:, i], norm], dim=1)
            d = attn.inner_dim // attn.heads
            q = apply_rotary(attn.to_q(norm), rope_q).reshape(b, n, attn.heads, d).transpose(1, 2)
            k = apply_rotary(attn.to_k(keys), rope_k).reshape(b, -1, attn.heads, d).transpose(1, 2)
            v = attn.to_v(keys).reshape(b, -1, attn.heads, d).transpose(1, 2)
            scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
            scores = scores.masked_fill(~sees.unsqueeze(1), float("-inf"))
            out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, n, attn.inner_dim)
            out = attn.to_out[0](out).masked_fill(~valid.unsqueeze(-1), 0.0)
            h = h + gate_msa.unsqueeze(1) * out
            ff_in = block.ff_norm(h) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
            h = h + gate_mlp.unsqueeze(1) * block.ff(ff_in)
        if dit.long_skip_connection is not None:
            h = dit.long_skip_connection(torch.cat((h, residual), dim=-1))
        out = dit.proj_out(dit.norm_out(h, temb)).transpose(1, 2)
        return out, torch.stack(hidden, dim=1), torch.stack(states, dim=1)


def not_chunk_causal(dit: nn.Module) -> str | None:
    """Why the DiT's masked output for a frame could change when later frames arrive; None if it cannot."""
    if int(getattr(dit, "static_chunk_size", 0)) <= 0:
        return "the DiT has no static chunk mask (static_chunk_size 0): every frame attends to all others"
    return None


def export_incremental_estimator(dit: nn.Module, path: Path, mel_bins: int, spk_bins: int) -> None:
    from .incremental import INPUTS, OUTPUTS

    wrapper = IncrementalDiT(dit)
    b, n, p = 2, 2 * wrapper.chunk, 3 * wrapper.chunk
    args = (torch.randn(b, mel_bins, n), torch.ones(b, 1, n), torch.randn(b, mel_bins, n), torch.rand(b),
            torch.randn(b, spk_bins), torch.randn(b, mel_bins, n), torch.tensor([p, p - wrapper.chunk]),
            torch.tensor([n, wrapper.chunk]), torch.randn(b, len(dit.transformer_blocks), p, wrapper.width),
            torch.randn(b, 2, wrapper.width, wrapper.conv_frames))
    new = {0: "batch", 2: "frames"}
    export(wrapper, args, path, INPUTS, OUTPUTS,
           {"x": new, "mask": new, "mu": new, "t": {0: "batch"}, "spks": {0: "batch"}, "cond": new,
            "offset": {0: "batch"}, "commit": {0: "batch"}, "past": {0: "batch", 2: "past"},
            "conv_state": {0: "batch"}, "estimator_out": new, "new_past": {0: "batch", 2: "frames"},
            "new_conv_state": {0: "batch"}})
