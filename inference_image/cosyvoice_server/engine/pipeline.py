"""Loads a model directory into the three stage engines, the text frontend and the voices."""

from __future__ import annotations

import logging
import os
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..config import Settings
from ..frontend import TextFrontend
from ..model.manifest import Manifest, ModelLoadError, Precision, stage_file, validate_model_dir
from ..startup import Phases
from .flow import FlowEngine, VocoderEngine
from .llm import LLMEngine
from .runtime import DeviceRequest, Runtime, RuntimeOptions

log = logging.getLogger(__name__)


VOICE_ARRAYS = ("embedding", "prompt_text_tokens", "prompt_speech_tokens", "prompt_mel")


@dataclass(frozen=True)
class Voice:
    """A speaker as upstream's `spk2info` entries hold it. The flow always gets the prompt speech tokens, the
    prompt mel and the embedding; the LLM's prefix is [prompt text + text, prompt speech tokens], where a
    cross-lingual voice (upstream's `frontend_cross_lingual`) and an instructed one (`frontend_instruct2`)
    leave the prompt speech tokens out. An SFT speaker has an embedding only."""

    name: str
    embedding: np.ndarray  # [192]
    prompt_text_tokens: np.ndarray  # the LLM's prompt text: a transcript, or an instruction (instructed())
    prompt_speech_tokens: np.ndarray  # the flow's prompt tokens (and the LLM's, unless cross_lingual)
    prompt_mel: np.ndarray  # [2 * prompt tokens, 80]
    cross_lingual: bool = False

    @property
    def llm_prompt_speech_tokens(self) -> np.ndarray:
        return self.prompt_speech_tokens[:0] if self.cross_lingual else self.prompt_speech_tokens

    @property
    def has_prompt_speech(self) -> bool:
        return len(self.prompt_speech_tokens) > 0

    def instructed(self, instruction_tokens: np.ndarray) -> Voice:
        """Upstream's instruct2 input: the instruction (ending in <|endofprompt|>) as the LLM's prompt text,
        no prompt speech in the LLM, the flow prompt and embedding unchanged."""
        return replace(self, prompt_text_tokens=np.asarray(instruction_tokens, np.int64), cross_lingual=True)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, k).nbytes for k in VOICE_ARRAYS)


def _load_npz(path: Path, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in keys if k not in data]
            if missing:
                raise ModelLoadError(f"{path}: missing array(s) {', '.join(missing)} (has {', '.join(data.files)})")
            return {k: data[k] for k in (*keys, *optional) if k in data}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"{path}: not a readable .npz file ({exc})") from exc


def load_voice(path: Path, m: Manifest, name: str | None = None) -> Voice:
    """One voice file (the model's voices/ dir format; `cross_lingual` is optional, false when absent)."""
    a = _load_npz(path, VOICE_ARRAYS, ("cross_lingual",))
    if a["embedding"].shape != (m.flow.spk_embed_dim,):
        raise ModelLoadError(f"{path}: embedding has shape {a['embedding'].shape}, expected ({m.flow.spk_embed_dim},)")
    for key in ("prompt_text_tokens", "prompt_speech_tokens"):
        if a[key].ndim != 1 or a[key].dtype.kind not in "iu":
            raise ModelLoadError(f"{path}: {key} is {a[key].dtype} {a[key].shape}, expected a 1-d integer array")
    if a["prompt_mel"].shape != (len(a["prompt_speech_tokens"]) * m.token_mel_ratio, m.flow.mel_bins):
        raise ModelLoadError(
            f"{path}: prompt_mel has shape {a['prompt_mel'].shape}, expected "
            f"({len(a['prompt_speech_tokens']) * m.token_mel_ratio}, {m.flow.mel_bins}) for its prompt tokens"
        )
    if len(a["prompt_speech_tokens"]) and int(a["prompt_speech_tokens"].max()) >= m.llm.speech_token_size:
        raise ModelLoadError(f"{path}: prompt speech tokens reach {int(a['prompt_speech_tokens'].max())}; the model "
                             f"has {m.llm.speech_token_size}")
    return Voice(name or path.stem, a["embedding"].astype(np.float32), a["prompt_text_tokens"].astype(np.int64),
                 a["prompt_speech_tokens"].astype(np.int64), a["prompt_mel"].astype(np.float32),
                 bool(a.get("cross_lingual", np.False_)))


def save_voice(path: Path, voice: Voice) -> None:
    """Writes the voice as load_voice reads it, atomically: a temporary file beside it, fsynced, renamed."""
    arrays = {k: getattr(voice, k) for k in VOICE_ARRAYS} | {"cross_lingual": np.bool_(voice.cross_lingual)}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_voices(model_dir: Path, m: Manifest) -> dict[str, Voice]:
    return {path.stem: load_voice(path, m) for path in sorted((model_dir / m.voices.dir).glob("*.npz"))}


def _load_npy(path: Path, mmap: bool = False) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a readable .npy file ({exc})") from exc


def load_flow_noise(model_dir: Path, m: Manifest) -> np.ndarray:
    path = model_dir / m.flow.noise
    noise = _load_npy(path)
    if noise.ndim != 2 or noise.shape[0] != m.flow.mel_bins or noise.dtype != np.float32:
        raise ModelLoadError(f"{path}: flow noise is {noise.dtype} {noise.shape}, expected float32 ({m.flow.mel_bins}, frames)")
    return noise


def load_vocoder_noise(model_dir: Path, m: Manifest) -> np.ndarray | None:
    """The causal vocoder's fixed source noise [samples, harmonics], memory-mapped: CosyVoice3's covers 300 s
    (259 MB), of which a segment reads its own length."""
    if not m.vocoder.noise:
        return None
    path = model_dir / m.vocoder.noise
    noise = _load_npy(path, mmap=True)
    if noise.ndim != 2 or noise.dtype != np.float32 or noise.shape[0] < m.hop_samples:
        raise ModelLoadError(f"{path}: vocoder noise is {noise.dtype} {noise.shape}, expected float32 (samples, harmonics)")
    return noise


def choose_precision(requested: str, device: str, m: Manifest) -> Precision:
    """`auto` takes FP16 files on CUDA when the manifest provides them for every stage, else FP32."""
    if requested != "auto":
        return requested  # type: ignore[return-value]
    stages = (m.llm, m.flow.encoder, m.flow.estimator, m.vocoder)
    if device == "cuda" and all("fp16" in s.files for s in stages):
        return "fp16"
    return "fp32"


class Pipeline:
    def __init__(self, model_dir: Path, device: DeviceRequest = "auto", precision: str = "auto",
                 options: RuntimeOptions | None = None, phases: Phases | None = None, load_threads: int = 1,
                 flow_cache_bytes: int = Settings.model_fields["flow_cache_mib"].default * 2**20) -> None:
        """`load_threads` stages' sessions are created side by side (ONNX Runtime's graph optimisation of one
        session runs on one core); `phases` times each session and the rest of the load; streamed segments'
        flow caches hold at most `flow_cache_bytes` together."""
        t0 = time.perf_counter()
        phases = phases or Phases(emit=log.debug)
        self.model_dir = model_dir
        self.manifest = m = validate_model_dir(model_dir, "fp32")
        self.runtime = Runtime(device, options, phases)
        self.precision = choose_precision(precision, self.runtime.device, m)
        if self.precision != "fp32":
            validate_model_dir(model_dir, self.precision)
        p = self.precision
        self.frontend = TextFrontend.of_model(model_dir, m.frontend)
        emb = _load_npz(model_dir / m.llm.embeddings, ("text_embedding", "speech_embedding", "llm_embedding"))
        inc = m.flow.incremental
        with phases("sessions"), ThreadPoolExecutor(load_threads, thread_name_prefix="session-load") as pool:
            llm = pool.submit(LLMEngine, self.runtime, stage_file(model_dir, m.llm, p, "llm"), m.llm, emb)
            flow = pool.submit(FlowEngine, self.runtime, stage_file(model_dir, m.flow.encoder, p, "flow.encoder"),
                               stage_file(model_dir, m.flow.estimator, p, "flow.estimator"), m.flow, m.token_mel_ratio,
                               load_flow_noise(model_dir, m),
                               stage_file(model_dir, inc, p, "flow.incremental") if inc else None, flow_cache_bytes,
                               stage_file(model_dir, inc.encoder, p, "flow.incremental.encoder") if inc and inc.encoder else None)
            vocoder = pool.submit(VocoderEngine, self.runtime, stage_file(model_dir, m.vocoder, p, "vocoder"),
                                  m.hop_samples, load_vocoder_noise(model_dir, m))
            self.llm, self.flow, self.vocoder = llm.result(), flow.result(), vocoder.result()
        with phases("voices"):
            self.voices = load_voices(model_dir, m)
        if m.voices.default not in self.voices:
            raise ModelLoadError(f"{model_dir / m.voices.dir}: the default voice '{m.voices.default}' is missing")
        log.info("loaded %s from %s on %s (%s) in %.2fs; voices: %s", m.name, model_dir, self.runtime.device, p,
                 time.perf_counter() - t0, ", ".join(self.voices))

    @property
    def sample_rate(self) -> int:
        return self.manifest.sample_rate

    def token_room(self, prompt_tokens: int) -> int:
        """Speech tokens one segment may have after a voice's `prompt_tokens`: the flow's fixed noise covers the
        prompt and the segment, a causal vocoder's the segment's audio."""
        room = self.flow.token_room(prompt_tokens)
        if (frames := self.vocoder.max_frames) is not None:
            room = min(room, frames // self.manifest.token_mel_ratio)
        return room
