"""A task cancelled in the same loop turn as the message or chunk it waits for arrives stays cancelled
(asyncio.wait_for on Python 3.11 returned the item and dropped the cancel), and nothing it waited for is
lost: the item stays queued for whoever reads next."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest

from cosyvoice_server.api.openai import _next
from cosyvoice_server.timeouts import BodyTimeoutMiddleware


async def _cancelled_as_item_arrives(wait, queue: asyncio.Queue, item) -> None:
    task = asyncio.create_task(wait())
    await asyncio.sleep(0)  # the task now waits on the queue
    queue.put_nowait(item)  # wakes it ...
    task.cancel()  # ... and cancels it, before it runs again
    with pytest.raises(asyncio.CancelledError):
        await task
    assert queue.get_nowait() is item


def test_waiting_for_audio_stays_cancelled_when_a_chunk_arrives_with_the_cancel():
    async def run():
        req = SimpleNamespace(out=asyncio.Queue(), deadline=time.monotonic() + 60)
        await _cancelled_as_item_arrives(lambda: _next(req, None), req.out, np.zeros(4, np.float32))

    asyncio.run(run())


def test_reading_a_body_stays_cancelled_when_a_message_arrives_with_the_cancel():
    async def run():
        messages: asyncio.Queue = asyncio.Queue()

        async def app(scope, receive, send):
            await receive()

        middleware = BodyTimeoutMiddleware(app, timeout_s=60)
        message = {"type": "http.request", "body": b"{}", "more_body": False}
        await _cancelled_as_item_arrives(lambda: middleware({"type": "http"}, messages.get, None), messages, message)

    asyncio.run(run())
