"""Running a coroutine to completion from synchronous code, inside or outside an event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine


def in_event_loop() -> bool:
    """Whether the calling thread is running an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_coroutine(coro: Coroutine, thread_name: str = "run-coroutine") -> Any:
    """``asyncio.run(coro)``, or the same in a private thread when the caller is inside an event
    loop already (a notebook, an async server), where ``asyncio.run`` would refuse.

    Raises:
        whatever ``coro`` raises, in the caller's thread.
    """
    if not in_event_loop():
        return asyncio.run(coro)
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = asyncio.run(coro)
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, name=thread_name, daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]
