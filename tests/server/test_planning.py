"""The LLM stage's decisions from a snapshot, without threads or ONNX Runtime: who joins the batch before a
step (started sessions first, then arrivals, never past the batch size or a session's KV bound) and, after
it, which rows stay, park for text or end."""

from __future__ import annotations

from cosyvoice_server.scheduling.planning import Admission, ParkedView, RowView, Settlement, admit, settle

KV = 100  # a session's KV bound, in positions


def ready(key: int, block: int = 5, pos: int = 10) -> ParkedView:
    return ParkedView(key, input_ended=False, block=block, pos=pos)


def silent(key: int) -> ParkedView:
    """A parked session still waiting for text."""
    return ParkedView(key, input_ended=False, block=None, pos=10)


def ended(key: int) -> ParkedView:
    return ParkedView(key, input_ended=True, block=None, pos=10)


def test_an_idle_batch_takes_arrivals_up_to_its_size() -> None:
    assert admit(0, 4, [], 3, KV) == Admission((), (), (), 3, False)
    assert admit(0, 4, [], 9, KV).arrivals == 4
    assert admit(3, 4, [], 9, KV).arrivals == 1
    assert admit(4, 4, [], 9, KV).arrivals == 0  # a full batch takes nobody, the queue waits
    assert admit(0, 4, [], 0, KV).arrivals == 0


def test_started_sessions_go_before_arrivals_in_the_order_they_parked() -> None:
    plan = admit(1, 4, [ready(7), silent(8), ready(9)], 5, KV)
    assert plan.resume == (7, 9) and plan.arrivals == 1  # 1 running + 2 sessions + 1 arrival = 4
    assert not plan.look_again


def test_ready_sessions_beyond_the_room_stay_parked_and_are_looked_at_again() -> None:
    plan = admit(2, 4, [ready(1), ready(2), ready(3)], 5, KV)
    assert plan == Admission((), (1, 2), (), 0, True)
    assert admit(4, 4, [ready(1)], 0, KV) == Admission((), (), (), 0, True)


def test_a_session_waiting_for_text_neither_joins_nor_asks_to_be_looked_at_again() -> None:
    assert admit(0, 1, [silent(1), silent(2)], 0, KV) == Admission((), (), (), 0, False)


def test_a_session_whose_input_ended_drains_whatever_the_room() -> None:
    plan = admit(4, 4, [ended(1), ready(2), ended(3)], 2, KV)
    assert plan.drain == (1, 3) and plan.resume == () and plan.arrivals == 0 and plan.look_again


def test_a_block_that_would_pass_the_kv_bound_ends_the_session_and_takes_no_room() -> None:
    plan = admit(3, 4, [ready(1, block=5, pos=96), ready(2, block=5, pos=95)], 1, KV)
    assert plan.over == (1,)  # 101 positions > 100
    assert plan.resume == (2,)  # exactly at the bound still fits
    assert plan.arrivals == 0
    full = admit(4, 4, [ready(1, block=1, pos=KV)], 0, KV)
    assert full.over == (1,) and not full.look_again  # ended even when the batch has no room


def row(done: bool = False, alive: bool = True, expired: bool = False, streamed: bool = False, pos: int = 10,
        wants_text: bool = False) -> RowView:
    return RowView(done, alive, expired, streamed, pos, wants_text)


def test_rows_that_go_on_stay_and_done_or_ended_rows_leave() -> None:
    rows = [row(), row(done=True), row(alive=False), row(streamed=True), row(done=True, expired=True),
            row(alive=False, expired=True, streamed=True)]
    assert settle(rows, KV) == Settlement((0, 3), (), (), (), ())


def test_a_session_that_asks_for_text_parks() -> None:
    rows = [row(streamed=True, wants_text=True), row(streamed=True), row(streamed=True, wants_text=True)]
    assert settle(rows, KV) == Settlement((1,), (0, 2), (), (), ())


def test_an_expired_session_times_out_and_an_expired_request_only_leaves() -> None:
    rows = [row(expired=True, streamed=True, wants_text=True), row(expired=True), row(expired=True, pos=KV + 1)]
    assert settle(rows, KV) == Settlement((), (), (0,), (), (1, 2))


def test_a_session_past_its_kv_bound_ends_there_and_a_whole_text_row_has_no_such_bound() -> None:
    rows = [row(streamed=True, pos=KV + 1), row(streamed=True, pos=KV), row(pos=KV + 1),
            row(streamed=True, pos=KV + 1, wants_text=True)]
    assert settle(rows, KV) == Settlement((1, 2), (), (), (0, 3), ())
