"""OmDet-Turbo (transformers' ``OmDetTurboForObjectDetection``) exported to ONNX the way Grounding DINO is
(tools/models/detector_export.py), for the torch-free detector in shared/models/omdet_onnx.py.

OmDet-Turbo resizes every image to one square size (640 px), so one graph serves every image. Its prompt is a list
of class names and a task sentence, each encoded by CLIP's text encoder once per prompt (the model keeps them in an
LRU cache): the text encoder is a graph of its own (each token's features, and the projected embedding at the end
token), and the image graph takes the encoded classes and task, as Grounding DINO's size graphs take the encoded
text. It returns each query's class logits and box, and each encoder position's best class similarity, which picks
the decoder's queries (as Grounding DINO's ``selection_scores``: equal before the tie-sensitive top-k). The
TorchScript exporter traces both unchanged: no patch is needed.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.errors import ModelUnavailable
from shared.models.omdet_onnx import OMDET_GRAPH, OMDET_MANIFEST, OMDET_TEXT_GRAPH, OMDET_WEIGHTS, OmDetManifest
from tools.models.onnx_graphs import finish_graphs
from tools.models.torch_models import prepare_torch

TASK_TEMPLATE = "Detect {}."  # transformers' processor's task sentence when it is given none
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
    """Export the OmDet-Turbo in ``model_dir`` into ``out_dir``: its image and text graphs (with their OpenVINO
    forms and one weights file), its tokenizer and a manifest; returns the image graph's path.

    Raises:
        ModelUnavailable: its image processor does what the runtime does not (another resize or rescale).
    """
    import torch
    from transformers import AutoProcessor

    prepare_torch(0)
    model = load_omdet_turbo(model_dir)
    processor = AutoProcessor.from_pretrained(model_dir)
    manifest = _manifest(model, processor, model_dir)
    processor.tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    vocabulary = model.config.text_config.vocab_size
    class_ids, task_ids = torch.randint(1, vocabulary - 1, (2, 4)), torch.randint(1, vocabulary - 1, (1, 9))
    example = (torch.zeros(1, 3, *manifest.size), *encoded_prompt(model, class_ids, task_ids))
    traced = {
        out_dir / "omdet-turbo.traced": out_dir / OMDET_GRAPH,
        out_dir / "omdet-turbo-text.traced": out_dir / OMDET_TEXT_GRAPH,
    }
    [image_traced, text_traced] = traced
    with _selection_scores_kept(model), torch.no_grad(), warnings.catch_warnings():
        # Tracing warns at every shape it freezes: expected, as the graph takes one image size
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            image_graph(model).eval(),
            example,
            str(image_traced),
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
        torch.onnx.export(
            text_graph(model).eval(),
            (task_ids,),
            str(text_traced),
            input_names=["input_ids"],
            output_names=["hidden", "pooled"],
            dynamic_axes={"input_ids": {0: "texts", 1: "tokens"}},
            dynamo=False,
            opset_version=17,
        )
    finish_graphs(traced, out_dir / OMDET_WEIGHTS, openvino=True)
    (out_dir / OMDET_MANIFEST).write_text(manifest.model_dump_json(indent=2))
    return out_dir / OMDET_GRAPH


def _manifest(model: Any, processor: Any, model_dir: Path) -> OmDetManifest:
    images = processor.image_processor
    size = images.size or {}
    height, width = (
        size.get(side) if isinstance(size, dict) else getattr(size, side, None) for side in ("height", "width")
    )
    if not (images.do_resize and height and width) or abs(images.rescale_factor - 1 / 255) > 1e-12:
        raise ModelUnavailable(
            f"{model_dir}'s image processor resizes to {size} and rescales by {images.rescale_factor}: the export "
            "takes a fixed height and width, pixels rescaled by 1/255"
        )
    return OmDetManifest(
        source=str(model_dir),
        size=(int(height), int(width)),
        resample=int(images.resample),
        image_mean=[float(v) for v in images.image_mean],
        image_std=[float(v) for v in images.image_std],
        max_text_len=int(model.config.text_config.max_position_embeddings),
        task_template=TASK_TEMPLATE,
        queries=int(model.config.num_queries),
    )


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


def text_graph(model: Any) -> Any:
    """CLIP's text encoder as the model calls it: each token's features, and (for a class name) the projected
    features at its end token, the highest id."""
    import torch

    backbone = model.language_backbone

    class _TextGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = backbone

        def forward(self, input_ids: Any) -> tuple:
            hidden = self.backbone.model(input_ids)[0]
            ends = hidden[torch.arange(hidden.shape[0]), input_ids.argmax(dim=-1)]
            return hidden, ends @ self.backbone.text_projection

    return _TextGraph()


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
