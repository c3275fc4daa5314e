"""The bistream input schedule (upstream `Qwen2LM.inference_bistream`, which CosyVoice3LM shares), as a pure
state machine.

One segment of a streamed-text session: the LLM input starts with sos (CosyVoice3: then the prompt text up to
and including <|endofprompt|>, its system prompt, which does not interleave); the prompt's text and speech
tokens go in interleaved, `text` (5) text tokens then `speech` (15) speech tokens per group, as soon as
text tokens are there to fill the groups (the prompt text counts first); once the prompt speech is used
up the model decodes, and the fill token (`fill`) is forced at fixed intervals of
`speech` + 1 tokens (it may also be sampled): each fill asks for the next `text` text tokens, fed in
place of the fill. At the end of the input the rest of the text and task_id go in, and the model decodes
to eos as the whole-text path does.

Upstream's generator hands over one text token per loop iteration, and an iteration takes at most one
group after a fill; text that arrived while the model was decoding is replayed here the same way, token
by token, so the schedule depends on the text tokens only, never on when or in what pieces they came.
Where upstream is particular and this follows it: nothing runs before the first text token arrives; at
the end of input the last block fed is fed again before the remaining text (upstream keeps it in
`lm_input` after the fill); prompt speech tokens not yet interleaved when the input ends are dropped; a
prompt text longer than a third of the prompt speech (an instruction) leaves text behind that later
tokens take up one group each; the fill tokens stay in the sampling history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

SOS, TASK, TEXT, SPEECH = "sos", "task", "text", "speech"
Item = tuple[str, int]  # (kind, id); id is 0 for sos and task
TEXT_GROUP, SPEECH_GROUP = 5, 15


def text_room(speech_room: int, prompt_text: int) -> int:
    """The most text tokens one segment may take so that the speech tokens it is decoded with before its
    final phase stay below `speech_room` (the final phase is bounded on its own): up to SPEECH_GROUP are
    decoded before the first fill, then SPEECH_GROUP after each TEXT_GROUP of text, the prompt text's first."""
    return (speech_room - SPEECH_GROUP - 1) * TEXT_GROUP // SPEECH_GROUP - prompt_text


class Phase(str, Enum):
    WAITING = "waiting"  # needs more text (or the end of input) before the model can run
    INTERLEAVED = "interleaved"  # decoding speech tokens between text groups; eos masked
    FINAL = "final"  # all text is in: decoding to eos
    DONE = "done"


@dataclass
class Interleave:
    prompt_text: list[int]
    prompt_speech: list[int]
    fill: int  # the fill token id (CosyVoice2: speech_token_size + 2, CosyVoice3: + 3)
    head_end: int | None = None  # the prompt text up to this id goes in right after sos (CosyVoice3's system prompt)
    text_group: int = TEXT_GROUP
    speech_group: int = SPEECH_GROUP
    text_cache: list[int] = field(init=False)
    lm_input: list[Item] = field(init=False)  # upstream's `lm_input`: pending, or the last block fed
    history: list[int] = field(default_factory=list)  # every token decided, fills included (upstream's out_tokens)
    phase: Phase = Phase.WAITING
    started: bool = False  # a text token of this segment has arrived
    text_tokens: int = 0  # text tokens of this segment (the prompt text not counted)
    next_fill: int = 0

    def __post_init__(self) -> None:
        head = self.prompt_text.index(self.head_end) + 1 if self.head_end in self.prompt_text else 0
        self.text_cache = list(self.prompt_text[head:])
        self._arrived: list[int] = []  # text tokens not yet handed to the schedule (upstream's generator)
        self._speech_left = list(self.prompt_speech)
        self.lm_input = [(SOS, 0)] + [(TEXT, t) for t in self.prompt_text[:head]]
        p, s = len(self.prompt_speech), self.speech_group
        self.next_fill = (p // s + 1) * s - p

    def add_text(self, ids: list[int]) -> None:
        self._arrived.extend(ids)
        self.text_tokens += len(ids)

    def _take_text(self) -> list[Item]:
        group, self.text_cache = self.text_cache[: self.text_group], self.text_cache[self.text_group :]
        return [(TEXT, t) for t in group]

    def next_block(self, ended: bool) -> list[Item] | None:
        """While WAITING: the block to feed now (the phase becomes INTERLEAVED or FINAL), or None to wait.
        `ended`: no more text will come for this segment (flush or end of input)."""
        assert self.phase == Phase.WAITING
        while self._arrived:  # one loop iteration of upstream's per text token
            self.text_cache.append(self._arrived.pop(0))
            self.started = True
            if (block := self._iteration()) is not None:
                self.phase = Phase.INTERLEAVED
                return block
        if not ended or not self.started:
            return None
        self.lm_input = self.lm_input + [(TEXT, t) for t in self.text_cache] + [(TASK, 0)]
        self.text_cache = []
        self.phase = Phase.FINAL
        return self.lm_input

    def _iteration(self) -> list[Item] | None:
        while self._speech_left and len(self.text_cache) >= self.text_group:
            self.lm_input += self._take_text() + [(SPEECH, t) for t in self._speech_left[: self.speech_group]]
            self._speech_left = self._speech_left[self.speech_group :]
        if self._speech_left:
            return None
        needs_text = (self.history and self.history[-1] == self.fill) or (not self.history and len(self.lm_input) == 1)
        if not needs_text:  # the prompt has just been used up: decode straight on
            return self.lm_input
        if len(self.text_cache) < self.text_group:
            return None
        group = self._take_text()
        self.lm_input = group if self.history else self.lm_input + group
        return self.lm_input

    def forced(self) -> bool:
        """The next token is the fill token whatever the model says (INTERLEAVED only)."""
        return self.phase == Phase.INTERLEAVED and len(self.history) == self.next_fill

    def decided(self, token: int, speech_token_size: int) -> bool:
        """Records the token taken after the last input; True when it is a speech token to keep.
        A fill pauses the segment (WAITING); any other stop token ends it (upstream raises on one while
        interleaving and its stream then waits forever; a whole-text decode would stop there)."""
        interleaved = self.phase == Phase.INTERLEAVED
        if interleaved and token == self.fill:
            self.next_fill = len(self.history) + self.speech_group + 1
        self.history.append(token)
        if token >= speech_token_size:
            self.phase = Phase.WAITING if interleaved and token == self.fill else Phase.DONE
            return False
        self.lm_input = [(SPEECH, token)]
        return True
