"""Upstream CosyVoice2's prompt frontend (`cosyvoice/cli/frontend.py` of `cosyvoice-minicpmo`) as the parity
reference for voice cloning, with the pieces it imports that are not importable here supplied from their own
sources:

- `whisper.log_mel_spectrogram`: openai-whisper's `whisper/audio.py` (installed with --no-deps; the package's
  __init__ needs tiktoken and numba, which only transcription uses), loaded on its own;
- `torchaudio.compliance.kaldi` and `torchaudio.transforms.Resample`: PyPI has no torchaudio for this torch, so
  `make install-convert` downloads the torchaudio wheel (not installed) and this module runs its own
  `compliance/kaldi.py` and the two resampling functions of `functional/functional.py` from it;
- `librosa.filters.mel` (Matcha's mel_spectrogram, the feat_extractor): librosa needs numba; the filters come
  from kaldi-native-fbank's librosa-mode mel banks, an implementation independent of the server's.

Upstream main's frontend reads the clip with `load_wav(wav, rate)` (resampled from the file's rate to 16 kHz
for tokens and embedding and to 24 kHz for the prompt mel); the snapshot takes a 16 kHz tensor and resamples
it to 24 kHz. `main_zero_shot` composes main's order from the snapshot's `_extract_*` methods.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import math
import sys
import types
import warnings
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from cosyvoice_server.convert import upstream

# CosyVoice2-0.5B's cosyvoice2.yaml: feat_extractor (matcha.utils.audio.mel_spectrogram)
FEAT_EXTRACTOR = dict(n_fft=1920, num_mels=80, sampling_rate=24000, hop_size=480, win_size=1920, fmin=0, fmax=8000,
                      center=False)
TORCHAUDIO_WHEELS = Path(sys.prefix) / "reference-wheels"


class Missing(ImportError):
    pass


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def _load_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _whisper() -> types.ModuleType:
    spec = importlib.util.find_spec("whisper")
    if spec is None or not spec.submodule_search_locations:
        raise Missing("openai-whisper is not installed (make install-convert)")
    pkg = _module("whisper")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["whisper"] = pkg
    audio = _load_file("whisper.audio", Path(pkg.__path__[0]) / "audio.py")
    pkg.log_mel_spectrogram = audio.log_mel_spectrogram
    return pkg


def _torchaudio() -> types.ModuleType:
    wheels = sorted(TORCHAUDIO_WHEELS.glob("torchaudio-*.whl"))
    if not wheels:
        raise Missing(f"no torchaudio wheel in {TORCHAUDIO_WHEELS} (make install-convert downloads it)")
    with zipfile.ZipFile(wheels[-1]) as z:
        kaldi_src = z.read("torchaudio/compliance/kaldi.py").decode()
        functional_src = z.read("torchaudio/functional/functional.py").decode()
    ta = _module("torchaudio")
    sys.modules["torchaudio"] = ta  # kaldi.py imports it (for mfcc's DCT only)
    kaldi = _module("torchaudio.compliance.kaldi")
    exec(compile(kaldi_src, "torchaudio/compliance/kaldi.py", "exec"), kaldi.__dict__)
    ns = {"torch": torch, "math": math, "warnings": warnings, "Optional": Optional, "Tensor": torch.Tensor,
          "_CPU": torch.device("cpu")}
    for node in ast.parse(functional_src).body:
        if isinstance(node, ast.FunctionDef) and node.name in ("_get_sinc_resample_kernel", "_apply_sinc_resample_kernel"):
            exec(compile(ast.Module([node], []), "torchaudio/functional/functional.py", "exec"), ns)

    class Resample(torch.nn.Module):
        """torchaudio.transforms.Resample with its defaults (sinc_interp_hann, width 6, rolloff 0.99)."""

        def __init__(self, orig_freq: int, new_freq: int) -> None:
            super().__init__()
            self.orig, self.new, self.gcd = orig_freq, new_freq, math.gcd(orig_freq, new_freq)
            if orig_freq != new_freq:
                self.kernel, self.width = ns["_get_sinc_resample_kernel"](orig_freq, new_freq, self.gcd)

        def forward(self, wav: torch.Tensor) -> torch.Tensor:
            if self.orig == self.new:
                return wav
            return ns["_apply_sinc_resample_kernel"](wav, self.orig, self.new, self.gcd, self.kernel, self.width)

    compliance = _module("torchaudio.compliance", kaldi=kaldi)
    ta.compliance, ta.transforms = compliance, _module("torchaudio.transforms", Resample=Resample)
    sys.modules.update({"torchaudio.compliance": compliance, "torchaudio.compliance.kaldi": kaldi,
                        "torchaudio.transforms": ta.transforms})
    return ta


def _librosa_mel(sr, n_fft, n_mels, fmin, fmax):
    import kaldi_native_fbank as knf

    mel = knf.MelBanksOptions()
    mel.num_bins, mel.low_freq, mel.high_freq, mel.is_librosa, mel.norm = n_mels, fmin, fmax, True, "slaney"
    frame = knf.FrameExtractionOptions()
    frame.samp_freq, frame.frame_length_ms, frame.round_to_power_of_two = sr, n_fft * 1000 / sr, False
    return np.array(knf.MelBanks(mel, frame).get_matrix(), np.float32)


class _Tokenizer:
    """upstream QwenTokenizer.encode over the checkpoint's BlankEN tokenizer with its special tokens."""

    def __init__(self, ckpt: Path) -> None:
        from transformers import AutoTokenizer

        from cosyvoice_server.convert.tokens import special_tokens

        self.tok = AutoTokenizer.from_pretrained(str(ckpt / "CosyVoice-BlankEN"))
        self.tok.add_special_tokens(special_tokens("cosyvoice2"))

    def encode(self, text, allowed_special=None):
        return self.tok([text])["input_ids"][0]


@functools.cache
def frontend_class():
    upstream.load()
    before = set(sys.modules)
    ta, _ = _torchaudio(), _whisper()
    librosa = _module("librosa", filters=_module("librosa.filters", mel=_librosa_mel))
    sys.modules.update({"librosa": librosa, "librosa.filters": librosa.filters})
    import matcha

    audio = _load_file("matcha.utils.audio", Path(matcha.__path__[0]) / "utils" / "audio.py")
    from cosyvoice.cli.frontend import CosyVoiceFrontEnd

    # The stand-ins served these imports; other code probing for the real packages (diffusers does) must not
    # find them. The frontend and Matcha keep their references.
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("torchaudio", "whisper", "librosa"):
            del sys.modules[name]
    return CosyVoiceFrontEnd, audio.mel_spectrogram, ta


def load(ckpt: Path):
    """CosyVoiceFrontEnd for the checkpoint, built as CosyVoice2.__init__ builds it, text normalization as wetext."""
    import inflect
    from wetext import Normalizer

    cls, mel_spectrogram, _ = frontend_class()
    fe = cls(lambda: _Tokenizer(ckpt), functools.partial(mel_spectrogram, **FEAT_EXTRACTOR), str(ckpt / "campplus.onnx"),
             str(ckpt / "speech_tokenizer_v2.onnx"), str(ckpt / "spk2info.pt"), "all")
    fe.use_ttsfrd = False  # the snapshot's text_normalize as main's wetext branch
    fe.zh_tn_model, fe.en_tn_model = Normalizer(lang="zh", operator="tn", remove_erhua=False), Normalizer(lang="en", operator="tn")
    fe.inflect_parser = inflect.engine()
    return fe


def resample(wav: np.ndarray, orig: int, new: int) -> torch.Tensor:
    """upstream main's load_wav(wav, new) for a mono clip at `orig`: [1, samples]."""
    _, _, ta = frontend_class()
    return ta.transforms.Resample(orig, new)(torch.from_numpy(wav)[None])


def main_zero_shot(fe, prompt_text: str, wav: np.ndarray, sr: int) -> dict:
    """upstream main's inference_zero_shot model input (without the text) for a clip at its own rate."""
    speech16, speech24 = resample(wav, sr, 16000), resample(wav, sr, 24000)
    text = fe._extract_text_token(fe.text_normalize(prompt_text, split=False))[0]
    feat, _ = fe._extract_speech_feat(speech24)
    tokens, _ = fe._extract_speech_token(speech16)
    n = min(int(feat.shape[1] / 2), tokens.shape[1])
    return {"prompt_text": text, "llm_prompt_speech_token": tokens[:, :n], "flow_prompt_speech_token": tokens[:, :n],
            "prompt_speech_feat": feat[:, : 2 * n], "llm_embedding": fe._extract_spk_embedding(speech16),
            "flow_embedding": fe._extract_spk_embedding(speech16)}
