"""The model repository format (`model.yaml`) and its validation.

A model directory holds one CosyVoice2 or CosyVoice3 stage graph. The manifest describes the model family
(special tokens, prompt text, streaming seams, fixed noise): the engine reads the description and never the
family's name.

    model.yaml                          this manifest
    tokenizer.json                      text tokenizer (HF `tokenizers` format; Qwen2's for CosyVoice2)
    llm.<precision>.onnx                decoder step with KV cache (see README "Model repository")
    llm_embeddings.npz                  text_embedding, speech_embedding, llm_embedding tables
    flow_encoder.<precision>.onnx       speech tokens -> mu, speaker embedding -> spks
    flow_encoder.incremental.<p>.onnx   the same for a streamed segment's tokens after its settled ones
                                        (CosyVoice2 with a chunk-masked encoder; optional)
    flow.decoder.estimator.<p>.onnx     x, mask, mu, t, spks, cond, streaming -> estimator_out
    flow.decoder.estimator.incremental.<p>.onnx
                                        the same over a streamed segment's new frames (optional)
    <stage>.<p>.weights                 the weights a stage's whole and incremental graphs share
    flow_noise.npy                      the fixed initial flow-matching noise [80, frames]
    hift.<precision>.onnx               speech_feat, noise, cache_source -> waveform (24 kHz), source; or,
                                        for a causal vocoder, speech_feat, noise -> waveform
    hift_noise.npy                      a causal vocoder's fixed source noise [samples, harmonics] (CosyVoice3)
    voices/<name>.npz                   embedding, prompt_text_tokens, prompt_speech_tokens, prompt_mel

Loading checks every file exists and every ONNX graph has the inputs and outputs, element types
and ranks the engine feeds it; errors name the file and what is wrong.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Precision = Literal["fp32", "fp16", "int8"]


class ModelLoadError(Exception):
    """The model directory is unusable; the message names the file and the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StageFiles(_Strict):
    files: dict[Precision, str] = Field(description="ONNX file per precision; fp32 is required")

    @model_validator(mode="after")
    def _needs_fp32(self) -> StageFiles:
        if "fp32" not in self.files:
            raise ValueError("files must include an fp32 entry")
        return self


class Sampling(_Strict):
    """CosyVoice2's repetition-aware sampling (`ras_sampling`); top_k 1 with tau_r > 1 is greedy decoding."""

    top_k: int = Field(25, ge=1)
    top_p: float = Field(0.8, gt=0, le=1)
    win_size: int = Field(10, ge=1)
    tau_r: float = Field(0.1, gt=0, description="resample from the whole distribution when the drawn token occurs "
                         "win_size x tau_r times in the last win_size tokens; above 1 never")


class Frontend(_Strict):
    """Upstream's text_normalize: wetext normalization and split_paragraph's lengths."""

    tokenizer: str = "tokenizer.json"
    system_prompt: str | None = Field(
        None, description="CosyVoice3: the text every LLM prompt starts with ('You are a helpful assistant.'); a "
        "clip's transcript becomes `<system_prompt><|endofprompt|><transcript>` and an instruction "
        "`<system_prompt> <instruction><|endofprompt|>`, as upstream's examples write them. None (CosyVoice2): the "
        "transcript alone, and the instruction followed by <|endofprompt|>")
    text_frontend: bool = Field(True, description="normalize (wetext) and split into segments; false: the text as is, "
                                "one segment (upstream's text_frontend=False)")
    max_text_tokens_per_segment: int = Field(80, ge=8, description="token_max_n")
    min_text_tokens_per_segment: int = Field(60, ge=0, description="token_min_n: a segment closes only past it")
    merge_text_tokens: int = Field(20, ge=0, description="merge_len: a shorter last segment joins the previous one")


class LLM(StageFiles):
    embeddings: str
    hidden_size: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    speech_token_size: int = Field(ge=2, description="speech vocabulary; every id from speech_token_size on stops "
                                   "a segment, and before min_len the id speech_token_size is masked (upstream's "
                                   "sampling_ids)")
    fill_token: int | None = Field(None, description="the streamed-text fill token, asking for more text "
                                   "(default speech_token_size + 2, CosyVoice2's; CosyVoice3's is + 3)")
    bistream_prompt_head: int | None = Field(
        None, description="streamed text: the prompt text up to and including this id goes into the LLM input "
        "before text and speech interleave (CosyVoice3: <|endofprompt|>); None: all of it interleaves")
    silent_tokens: list[int] = Field([], description="speech tokens of silence: after `max_silent_run` of them in a "
                                     "row, further ones go back into the LLM but not to the flow (CosyVoice3)")
    max_silent_run: int = Field(5, ge=0)
    sampling: Sampling = Sampling()
    min_token_text_ratio: float = Field(2, ge=0)
    max_token_text_ratio: float = Field(20, gt=0)

    @property
    def fill(self) -> int:
        return self.fill_token if self.fill_token is not None else self.speech_token_size + 2


class IncrementalEstimator(StageFiles):
    """The estimator over a streamed segment's new frames, given its earlier chunks' states
    (convert/incremental.py); a model without it re-runs the flow over every prefix, as upstream does."""

    chunk_frames: int = Field(ge=1, description="the estimator's static chunk mask, in mel frames: a frame of a "
                              "complete chunk is final")
    encoder_chunk_tokens: int | None = Field(None, ge=1, description="the encoder's static chunk mask, in tokens: its "
                                             "output for a complete chunk is final (None: an encoder without "
                                             "attention, CosyVoice3's, whose output is final for every token)")
    encoder: StageFiles | None = Field(None, description="the flow encoder over a streamed segment's tokens after its "
                                       "settled ones, given their attention keys and values "
                                       "(convert/incremental_encoder.py); None: every streamed chunk re-runs the "
                                       "encoder over the whole prefix")

    @model_validator(mode="after")
    def _encoder_chunks(self) -> IncrementalEstimator:
        if self.encoder is not None and self.encoder_chunk_tokens is None:
            raise ValueError("encoder needs encoder_chunk_tokens: the incremental encoder keeps whole encoder chunks")
        return self


class Flow(_Strict):
    encoder: StageFiles
    estimator: StageFiles
    incremental: IncrementalEstimator | None = None
    n_timesteps: int = Field(10, ge=1, le=100)
    cfg_rate: float = Field(0.7, ge=0)
    pre_lookahead_tokens: int = Field(3, ge=0)
    noise: str = Field("flow_noise.npy", description="fixed initial noise [mel_bins, frames], indexed from frame 0 "
                       "for every run, as upstream's CausalConditionalCFM.rand_noise")
    mel_bins: int = 80
    spk_embed_dim: int = 192


class Vocoder(StageFiles):
    noise: str | None = Field(None, description="a causal vocoder's fixed source noise, float32 [samples, harmonics], "
                              "read from sample 0 by every run (CosyVoice3's `sine_waves`, drawn at construction); "
                              "None: Gaussian noise drawn per request (CosyVoice2)")


class Streaming(_Strict):
    """Upstream's streaming constants (`cli/model.py`, CosyVoice2Model and CosyVoice3Model)."""

    first_hop_tokens: int = Field(25, ge=1, description="token_hop_len: the flow's static chunk size in tokens")
    max_hop_tokens: int = Field(100, ge=1, description="token_max_hop_len")
    hop_growth: int = Field(2, ge=1, description="stream_scale_factor: the hop is multiplied by it after each chunk")
    seams: Literal["crossfade", "causal"] = Field(
        "crossfade", description="how a streamed segment's chunks join. crossfade (CosyVoice2): each chunk's mel is "
        "vocoded after the previous chunk's last `mel_cache_frames` frames and source, the audio of those frames "
        "cross-faded with a Hamming window and held back. causal (CosyVoice3): the vocoder is causal but for a "
        "look-right; a chunk's audio is that of the segment's mel so far, less the last `look_right_frames` "
        "frames', which wait for the next chunk")
    mel_cache_frames: int = Field(8, ge=1, description="mel_cache_len (crossfade seams)")
    look_right_frames: int = Field(8, ge=0, description="causal seams: mel frames at the end of a non-final chunk "
                                   "whose audio waits for the next chunk")


VOICE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class Voices(_Strict):
    dir: str = "voices"
    default: str
    aliases: dict[str, str] = Field(
        {}, description="other names for voices (alias: voice file stem), e.g. OpenAI's `alloy: default`; "
        "an alias may not shadow a voice")

    @model_validator(mode="after")
    def _alias_names(self) -> Voices:
        bad = [n for pair in self.aliases.items() for n in pair if not re.match(VOICE_NAME, n)]
        if bad:
            raise ValueError(f"aliases: {bad[0]!r} is not a voice name (letters, digits, '_', '.', '-')")
        return self


class PromptEncoders(_Strict):
    """Upstream's ONNX prompt encoders, shipped with converted models for voice cloning."""

    campplus: str = Field("campplus.onnx", description="fbank [1,T,80] -> speaker embedding [1,192]")
    speech_tokenizer: str = Field("speech_tokenizer_v2.onnx", description="16 kHz log-mel [1,128,T] -> speech tokens")
    mel_fmax: float | None = Field(8000.0, gt=0, description="the prompt mel's highest filter edge in Hz "
                                   "(feat_extractor's fmax; CosyVoice3's null is half the sample rate)")


class Manifest(_Strict):
    format: Literal["cosyvoice2-onnx/v1"]
    name: str = Field(min_length=1)
    family: str = Field("CosyVoice2", description="the upstream model family, shown to users (the engine reads the "
                        "description below, never this name)")
    description: str = ""
    sample_rate: int = 24000
    token_rate: int = 25
    mel_rate: int = 50
    hop_samples: int = 480
    frontend: Frontend = Frontend()
    llm: LLM
    flow: Flow
    vocoder: Vocoder
    streaming: Streaming = Streaming()
    voices: Voices
    prompt_encoders: PromptEncoders | None = None
    generator: dict | None = None

    @property
    def token_mel_ratio(self) -> int:
        return self.mel_rate // self.token_rate

    @property
    def samples_per_token(self) -> int:
        return self.hop_samples * self.token_mel_ratio

    @model_validator(mode="after")
    def _causal_noise(self) -> Manifest:
        if self.streaming.seams == "causal" and not self.vocoder.noise:
            raise ValueError("streaming.seams causal needs vocoder.noise: every chunk re-vocodes the segment's mel so "
                             "far, which must read the same source noise each time")
        return self

    @model_validator(mode="after")
    def _rates(self) -> Manifest:
        if self.mel_rate % self.token_rate or self.sample_rate != self.mel_rate * self.hop_samples:
            raise ValueError(
                f"rates disagree: sample_rate {self.sample_rate} must equal mel_rate {self.mel_rate} x hop_samples "
                f"{self.hop_samples}, and mel_rate must be a multiple of token_rate {self.token_rate}"
            )
        return self


# What the engine feeds each graph: name -> (element type, rank). Outputs likewise.
def _llm_io(m: Manifest) -> tuple[dict[str, tuple[str, int]], dict[str, tuple[str, int]]]:
    ins = {"inputs_embeds": ("float", 3), "attention_mask": ("int64", 2), "position_ids": ("int64", 2)}
    outs = {"logits": ("float", 2)}
    for i in range(m.llm.num_layers):
        for kind in ("key", "value"):
            ins[f"past_key_values.{i}.{kind}"] = ("float", 4)
            outs[f"present.{i}.{kind}"] = ("float", 4)
    return ins, outs


# Inputs a graph may leave out: the engine feeds only those it has (CosyVoice3's flow encoder has no attention).
OPTIONAL_INPUTS = {"flow encoder": {"streaming"}}
STAGE_IO = {
    "flow encoder": (
        {"token": ("int64", 2), "token_len": ("int64", 1), "context_len": ("int64", 1), "streaming": ("int64", 1),
         "embedding": ("float", 2)},
        {"mu": ("float", 3), "spks": ("float", 2)},
    ),
    "flow estimator": (
        {"x": ("float", 3), "mask": ("float", 3), "mu": ("float", 3), "t": ("float", 1), "spks": ("float", 2), "cond": ("float", 3),
         "streaming": ("int64", 1)},
        {"estimator_out": ("float", 3)},
    ),
    "flow incremental estimator": (
        {"x": ("float", 3), "mask": ("float", 3), "mu": ("float", 3), "t": ("float", 1), "spks": ("float", 2),
         "cond": ("float", 3), "offset": ("int64", 1), "commit": ("int64", 1), "past": ("float", 4),
         "conv_state": ("float", 4)},
        {"estimator_out": ("float", 3), "new_past": ("float", 4), "new_conv_state": ("float", 4)},
    ),
    "flow incremental encoder": (
        {"token": ("int64", 2), "token_len": ("int64", 1), "context_len": ("int64", 1), "offset": ("int64", 1),
         "commit": ("int64", 1), "embedding": ("float", 2), "past": ("float", 4), "up_past": ("float", 4),
         "up_state": ("float", 3)},
        {"mu": ("float", 3), "spks": ("float", 2), "new_past": ("float", 4), "new_up_past": ("float", 4),
         "new_up_state": ("float", 3)},
    ),
    "vocoder": ({"speech_feat": ("float", 3), "noise": ("float", 3), "cache_source": ("float", 3)},
                {"waveform": ("float", 2), "source": ("float", 3)}),
    "causal vocoder": ({"speech_feat": ("float", 3), "noise": ("float", 3)}, {"waveform": ("float", 2)}),
}


def _varint(buf, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf, start: int, end: int):
    """(field number, start, end) of each length-delimited field of the protobuf message in buf[start:end]."""
    i = start
    while i < end:
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > end:
                raise ValueError("field runs past its message")
            yield key >> 3, i, i + n
            i += n
        else:
            raise ValueError(f"wire type {wire}")
    if i != end:
        raise ValueError("message runs past its end")


# ModelProto.graph, GraphProto.initializer/input/output/sparse_initializer, TensorProto.name, SparseTensorProto.values
_GRAPH, _INITIALIZER, _INPUT, _OUTPUT, _SPARSE_INITIALIZER, _TENSOR_NAME, _SPARSE_VALUES = 7, 5, 11, 12, 15, 8, 1
# TensorProto.external_data, StringStringEntryProto.key/value
_EXTERNAL_DATA, _KEY, _VALUE = 13, 1, 2


def _interface(path: Path):
    """The graph's inputs and outputs (onnx ValueInfoProtos), its initializers' names and the files their
    external data lie in, read without parsing the weights: onnx.load would decode every embedded tensor (half
    a gigabyte for the flow and HiFT stages at CosyVoice2's size, seconds of start-up) only for these few
    fields."""
    import mmap

    import onnx  # here, not at the top: its import takes most of a second, and the worker processes need none

    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        graphs = [(s, e) for field, s, e in _fields(buf, 0, len(buf)) if field == _GRAPH]
        if len(graphs) != 1:
            raise ValueError(f"{len(graphs)} graphs")
        inputs, outputs, init_names, external = [], [], set(), set()
        for field, s, e in _fields(buf, *graphs[0]):
            if field in (_INPUT, _OUTPUT):
                (inputs if field == _INPUT else outputs).append(onnx.ValueInfoProto.FromString(buf[s:e]))
            elif field in (_INITIALIZER, _SPARSE_INITIALIZER):
                if field == _SPARSE_INITIALIZER:
                    s, e = next(((vs, ve) for f2, vs, ve in _fields(buf, s, e) if f2 == _SPARSE_VALUES), (s, s))
                for f2, ns, ne in _fields(buf, s, e):
                    if f2 == _TENSOR_NAME:
                        init_names.add(buf[ns:ne].decode())
                    elif f2 == _EXTERNAL_DATA:
                        entry = {k: buf[vs:ve].decode() for k, vs, ve in _fields(buf, ns, ne)}
                        if entry.get(_KEY) == "location":
                            external.add(entry.get(_VALUE, ""))
        return inputs, outputs, init_names, external


def check_onnx_io(path: Path, stage: str, inputs: dict[str, tuple[str, int]], outputs: dict[str, tuple[str, int]],
                  optional: set[str] = frozenset()) -> None:
    """Raises ModelLoadError naming the file when the graph's interface differs from what the engine feeds
    (`optional` inputs may be absent)."""
    import onnx

    try:
        graph_in, graph_out, init_names, external = _interface(path)
    except Exception as exc:  # a corrupt file: ValueError, IndexError, DecodeError, OSError, ...
        raise ModelLoadError(f"{path}: not a readable ONNX model ({exc.__class__.__name__}: {exc})") from exc
    for name in sorted(external):
        # the runtime would open whatever the graph names: only a file beside it is part of the model
        if name in ("", ".", "..") or Path(name).name != name or "\\" in name:
            raise ModelLoadError(f"{path}: its weights must lie in a file beside it, not {name!r}")
        if not (path.parent / name).is_file():
            raise ModelLoadError(f"{path.parent / name}: missing (the weights of {path.name})")
    have_in = {v.name: v for v in graph_in if v.name not in init_names}
    have_out = {v.name: v for v in graph_out}
    inputs = {k: v for k, v in inputs.items() if k in have_in or k not in optional}
    for kind, want, have in (("input", inputs, have_in), ("output", outputs, have_out)):
        missing = sorted(set(want) - set(have))
        if missing:
            raise ModelLoadError(
                f"{path}: the {stage} graph lacks {kind}(s) {', '.join(missing)}; it has {', '.join(sorted(have)) or 'none'}"
            )
        for name, (elem, rank) in want.items():
            t = have[name].type.tensor_type
            try:
                got_elem = onnx.TensorProto.DataType.Name(t.elem_type).lower()
            except ValueError:  # a type number this onnx does not know
                got_elem = str(t.elem_type)
            got_rank = len(t.shape.dim) if t.HasField("shape") else rank
            if got_elem != elem or got_rank != rank:
                raise ModelLoadError(
                    f"{path}: {stage} {kind} '{name}' is {got_elem} rank {got_rank}, expected {elem} rank {rank}"
                )
    extra = sorted(set(have_in) - set(inputs))
    if extra:
        raise ModelLoadError(f"{path}: the {stage} graph has unexpected input(s) {', '.join(extra)}")


def load_manifest(model_dir: Path) -> Manifest:
    path = model_dir / "model.yaml"
    if not model_dir.is_dir():
        raise ModelLoadError(f"{model_dir}: model directory does not exist")
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing; a model directory needs a model.yaml manifest (see README)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ModelLoadError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise ModelLoadError(f"{path}: {problems}") from exc


def stage_file(model_dir: Path, stage: StageFiles, precision: Precision, what: str) -> Path:
    if precision not in stage.files:
        raise ModelLoadError(
            f"{model_dir / 'model.yaml'}: {what} has no {precision} file (available: {', '.join(sorted(stage.files))})"
        )
    path = model_dir / stage.files[precision]
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing ({what}, {precision})")
    return path


def validate_model_dir(model_dir: Path, precision: Precision = "fp32", extra_aliases: dict[str, str] | None = None) -> Manifest:
    """Loads the manifest and checks every file it names and every voice alias (with the server's own
    `extra_aliases`); used at start-up before any session is built."""
    m = load_manifest(model_dir)
    llm_in, llm_out = _llm_io(m)
    check_onnx_io(stage_file(model_dir, m.llm, precision, "llm"), "llm", llm_in, llm_out)
    check_onnx_io(stage_file(model_dir, m.flow.encoder, precision, "flow.encoder"), "flow encoder", *STAGE_IO["flow encoder"],
                  OPTIONAL_INPUTS["flow encoder"])
    check_onnx_io(stage_file(model_dir, m.flow.estimator, precision, "flow.estimator"), "flow estimator", *STAGE_IO["flow estimator"])
    if m.flow.incremental is not None:
        check_onnx_io(stage_file(model_dir, m.flow.incremental, precision, "flow.incremental"),
                      "flow incremental estimator", *STAGE_IO["flow incremental estimator"])
        if m.flow.incremental.encoder is not None:
            check_onnx_io(stage_file(model_dir, m.flow.incremental.encoder, precision, "flow.incremental.encoder"),
                          "flow incremental encoder", *STAGE_IO["flow incremental encoder"])
    vocoder = "causal vocoder" if m.streaming.seams == "causal" else "vocoder"
    check_onnx_io(stage_file(model_dir, m.vocoder, precision, "vocoder"), vocoder, *STAGE_IO[vocoder])
    fixed = [(m.vocoder.noise, "vocoder noise")] if m.vocoder.noise else []
    for rel, what in ((m.frontend.tokenizer, "tokenizer"), (m.llm.embeddings, "LLM embeddings"), (m.flow.noise, "flow noise"),
                      *fixed):
        if not (model_dir / rel).is_file():
            raise ModelLoadError(f"{model_dir / rel}: missing ({what})")
    if m.prompt_encoders is not None:
        for rel in (m.prompt_encoders.campplus, m.prompt_encoders.speech_tokenizer):
            if not (model_dir / rel).is_file():
                raise ModelLoadError(f"{model_dir / rel}: missing (a prompt encoder named in model.yaml)")
    vdir = model_dir / m.voices.dir
    if not (vdir / f"{m.voices.default}.npz").is_file():
        raise ModelLoadError(f"{vdir / (m.voices.default + '.npz')}: missing (the default voice named in model.yaml)")
    voice_aliases(model_dir, m, {p.stem for p in vdir.glob("*.npz")}, extra_aliases or {})
    return m


def voice_aliases(model_dir: Path, m: Manifest, voices: set[str], extra: dict[str, str]) -> dict[str, str]:
    """The model's alias table with `extra` (the server's --voice-aliases) added over it; every alias must
    name an existing voice and none may hide one."""
    table = m.voices.aliases | extra
    for alias, target in sorted(table.items()):
        where = "--voice-aliases" if alias in extra else f"{model_dir / 'model.yaml'}: voices.aliases"
        if target not in voices:
            raise ModelLoadError(f"{where}: alias '{alias}' points to voice '{target}', which does not exist "
                                 f"(voices: {', '.join(sorted(voices))})")
        if alias in voices:
            raise ModelLoadError(f"{where}: alias '{alias}' has the name of an existing voice; choose another name")
    return table
