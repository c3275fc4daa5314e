"""Upstream's bistream input schedule, step by step (the pure state machine the LLM stage follows)."""

from __future__ import annotations

import pytest

from cosyvoice_server.engine.bistream import SOS, SPEECH, TASK, TEXT, Interleave, Phase, text_room
from cosyvoice_server.engine.flow import segment_token_room

SPEECH_SIZE = 100
FILL = SPEECH_SIZE + 2


def run_to_fill(b: Interleave, first: int = 0) -> list[int]:
    """Decides speech tokens first, first+1, ... until the schedule forces a fill; returns the speech tokens."""
    out = []
    while b.phase == Phase.INTERLEAVED:
        t = FILL if b.forced() else first + len(out)
        if b.decided(t, SPEECH_SIZE):
            out.append(t)
    return out


def texts(*ids: int) -> list:
    return [(TEXT, i) for i in ids]


def test_without_a_prompt_text_goes_in_five_at_a_time_with_fifteen_speech_tokens_between():
    b = Interleave([], [], FILL)
    assert b.next_block(False) is None  # nothing before the first text token
    b.add_text([1, 2, 3, 4])
    assert b.next_block(False) is None  # fewer than five
    b.add_text([5, 6])
    assert b.next_block(False) == [(SOS, 0), *texts(1, 2, 3, 4, 5)]
    assert len(run_to_fill(b)) == 15
    assert b.phase == Phase.WAITING and b.history[-1] == FILL
    assert b.next_block(False) is None  # one text token buffered
    b.add_text([7, 8, 9, 10])
    assert b.next_block(False) == texts(6, 7, 8, 9, 10)  # in place of the fill, after the cache
    assert len(run_to_fill(b, 50)) == 15
    assert [i for i, t in enumerate(b.history) if t == FILL] == [15, 31]


def test_end_of_input_feeds_the_last_block_again_then_the_rest_and_task_id():
    b = Interleave([], [], FILL)
    b.add_text([1, 2, 3, 4, 5, 6, 7])
    b.next_block(False)
    speech = run_to_fill(b)
    block = b.next_block(True)
    # upstream's lm_input still holds the last speech token fed before the fill
    assert block == [(SPEECH, speech[-1]), *texts(6, 7), (TASK, 0)]
    assert b.phase == Phase.FINAL
    assert not b.forced() and b.decided(40, SPEECH_SIZE)
    assert not b.decided(SPEECH_SIZE, SPEECH_SIZE) and b.phase == Phase.DONE


def test_full_groups_are_decoded_before_the_end_of_input_counts():
    b = Interleave([], [], FILL)
    b.add_text(list(range(1, 13)))  # 12 tokens arrive with the end of input
    assert b.next_block(True) == [(SOS, 0), *texts(1, 2, 3, 4, 5)]
    run_to_fill(b)
    assert b.next_block(True) == texts(6, 7, 8, 9, 10)
    speech = run_to_fill(b)
    assert b.next_block(True) == [(SPEECH, speech[-1]), *texts(11, 12), (TASK, 0)]


def test_short_text_goes_in_whole_with_task_id():
    b = Interleave([], [], FILL)
    b.add_text([1, 2])
    assert b.next_block(True) == [(SOS, 0), *texts(1, 2), (TASK, 0)]


def test_a_prompt_is_interleaved_before_decoding_and_sets_the_first_fill():
    prompt_speech = list(range(200, 217))  # 17 tokens: groups of 15 and 2
    b = Interleave([90, 91, 92, 93, 94, 95], prompt_speech, FILL)
    assert b.next_block(False) is None  # the prompt alone starts nothing
    b.add_text([1])
    assert b.next_block(False) is None  # one group in (prompt text 90-94), the second waits for text
    b.add_text([2, 3, 4])
    block = b.next_block(False)
    assert block == [(SOS, 0), *texts(90, 91, 92, 93, 94), *[(SPEECH, t) for t in prompt_speech[:15]],
                     *texts(95, 1, 2, 3, 4), *[(SPEECH, t) for t in prompt_speech[15:]]]
    # the group of 15 is completed by the model: 13 tokens, then a fill
    assert len(run_to_fill(b)) == 13


def test_input_ending_inside_the_prompt_drops_the_prompt_speech_left():
    b = Interleave([90, 91], list(range(200, 230)), FILL)
    b.add_text([1, 2, 3, 4])
    b.next_block(False)
    block = b.next_block(True)  # one group (90 91 1 2 3 + 200-214), then the rest of the text: 215-229 never go in
    assert block[-3:] == [(SPEECH, 214), (TEXT, 4), (TASK, 0)] and len(block) == 1 + 5 + 15 + 2


def test_a_sampled_fill_restarts_the_schedule():
    b = Interleave([], [], FILL)
    b.add_text([1, 2, 3, 4, 5])
    b.next_block(False)
    for t in range(4):
        b.decided(t, SPEECH_SIZE)
    assert not b.decided(FILL, SPEECH_SIZE) and b.phase == Phase.WAITING  # the model asked for text early
    b.add_text([6, 7, 8, 9, 10])
    b.next_block(False)
    assert len(run_to_fill(b)) == 15 and b.history.index(FILL, 5) == 5 + 15


def test_a_long_prompt_text_is_taken_up_one_group_per_arriving_token_as_upstream():
    b = Interleave(list(range(80, 92)), list(range(200, 215)), FILL)  # 12 prompt text tokens, 15 prompt speech
    b.add_text([1])
    assert b.next_block(False)[-1] == (SPEECH, 214)  # one group, then decoding straight on
    run_to_fill(b)
    assert b.text_cache == [85, 86, 87, 88, 89, 90, 91, 1]
    assert b.next_block(False) is None  # eight buffered, but no token arrived since the fill
    b.add_text([2, 3])
    assert b.next_block(False) == texts(85, 86, 87, 88, 89)  # the first arrival takes one group
    run_to_fill(b)
    assert b.next_block(False) == texts(90, 91, 1, 2, 3)  # the second, after the model's next fill
    run_to_fill(b)
    assert b.next_block(False) is None and not b.text_cache


def test_a_segments_speech_room_is_what_the_flow_noise_leaves_after_the_voices_prompt():
    assert segment_token_room(4000, 2, 0) == 2000  # the tiny model's buffer, a voice without prompt speech
    assert segment_token_room(4000, 2, 12) == 1988
    assert segment_token_room(15000, 2, 250) == 7250  # upstream's 300 s buffer, a 10 s prompt
    assert segment_token_room(20, 2, 12) == -2  # a prompt longer than the buffer leaves no room


@pytest.mark.parametrize(("room", "prompt_text", "prompt_speech"), [
    (300, 0, 0), (300, 6, 12), (1988, 6, 12), (120, 30, 40), (7250, 40, 250)])
def test_text_within_its_room_is_decoded_to_fewer_speech_tokens_than_the_room(room, prompt_text, prompt_speech):
    """A model that never asks for text itself decodes the most speech per text token (a fill only when forced)."""
    n = text_room(room, prompt_text)
    assert n > 0
    b = Interleave(list(range(1000, 1000 + prompt_text)), list(range(prompt_speech)), FILL)
    b.add_text(list(range(2000, 2000 + n)))
    speech = []
    while (block := b.next_block(True)) is not None and b.phase == Phase.INTERLEAVED:
        speech += run_to_fill(b)
    assert b.phase == Phase.FINAL and len(speech) < room
