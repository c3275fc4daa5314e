"""CosyVoice3's vocoder (`CausalHiFTGenerator` with `CausalConvRNNF0Predictor`): the project's own
implementation of upstream's modules (FunAudioLLM/CosyVoice `cosyvoice/hifigan/generator.py`,
`hifigan/f0_predictor.py`, `transformer/convolution.py`, `transformer/activation.py`), for loading upstream's
`hift.pt` and exporting it. Constructor arguments, submodule names and parameter creation order are
upstream's, so the state dict loads strictly and the source module's fixed random buffers, drawn at
construction from torch's generator, come out as upstream's when the flow is built first (as upstream's
yaml builds them).

Everything is causal but a look-right: the f0 predictor's first convolution sees 3 frames ahead, `conv_pre`
4. Upstream's non-final call (`finalize=False`) uses those frames as context and cuts them and one more
frame's samples from its output; that output equals the first samples of the `finalize=True` run over the
same mel (the convolutions look left only, the STFT's reflection padding and the iSTFT's last frame lie in
the cut), so the exported graph is the `finalize=True` run and the engine keeps what a non-final call returns.

Differences from upstream that change no number: the f0 predictor's convolutions are written as matrix
products (float64, as upstream runs the predictor, and ONNX Runtime has no float64 convolution); the
STFT/iSTFT are windowed-DFT convolutions (torch.stft/istft do not export; export.py); the source phase's
cumulative sum is taken in float64 and rounded, which is what torch's CPU cumsum does for float32; the random
initial phase (`rand_ini`) lands on sample 0, which the linear down-sampling of the phase never reads, so it
is drawn (to keep the generator's state) and not used.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from .export import _dft_kernels, _repeat

SOURCE_SAMPLES = 300 * 24000  # upstream's fixed source buffers cover 300 s at 24 kHz, whatever the rates
SOURCE_HARMONICS = 9  # ... and 9 channels (the fundamental and 8 harmonics), whatever nb_harmonics says


class CausalConv1d(nn.Conv1d):
    """A convolution padded on one side: 'left' looks back only, 'right' looks ahead only."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, dilation: int = 1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", causal_type: str = "left") -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=dilation, groups=groups,
                         bias=bias, padding_mode=padding_mode)
        if stride != 1 or causal_type not in ("left", "right"):
            raise ValueError(f"CausalConv1d takes stride 1 and causal_type left or right, not {stride}, {causal_type!r}")
        self.causal_padding = int((kernel_size * dilation - dilation) / 2) * 2 + (kernel_size + 1) % 2
        self.causal_type = causal_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = (self.causal_padding, 0) if self.causal_type == "left" else (0, self.causal_padding)
        return super().forward(F.pad(x, pad))


class CausalConv1dDownSample(nn.Conv1d):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, dilation: int = 1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros") -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding=0, dilation=dilation, groups=groups,
                         bias=bias, padding_mode=padding_mode)
        self.causal_padding = stride - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.causal_padding, 0)))


class CausalConv1dUpsample(nn.Conv1d):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, dilation: int = 1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros") -> None:
        super().__init__(in_channels, out_channels, kernel_size, 1, padding=0, dilation=dilation, groups=groups,
                         bias=bias, padding_mode=padding_mode)
        self.causal_padding = kernel_size - 1
        self.stride_up = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(_repeat(x, self.stride_up), (self.causal_padding, 0)))


class Snake(nn.Module):
    def __init__(self, in_features: int, alpha: float = 1.0, alpha_trainable: bool = True,
                 alpha_logscale: bool = False) -> None:
        super().__init__()
        self.alpha_logscale = alpha_logscale
        self.alpha = nn.Parameter((torch.zeros(in_features) if alpha_logscale else torch.ones(in_features)) * alpha)
        self.no_div_by_zero = 0.000000001

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        if self.alpha_logscale:
            alpha = torch.exp(alpha)
        return x + (1.0 / (alpha + self.no_div_by_zero)) * torch.pow(torch.sin(x * alpha), 2)


def _init_weights(m: nn.Module) -> None:
    if "Conv" in m.__class__.__name__:
        m.weight.data.normal_(0.0, 0.01)


class ResBlock(nn.Module):
    def __init__(self, channels: int = 512, kernel_size: int = 3, dilations: tuple[int, ...] = (1, 3, 5),
                 causal: bool = True) -> None:
        super().__init__()
        if not causal:
            raise ValueError("CosyVoice3's vocoder blocks are causal")
        self.convs1 = nn.ModuleList(
            [weight_norm(CausalConv1d(channels, channels, kernel_size, 1, dilation=d)) for d in dilations])
        self.convs2 = nn.ModuleList(
            [weight_norm(CausalConv1d(channels, channels, kernel_size, 1, dilation=1)) for _ in dilations])
        self.convs1.apply(_init_weights)
        self.convs2.apply(_init_weights)
        self.activations1 = nn.ModuleList([Snake(channels) for _ in self.convs1])
        self.activations2 = nn.ModuleList([Snake(channels) for _ in self.convs2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class CausalConvRNNF0Predictor(nn.Module):
    """mel [B,80,T] -> f0 [B,T] (Hz), in float64 whatever the input's type (upstream moves it to float64:
    the source phase is a running sum of f0, where float32's error would build up)."""

    def __init__(self, num_class: int = 1, in_channels: int = 80, cond_channels: int = 512) -> None:
        super().__init__()
        self.num_class = num_class
        self.condnet = nn.Sequential(
            weight_norm(CausalConv1d(in_channels, cond_channels, kernel_size=4, causal_type="right")), nn.ELU(),
            weight_norm(CausalConv1d(cond_channels, cond_channels, kernel_size=3)), nn.ELU(),
            weight_norm(CausalConv1d(cond_channels, cond_channels, kernel_size=3)), nn.ELU(),
            weight_norm(CausalConv1d(cond_channels, cond_channels, kernel_size=3)), nn.ELU(),
            weight_norm(CausalConv1d(cond_channels, cond_channels, kernel_size=3)), nn.ELU(),
        )
        self.classifier = nn.Linear(in_features=cond_channels, out_features=self.num_class)

    @staticmethod
    def _conv64(conv: CausalConv1d, x: torch.Tensor) -> torch.Tensor:
        """conv(x) in float64 as a matrix product over the kernel's shifted views (x [B,T,C])."""
        k, d, pad = conv.kernel_size[0], conv.dilation[0], conv.causal_padding
        t = x.size(1)
        x = F.pad(x, (0, 0, pad, 0) if conv.causal_type == "left" else (0, 0, 0, pad))
        taps = torch.cat([x[:, i * d : i * d + t] for i in range(k)], dim=2)  # [B,T,k*C]
        w = conv.weight.to(torch.float64).permute(2, 1, 0).reshape(-1, conv.out_channels)  # [k*C, out]
        return torch.matmul(taps, w) + conv.bias.to(torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float64).transpose(1, 2)
        for i in range(0, len(self.condnet), 2):
            h = F.elu(self._conv64(self.condnet[i], h))
        w = self.classifier.weight.to(torch.float64).t()
        return torch.abs(torch.matmul(h, w) + self.classifier.bias.to(torch.float64)).squeeze(-1)


class SineGen2(nn.Module):
    """Holds the sine source's settings and upstream's fixed draws: `rand_ini` (unused, see the module
    docstring) and `sine_waves`, the noise added to the harmonics."""

    def __init__(self, samp_rate: int, upsample_scale: int, harmonic_num: int = 0, sine_amp: float = 0.1,
                 noise_std: float = 0.003, voiced_threshold: float = 0, flag_for_pulse: bool = False,
                 causal: bool = True) -> None:
        super().__init__()
        self.sine_amp, self.noise_std, self.harmonic_num = sine_amp, noise_std, harmonic_num
        self.sampling_rate, self.voiced_threshold, self.upsample_scale = samp_rate, voiced_threshold, upsample_scale
        self.rand_ini = torch.rand(1, SOURCE_HARMONICS)
        self.rand_ini[:, 0] = 0
        self.sine_waves = torch.rand(1, SOURCE_SAMPLES, SOURCE_HARMONICS)


class SourceModuleHnNSF(nn.Module):
    def __init__(self, sampling_rate: int, upsample_scale: int, harmonic_num: int = 0, sine_amp: float = 0.1,
                 add_noise_std: float = 0.003, voiced_threshod: float = 0) -> None:
        super().__init__()
        self.sine_amp, self.noise_std = sine_amp, add_noise_std
        self.l_sin_gen = SineGen2(sampling_rate, upsample_scale, harmonic_num, sine_amp, add_noise_std, voiced_threshod)
        self.l_linear = nn.Linear(harmonic_num + 1, 1)
        self.l_tanh = nn.Tanh()
        # upstream draws `uv` here (torch.rand(1, 300 * 24000, 1)) for a noise branch inference never uses;
        # nothing is drawn after it that the model keeps, so it is not drawn


class CausalHiFTGenerator(nn.Module):
    """mel [B,80,T] + the source's noise [B,T*hop,9] -> waveform [B,T*hop] (upstream's inference with
    finalize=True)."""

    def __init__(self, in_channels: int = 80, base_channels: int = 512, nb_harmonics: int = 8, sampling_rate: int = 22050,
                 nsf_alpha: float = 0.1, nsf_sigma: float = 0.003, nsf_voiced_threshold: float = 10,
                 upsample_rates: list[int] = (8, 8), upsample_kernel_sizes: list[int] = (16, 16),
                 istft_params: dict | None = None, resblock_kernel_sizes: list[int] = (3, 7, 11),
                 resblock_dilation_sizes: list[list[int]] = ((1, 3, 5), (1, 3, 5), (1, 3, 5)),
                 source_resblock_kernel_sizes: list[int] = (7, 11),
                 source_resblock_dilation_sizes: list[list[int]] = ((1, 3, 5), (1, 3, 5)), lrelu_slope: float = 0.1,
                 audio_limit: float = 0.99, conv_pre_look_right: int = 4, f0_predictor: nn.Module | None = None) -> None:
        super().__init__()
        istft_params = dict(istft_params or {"n_fft": 16, "hop_len": 4})
        if nb_harmonics + 1 != SOURCE_HARMONICS or sampling_rate == 22050:
            raise ValueError(f"CosyVoice3's causal source draws {SOURCE_HARMONICS} channels at 24 kHz "
                             f"(nb_harmonics 8, not {nb_harmonics}; sampling_rate {sampling_rate})")
        self.nb_harmonics, self.sampling_rate, self.istft_params = nb_harmonics, sampling_rate, istft_params
        self.lrelu_slope, self.audio_limit = lrelu_slope, audio_limit
        self.num_kernels, self.num_upsamples = len(resblock_kernel_sizes), len(upsample_rates)
        self.upsample_rates = list(upsample_rates)
        self.upsample_scale = int(np.prod(upsample_rates) * istft_params["hop_len"])
        self.m_source = SourceModuleHnNSF(sampling_rate, self.upsample_scale, nb_harmonics, nsf_alpha, nsf_sigma,
                                          nsf_voiced_threshold)
        self.conv_pre = weight_norm(CausalConv1d(in_channels, base_channels, conv_pre_look_right + 1, 1, causal_type="right"))
        self.ups = nn.ModuleList([
            weight_norm(CausalConv1dUpsample(base_channels // (2**i), base_channels // (2 ** (i + 1)), k, u))
            for i, (u, k) in enumerate(zip(upsample_rates, upsample_kernel_sizes))])
        self.source_downs, self.source_resblocks = nn.ModuleList(), nn.ModuleList()
        down_rates = np.cumprod([1] + list(upsample_rates)[::-1][:-1])
        n_fft = istft_params["n_fft"]
        for i, (u, k, d) in enumerate(zip(down_rates[::-1], source_resblock_kernel_sizes, source_resblock_dilation_sizes)):
            ch = base_channels // (2 ** (i + 1))
            self.source_downs.append(CausalConv1d(n_fft + 2, ch, 1, 1) if u == 1
                                     else CausalConv1dDownSample(n_fft + 2, ch, int(u) * 2, int(u)))
            self.source_resblocks.append(ResBlock(ch, k, d))
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            ch = base_channels // (2 ** (i + 1))
            for k, d in zip(resblock_kernel_sizes, resblock_dilation_sizes):
                self.resblocks.append(ResBlock(ch, k, d))
        self.conv_post = weight_norm(CausalConv1d(ch, n_fft + 2, 7, 1))
        self.ups.apply(_init_weights)
        self.conv_post.apply(_init_weights)
        self.conv_pre_look_right = conv_pre_look_right
        self.f0_predictor = f0_predictor
        window = torch.from_numpy(np.hanning(n_fft + 1)[:-1].astype(np.float32))  # scipy's periodic "hann"
        fwd, inv = _dft_kernels(n_fft, window)
        for name, value in (("stft_fwd", fwd), ("stft_inv", inv), ("stft_win_sq", (window**2).view(1, 1, -1)),
                            ("harmonics", torch.arange(1, nb_harmonics + 2, dtype=torch.float32).view(1, 1, -1))):
            self.register_buffer(name, value, persistent=False)

    @property
    def look_right_frames(self) -> int:
        """Mel frames at the end of a non-final call whose audio upstream holds back: the f0 predictor's and
        conv_pre's look-ahead, and the frame the iSTFT's edge spoils."""
        return self.f0_predictor.condnet[0].causal_padding + self.conv_pre_look_right + 1

    def source(self, f0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """SourceModuleHnNSF with the causal SineGen2 over f0 [B,T] (frame rate, float64) and the fixed noise
        [B,T*hop,9] -> [B,1,T*hop]."""
        m, gen = self.m_source, self.m_source.l_sin_gen
        f0 = f0.to(torch.float32)
        # The phase increment of each frame: upstream up-samples f0 (nearest), takes (f0 x harmonic / sr) % 1 per
        # sample and down-samples it linearly, which reads two samples of the same frame: the frame's value.
        rad = (f0.unsqueeze(-1) * self.harmonics / gen.sampling_rate) % 1  # [B,T,H]
        phase = torch.cumsum(rad.to(torch.float64), dim=1).to(torch.float32) * 2 * np.pi
        phase = _repeat((phase * self.upsample_scale).transpose(1, 2), self.upsample_scale).transpose(1, 2)  # nearest
        sines = torch.sin(phase) * gen.sine_amp
        uv = (_repeat(f0.unsqueeze(1), self.upsample_scale).transpose(1, 2) > gen.voiced_threshold).to(torch.float32)
        noise_amp = uv * gen.noise_std + (1 - uv) * gen.sine_amp / 3
        sine_waves = sines * uv + noise_amp * noise
        return m.l_tanh(m.l_linear(sine_waves)).transpose(1, 2)

    def _stft(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n_fft, hop = self.istft_params["n_fft"], self.istft_params["hop_len"]
        spec = F.conv1d(F.pad(x.unsqueeze(1), (n_fft // 2, n_fft // 2), mode="reflect"), self.stft_fwd, stride=hop)
        bins = n_fft // 2 + 1
        return spec[:, :bins], spec[:, bins:]

    def _istft(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        n_fft, hop = self.istft_params["n_fft"], self.istft_params["hop_len"]
        magnitude = torch.clip(magnitude, max=1e2)
        spec = torch.cat([magnitude * torch.cos(phase), magnitude * torch.sin(phase)], dim=1)
        y = F.conv_transpose1d(spec, self.stft_inv, stride=hop)
        env = F.conv_transpose1d(torch.ones_like(spec[:, :1]), self.stft_win_sq, stride=hop)
        return (y / env)[:, 0, n_fft // 2 : -(n_fft // 2)]

    def decode(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        real, imag = self._stft(s.squeeze(1))
        s_stft = torch.cat([real, imag], dim=1)
        x = self.conv_pre(x)
        for i in range(self.num_upsamples):
            x = self.ups[i](F.leaky_relu(x, self.lrelu_slope))
            if i == self.num_upsamples - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            xs = self.resblocks[i * self.num_kernels](x)
            for j in range(1, self.num_kernels):
                xs = xs + self.resblocks[i * self.num_kernels + j](x)
            x = xs / self.num_kernels
        x = self.conv_post(F.leaky_relu(x))
        bins = self.istft_params["n_fft"] // 2 + 1
        wav = self._istft(torch.exp(x[:, :bins, :]), torch.sin(x[:, bins:, :]))
        return torch.clamp(wav, -self.audio_limit, self.audio_limit)

    def forward(self, speech_feat: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self.decode(speech_feat, self.source(self.f0_predictor(speech_feat), noise))

    def fixed_noise(self, samples: int | None = None) -> torch.Tensor:
        """Upstream's `sine_waves` draw, [samples, 9]: the noise every call reads from sample 0."""
        return self.m_source.l_sin_gen.sine_waves[0, :samples]
