"""Model loading at function init, and the SnapStart hooks around it.

In Lambda (``ANNOTATE_PRELOAD_MODELS=true``) a function's model is read from the models bucket while the
function initialises, not on its first request. Under SnapStart (zip functions) that happens before the
snapshot, so restored environments start with the model in memory; after a restore, what must not be
shared between environments (connections, random state) is made anew.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from shared.observability import logger
from shared.settings import Settings, get_settings


def _loaders() -> dict[str, Callable[[Settings], Any]]:
    from shared.captioning import load_captioner
    from shared.classification import load_classifier
    from shared.detection import load_detector
    from shared.tagging import load_tagger

    return {"detect": load_detector, "classify": load_classifier, "tag": load_tagger, "caption": load_captioner}


def prepare_function(step: str) -> None:
    """Called at a model function's module scope: load its model now, or just before the SnapStart snapshot."""
    settings = get_settings()
    if not settings.preload_models:
        return
    load = _loaders()[step]
    try:
        from snapshot_restore_py import register_after_restore, register_before_snapshot
    except ImportError:  # not a SnapStart runtime (a container image): load during init
        load(settings)
        return
    register_before_snapshot(lambda: load(settings))
    register_after_restore(refresh_after_restore)


def refresh_after_restore() -> None:
    """Each restored environment gets its own connections and random state."""
    import numpy as np

    from shared import storage

    storage._s3_store.cache_clear()
    random.seed()
    np.random.seed()
    logger.info("restored from snapshot")
