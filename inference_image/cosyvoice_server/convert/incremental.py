"""Upstream's CausalConditionalDecoder over a streamed segment's new frames only, exported to ONNX.

Upstream streams by calling the flow on every token so far with chunk attention masks. Under those masks a
frame attends only to frames of its own and earlier chunks, and every convolution of the decoder is causal,
so a frame of a complete chunk comes out the same in every later call (the noise is a fixed buffer indexed
from frame 0, and the CFG update works per frame). This graph takes what the earlier chunks computed at one
Euler step (each attention layer's normalised input, from which it recomputes keys and values, and each
causal convolution's last inputs) and runs the decoder over the new frames alone. It returns the same
states for the new frames so the engine can keep those of complete chunks.

`not_chunk_causal` says which layer stops a decoder from being computed this way; convert then ships no
incremental graph and the engine re-runs the flow over every prefix, as upstream does.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .export import export


def _causal_convs(est: nn.Module) -> list[nn.Module]:
    """The decoder's causal convolutions in the order forward() meets them."""
    convs = []
    for resnet, _, down in est.down_blocks:
        convs += [resnet.block1.block[0], resnet.block2.block[0], down]
    for resnet, _ in est.mid_blocks:
        convs += [resnet.block1.block[0], resnet.block2.block[0]]
    for resnet, _, up in est.up_blocks:
        convs += [resnet.block1.block[0], resnet.block2.block[0], up]
    return convs + [est.final_block.block[0]]


def _attention_blocks(est: nn.Module) -> list[nn.Module]:
    return [b for group in (*est.down_blocks, *est.mid_blocks, *est.up_blocks) for b in group[1]]


def not_chunk_causal(est: nn.Module) -> str | None:
    """Why the decoder's masked output for a frame could change when later frames arrive; None if it cannot."""
    from cosyvoice.flow.decoder import CausalBlock1D, CausalConv1d, CausalResnetBlock1D

    if int(getattr(est, "static_chunk_size", 0)) <= 0:
        return "the estimator has no static chunk mask (static_chunk_size 0): every frame attends to all others"
    if len(est.down_blocks) != 1 or len(est.up_blocks) != 1:
        return (f"the estimator has {len(est.down_blocks)} resolution levels (channels); Downsample1D and "
                "Upsample1D between them look at later frames")
    for name, (resnet, *_rest) in (("down", est.down_blocks[0]), *(("mid", b) for b in est.mid_blocks),
                                   ("up", est.up_blocks[0])):
        if not isinstance(resnet, CausalResnetBlock1D):
            return f"a {name} block's {type(resnet).__name__} is not upstream's CausalResnetBlock1D"
    if not isinstance(est.final_block, CausalBlock1D) or est.final_proj.kernel_size[0] != 1:
        return "the estimator's final block is not causal"
    for conv in _causal_convs(est):
        if not isinstance(conv, CausalConv1d) or conv.dilation[0] != 1 or conv.groups != 1:
            return f"{type(conv).__name__} (dilation {conv.dilation[0]}) is not a plain causal convolution"
    for block in _attention_blocks(est):
        if block.attn2 is not None or block.use_ada_layer_norm or block.use_ada_layer_norm_zero or block._chunk_size:
            return "a transformer block has cross-attention, adaptive norms or chunked feed-forward"
    return None


def before_commit(seq: torch.Tensor, commit: torch.Tensor, k: int) -> torch.Tensor:
    """A causal convolution's k inputs before new frame `commit` (per row), from its input `seq` [B,C,k+Tn],
    which begins k frames before the new ones: what the next chunk's run starts from."""
    idx = (commit.view(-1, 1, 1) + torch.arange(k).view(1, 1, k)).expand(seq.size(0), seq.size(1), k)
    return torch.gather(seq, 2, idx)


def sight(mask: torch.Tensor, offset: torch.Tensor, past_frames: int, n: int, chunk: int) -> torch.Tensor:
    """[B,Tn,Tp+Tn]: the keys each new frame attends to under the streaming chunk mask: every earlier frame (the
    first `offset` of `past`), and the valid new frames up to the end of its own chunk."""
    frames = offset.view(-1, 1) + torch.arange(n).view(1, -1)
    chunk_end = (torch.div(frames, chunk, rounding_mode="trunc") + 1) * chunk
    sees_new = (mask[:, 0, :] > 0).unsqueeze(1) & (frames.unsqueeze(1) < chunk_end.unsqueeze(2))
    sees_past = (torch.arange(past_frames).view(1, -1) < offset.view(-1, 1)).unsqueeze(1).expand(-1, n, -1)
    return torch.cat([sees_past, sees_new], dim=2)


class IncrementalEstimator(nn.Module):
    """x, mask, mu, cond [B,80,Tn] (new frames), t [B], spks [B,80], offset [B] (frames before them),
    commit [B] (new frames whose states to return), past [B,L,Tp,C] (attention inputs of the first `offset`
    frames), conv_state [B,Nc,Cin,K] -> estimator_out [B,80,Tn], new_past [B,L,Tn,C], new_conv_state."""

    def __init__(self, est: nn.Module) -> None:
        super().__init__()
        reason = not_chunk_causal(est)
        if reason:
            raise ValueError(reason)
        self.est = est
        self.chunk = int(est.static_chunk_size)
        self.convs = _causal_convs(est)
        self.blocks = _attention_blocks(est)
        self.conv_channels = max(c.in_channels for c in self.convs)
        self.conv_frames = max(c.causal_padding for c in self.convs)
        self.width = int(self.blocks[0].norm1.normalized_shape[0])

    def forward(self, x, mask, mu, t, spks, cond, offset, commit, past, conv_state):
        est = self.est
        b, n = x.size(0), x.size(2)
        states: list[torch.Tensor] = []
        hidden: list[torch.Tensor] = []

        def conv(module: nn.Module, h: torch.Tensor) -> torch.Tensor:
            i, k, c = len(states), module.causal_padding, module.in_channels
            seq = torch.cat([conv_state[:, i, :c, self.conv_frames - k:], h], dim=2)
            states.append(F.pad(before_commit(seq, commit, k), (self.conv_frames - k, 0, 0, self.conv_channels - c)))
            return F.conv1d(seq, module.weight, module.bias)

        def block1d(blk: nn.Module, h: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            out = conv(blk.block[0], h * m)
            for layer in blk.block[1:]:
                out = layer(out)
            return out * m

        def resnet(r: nn.Module, h: torch.Tensor, m: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
            out = block1d(r.block1, h, m) + r.mlp(temb).unsqueeze(-1)
            return block1d(r.block2, out, m) + r.res_conv(h * m)

        bias = (1.0 - sight(mask, offset, past.size(2), n, self.chunk).to(x.dtype)) * -1.0e10  # upstream's mask_to_bias

        def transformers(group: nn.ModuleList, h: torch.Tensor) -> torch.Tensor:
            h = h.transpose(1, 2)
            for blk in group:
                normed = blk.norm1(h)
                keys = torch.cat([past[:, len(hidden)], normed], dim=1)
                hidden.append(normed)
                h = blk.attn1(normed, encoder_hidden_states=keys, attention_mask=bias) + h
                h = blk.ff(blk.norm3(h)) + h
            return h.transpose(1, 2)

        temb = est.time_mlp(est.time_embeddings(t).to(t.dtype))
        h = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, n), cond], dim=1)
        (res, group, down), = est.down_blocks
        h = transformers(group, resnet(res, h, mask, temb))
        skip = h
        h = conv(down, h * mask)
        for res, group in est.mid_blocks:
            h = transformers(group, resnet(res, h, mask, temb))
        (res, group, up), = est.up_blocks
        h = transformers(group, resnet(res, torch.cat([h, skip], dim=1), mask, temb))
        h = conv(up, h * mask)
        h = block1d(est.final_block, h, mask)
        out = est.final_proj(h * mask) * mask
        return out, torch.stack(hidden, dim=1), torch.stack(states, dim=1)


INPUTS = ["x", "mask", "mu", "t", "spks", "cond", "offset", "commit", "past", "conv_state"]
OUTPUTS = ["estimator_out", "new_past", "new_conv_state"]


def export_incremental_estimator(est: nn.Module, path: Path, mel_bins: int, spk_bins: int) -> None:
    wrapper = IncrementalEstimator(est)
    b, n, p = 2, 2 * wrapper.chunk, 3 * wrapper.chunk
    layers, convs = len(wrapper.blocks), len(wrapper.convs)
    args = (torch.randn(b, mel_bins, n), torch.ones(b, 1, n), torch.randn(b, mel_bins, n), torch.rand(b),
            torch.randn(b, spk_bins), torch.randn(b, mel_bins, n), torch.tensor([p, p - wrapper.chunk]),
            torch.tensor([n, wrapper.chunk]), torch.randn(b, layers, p, wrapper.width),
            torch.randn(b, convs, wrapper.conv_channels, wrapper.conv_frames))
    new = {0: "batch", 2: "frames"}
    export(wrapper, args, path, INPUTS, OUTPUTS,
           {"x": new, "mask": new, "mu": new, "t": {0: "batch"}, "spks": {0: "batch"}, "cond": new,
            "offset": {0: "batch"}, "commit": {0: "batch"}, "past": {0: "batch", 2: "past"},
            "conv_state": {0: "batch"}, "estimator_out": new, "new_past": {0: "batch", 2: "frames"},
            "new_conv_state": {0: "batch"}})
