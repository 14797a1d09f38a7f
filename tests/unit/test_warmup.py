from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Iterator

import pytest

from shared.pipeline import warmup
from shared.pipeline.dependencies import Dependencies, Step, use_dependencies
from shared.settings import Settings, use_settings
from shared.storage import objects as storage


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


X86_CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16
"""
GRAVITON2_CPUINFO = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU part\t: 0xd0c
"""


def test_the_cpu_and_the_flags_that_pick_kernels_are_read_on_x86_and_arm() -> None:
    assert warmup.cpu_features(X86_CPUINFO) == {
        "cpu": "Intel(R) Xeon(R) Platinum 8488C",
        "cpu_flags": ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"],
    }
    assert warmup.cpu_features(GRAVITON2_CPUINFO) == {"cpu": "0x41/0xd0c", "cpu_flags": ["asimddp"]}  # no bf16


def test_every_model_function_logs_its_cpu_at_init(capsys: pytest.CaptureFixture[str]) -> None:
    from shared.observability import logger

    use_settings(Settings(preload_models=False))
    level = logger.log_level
    logger.setLevel("INFO")  # as in Lambda (the CLI quiets it to warnings)
    try:
        warmup.prepare_function(Step.DETECT)
    finally:
        logger.setLevel(level)
    [record] = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"cpu"' in line]
    assert record["message"] == "cpu" and record["cpu"] and isinstance(record["cpu_flags"], list)


@pytest.mark.parametrize(
    ("function", "loads"),
    [
        ("detect", [Step.DETECT]),
        ("classify", [Step.CLASSIFY]),
        ("tag", [Step.TAG]),
        ("caption", [Step.CAPTION]),
        ("segment", [Step.SEGMENT]),
        ("api", [Step.DETECT, Step.CLASSIFY, Step.TAG, Step.CAPTION]),
    ],
)
def test_each_model_function_s_handler_module_loads_its_models_at_import(
    built: list[Step], monkeypatch: pytest.MonkeyPatch, function: str, loads: list[Step]
) -> None:
    import importlib

    # GIVEN a runtime without SnapStart, and the handler's module not imported yet
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)
    monkeypatch.delitem(sys.modules, f"functions.{function}.app", raising=False)
    # WHEN Lambda imports the handler (its init phase)
    importlib.import_module(f"functions.{function}.app")
    # THEN the function's models were built then, not on its first image
    assert built == loads
