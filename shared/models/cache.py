"""The one per-process model cache: a loader runs once per distinct settings value, however many threads ask."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from pydantic import BaseModel

S = TypeVar("S", bound=BaseModel)
M = TypeVar("M")


_LOADERS: list[CachedLoader] = []  # type: ignore[type-arg]


class CachedLoader(Generic[S, M]):
    """``load(settings)`` calls the wrapped loader the first time it sees ``settings`` (compared by value)."""

    def __init__(self, loader: Callable[[S], M]) -> None:
        functools.update_wrapper(self, loader)
        self._loader = loader
        self._loaded: dict[str, M] = {}
        self._lock = threading.Lock()
        _LOADERS.append(self)

    def __call__(self, settings: S) -> M:
        key = settings.model_dump_json()
        with self._lock:  # one load at a time: two threads asking for one model must not load it twice
            if key not in self._loaded:
                self._loaded[key] = self._loader(settings)
            return self._loaded[key]


def cached_per_settings(loader: Callable[[S], M]) -> CachedLoader[S, M]:
    return CachedLoader(loader)


def forget_loaded_models() -> None:
    """Drop every loaded model, as a new process starts: the deployment rehearsal loads one function's models as its
    own role, not from another function's loads."""
    for loader in _LOADERS:
        with loader._lock:
            loader._loaded.clear()
