"""A reference clip -> a `Voice`, as upstream CosyVoice2's `frontend_zero_shot` / `frontend_cross_lingual`
(cosyvoice/cli/frontend.py) compute it:

- the clip at 16 kHz -> openai-whisper's 128-bin log-mel -> the speech tokenizer (`speech_tokenizer_v2.onnx`,
  CosyVoice3's `_v3`; with the frame count)
  -> prompt speech tokens; clips over 30 s are refused, as upstream's `_extract_speech_token` does;
- the clip at 16 kHz -> 80-bin Kaldi fbank (dither 0, Kaldi's other defaults; kaldi-native-fbank) minus its
  mean over time -> `campplus.onnx` -> the 192-d speaker embedding;
- the clip at 24 kHz -> the flow's 80-bin prompt mel (spectral.prompt_mel; up to 8 kHz for CosyVoice2, the
  whole band for CosyVoice3: the manifest's `mel_fmax`);
- tokens and mel cut to a common length, `token_len = min(mel_frames // 2, tokens)`, mel to 2 x token_len;
- the transcript -> normalized as synthesis input (upstream's `text_normalize(split=False)`) and tokenized:
  the LLM's prompt text. Without a transcript the voice is cross-lingual: the LLM prefix carries neither
  prompt text nor prompt speech tokens; the flow still gets tokens, mel and embedding.

Resampling goes from the clip's own rate straight to each target rate, as upstream's `load_wav(wav, rate)`.
The two encoders run on ONNX Runtime's CPU provider with few threads (small graphs), so registering a voice
never takes the accelerator from the synthesis stages and adds only a bounded load beside their threads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..engine.pipeline import Voice
from ..frontend import TextFrontend
from ..model.manifest import Manifest, ModelLoadError
from . import spectral

TOKENIZER_RATE = 16000
MAX_SECONDS = 30.0  # upstream's _extract_speech_token refuses longer prompts
SILENCE_PEAK = 10 ** (-60 / 20)  # a clip whose loudest sample stays under -60 dBFS has no voice to clone
KALDI_FRAME = 400  # one 25 ms Kaldi frame at 16 kHz: the shortest clip the fbank can take


class ClipError(ValueError):
    """The clip (or its transcript: `param`) cannot be turned into a voice; the message says why, in words for
    the API's user, and `code` is the stable machine-readable reason."""

    def __init__(self, message: str, code: str = "invalid_audio", param: str = "audio") -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param

    def __reduce__(self):  # raised in the extraction worker, re-raised in the server
        return type(self), (self.message, self.code, self.param)


def _session(path: Path, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime raises its own exception types for unreadable graphs
        raise ModelLoadError(f"{path}: not a usable prompt encoder ({exc.__class__.__name__}: {exc})") from exc


def kaldi_fbank(audio16k: np.ndarray, bins: int = 80) -> np.ndarray:
    """torchaudio.compliance.kaldi.fbank(num_mel_bins=bins, dither=0, sample_frequency=16000) on [-1, 1] audio."""
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = TOKENIZER_RATE
    opts.frame_opts.dither = 0.0
    opts.mel_opts.num_bins = bins
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(TOKENIZER_RATE, audio16k.astype(np.float32))
    fbank.input_finished()
    return np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)]).astype(np.float32)


class PromptEncoder:
    """Built once per server from the model directory; `extract` is thread-safe."""

    def __init__(self, model_dir: Path, manifest: Manifest, frontend: TextFrontend, threads: int = 1) -> None:
        enc = manifest.prompt_encoders
        if enc is None:
            raise ModelLoadError(f"{model_dir / 'model.yaml'}: no prompt_encoders (campplus, speech_tokenizer); this "
                                 "model cannot clone voices (models converted by `cosyvoice-server convert` can)")
        self.manifest = manifest
        self.frontend = frontend
        self.campplus = _session(model_dir / enc.campplus, threads)
        self.tokenizer = _session(model_dir / enc.speech_tokenizer, threads)
        self._tok_in = [i.name for i in self.tokenizer.get_inputs()]
        self._spk_in = self.campplus.get_inputs()[0].name

    # The pieces, each as upstream's frontend method of the same job -----------------------------------
    def speech_tokens(self, audio16k: np.ndarray) -> np.ndarray:
        feats = spectral.whisper_log_mel(audio16k)[None]
        out = self.tokenizer.run(None, {self._tok_in[0]: feats, self._tok_in[1]: np.array([feats.shape[2]], np.int32)})
        return out[0].reshape(-1).astype(np.int64)

    def speaker_embedding(self, audio16k: np.ndarray) -> np.ndarray:
        feat = kaldi_fbank(audio16k)
        feat = feat - feat.mean(axis=0, keepdims=True)
        return self.campplus.run(None, {self._spk_in: feat[None]})[0].reshape(-1).astype(np.float32)

    def prompt_text(self, transcript: str) -> np.ndarray:
        return np.asarray(self.frontend.prompt_tokens(transcript), np.int64)

    # The whole clip ------------------------------------------------------------------------------------
    def extract(self, audio: np.ndarray, sample_rate: int, transcript: str | None, name: str = "") -> Voice:
        """A voice from mono audio in [-1, 1] at its own rate (>= 16 kHz). `transcript` None: cross-lingual."""
        audio = check_clip(audio, sample_rate)
        m = self.manifest
        text = np.zeros(0, np.int64)
        if transcript is not None:
            if not self.frontend.encode(self.frontend.normalized(transcript)):
                raise ClipError("The transcript has no words after normalization; give the words spoken in the clip, "
                                "or leave the transcript out for a cross-lingual voice.", "invalid_transcript", "transcript")
            text = self.prompt_text(transcript)
        elif self.frontend.system_prompt is not None:  # CosyVoice3: the LLM prompt always ends the system prompt
            text = self.prompt_text("")
        audio16k = spectral.resample(audio, sample_rate, TOKENIZER_RATE)
        tokens = self.speech_tokens(audio16k)
        fmax = m.prompt_encoders.mel_fmax or m.sample_rate / 2  # type: ignore[union-attr]  (librosa's None)
        mel = spectral.prompt_mel(spectral.resample(audio, sample_rate, m.sample_rate), m.sample_rate,
                                  hop=m.hop_samples, n_mels=m.flow.mel_bins, fmax=fmax)
        ratio = m.token_mel_ratio
        n = min(len(mel) // ratio, len(tokens))
        if n < 1:
            raise ClipError("The clip is too short to give any speech tokens.")
        if int(tokens.max()) >= m.llm.speech_token_size:
            raise ModelLoadError(f"the speech tokenizer gave token {int(tokens.max())}; the model's LLM has "
                                 f"{m.llm.speech_token_size} speech tokens (a tokenizer from another model?)")
        embedding = self.speaker_embedding(audio16k)
        if embedding.shape != (m.flow.spk_embed_dim,) or not np.isfinite(embedding).all():
            raise ModelLoadError(f"campplus gave an embedding of shape {embedding.shape}; the flow takes "
                                 f"({m.flow.spk_embed_dim},) finite values")
        return Voice(name, embedding, text, tokens[:n], mel[: n * ratio], cross_lingual=transcript is None)


def check_clip(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """The clip as float32 mono, or ClipError for what upstream could not use (or would clone silence from)."""
    audio = np.asarray(audio)
    if audio.ndim != 1:
        raise ClipError(f"The clip must be mono audio (one channel); got an array of shape {audio.shape}.")
    if sample_rate < TOKENIZER_RATE:
        raise ClipError(f"The clip's sample rate is {sample_rate} Hz; voice cloning needs at least {TOKENIZER_RATE} Hz.")
    seconds = len(audio) / sample_rate
    if seconds > MAX_SECONDS:
        raise ClipError(f"The clip is {seconds:.1f} s long; a voice prompt may be at most {MAX_SECONDS:g} s.")
    if len(audio) * TOKENIZER_RATE < KALDI_FRAME * sample_rate:
        raise ClipError(f"The clip is {seconds * 1000:.0f} ms long; it is too short to clone a voice from.")
    if not np.isfinite(audio).all():
        raise ClipError("The clip contains samples that are not finite numbers.")
    if float(np.abs(audio).max()) < SILENCE_PEAK:
        raise ClipError("The clip is silent (its loudest sample is below -60 dBFS).")
    return audio.astype(np.float32)
