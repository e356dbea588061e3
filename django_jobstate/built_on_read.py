"""Sequences whose items are built when first read: bulk_enqueue()'s TaskResults, and the
Jobs under them. A bulk enqueue's caller seldom reads its thousands of results, and
building them was most of its time (bench/benchmark/enqueue_cost.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload


class BuiltOnRead[T](Sequence[T]):
    """A sequence whose i-th item is built by `_build(i)` when first read, and is the same
    object every time after (two threads reading it first share one); equal to a list or
    tuple of the same items. A subclass gives `__len__()` and `_build()`."""

    __slots__ = ("_built",)

    def __init__(self, built: dict[int, T] | None = None) -> None:
        self._built: dict[int, T] = {} if built is None else built  # those read already

    def _build(self, i: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        i = range(len(self))[index]  # negative indexes, and IndexError past the end
        item = self._built.get(i)
        if item is None:
            item = self._built.setdefault(i, self._build(i))
        return item

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BuiltOnRead | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as the list it reads as
        return (list, (list(self),))
