from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator

import pytest

from shared import storage, warmup
from shared.dependencies import Dependencies, Step, use_dependencies
from shared.settings import Settings, use_settings


@pytest.fixture
def built() -> Iterator[list[Step]]:
    """GIVEN a function whose dependencies record that they were built (its model loaded)"""
    steps: list[Step] = []

    def build(step: Step) -> Dependencies:
        steps.append(step)
        return Dependencies(storage.store_for, Settings().image_limits)

    use_dependencies(build)
    use_settings(Settings(preload_models=True))
    yield steps
    use_dependencies(None)


def test_without_snapstart_the_model_loads_during_init(built: list[Step], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)  # import fails: a container image runtime
    warmup.prepare_function(Step.CAPTION)
    assert built == [Step.CAPTION]


def test_under_snapstart_the_model_loads_before_the_snapshot_and_restores_refresh(
    built: list[Step], monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks: dict[str, Callable[[], None]] = {}
    runtime = types.ModuleType("snapshot_restore_py")
    runtime.register_before_snapshot = lambda hook: hooks.setdefault("before", hook)  # type: ignore[attr-defined]
    runtime.register_after_restore = lambda hook: hooks.setdefault("after", hook)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", runtime)

    warmup.prepare_function(Step.CAPTION)
    assert built == []  # nothing yet: the runtime calls the hook when it takes the snapshot
    hooks["before"]()
    assert built == [Step.CAPTION]

    stale = storage.store_for("s3://bucket/key")
    hooks["after"]()
    assert storage.store_for("s3://bucket/key") is not stale  # a new client, new connections


def test_nothing_loads_at_init_unless_asked(built: list[Step]) -> None:
    use_settings(Settings(preload_models=False))
    warmup.prepare_function(Step.DETECT)
    assert built == []
