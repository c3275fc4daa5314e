"""The LLM stage: speech tokens from text, one decode step at a time over a changing batch.

A running batch keeps one left-padded KV cache per layer on the device. Requests join between
steps (their prompts are prefilled together, then merged into the batch) and leave when they stop
(their rows are dropped and padding nobody needs is trimmed). Only logits come back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ..model.manifest import LLM as LLMSpec
from .bistream import SOS, SPEECH, TASK, TEXT, Interleave, Item, Phase
from .device_ops import KVOps
from .runtime import Runtime
from .sampling import sample_tokens


@dataclass
class Sequence:
    """One segment of one request being decoded."""

    prompt: np.ndarray  # [S, H] prefill embeddings
    min_len: int
    max_len: int
    rng: np.random.Generator
    owner: Any = None
    tokens: list[int] = field(default_factory=list)
    pos: int = 0
    done: bool = False
    bistream: Interleave | None = None  # streamed text: the input schedule (None: whole text, `prompt` is all of it)
    kv: list[ort.OrtValue] | None = None  # the cache of a sequence out of the batch (a parked bistream segment)
    kv_mask: np.ndarray | None = None  # [P] its attention mask (1 = real position)

    @property
    def waiting(self) -> bool:
        """A bistream segment that asked for more text (a fill token): it leaves the batch with its cache."""
        return self.bistream is not None and self.bistream.phase == Phase.WAITING


@dataclass
class Batch:
    seqs: list[Sequence]
    kv: list[ort.OrtValue]
    mask: np.ndarray  # [B, P] int64, 1 = real position


class LLMEngine:
    def __init__(self, rt: Runtime, onnx_path: Path, spec: LLMSpec, embeddings: dict[str, np.ndarray]) -> None:
        self.rt = rt
        self.spec = spec
        self.session = rt.session(onnx_path, "llm")
        self.ops = KVOps(rt, 2 * spec.num_layers)
        self.kv_names = [f"past_key_values.{i}.{k}" for i in range(spec.num_layers) for k in ("key", "value")]
        self.present_names = [f"present.{i}.{k}" for i in range(spec.num_layers) for k in ("key", "value")]
        self.text_embedding = embeddings["text_embedding"]
        self.speech_embedding = embeddings["speech_embedding"]
        self.sos, self.task = embeddings["llm_embedding"][0], embeddings["llm_embedding"][1]
        self.eos = spec.speech_token_size
        self.fill = spec.fill  # the fill token: "more text, please"
        self.kv_bytes_per_position = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 4  # float32 K and V
        self._empty_kv = np.zeros((0, spec.num_kv_heads, 0, spec.head_dim), np.float32)

    # Building a sequence ---------------------------------------------------------------------
    def sequence(self, text: np.ndarray, prompt_text: np.ndarray, prompt_speech: np.ndarray, rng: np.random.Generator, owner: Any) -> Sequence:
        """CosyVoice2's LLM input: [sos, prompt text + text, task_id, prompt speech tokens]; at least
        min_len and at most max_len speech tokens, both counted on the text without the prompt text."""
        all_text = np.concatenate([prompt_text, text]) if len(prompt_text) else text
        parts = [self.sos[None], self.text_embedding[all_text], self.task[None]]
        if len(prompt_speech):
            parts.append(self.speech_embedding[prompt_speech])
        n = len(text)
        return Sequence(
            prompt=np.concatenate(parts).astype(np.float32),
            min_len=int(n * self.spec.min_token_text_ratio),
            max_len=int(n * self.spec.max_token_text_ratio),
            rng=rng,
            owner=owner,
        )

    def bistream_sequence(self, prompt_text: np.ndarray, prompt_speech: np.ndarray, rng: np.random.Generator,
                          owner: Any) -> Sequence:
        """A segment of streamed text; its input comes block by block from `Interleave.next_block`."""
        schedule = Interleave(prompt_text.tolist(), prompt_speech.tolist(), self.fill, head_end=self.spec.bistream_prompt_head)
        return Sequence(prompt=np.zeros((0, self.sos.shape[0]), np.float32), min_len=0, max_len=0, rng=rng, owner=owner,
                        bistream=schedule)

    def embed(self, items: list[Item]) -> np.ndarray:
        table = {SOS: lambda _: self.sos, TASK: lambda _: self.task, TEXT: self.text_embedding.__getitem__,
                 SPEECH: self.speech_embedding.__getitem__}
        return np.stack([table[kind](i) for kind, i in items]).astype(np.float32)

    # Running ---------------------------------------------------------------------------------
    def _run(self, embeds: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: list[ort.OrtValue] | None) -> tuple[np.ndarray, list[ort.OrtValue]]:
        b = self.session.io_binding()
        b.bind_cpu_input("inputs_embeds", embeds)
        b.bind_cpu_input("attention_mask", mask)
        b.bind_cpu_input("position_ids", pos)
        for j, name in enumerate(self.kv_names):
            if past is None:
                b.bind_cpu_input(name, np.zeros((len(embeds),) + self._empty_kv.shape[1:], np.float32))
            else:
                b.bind_ortvalue_input(name, past[j])
        b.bind_output("logits", "cpu")
        for name in self.present_names:
            self.rt.bind_out(b, name)
        self.session.run_with_iobinding(b)
        outs = b.get_outputs()  # in binding order: logits, then presents in kv order
        return outs[0].numpy(), list(outs[1:])

    def _sample(self, seqs: list[Sequence], logits: np.ndarray) -> None:
        s = self.spec.sampling
        forced = [q.bistream is not None and q.bistream.forced() for q in seqs]
        rows = [i for i, f in enumerate(forced) if not f]  # a forced fill draws nothing, as upstream
        picked = np.full(len(seqs), self.fill, np.int64)
        if rows:
            sub = [seqs[i] for i in rows]
            lg = logits[rows]
            interleaved = np.array([q.bistream is not None and q.bistream.phase == Phase.INTERLEAVED for q in sub])
            if interleaved.any():  # upstream raises on speech_token_size + 1 here; never draw it
                lg = lg.copy()
                lg[interleaved, self.eos + 1] = -np.inf
            # whole text: eos from min_len on; bistream: never between text groups, always at the end (upstream)
            allow_eos = np.array([len(q.tokens) >= q.min_len if q.bistream is None else q.bistream.phase == Phase.FINAL
                                  for q in sub])
            histories = [q.tokens if q.bistream is None else q.bistream.history for q in sub]
            picked[rows] = sample_tokens(lg, histories, [q.rng for q in sub], allow_eos, self.eos, s.top_k, s.top_p,
                                         s.win_size, s.tau_r)
        for q, t in zip(seqs, picked):
            t = int(t)
            if q.bistream is not None:
                if q.bistream.decided(t, self.eos):
                    q.tokens.append(t)
                q.done = q.bistream.phase == Phase.DONE or (q.bistream.phase == Phase.FINAL and len(q.tokens) >= q.max_len)
            elif t >= self.eos:  # eos or one of the fill tokens: upstream's stop_token_ids
                q.done = True
            else:
                q.tokens.append(t)
                q.done = len(q.tokens) >= q.max_len

    def prefill(self, seqs: list[Sequence]) -> Batch:
        """Runs the new sequences' prompts as one left-padded batch and samples their first tokens."""
        for q in seqs:
            q.pos = 0
        embeds, mask, pos = _left_padded(seqs)
        logits, kv = self._run(embeds, mask, pos, None)
        self._sample(seqs, logits)
        return Batch(list(seqs), kv, mask)

    def resume(self, seqs: list[Sequence]) -> Batch:
        """Runs each parked sequence's next input block over its own cache (caches left-padded to one
        length, blocks right-aligned after them) and samples the next tokens: a prefill with a past."""
        parts = None
        for q in seqs:
            part = Batch([q], q.kv, q.kv_mask[None])
            parts = self.merge(parts, part)
            q.kv = q.kv_mask = None
        embeds, block_mask, pos = _left_padded(seqs)
        mask = np.concatenate([parts.mask, block_mask], axis=1)
        logits, kv = self._run(embeds, mask, pos, parts.kv)
        self._sample(seqs, logits)
        return Batch(list(seqs), kv, mask)

    def park(self, batch: Batch, rows: list[int]) -> None:
        """Copies the rows' caches out of the batch (onto their sequences), without their left padding."""
        for r in rows:
            start = int(np.argmax(batch.mask[r]))
            q = batch.seqs[r]
            q.kv = self.ops.kv_select(batch.kv, np.asarray([r]), start)
            q.kv_mask = batch.mask[r, start:].copy()

    def step(self, batch: Batch) -> None:
        """One decode step for every row: feeds each row's last token, samples the next."""
        seqs = batch.seqs
        last = np.array([q.tokens[-1] if q.tokens else self.eos for q in seqs])
        embeds = self.speech_embedding[last][:, None, :]
        mask = np.concatenate([batch.mask, np.ones((len(seqs), 1), np.int64)], axis=1)
        pos = np.array([[q.pos] for q in seqs], np.int64)
        logits, batch.kv = self._run(embeds, mask, pos, batch.kv)
        batch.mask = mask
        for q in seqs:
            q.pos += 1
        self._sample(seqs, logits)

    def keep(self, batch: Batch, keep: list[int]) -> Batch | None:
        """Drops the other rows, and the leading columns that only padded them."""
        if not keep:
            return None
        if len(keep) == len(batch.seqs):
            return batch
        mask = batch.mask[keep]
        start = int(np.argmax(mask.any(axis=0)))
        kv = self.ops.kv_select(batch.kv, np.asarray(keep), start)
        return Batch([batch.seqs[i] for i in keep], kv, mask[:, start:])

    def merge(self, a: Batch | None, b: Batch) -> Batch:
        if a is None:
            return b
        pa, pb = a.mask.shape[1], b.mask.shape[1]
        p = max(pa, pb)
        kv = self.ops.kv_merge(a.kv, p - pa, b.kv, p - pb)
        mask = np.concatenate([np.pad(a.mask, ((0, 0), (p - pa, 0))), np.pad(b.mask, ((0, 0), (p - pb, 0)))])
        return Batch(a.seqs + b.seqs, kv, mask)


def _left_padded(seqs: list[Sequence]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sequences' input blocks as one left-padded batch: embeddings, mask and positions (each block
    continues from its sequence's position, which it then advances)."""
    s = max(len(q.prompt) for q in seqs)
    embeds = np.zeros((len(seqs), s, seqs[0].prompt.shape[1]), np.float32)
    mask = np.zeros((len(seqs), s), np.int64)
    pos = np.zeros((len(seqs), s), np.int64)
    for i, q in enumerate(seqs):
        n = len(q.prompt)
        embeds[i, s - n :] = q.prompt
        mask[i, s - n :] = 1
        pos[i, s - n :] = q.pos + np.arange(n)
        q.pos += n
    return embeds, mask, pos
