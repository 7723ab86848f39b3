"""`ThreadBatcher`: a synchronous batch function behind an async call, in one worker thread.

The event loop never runs the computation: each call waits on a future while one dedicated
thread computes. Calls made while a batch is being computed are joined into the next batch (up
to `max_texts` texts), so a burst of concurrent lookups costs one model run, not one each. One
thread, so the computation uses one core whatever the load; onnxruntime and numpy release the
GIL while they compute, so the event loop keeps serving.

A caller that goes away (its task cancelled) leaves its texts to be computed with the batch
they joined; the result is dropped. An exception from the function fails every call of its
batch and no other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

Row = TypeVar("Row", bound=np.generic)


class ThreadBatcher(Generic[Row]):
    __slots__ = ("_compute", "_max_texts", "_pending", "_task", "_executor")

    def __init__(self, compute: Callable[[list[str]], npt.NDArray[Row]], *,
                 max_texts: int = 32) -> None:
        if max_texts < 1:
            raise ValueError(f"max_texts must be positive, not {max_texts}")
        self._compute = compute
        self._max_texts = max_texts
        self._pending: list[tuple[list[str], asyncio.Future[npt.NDArray[Row]]]] = []
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-embed")

    async def __call__(self, texts: Sequence[str]) -> npt.NDArray[Row]:
        """`compute(texts)`, computed in the worker thread, possibly with other calls' texts."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[npt.NDArray[Row]] = loop.create_future()
        self._pending.append((list(texts), future))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain())
        return await future

    def close(self) -> None:
        """Lets the worker thread go once its batch (if any) is done."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            calls = self._take()
            texts = [text for call_texts, _ in calls for text in call_texts]
            try:
                rows = await loop.run_in_executor(self._executor, self._compute, texts)
            except Exception as exc:
                for _, future in calls:
                    if not future.done():
                        future.set_exception(exc)
                continue
            start = 0
            for call_texts, future in calls:
                end = start + len(call_texts)
                if not future.done():
                    future.set_result(rows[start:end])
                start = end

    def _take(self) -> list[tuple[list[str], asyncio.Future[npt.NDArray[Row]]]]:
        """The pending calls of the next batch: at least one, then while `max_texts` allows."""
        count = 0
        taken = 0
        for texts, _ in self._pending:
            if taken and count + len(texts) > self._max_texts:
                break
            count += len(texts)
            taken += 1
        calls, self._pending = self._pending[:taken], self._pending[taken:]
        return calls
