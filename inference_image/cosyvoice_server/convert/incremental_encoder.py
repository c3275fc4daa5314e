"""Upstream's UpsampleConformerEncoder over a streamed segment's new tokens only, exported to ONNX.

Upstream streams by running the flow encoder over every token so far with static chunk masks (25 tokens at
token rate, 50 frames after the upsampling, every earlier chunk in sight). Under those masks a token of a
complete chunk attends only to tokens of its own and earlier chunks, and the encoder's convolutions reach a few
tokens either side: PreLookaheadLayer's conv1 looks `pre_lookahead_len` tokens ahead (a streamed chunk's
`context`, the real next tokens), its conv2 and Upsample1D's convolution look back. So a token of a complete
chunk whose look-ahead tokens are known comes out the same in every later masked run of the segment. This
graph takes what earlier runs computed for those settled tokens (each attention layer's keys and values, at
token and at frame rate, and the token-rate outputs Upsample1D's convolution reads next) and runs the encoder
over the tokens after them; it returns the same states for the new tokens, so the engine keeps those of
complete chunks.

`not_chunk_causal` says which part stops an encoder from being computed this way; convert then ships no
incremental encoder and the engine re-runs the encoder over every prefix, as upstream does.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .export import _repeat, export, rel_pos_table
from .incremental import before_commit, sight


def not_chunk_causal(enc: nn.Module) -> str | None:
    """Why the encoder's masked output for a settled token could change when later tokens arrive, or why this
    graph cannot compute it; None if neither."""
    from cosyvoice.transformer.attention import RelPositionMultiHeadedAttention
    from cosyvoice.transformer.embedding import EspnetRelPositionalEncoding
    from cosyvoice.transformer.subsampling import LinearNoSubsampling
    from cosyvoice.transformer.upsample_encoder import UpsampleConformerEncoder

    if not isinstance(enc, UpsampleConformerEncoder):
        return f"the flow encoder is {type(enc).__name__}, not upstream's UpsampleConformerEncoder"
    if int(enc.static_chunk_size) <= 0:
        return "the encoder has no static chunk mask (static_chunk_size 0): every token attends to all others"
    if enc.global_cmvn is not None:
        return "the encoder normalises its input with a global CMVN"
    for embed in (enc.embed, enc.up_embed):
        if not isinstance(embed, LinearNoSubsampling) or not isinstance(embed.pos_enc, EspnetRelPositionalEncoding):
            return "the encoder's input layers are not linear with espnet relative positions (rel_pos_espnet)"
    for layer in (*enc.encoders, *enc.up_encoders):
        if layer.conv_module is not None:
            return "a conformer block has a convolution module, which looks at later frames (use_cnn_module)"
        if not layer.normalize_before:
            return "a conformer block normalises after its sub-blocks (normalize_before false)"
        if type(layer.self_attn) is not RelPositionMultiHeadedAttention:
            return f"a conformer block's attention is {type(layer.self_attn).__name__}, not rel_selfattn"
    return None


def _left_tokens(enc: nn.Module) -> int:
    """Tokens before the new ones that the new ones' outputs read: PreLookaheadLayer's conv2 (causal) and
    Upsample1D's convolution (causal over the repeated tokens) look that far back."""
    up = enc.up_layer
    return max(enc.pre_lookahead_layer.conv2.kernel_size[0] - 1, math.ceil((up.conv.kernel_size[0] - 1) / up.stride))


class _Layers:
    """Upstream's conformer blocks over new positions, each attending to its cached keys and values too."""

    def __init__(self, layers: nn.ModuleList, chunk: int, width: int) -> None:
        self.layers, self.chunk, self.width = layers, chunk, width

    def __call__(self, xs: torch.Tensor, valid: torch.Tensor, offset: torch.Tensor, past: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """xs [B,Tn,d] at positions offset.., valid [B,Tn] (keys before the row's length), past [B,L,Tp,2d]
        (keys and values of each row's first `offset` positions) -> xs, the new positions' keys and values."""
        b, n, tp = xs.size(0), xs.size(1), past.size(2)
        sees = sight(valid.unsqueeze(1), offset, tp, n, self.chunk)  # [B,Tn,Tp+Tn]
        # The relative positions (query - key) a new position may see run from offset+Tn-1 (the first past
        # key) down to -(Tn-1) (the last new key): one table row each, from `top` down.
        top = tp + n - 1
        pos_emb = rel_pos_table(top, tp + 2 * n - 1, self.width)
        query = offset.view(-1, 1, 1) + torch.arange(n).view(1, -1, 1)
        to_past = query - torch.arange(tp).view(1, 1, -1)
        to_new = (torch.arange(n).view(-1, 1) - torch.arange(n).view(1, -1)).unsqueeze(0).expand(b, -1, -1)
        # Past slots beyond a row's offset are padding, hidden by `sees`: row 0 stands in for them.
        rel = torch.where(sees, top - torch.cat([to_past, to_new], dim=2), 0)  # [B,Tn,Tp+Tn]
        kv: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            if layer.feed_forward_macaron is not None:
                xs = xs + layer.ff_scale * layer.feed_forward_macaron(layer.norm_ff_macaron(xs))
            h = layer.norm_mha(xs)
            att = layer.self_attn
            new_kv = torch.cat([att.linear_k(h), att.linear_v(h)], dim=2)
            kv.append(new_kv)
            both = torch.cat([past[:, i], new_kv], dim=1)
            k = both[:, :, : self.width].view(b, -1, att.h, att.d_k).transpose(1, 2)
            v = both[:, :, self.width:].view(b, -1, att.h, att.d_k).transpose(1, 2)
            q = att.linear_q(h).view(b, n, att.h, att.d_k)
            p = att.linear_pos(pos_emb).view(1, -1, att.h, att.d_k).transpose(1, 2)  # [1,h,R,d_k]
            ac = torch.matmul((q + att.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
            bd = torch.matmul((q + att.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))  # [B,h,Tn,R]
            bd = torch.gather(bd, 3, rel.unsqueeze(1).expand(-1, att.h, -1, -1))
            xs = xs + att.forward_attention(v, (ac + bd) / math.sqrt(att.d_k), sees)
            xs = xs + layer.ff_scale * layer.feed_forward(layer.norm_ff(xs))
        return xs, torch.stack(kv, dim=1)


class IncrementalFlowEncoder(nn.Module):
    """The flow encoder over each row's tokens after its first `offset` (settled) ones.

    token [B,N]: per row the `left` tokens before `offset` (anything for offset 0), then the tokens from
    `offset` on and the context tokens; token_len [B] (prompt + tokens, without the context), context_len [B],
    offset [B] (a multiple of the chunk), commit [B] (new tokens whose states to return), embedding [B,192],
    past [B,Lt,Tp,2d] and up_past [B,Lf,Tp*stride,2d] (each attention layer's keys and values of the first
    `offset` tokens / `offset*stride` frames), up_state [B,d,left] (the token-rate outputs of the `left`
    tokens before `offset`; zeros for offset 0)
    -> mu [B,80,(N-left)*stride] (frames from offset*stride on, zero past token_len*stride), spks [B,80],
    new_past [B,Lt,N-left,2d], new_up_past [B,Lf,(N-left)*stride,2d], new_up_state [B,d,left] (up_state for
    offset + commit)."""

    def __init__(self, flow: nn.Module) -> None:
        super().__init__()
        enc = flow.encoder
        reason = not_chunk_causal(enc)
        if reason:
            raise ValueError(reason)
        self.flow = flow
        self.chunk = int(enc.static_chunk_size)
        self.stride = int(enc.up_layer.stride)
        self.width = int(enc.output_size())
        self.left = _left_tokens(enc)
        self.token_layers = _Layers(enc.encoders, self.chunk, self.width)
        self.frame_layers = _Layers(enc.up_encoders, self.chunk * self.stride, self.width)

    def forward(self, token, token_len, context_len, offset, commit, embedding, past, up_past, up_state):
        flow, enc = self.flow, self.flow.encoder
        left, stride = self.left, self.stride
        n = token.size(1) - left
        at = (offset - left).view(-1, 1) + torch.arange(token.size(1)).view(1, -1)  # each slot's token position
        with_ctx = ((at >= 0) & (at < (token_len + context_len).view(-1, 1))).unsqueeze(-1).to(torch.float32)
        x = flow.input_embedding(torch.clamp(token, min=0)) * with_ctx
        x = enc.embed.out(x) * enc.embed.pos_enc.xscale * with_ctx
        # PreLookaheadLayer: conv1 over the slots and the zeros past them; its outputs before position 0 are
        # conv2's zero padding, as upstream pads them.
        pre = enc.pre_lookahead_layer
        h = F.leaky_relu(pre.conv1(F.pad(x.transpose(1, 2), (0, pre.pre_lookahead_len))))
        h = h * (at >= 0).unsqueeze(1).to(torch.float32)
        k2 = pre.conv2.kernel_size[0] - 1
        h = pre.conv2(h[:, :, left - k2:])
        xs = h.transpose(1, 2) + x[:, left:]
        new = offset.view(-1, 1) + torch.arange(n).view(1, -1)
        xs, new_past = self.token_layers(xs, new < token_len.view(-1, 1), offset, past)
        # Upsample1D: each token repeated `stride` times, then its causal convolution over the repeats of the
        # `left` tokens before and the new ones.
        seq = torch.cat([up_state, xs.transpose(1, 2)], dim=2)
        new_up_state = before_commit(seq, commit, left)
        reach = enc.up_layer.conv.kernel_size[0] - 1
        xs = enc.up_layer.conv(_repeat(seq, stride)[:, :, left * stride - reach:])
        xs = enc.up_embed.out(xs.transpose(1, 2)) * enc.up_embed.pos_enc.xscale
        frames = stride * offset.view(-1, 1) + torch.arange(n * stride).view(1, -1)
        valid2 = frames < stride * token_len.view(-1, 1)
        xs, new_up_past = self.frame_layers(xs, valid2, stride * offset, up_past)
        xs = enc.after_norm(xs)
        mu = flow.encoder_proj(xs).transpose(1, 2) * valid2.unsqueeze(1).to(torch.float32)
        spks = flow.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        return mu, spks, new_past, new_up_past, new_up_state


INPUTS = ["token", "token_len", "context_len", "offset", "commit", "embedding", "past", "up_past", "up_state"]
OUTPUTS = ["mu", "spks", "new_past", "new_up_past", "new_up_state"]


def export_incremental_encoder(flow: nn.Module, path: Path) -> None:
    wrapper = IncrementalFlowEncoder(flow)
    enc, c, d = flow.encoder, wrapper.chunk, wrapper.width
    b, tp, n = 2, 3 * c, 2 * c
    lt, lf = len(enc.encoders), len(enc.up_encoders)
    # A row with a full cache and one a chunk shorter whose last tokens end before the batch's.
    args = (torch.randint(0, 100, (b, wrapper.left + n + 3)), torch.tensor([tp + n, tp - c + n - 5]), torch.tensor([3, 3]),
            torch.tensor([tp, tp - c]), torch.tensor([n, c]), torch.randn(b, 192), torch.randn(b, lt, tp, 2 * d),
            torch.randn(b, lf, tp * wrapper.stride, 2 * d), torch.randn(b, d, wrapper.left))
    tokens, frames = {0: "batch", 2: "tokens"}, {0: "batch", 2: "frames"}
    export(wrapper, args, path, INPUTS, OUTPUTS,
           {"token": {0: "batch", 1: "tokens"}, "token_len": {0: "batch"}, "context_len": {0: "batch"},
            "offset": {0: "batch"}, "commit": {0: "batch"}, "embedding": {0: "batch"},
            "past": {0: "batch", 2: "past_tokens"}, "up_past": {0: "batch", 2: "past_frames"}, "up_state": {0: "batch"},
            "mu": frames, "spks": {0: "batch"}, "new_past": tokens, "new_up_past": frames, "new_up_state": {0: "batch"}})
