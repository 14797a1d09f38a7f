"""OmDet-Turbo (transformers' ``OmDetTurboForObjectDetection``) exported to ONNX the way Grounding DINO is
(tools/models/detector_export.py), to be compared with it (annotate bench-detectors): not a model Detect loads.

OmDet-Turbo resizes every image to one square size (640 px), so one graph serves every image. Its prompt is a list
of class names and a task sentence, each encoded by CLIP's text encoder once per prompt (the model keeps them in an
LRU cache): the graph takes the encoded classes and task, as Grounding DINO's size graphs take the encoded text,
and returns each query's class logits and box, and each encoder position's best class similarity, which picks the
decoder's queries (as Grounding DINO's ``selection_scores``: equal before the tie-sensitive top-k). The TorchScript
exporter traces it unchanged: no patch is needed.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.models.onnx_graphs import finish_graphs
from tools.models.torch_models import prepare_torch

OMDET_GRAPH = "omdet-turbo.onnx"
OMDET_WEIGHTS = "omdet-turbo.weights"
INPUT_NAMES = ["pixel_values", "class_features", "task_features", "task_mask"]
OUTPUT_NAMES = ["class_logits", "boxes", "selection_scores"]


def load_omdet_turbo(model_dir: Path) -> Any:
    from transformers import AutoModelForZeroShotObjectDetection

    return AutoModelForZeroShotObjectDetection.from_pretrained(model_dir).eval()


def image_size(model: Any) -> tuple[int, int]:
    size = model.config.image_size
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def encoded_prompt(model: Any, class_ids: Any, task_ids: Any) -> tuple[Any, Any, Any]:
    """The graph's prompt inputs, (class features, task features, task mask), for tokenized class names
    (classes, tokens) and one tokenized task (1, tokens), as the model's forward encodes them."""
    import torch

    with torch.inference_mode():
        classes, task, mask = model.get_language_embedding(
            class_ids,
            torch.ones_like(class_ids),
            task_ids,
            torch.ones_like(task_ids),
            torch.tensor([class_ids.shape[0]]),
        )
    return classes, task, mask


def export_omdet_turbo(model_dir: Path, out_dir: Path) -> Path:
    """Export the OmDet-Turbo in ``model_dir`` into ``out_dir`` (its graph, its OpenVINO form and one weights file);
    returns the graph's path."""
    import torch

    prepare_torch(0)
    model = load_omdet_turbo(model_dir)
    height, width = image_size(model)
    vocabulary = model.config.text_config.vocab_size
    class_ids, task_ids = torch.randint(1, vocabulary - 1, (2, 4)), torch.randint(1, vocabulary - 1, (1, 9))
    example = (torch.zeros(1, 3, height, width), *encoded_prompt(model, class_ids, task_ids))
    traced, graph = out_dir / "omdet-turbo.traced", out_dir / OMDET_GRAPH
    with _selection_scores_kept(model), torch.no_grad(), warnings.catch_warnings():
        # Tracing warns at every shape it freezes: expected, as the graph takes one image size
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            image_graph(model).eval(),
            example,
            str(traced),
            input_names=INPUT_NAMES,
            output_names=OUTPUT_NAMES,
            dynamic_axes={
                "class_features": {0: "classes"},
                "task_features": {0: "tokens"},
                "task_mask": {1: "tokens"},
                "class_logits": {2: "classes"},
            },
            dynamo=False,  # as Grounding DINO's: the dynamo exporter fails on Swin's views
            opset_version=17,
        )
    finish_graphs({traced: graph}, out_dir / OMDET_WEIGHTS, openvino=True)
    return graph


def torch_outputs(model: Any, pixel_values: Any, class_features: Any, task_features: Any, task_mask: Any) -> tuple:
    """The graph's outputs as torch computes them (eager, fp32)."""
    import torch

    with _selection_scores_kept(model), torch.inference_mode():
        return tuple(out.numpy() for out in image_graph(model)(pixel_values, class_features, task_features, task_mask))


class _Kept:
    selection_scores: Any = None


def image_graph(model: Any) -> Any:
    """The model from the image and the encoded prompt to the decoder's last class logits and boxes, and each
    encoder position's best class similarity."""
    import torch

    class _ImageGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any, class_features: Any, task_features: Any, task_mask: Any) -> tuple:
            _Kept.selection_scores = None
            encoded = self.model.encoder(self.model.vision_backbone(pixel_values))
            decoded = self.model.decoder(encoded.extracted_states, class_features, task_features, task_mask)
            return decoded.decoder_classes[-1], decoded.decoder_coords[-1], _Kept.selection_scores

    return _ImageGraph()


@contextlib.contextmanager
def _selection_scores_kept(model: Any) -> Iterator[None]:
    """The decoder's query selection, keeping the scores it ranks (every position's best class similarity)."""
    module: Any = sys.modules[type(model).__module__]
    similarity = module.get_class_similarity

    def kept(distance_type: str, features: Any, projected: Any) -> Any:
        scores = similarity(distance_type, features, projected)
        if _Kept.selection_scores is None:  # the encoder's call comes first; the decoder layers' follow
            _Kept.selection_scores = scores.max(-1).values
        return scores

    module.get_class_similarity = kept
    try:
        yield
    finally:
        module.get_class_similarity = similarity
        _Kept.selection_scores = None
