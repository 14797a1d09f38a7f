"""Upload the models the settings name to the models bucket, under the keys the template reads them from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shared.model_sources import resolve_model_dir, resolve_model_file
from shared.observability import logger
from shared.settings import Settings
from shared.storage import join_uri, store_for

# Template parameter -> where its model goes under the models prefix (the parameters' defaults).
MODEL_LOCATIONS = {
    "DetectorModel": "grounding-dino-tiny/",
    "ClassifierModel": "convnext-tiny-224/",
    "TaggerModel": "clip/",
    "CaptionModel": "caption.gguf",
}


@dataclass(frozen=True)
class PushedModel:
    parameter: str
    source: str
    uri: str
    files: int
    bytes: int


def _local_sources(settings: Settings) -> dict[str, Path]:
    tagger = (settings.tagger_models or [""])[0]
    return {
        "DetectorModel": resolve_model_dir(settings.detector_model, settings),
        "ClassifierModel": resolve_model_dir(settings.classifier_model, settings),
        "TaggerModel": resolve_model_dir(tagger, settings),
        "CaptionModel": resolve_model_file(settings.caption_model, settings),
    }


def push_models(settings: Settings, bucket: str, prefix: str = "models/") -> list[PushedModel]:
    """Resolve each model (hub cache, local, packaged or tiny) to local files and upload them.

    Raises:
        ModelUnavailable: a model is not available on this machine; the message says how to get it.
    """
    pushed = []
    sources = {
        "DetectorModel": settings.detector_model,
        "ClassifierModel": settings.classifier_model,
        "TaggerModel": (settings.tagger_models or [""])[0],
        "CaptionModel": settings.caption_model,
    }
    for parameter, local in _local_sources(settings).items():
        target = join_uri(f"s3://{bucket}", prefix, MODEL_LOCATIONS[parameter])
        files = (
            [local]
            if local.is_file()
            else sorted(p for p in local.rglob("*") if p.is_file() and not p.name.startswith("."))
        )
        size = 0
        for path in files:
            uri = target if local.is_file() else join_uri(target, str(path.relative_to(local)))
            data = path.read_bytes()
            store_for(uri).write_bytes(uri, data)
            size += len(data)
        logger.info("model pushed", extra={"parameter": parameter, "uri": target, "files": len(files)})
        pushed.append(
            PushedModel(parameter, sources[parameter], target + ("/" if local.is_dir() else ""), len(files), size)
        )
    return pushed
