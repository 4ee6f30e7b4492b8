"""``async with`` for the client's iterators: whatever has an ``aclose()`` closes on exit."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncClosing:
    """Mixin: ``async with obj as it`` gives ``obj`` and awaits ``obj.aclose()`` on exit."""

    async def aclose(self) -> None:
        """Release what the object holds; subclasses say what."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        """The object itself."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close on exit."""
        await self.aclose()
