"""Model loading at function init, and the SnapStart hooks around it.

In Lambda (``ANNOTATE_PRELOAD_MODELS=true``) a function's model is read from the models bucket while the
function initialises, not on its first request. Under SnapStart (zip functions) that happens before the
snapshot, so restored environments start with the model in memory; after a restore, what must not be
shared between environments (connections, random state) is made anew.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Any

from shared.observability import logger
from shared.pipeline.dependencies import Step, dependencies_of
from shared.settings import get_settings
from shared.storage.objects import refresh_clients

# The instruction sets that decide which kernels torch, ONNX Runtime and llama.cpp take. x86 Lambda promises AVX2
# only, arm64 Lambda is Graviton2 (dot products, no bf16): what a measurement here assumed may be absent there.
WATCHED_CPU_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "asimddp",
    "bf16",
    "i8mm",
    "sve",
)


def cpu_features(cpuinfo: str) -> dict[str, Any]:
    """The CPU's name and which of :data:`WATCHED_CPU_FLAGS` it has, from ``/proc/cpuinfo``'s text."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    name = fields.get("model name") or f"{fields.get('CPU implementer', '?')}/{fields.get('CPU part', '?')}"
    return {"cpu": name, "cpu_flags": [flag for flag in WATCHED_CPU_FLAGS if flag in flags]}


def log_cpu() -> None:
    """Say which CPU this environment runs on: Lambda's hardware is mixed, and a restored snapshot may move."""
    with contextlib.suppress(OSError):  # not Linux: nothing to say
        logger.info("cpu", extra=cpu_features(Path("/proc/cpuinfo").read_text()))


def prepare_function(*steps: Step) -> None:
    """Called at a model function's module scope: log the CPU, and build the dependencies (the models) of the
    function's steps now, or just before the SnapStart snapshot."""
    log_cpu()
    if not get_settings().preload_models:
        return

    def load() -> None:
        for step in steps:
            dependencies_of(step)

    try:
        from snapshot_restore_py import register_after_restore, register_before_snapshot
    except ImportError:  # not a SnapStart runtime (a container image): load during init
        load()
        return
    register_before_snapshot(load)
    register_after_restore(refresh_after_restore)


def refresh_after_restore() -> None:
    """Each restored environment gets its own connections and random state."""
    import numpy as np

    refresh_clients()
    random.seed()
    np.random.seed()
    logger.info("restored from snapshot")
    log_cpu()
