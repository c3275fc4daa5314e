"""CosyVoice3's flow (`CausalMaskedDiffWithDiT`): the project's own implementation of upstream's modules, for
loading upstream's `flow.pt` and exporting it. No package ships upstream's CosyVoice3 classes, so these mirror
them (FunAudioLLM/CosyVoice `cosyvoice/flow/flow.py`, `flow/flow_matching.py`, `flow/DiT/dit.py`,
`flow/DiT/modules.py`, `transformer/upsample_encoder.py`): the same constructor arguments (the checkpoint's
yaml builds them, `build.py`), the same submodule names (the state dict loads strictly) and the same parameter
creation order, so the random draws at construction (the CFM's fixed noise, the vocoder's source buffers
after it) come out as upstream's. `tests/convert/test_cosyvoice3_golden.py` proves them equal to upstream's
own outputs.

Two choices differ from upstream, both without changing a number: the DiT takes `streaming` per row (one
batch mixes streamed chunks and final ones), and attention is written out (softmax of masked scores), which
exports to ONNX on every opset.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def chunk_mask(valid: torch.Tensor, streaming: torch.Tensor, chunk: int) -> torch.Tensor:
    """[B,T] key validity + per-row streaming flag -> [B,T,T] attention mask: upstream's
    `add_optional_chunk_mask` with `static_chunk_size` for streaming rows (every left chunk), full context
    otherwise; a chunk of 0 is full context for every row."""
    t = valid.size(1)
    pos = torch.arange(t, device=valid.device)
    if chunk > 0:
        block = (torch.div(pos, chunk, rounding_mode="trunc") + 1) * chunk
        within = pos.unsqueeze(0) < block.unsqueeze(1)  # [T,T]
    else:  # the same expression, so an exported graph keeps its `streaming` input
        within = (pos.unsqueeze(0) >= 0) & (pos.unsqueeze(1) >= 0)
    return valid.unsqueeze(1) & (within.unsqueeze(0) | (streaming == 0).view(-1, 1, 1))


class PreLookaheadLayer(nn.Module):
    """Each token mixed with the `pre_lookahead_len` tokens after it (zeros past the end, or the `context`
    tokens a streamed chunk passes), then a causal convolution; residual."""

    def __init__(self, in_channels: int, channels: int, pre_lookahead_len: int = 1) -> None:
        super().__init__()
        self.in_channels, self.channels, self.pre_lookahead_len = in_channels, channels, pre_lookahead_len
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3)

    def forward(self, inputs: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """inputs [B,T,C]; context [B,lookahead,C] or None (zeros)."""
        x = inputs.transpose(1, 2)
        if context is not None and context.size(1):
            x = torch.cat([x, context.transpose(1, 2)], dim=2)
            x = F.pad(x, (0, self.pre_lookahead_len - context.size(1)))
        else:
            x = F.pad(x, (0, self.pre_lookahead_len))
        x = F.leaky_relu(self.conv1(x))
        x = self.conv2(F.pad(x, (self.conv2.kernel_size[0] - 1, 0)))
        return x.transpose(1, 2) + inputs


class SinusPositionEmbedding(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor, scale: float = 1000) -> torch.Tensor:
        half = self.dim // 2
        emb = math.log(10000) / (half - 1)
        emb = torch.exp(torch.arange(half, device=x.device).float() * -emb)
        emb = scale * x.unsqueeze(1) * emb.unsqueeze(0)
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int, freq_embed_dim: int = 256) -> None:
        super().__init__()
        self.time_embed = SinusPositionEmbedding(freq_embed_dim)
        self.time_mlp = nn.Sequential(nn.Linear(freq_embed_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, timestep: torch.Tensor) -> torch.Tensor:
        return self.time_mlp(self.time_embed(timestep).to(timestep.dtype))


class CausalConvPositionEmbedding(nn.Module):
    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        x = self.conv1(F.pad(x, (self.kernel_size - 1, 0)))
        x = self.conv2(F.pad(x, (self.kernel_size - 1, 0)))
        return x.transpose(1, 2)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, text_dim: int, out_dim: int, spk_dim: int | None = None) -> None:
        super().__init__()
        self.spk_dim = spk_dim or 0
        self.proj = nn.Linear(mel_dim * 2 + text_dim + self.spk_dim, out_dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(dim=out_dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, text_embed: torch.Tensor, spks: torch.Tensor) -> torch.Tensor:
        parts = [x, cond, text_embed]
        if self.spk_dim > 0:
            parts.append(spks.unsqueeze(1).expand(-1, x.size(1), -1))
        x = self.proj(torch.cat(parts, dim=-1))
        return self.conv_pos_embed(x) + x


class RotaryEmbedding(nn.Module):
    """x-transformers' RotaryEmbedding as the DiT builds it (no xpos, no rescaling): `inv_freq` is a buffer of
    the checkpoint."""

    def __init__(self, dim: int, base: float = 10000) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))

    def forward(self, seq_len: int | torch.Tensor) -> torch.Tensor:
        """[1, T, dim]: each frequency twice, side by side ((d r) with r = 2)."""
        t = torch.arange(seq_len, device=self.inv_freq.device).to(self.inv_freq.dtype)
        freqs = t.unsqueeze(1) * self.inv_freq.unsqueeze(0)
        return torch.stack((freqs, freqs), dim=-1).reshape(1, freqs.size(0), -1)


def apply_rotary(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x-transformers' apply_rotary_pos_emb on t[B,T,inner]: only the first `rot_dim` features (the first
    head's, as the DiT calls it before splitting heads) turn; pairs of neighbours rotate together."""
    rot = freqs.size(-1)
    head, rest = t[..., :rot], t[..., rot:]
    pairs = head.reshape(*head.shape[:-1], rot // 2, 2)
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).reshape(head.shape)
    return torch.cat((head * freqs.cos() + rotated * freqs.sin(), rest), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int = 8, dim_head: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.inner_dim = heads, dim_head * heads
        self.to_q = nn.Linear(dim, self.inner_dim)
        self.to_k = nn.Linear(dim, self.inner_dim)
        self.to_v = nn.Linear(dim, self.inner_dim)
        self.to_out = nn.ModuleList([nn.Linear(self.inner_dim, dim), nn.Dropout(dropout)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """x[B,T,dim], mask[B,T,T] (query, key), rope[1,T,dim_head]."""
        b = x.size(0)
        q, k, v = apply_rotary(self.to_q(x), rope), apply_rotary(self.to_k(x), rope), self.to_v(x)
        d = self.inner_dim // self.heads
        q, k, v = (z.reshape(b, -1, self.heads, d).transpose(1, 2) for z in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, -1, self.inner_dim)
        out = self.to_out[1](self.to_out[0](out))
        # upstream zeroes the output where the mask's last query row (the padding mask) has no key
        return out.masked_fill(~mask[:, -1].unsqueeze(-1), 0.0)


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 6)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x: torch.Tensor, emb: torch.Tensor):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = torch.chunk(self.linear(self.silu(emb)), 6, dim=1)
        return self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None], gate_msa, shift_mlp, scale_mlp, gate_mlp


class AdaLayerNormZeroFinal(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 2)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        scale, shift = torch.chunk(self.linear(self.silu(emb)), 2, dim=1)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: float = 4, dropout: float = 0.0) -> None:
        super().__init__()
        inner = int(dim * mult)
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")), nn.Dropout(dropout),
                                nn.Linear(inner, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: float = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head, dropout)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim, ff_mult, dropout)

    def forward(self, x: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        norm, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(x, t)
        x = x + gate_msa.unsqueeze(1) * self.attn(norm, mask, rope)
        ff_in = self.ff_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp.unsqueeze(1) * self.ff(ff_in)


class DiT(nn.Module):
    """The flow-matching estimator: x, mask, mu, t, spks, cond -> velocity, all [B,80,T] but t [B], spks [B,80]."""

    def __init__(self, *, dim: int, depth: int = 8, heads: int = 8, dim_head: int = 64, dropout: float = 0.1,
                 ff_mult: float = 4, mel_dim: int = 80, mu_dim: int | None = None, long_skip_connection: bool = False,
                 spk_dim: int | None = None, out_channels: int | None = None, static_chunk_size: int = 50,
                 num_decoding_left_chunks: int = 2) -> None:
        super().__init__()
        self.time_embed = TimestepEmbedding(dim)
        self.input_embed = InputEmbedding(mel_dim, mu_dim if mu_dim is not None else mel_dim, dim, spk_dim)
        self.rotary_embed = RotaryEmbedding(dim_head)
        self.dim, self.depth = dim, depth
        self.transformer_blocks = nn.ModuleList(
            [DiTBlock(dim=dim, heads=heads, dim_head=dim_head, ff_mult=ff_mult, dropout=dropout) for _ in range(depth)])
        self.long_skip_connection = nn.Linear(dim * 2, dim, bias=False) if long_skip_connection else None
        self.norm_out = AdaLayerNormZeroFinal(dim)
        self.proj_out = nn.Linear(dim, mel_dim)
        self.out_channels = out_channels
        self.static_chunk_size = static_chunk_size
        # upstream stores it but decodes with every left chunk (add_optional_chunk_mask(..., -1))
        self.num_decoding_left_chunks = num_decoding_left_chunks

    def forward(self, x, mask, mu, t, spks, cond, streaming) -> torch.Tensor:
        """`streaming`: a bool for every row (upstream's argument) or a [B] tensor, one flag per row."""
        b, seq_len = x.size(0), x.size(2)
        if not torch.is_tensor(streaming):
            streaming = torch.full((b,), int(streaming), dtype=torch.int64)
        if t.ndim == 0:
            t = t.repeat(b)
        temb = self.time_embed(t)
        h = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        rope = self.rotary_embed(seq_len)
        residual = h
        attn_mask = chunk_mask(mask[:, 0, :].bool(), streaming, self.static_chunk_size)
        for block in self.transformer_blocks:
            h = block(h, temb, attn_mask, rope)
        if self.long_skip_connection is not None:
            h = self.long_skip_connection(torch.cat((h, residual), dim=-1))
        return self.proj_out(self.norm_out(h, temb)).transpose(1, 2)


class CausalConditionalCFM(nn.Module):
    """Holds the estimator and the flow-matching settings the server's engine runs (10 Euler steps on a cosine
    t-schedule, classifier-free guidance); `rand_noise` is upstream's fixed initial noise, drawn right after
    seeding torch with 0 as upstream's constructor does."""

    def __init__(self, in_channels: int, cfm_params, n_spks: int = 1, spk_emb_dim: int = 64,
                 estimator: nn.Module | None = None) -> None:
        super().__init__()
        self.n_feats, self.n_spks, self.spk_emb_dim = in_channels, n_spks, spk_emb_dim
        self.solver = cfm_params.solver
        self.sigma_min = cfm_params.get("sigma_min", 1e-4)
        self.t_scheduler = cfm_params.t_scheduler
        self.training_cfg_rate = cfm_params.training_cfg_rate
        self.inference_cfg_rate = cfm_params.inference_cfg_rate
        self.estimator = estimator
        torch.manual_seed(0)  # upstream's set_all_random_seed(0); only torch's generator is drawn from
        self.rand_noise = torch.randn([1, 80, 50 * 300])

    @torch.inference_mode()
    def forward(self, mu, mask, n_timesteps, spks=None, cond=None, streaming=False) -> torch.Tensor:
        """Upstream's solve_euler over its fixed noise, batch 1 (the reference for the engine's loop)."""
        x = self.rand_noise[:, :, : mu.size(2)].to(mu.dtype)
        t_span = torch.linspace(0, 1, n_timesteps + 1, dtype=mu.dtype)
        if self.t_scheduler == "cosine":
            t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
        t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            out = self.estimator(torch.cat([x, x]), torch.cat([mask, mask]), torch.cat([mu, torch.zeros_like(mu)]),
                                 torch.cat([t, t]), torch.cat([spks, torch.zeros_like(spks)]),
                                 torch.cat([cond, torch.zeros_like(cond)]), streaming)
            v, v_uncond = out[:1], out[1:]
            x = x + dt * ((1.0 + self.inference_cfg_rate) * v - self.inference_cfg_rate * v_uncond)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x.float()


class CausalMaskedDiffWithDiT(nn.Module):
    """Speech tokens -> mel: token embedding, the pre-lookahead layer, x token_mel_ratio, the DiT CFM."""

    def __init__(self, input_size: int = 512, output_size: int = 80, spk_embed_dim: int = 192, output_type: str = "mel",
                 vocab_size: int = 4096, input_frame_rate: int = 50, only_mask_loss: bool = True,
                 token_mel_ratio: int = 2, pre_lookahead_len: int = 3, pre_lookahead_layer: nn.Module | None = None,
                 decoder: nn.Module | None = None, decoder_conf: dict | None = None) -> None:
        super().__init__()
        self.input_size, self.output_size, self.output_type = input_size, output_size, output_type
        self.vocab_size, self.input_frame_rate = vocab_size, input_frame_rate
        self.input_embedding = nn.Embedding(vocab_size, input_size)
        self.spk_embed_affine_layer = nn.Linear(spk_embed_dim, output_size)
        self.pre_lookahead_len = pre_lookahead_len
        self.pre_lookahead_layer = pre_lookahead_layer
        self.decoder = decoder
        self.only_mask_loss = only_mask_loss
        self.token_mel_ratio = token_mel_ratio

    @torch.inference_mode()
    def inference(self, token, token_len, prompt_token, prompt_token_len, prompt_feat, prompt_feat_len, embedding,
                  streaming: bool, finalize: bool) -> torch.Tensor:
        """Upstream's `flow.inference` for one request: the mel of `token` after the prompt's frames (the
        last `pre_lookahead_len` tokens are context when not `finalize`)."""
        embedding = self.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        token = torch.cat([prompt_token, token], dim=1)
        h = self.input_embedding(torch.clamp(token, min=0).long())
        if finalize:
            h = self.pre_lookahead_layer(h)
        else:
            n = self.pre_lookahead_len
            h = self.pre_lookahead_layer(h[:, :-n], context=h[:, -n:])
        h = h.repeat_interleave(self.token_mel_ratio, dim=1)
        prompt_frames = prompt_feat.size(1)
        conds = torch.zeros(1, h.size(1), self.output_size, dtype=h.dtype)
        conds[:, :prompt_frames] = prompt_feat
        mask = torch.ones(1, 1, h.size(1), dtype=h.dtype)
        feat = self.decoder(h.transpose(1, 2).contiguous(), mask, 10, spks=embedding, cond=conds.transpose(1, 2),
                            streaming=streaming)
        return feat[:, :, prompt_frames:]
