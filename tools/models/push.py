"""Upload the models the settings name to the deployed stack, where its functions read them from.

The stack says where: its outputs ``DetectorModelUri``, ``ClassifierModelUri``, ... are the S3 locations its
functions load (built from its model parameters), so a push follows whatever the stack was deployed with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.errors import RequestRejected
from shared.models.sources import BUILT_PREFIXES, resolve_model_dir, resolve_model_file
from shared.observability import logger
from shared.settings import Settings
from shared.storage.objects import join_uri, store_for
from tools.aws.stack_outputs import stack_outputs
from tools.models.describe_export import exported_classifier_dir, exported_tagger_dir
from tools.models.detector_export import exported_detector_dir
from tools.models.segment_export import exported_segmenter_dir
from tools.models.tiny_models import build_model

# Stack output -> the setting that names the model to upload there. VariantsModelUri exists only in a stack
# deployed with variants.
MODEL_OUTPUTS = {
    "DetectorModelUri": "detector_model",
    "ClassifierModelUri": "classifier_model",
    "TaggerModelUri": "tagger_models",
    "SegmenterModelUri": "segment_model",
    "CaptionModelUri": "caption_model",
    "CaptionVisionModelUri": "caption_vision_model",
    "CaptionVisionProjectorUri": "caption_vision_mmproj",
    "VariantsModelUri": "variants_model",
}


@dataclass(frozen=True)
class PushedModel:
    output: str
    source: str
    uri: str
    files: int
    bytes: int


def stack_model_uris(stack_name: str, cloudformation: Any = None) -> dict[str, str]:
    """The stack's model locations, by output name.

    Raises:
        RequestRejected: the stack does not exist or has no model outputs.
    """
    outputs = stack_outputs(stack_name, cloudformation=cloudformation)
    uris = {name: outputs[name] for name in MODEL_OUTPUTS if name in outputs}
    if not uris:
        raise RequestRejected(f"stack {stack_name!r} has no model outputs ({', '.join(MODEL_OUTPUTS)})")
    return uris


def _source(settings: Settings, output: str) -> str:
    value = getattr(settings, MODEL_OUTPUTS[output])
    return str((value or [""])[0] if isinstance(value, list) else value)


def _local_files(settings: Settings, output: str, target: str) -> list[tuple[Path, str]]:
    """(local file, S3 URI) pairs: a single-file model (a GGUF) to ``target``, a folder's files under it; for
    Detect, Classify and Tag, their models' ONNX exports (made here unless they are cached)."""
    source, files = _source(settings, output), settings.model_files
    if not target.endswith("/"):
        if source.startswith(BUILT_PREFIXES):  # a file of a built model (tiny:smolvlm/model.gguf)
            build_model(source.split("/", 1)[0], files)
        return [(resolve_model_file(source, files), target)]
    if source.startswith(BUILT_PREFIXES):
        build_model(source, files)
    if output == "DetectorModelUri":
        folder = exported_detector_dir(settings.detection)
    elif output == "ClassifierModelUri":
        folder = exported_classifier_dir(settings.describe)
    elif output == "TaggerModelUri":
        folder = exported_tagger_dir(source, files)
    elif output == "SegmenterModelUri":
        folder = exported_segmenter_dir(settings.segment)
    else:
        folder = resolve_model_dir(source, files)
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    return [(path, join_uri(target, str(path.relative_to(folder)))) for path in paths]


def push_models(settings: Settings, targets: dict[str, str]) -> list[PushedModel]:
    """Resolve each model (hub cache, local, packaged or tiny) to local files and upload them to ``targets``.

    ``targets``: output name -> S3 location, as :func:`stack_model_uris` returns them; a location ending in '/'
    is a folder.

    Raises:
        ModelUnavailable: a model is not available on this machine; the message says how to get it.
    """
    pushed = []
    for output, target in targets.items():
        source = _source(settings, output)
        size = 0
        files = _local_files(settings, output, target)
        for path, uri in files:
            data = path.read_bytes()
            store_for(uri).write_bytes(uri, data)
            size += len(data)
        logger.info("model pushed", extra={"output": output, "uri": target, "files": len(files)})
        pushed.append(PushedModel(output, source, target, len(files), size))
    return pushed
