from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pytest

from shared import storage, warmup
from shared.settings import Settings, use_settings


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(warmup, "_loaders", lambda: {"caption": lambda settings: calls.append(settings.caption_model)})
    use_settings(Settings(preload_models=True, caption_model="s3://models/caption.gguf"))
    return calls


def test_without_snapstart_the_model_loads_during_init(loaded: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)  # import fails: a container image runtime
    warmup.prepare_function("caption")
    assert loaded == ["s3://models/caption.gguf"]


def test_under_snapstart_the_model_loads_before_the_snapshot_and_restores_refresh(
    loaded: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks: dict[str, Callable[[], None]] = {}
    runtime = types.ModuleType("snapshot_restore_py")
    runtime.register_before_snapshot = lambda hook: hooks.setdefault("before", hook)  # type: ignore[attr-defined]
    runtime.register_after_restore = lambda hook: hooks.setdefault("after", hook)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", runtime)

    warmup.prepare_function("caption")
    assert loaded == []  # nothing yet: the runtime calls the hook when it takes the snapshot
    hooks["before"]()
    assert loaded == ["s3://models/caption.gguf"]

    stale = storage._s3_store()
    hooks["after"]()
    assert storage._s3_store() is not stale  # a new client, new connections


def test_nothing_loads_at_init_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warmup, "_loaders", lambda: pytest.fail("loaded"))
    use_settings(Settings(preload_models=False))
    warmup.prepare_function("detect")
