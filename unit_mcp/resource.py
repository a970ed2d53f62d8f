"""One way to own parts entered with `async with`: they close in reverse order, also when opening fails."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Self


class StackedResource:
    """Enter it to run `_open`, which puts every part it starts on the stack; leaving (or `aclose`) closes them."""

    _stack: AsyncExitStack | None = None

    async def _open(self, stack: AsyncExitStack) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        stack = AsyncExitStack()
        try:
            await self._open(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
