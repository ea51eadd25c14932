"""Background tasks kept referenced until they are done (the event loop holds only weak
references to the tasks it runs, so an unreferenced one may be collected mid-way)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def spawn(tasks: set[asyncio.Task[T]], coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run `coro` in a task kept in `tasks` until it is done."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task
