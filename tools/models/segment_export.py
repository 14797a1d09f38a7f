"""Segment's model (a transformers SAM 2-family checkpoint: EdgeTAM, SAM 2) exported to ONNX once, for the
torch-free Segment (shared/models/segmentation.py): the image encoder as one graph (the image's features), the
prompt encoder and mask decoder as another that takes those features and any number of boxes. Both share one
weights file. Traced with the TorchScript exporter, as the other models are; the decoder's single-mask output
(``multimask_output=False``, with SAM 2's choice by stability) is traced as the model computes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.models.onnx_runtime import weights_file
from shared.models.segmentation import (
    DECODER_GRAPH,
    FEATURE_NAMES,
    IMAGE_GRAPH,
    SEGMENTER_EXPORT_VERSION,
    SEGMENTER_MANIFEST,
    SegmenterExport,
)
from shared.settings import SegmentSettings
from tools.models.onnx_graphs import finish_graphs
from tools.models.torch_models import export_once, weights_revision


def exported_segmenter_dir(settings: SegmentSettings) -> Path:
    """The export of the segmenter the settings name, made here unless it is there already."""
    return export_once(settings.segment_model, settings, SEGMENTER_MANIFEST, export_segmenter, SEGMENTER_EXPORT_VERSION)


def load_torch_segmenter(folder: Path) -> tuple[Any, Any]:
    """The checkpoint in ``folder`` as transformers runs it, with its processor (the reference the export is held
    to)."""
    from transformers import AutoModel, AutoProcessor

    return AutoModel.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)


def export_segmenter(model_dir: Path, out_dir: Path) -> None:
    import torch

    model, processor = load_torch_segmenter(model_dir)
    image_processor = processor.image_processor
    size = int(image_processor.size["height"])
    manifest = SegmenterExport(
        source=str(model_dir),
        revision=weights_revision(model),
        image_size=size,
        image_mean=list(image_processor.image_mean),
        image_std=list(image_processor.image_std),
    )

    class ImageFeatures(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> tuple[Any, ...]:
            return tuple(self.model.get_image_embeddings(pixel_values))

    class BoxMasks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, features_0: Any, features_1: Any, image_embedding: Any, boxes: Any) -> tuple[Any, Any]:
            output = self.model(
                image_embeddings=[features_0, features_1, image_embedding], input_boxes=boxes, multimask_output=False
            )
            return output.pred_masks[0, :, 0], output.iou_scores[0, :, 0]

    pixels = torch.rand(1, 3, size, size)
    with torch.no_grad():
        features = tuple(model.get_image_embeddings(pixels))
        boxes = torch.tensor([[[0.1, 0.1, 0.5, 0.6], [0.3, 0.2, 0.9, 0.9]]]) * size
        traced_image, traced_decoder = out_dir / "image.traced", out_dir / "decoder.traced"
        # The wrappers are put in eval mode: the exporter restores each module's mode after it traces, and a
        # wrapper made in training mode would leave the model's BatchNorm layers training.
        torch.onnx.export(
            ImageFeatures().eval(),
            (pixels,),
            str(traced_image),
            input_names=["pixel_values"],
            output_names=FEATURE_NAMES,
            dynamo=False,
            opset_version=17,
        )
        torch.onnx.export(
            BoxMasks().eval(),
            (*features, boxes),
            str(traced_decoder),
            input_names=[*FEATURE_NAMES, "boxes"],
            output_names=["mask_logits", "iou_scores"],
            dynamic_axes={"boxes": {1: "boxes"}, "mask_logits": {0: "boxes"}, "iou_scores": {0: "boxes"}},
            dynamo=False,
            opset_version=17,
        )
    image_graph = out_dir / IMAGE_GRAPH
    finish_graphs({traced_image: image_graph, traced_decoder: out_dir / DECODER_GRAPH}, weights_file(image_graph))
    (out_dir / SEGMENTER_MANIFEST).write_text(manifest.model_dump_json(indent=2))
