"""Model loading at function init, and the SnapStart hooks around it.

In Lambda (``ANNOTATE_PRELOAD_MODELS=true``) a function's model is read from the models bucket while the
function initialises, not on its first request. Under SnapStart (zip functions) that happens before the
snapshot, so restored environments start with the model in memory; after a restore, what must not be
shared between environments (connections, random state) is made anew.
"""

from __future__ import annotations

import random

from shared.dependencies import Step, dependencies_of
from shared.observability import logger
from shared.settings import get_settings
from shared.storage import refresh_clients


def prepare_function(step: Step) -> None:
    """Called at a model function's module scope: build its dependencies (its model) now, or just before the
    SnapStart snapshot."""
    if not get_settings().preload_models:
        return
    try:
        from snapshot_restore_py import register_after_restore, register_before_snapshot
    except ImportError:  # not a SnapStart runtime (a container image): load during init
        dependencies_of(step)
        return
    register_before_snapshot(lambda: dependencies_of(step))
    register_after_restore(refresh_after_restore)


def refresh_after_restore() -> None:
    """Each restored environment gets its own connections and random state."""
    import numpy as np

    refresh_clients()
    random.seed()
    np.random.seed()
    logger.info("restored from snapshot")
