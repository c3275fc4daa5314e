"""What the HTTP layer shares: the loaded pipeline, the scheduler, readiness and draining."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .config import Settings
from .engine.bistream import text_room
from .engine.pipeline import Pipeline, Voice
from .frontend import TextFrontend
from .keys import RotatingKey
from .lexicons import LexiconStore
from .model.manifest import voice_aliases
from .metrics import Metrics
from .options import SpeechRequest
from .model_cache import hold_in_use
from .scheduling.request import Done, Outcome, SynthesisRequest, TextFeed, WholeText
from .scheduling.scheduler import Scheduler, SchedulerConfig
from .startup import Phases
from .streaming import ChunkPlanner
from .streamtext import StreamTokenizer
from .text_workers import TextWorkers
from .voices.store import UNREADABLE_REASONS, PromptCache, VoiceStore
from .voices.worker import ExtractionPool

log = logging.getLogger(__name__)

WARMUP_TEXT = "Warm-up."
# Speech tokens the warm-up may generate: the flow and the vocoder need only a few to run once on real input;
# the first runs' set-up is what a warm-up is for, and each token more is only a decode step (16 took 3.1 s
# at CosyVoice2-0.5B's size on 2 cores, where a 6-token request took 1.25 s once warm).
WARMUP_MAX_TOKENS = 4

STORE_IO_THREADS = 2  # voice-store reads are small files; two keep a listing from waiting behind a lookup
# WebSocket text deltas are tokenized on these (up to a message's worth each, bounded by streamtext.RUN_CHARS
# held back); the tokenizer leaves the interpreter lock often enough that the loop keeps its turns.
STREAM_TEXT_THREADS = 2


class InstructionError(ValueError):
    """A request's `instructions` cannot be applied; the message says why."""


def instruct(voice: Voice, instructions: str, frontend: TextFrontend) -> Voice:
    """The voice for upstream's `inference_instruct2`: the instruction with the end-of-prompt token as the
    LLM's prompt text, no prompt speech in the LLM, the voice's flow prompt and embedding. Upstream's
    CosyVoice2 takes instructions only with a prompt clip (its `inference_instruct` for SFT speakers raises
    NotImplementedError), so a voice without prompt speech is refused."""
    if not frontend.takes_instructions:
        raise InstructionError("This model's tokenizer has no <|endofprompt|> token, so it cannot take 'instructions' "
                               "(CosyVoice2's instruct mode needs it).")
    if not voice.has_prompt_speech:
        raise InstructionError(f"The voice '{voice.name}' is a speaker embedding without prompt speech (an SFT voice); "
                               "CosyVoice2 follows instructions only with a voice cloned from a clip (instruct2). "
                               "Register a voice from a clip, or leave 'instructions' out.")
    tokens = frontend.instruction_tokens(instructions)
    if len(tokens) > frontend.hard_max:
        raise InstructionError(f"The instructions are {len(tokens)} tokens long; the limit is {frontend.hard_max}.")
    return voice.instructed(tokens)


@dataclass
class ServerState:
    settings: Settings
    metrics: Metrics
    api_key: RotatingKey | None = None
    registration_key: RotatingKey | None = None
    admin_key: RotatingKey | None = None  # deletes any registered voice
    pipeline: Pipeline | None = None
    scheduler: Scheduler | None = None
    ready: bool = False
    draining: bool = False
    load_error: str | None = None
    voice_aliases: dict[str, str] = field(default_factory=dict)  # alias -> voice, model.yaml + --voice-aliases
    created: int = field(default_factory=lambda: int(time.time()))
    voice_store: VoiceStore | None = None
    prompt_cache: PromptCache | None = None
    extraction: ExtractionPool | None = None  # voice feature extraction, while registration is allowed
    text: TextWorkers | None = None  # request text normalization, once loaded
    lexicons: LexiconStore | None = None  # the pronunciation lexicons (--lexicon-dir), once loaded
    # Blocking work off the event loop, each kind on threads of its own, never the loop's default executor:
    # registrations wait for an extraction worker for up to their deadline, and while the default executor's
    # few threads (cores + 4) were all held by them, compressed responses could not be encoded.
    encoders: ThreadPoolExecutor = field(init=False)
    registrations: ThreadPoolExecutor = field(init=False)
    phases: Phases = field(init=False)  # the start's phases, logged and in cosyvoice_startup_phase_seconds
    model_lock: int | None = None  # a shared flock on a fetched model: the node cache does not evict it while held
    store_io: ThreadPoolExecutor = field(init=False)  # reads and deletes of the voice store (disk or shared volume)
    stream_text: ThreadPoolExecutor = field(init=False)  # WebSocket sessions' text deltas

    def __post_init__(self) -> None:
        self.phases = Phases(lambda phase, seconds: self.metrics.startup_phase.labels(phase).set(seconds))
        self.encoders = ThreadPoolExecutor(self.settings.audio_encoder_threads, thread_name_prefix="audio-encoder")
        # one per registration that may run (more get 429 before they need one)
        self.registrations = ThreadPoolExecutor(self.settings.voice_registration_concurrency,
                                                thread_name_prefix="voice-registration")
        self.store_io = ThreadPoolExecutor(STORE_IO_THREADS, thread_name_prefix="voice-store")
        self.stream_text = ThreadPoolExecutor(STREAM_TEXT_THREADS, thread_name_prefix="stream-text")

    def close_executors(self) -> None:
        for executor in (self.encoders, self.registrations, self.store_io, self.stream_text):
            executor.shutdown(wait=False, cancel_futures=True)

    async def on_store(self, fn, *args):
        """`fn(*args)` on the voice store's threads: a slow shared volume delays voice lookups, nothing else."""
        return await asyncio.get_running_loop().run_in_executor(self.store_io, fn, *args)

    @property
    def model_id(self) -> str:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        return self.pipeline.manifest.name if self.pipeline else "loading"

    def load(self) -> None:
        """Builds the sessions and starts the stage threads (blocking; run off the event loop)."""
        s = self.settings
        from .engine.runtime import RuntimeOptions

        self.model_lock = hold_in_use(s.model_dir)

        opts = RuntimeOptions(device_id=s.device_id, gpu_mem_limit_bytes=s.gpu_mem_limit_bytes,
                              intra_op_threads=s.intra_op_threads, flow_threads=s.flow_threads)
        self.pipeline = Pipeline(s.model_dir, s.device, s.precision, opts, self.phases, s.session_load_threads,
                                 s.flow_cache_mib * 2**20)
        self.metrics.model_info.labels(self.model_id, s.model_version or self.model_id).set(1)
        self.voice_aliases = voice_aliases(s.model_dir, self.pipeline.manifest, set(self.pipeline.voices),
                                           s.voice_alias_table())
        if s.voice_store_dir is not None:
            self.voice_store = VoiceStore(s.voice_store_dir, self.pipeline.manifest, writable=s.allow_voice_registration)
            self.prompt_cache = PromptCache(self.voice_store, s.voice_cache_bytes, self._count_lookup)
            self.metrics.registered_voices.set_function(self.voice_store.count)
            for reason in UNREADABLE_REASONS:
                self.metrics.voice_store_unreadable.labels(reason).set_function(
                    lambda reason=reason: self.voice_store.unreadable[reason])
        if s.allow_voice_registration:
            with self.phases("voice_workers"):
                self.extraction = ExtractionPool(s.model_dir, s.voice_registration_concurrency, s.voice_worker_memory_mib,
                                                 lambda reason: self.metrics.voice_extraction_replacements.labels(reason).inc())
            self.metrics.voice_extraction_workers.set_function(lambda: self.extraction.live)
        self.lexicons = LexiconStore(s.lexicon_dir, s.default_lexicon_names())
        with self.phases("text_workers"):
            self.text = TextWorkers(s.model_dir, self.pipeline.manifest.frontend, s.text_workers)
        self.scheduler = Scheduler(self.pipeline, SchedulerConfig.from_settings(s, self._measured_batches()),
                                   self.metrics)
        self.metrics.flow_cache_bytes.set_function(lambda: self.pipeline.flow.ledger.used)
        self.metrics.flow_prompt_cache_bytes.set_function(lambda: self.pipeline.flow.prompt_cache_bytes)
        self.scheduler.start()

    def _measured_batches(self) -> dict[str, int]:
        """The paying batch of each stage set to 0 (measure), measured on this device."""
        s = self.settings
        if s.flow_max_batch and s.vocoder_max_batch:
            return {}
        from .scheduling import probe

        with self.phases("batch_probe"):
            found = probe.measure(self.pipeline, s.max_batch_size)
        for stage, (size, times) in found.items():
            log.info("%s stage: batches of up to %d (%s)", stage, size,
                     ", ".join(f"{b}: {t * 1000:.1f} ms" for b, t in times.items()))
        return {stage: size for stage, (size, _) in found.items()}

    async def warm_up(self) -> None:
        """One real synthesis through every stage, so the first user request pays no lazy init."""
        with self.phases("warmup"):
            await self._warm_up()

    async def _warm_up(self) -> None:
        req = self.new_request(SpeechRequest(model=self.model_id, input=WARMUP_TEXT, seed=0), None,
                               await self.text_segments(WARMUP_TEXT))
        # Not bound by --request-timeout-s: an expired request is dropped without a Done, which would
        # leave start-up waiting forever on a slow device; the startup probe bounds start-up instead.
        req.deadline = math.inf
        req.max_tokens = min(req.max_tokens, WARMUP_MAX_TOKENS)
        self.scheduler.submit(req)
        while not isinstance(item := await req.out.get(), Done):
            pass
        if item.outcome != Outcome.OK:
            raise RuntimeError(f"warm-up synthesis failed: {item.message}")

    def voice(self, name: str | None) -> str | None:
        """The bundled voice a requested name (a voice or an alias) stands for; the default for None; None if unknown."""
        if name is None:
            return self.pipeline.manifest.voices.default
        name = self.voice_aliases.get(name, name)
        return name if name in self.pipeline.voices else None

    async def find_voice(self, name: str | None) -> Voice | None:
        """A bundled voice or alias first (they cannot be shadowed), then a registered voice; None if unknown."""
        bundled = self.voice(name)
        if bundled is not None:
            return self.pipeline.voices[bundled]
        if self.prompt_cache is None or name is None:
            return None
        found = await self.on_store(self.prompt_cache.lookup, name)
        self.metrics.voice_cache_bytes.set(self.prompt_cache.bytes)
        return found

    def _count_lookup(self, hit: bool) -> None:
        self.metrics.voice_cache_lookups.labels("hit" if hit else "miss").inc()

    async def text_segments(self, text: str) -> list[np.ndarray]:
        """The input's LLM segments, computed in a text worker process: normalizing a long input takes up to
        a second of CPU under the GIL, which on the event loop would hold up every other request."""
        return await self.text.segments(text)

    def new_request(self, body: SpeechRequest, voice: Voice | None = None,
                    segments: list[np.ndarray] | None = None, max_tokens: int | None = None,
                    speeds: list[float] | None = None) -> SynthesisRequest:
        """`voice`: as `find_voice` resolved it; None looks the request's voice up among the bundled ones.
        `segments`: the input's, from `text_segments`; None computes them here, on the calling thread.
        `max_tokens`: the most of `token_bounds`, when the caller has it already. `speeds`: each segment's
        speed where SSML set them (else the body's for all)."""
        p = self.pipeline
        voice = voice or p.voices[self.voice(body.voice_id)]
        if body.instructions and body.instructions.strip():
            voice = instruct(voice, body.instructions, p.frontend)
        # As upstream: chunks only for streamed responses, and `speed` stretches whole segments only.
        chunked = body.stream and body.speed == 1.0 and all(x == 1.0 for x in speeds or ())
        if segments is None:
            segments = p.frontend.segments(body.input)
        return SynthesisRequest(
            text=WholeText(segments, speeds),
            voice=voice,
            speed=body.speed,
            seed=body.seed,
            deadline=time.monotonic() + self.settings.request_timeout_s,
            loop=asyncio.get_running_loop(),
            planner=self._planner(voice, chunked),
            max_tokens=self.token_bounds(segments, min(speeds or [body.speed]))[1] if max_tokens is None else max_tokens,
        )

    def new_bistream_request(self, voice: str | Voice | None = None, seed: int | None = None,
                             instructions: str | None = None) -> SynthesisRequest:
        """A session whose text arrives through `req.text` (push / flush / end); submit it as usual. Its
        out queue gets audio chunks, a SegmentDone after each segment, then Done. `voice`: a resolved
        Voice, or a bundled voice or alias name (None: the default); ValueError for an unknown name and
        InstructionError (a ValueError) for instructions the voice or model cannot take."""
        p = self.pipeline
        m = p.manifest
        if isinstance(voice, Voice):
            v = voice
        elif (name := self.voice(voice)) is not None:
            v = p.voices[name]
        else:
            raise ValueError(f"unknown voice {voice!r}")
        if instructions and instructions.strip():
            v = instruct(v, instructions, p.frontend)  # as upstream's inference_instruct2 with a text generator
        # a segment is cut where the whole-text path cuts one, or sooner if its speech would not fit the flow
        room = p.token_room(len(v.prompt_speech_tokens))
        cap = max(1, min(p.frontend.hard_max, text_room(room, len(v.prompt_text_tokens))))
        return SynthesisRequest(
            voice=v,
            speed=1.0,
            seed=seed,
            deadline=float("inf"),  # a session's deadline is its feed's: see TextFeed
            loop=asyncio.get_running_loop(),
            planner=self._planner(v, True),
            max_tokens=max(1, int(self.settings.max_audio_seconds * m.token_rate)),  # per segment
            text=TextFeed(StreamTokenizer(p.frontend.tokenizer), self.settings.request_timeout_s,
                          m.frontend.max_text_tokens_per_segment, cap),
        )

    def _planner(self, voice: Voice, chunked: bool) -> ChunkPlanner:
        """A request's streaming chunks: the model's hops after the voice's prompt tokens (`chunked` False:
        one chunk per segment, as upstream's non-streamed and speed-changed synthesis)."""
        m = self.pipeline.manifest
        st = m.streaming
        return ChunkPlanner(st.first_hop_tokens, st.max_hop_tokens, st.hop_growth, m.flow.pre_lookahead_tokens,
                            len(voice.prompt_speech_tokens), chunked)

    def token_bounds(self, segments: list, speed: float) -> tuple[int, int]:
        """(fewest, most) speech tokens a request may produce: the model's token/text ratios per
        segment (as upstream bounds its decode), the most also capped by `max_audio_seconds` of audio
        at the requested speed."""
        llm = self.pipeline.manifest.llm
        fewest = sum(int(len(x) * llm.min_token_text_ratio) for x in segments)
        most = sum(max(1, int(len(x) * llm.max_token_text_ratio)) for x in segments)
        audio_cap = int(self.settings.max_audio_seconds * self.pipeline.manifest.token_rate * speed)
        return fewest, max(1, min(most, audio_cap))

    def record(self, code: int, started: float) -> None:
        self.metrics.requests.labels(str(code)).inc()
        self.metrics.request_duration.labels(str(code)).observe(time.monotonic() - started)

    def set_ready(self, ready: bool) -> None:
        self.ready = ready
        self.metrics.ready.set(1 if ready and not self.draining else 0)
