"""The LLM stage's decisions, as pure functions of a snapshot of its requests (as vLLM's `schedule()`
returns a `SchedulerOutput` that the executor applies): which parked sessions and waiting requests join
the batch before a step, and, after it, which rows stay, which park and which end. The scheduler takes
the snapshot under its lock, runs the models and moves each request's phase as the plan says."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ParkedView:
    """A parked session, in the order sessions left the batch."""

    key: int
    input_ended: bool  # no text came after its last segment and the input has ended: it is done
    block: int | None  # positions its next input block takes (None: it waits for text)
    pos: int  # positions already in its KV cache


@dataclass(frozen=True)
class Admission:
    drain: tuple[int, ...]  # sessions whose input ended: only their last chunk is left, in the flow
    resume: tuple[int, ...]  # sessions that rejoin the batch, in park order
    over: tuple[int, ...]  # sessions whose next block would pass the KV bound: they end with LIMIT
    arrivals: int  # waiting requests that join, from the front of the queue
    look_again: bool  # a ready session was left parked for lack of room


def admit(running: int, max_batch: int, parked: Sequence[ParkedView], waiting: int, kv_limit: int) -> Admission:
    """Before a step: `running` rows in the batch of at most `max_batch`; started work (parked sessions
    with their next block ready) goes before `waiting` arrivals; a session whose cache would pass
    `kv_limit` positions ends instead of joining and takes no room."""
    room = max_batch - running
    drain, resume, over = [], [], []
    look_again = False
    for s in parked:
        if s.input_ended:
            drain.append(s.key)
        elif s.block is None:
            continue
        elif s.pos + s.block > kv_limit:
            over.append(s.key)
        elif len(resume) < room:
            resume.append(s.key)
        else:
            look_again = True
    return Admission(tuple(drain), tuple(resume), tuple(over), min(waiting, room - len(resume)), look_again)


@dataclass(frozen=True)
class RowView:
    """A row of the running batch after a step."""

    done: bool  # its segment is decoded (what follows was decided when its tokens were read)
    alive: bool
    expired: bool
    streamed: bool  # a session's: it ends itself on expiry (a whole-text request's handler has its own clock)
    pos: int
    wants_text: bool  # a session's segment asked for more text (a fill token)


@dataclass(frozen=True)
class Settlement:
    keep: tuple[int, ...]  # row indexes that stay in the batch
    park: tuple[int, ...]  # rows that leave with a copy of their cache, to wait for text
    timeout: tuple[int, ...]  # sessions past their deadline
    limit: tuple[int, ...]  # sessions past their KV bound
    expired: tuple[int, ...]  # whole-text requests past their deadline: they leave, their handler answers


def settle(rows: Sequence[RowView], kv_limit: int) -> Settlement:
    """After a step: every row either stays, parks or leaves; done and ended rows simply leave."""
    keep, park, timeout, limit, expired = [], [], [], [], []
    for i, r in enumerate(rows):
        if r.done or not r.alive:
            continue
        if r.expired:
            (timeout if r.streamed else expired).append(i)
        elif r.streamed and r.pos > kv_limit:
            limit.append(i)
        else:
            (park if r.wants_text else keep).append(i)
    return Settlement(tuple(keep), tuple(park), tuple(timeout), tuple(limit), tuple(expired))
