"""Classify's and Tag's models exported to ONNX once, for the torch-free functions (shared/models/classification.py,
shared/models/tagging.py): the ConvNeXt (transformers) with its preprocessing, and OpenVINO's form of it, and both CLIP
towers (open_clip) with a `tokenizers` copy of open_clip's tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.errors import ModelUnavailable
from shared.models.classification import CLASSIFIER_GRAPH, CLASSIFIER_MANIFEST, TORCHSCRIPT_FILE, ClassifierExport
from shared.models.onnx_runtime import weights_file
from shared.models.tagging import (
    CLIP_EXPORT_VERSION,
    IMAGE_GRAPH,
    TAGGER_MANIFEST,
    TEXT_GRAPH,
    TOKENIZER_FILE,
    ClipExport,
)
from shared.settings import DescribeSettings, ModelFiles
from tools.models.onnx_graphs import finish_graphs
from tools.models.torch_models import export_once, torchscript_labels, torchscript_preprocessing, weights_revision


def exported_classifier_dir(settings: DescribeSettings) -> Path:
    """The export of the classifier the settings name, made here unless it is there already."""
    return export_once(settings.classifier_model, settings, CLASSIFIER_MANIFEST, export_classifier)


def exported_tagger_dir(source: str, files: ModelFiles) -> Path:
    """The export of the open_clip model ``source``, made here unless it is there already."""
    return export_once(source, files, TAGGER_MANIFEST, export_clip, CLIP_EXPORT_VERSION)


def export_classifier(model_dir: Path, out_dir: Path) -> None:
    """An image classifier: logits for a batch of crops, with its class names and preprocessing. A transformers
    checkpoint (its processor's preprocessing), or a traced TorchScript model with ``labels.txt``."""
    import torch

    if (model_dir / TORCHSCRIPT_FILE).is_file():
        labels = torchscript_labels(model_dir)
        module = torch.jit.load(str(model_dir / TORCHSCRIPT_FILE), map_location="cpu").eval()
        options = torchscript_preprocessing(model_dir)
        size, resize, bicubic = options["size"], options["size"], False  # a plain resize to a square
        mean, std = options["mean"], options["std"]
    else:
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        model = AutoModelForImageClassification.from_pretrained(model_dir).eval()
        processor = AutoImageProcessor.from_pretrained(model_dir)
        labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        size = processor.size["shortest_edge"]
        # ConvNeXt's processor: below 384 px, resize the short side to size / crop_pct and center-crop; else warp.
        resize = int(size / processor.crop_pct) if size < 384 else size
        bicubic, mean, std = int(processor.resample) == 3, list(processor.image_mean), list(processor.image_std)
        module = _calling(model, lambda model, pixels: model(pixel_values=pixels).logits)
    manifest = ClassifierExport(
        source=str(model_dir),
        labels=labels,
        resize_short_side=resize,
        crop_size=size,
        bicubic=bicubic,
        image_mean=mean,
        image_std=std,
    )
    # With OpenVINO's form beside it (classifier_runtime=openvino, the bulk task's), sharing its weights file.
    _export(module, torch.rand(1, 3, size, size), out_dir / CLASSIFIER_GRAPH, "pixel_values", "logits", openvino=True)
    (out_dir / CLASSIFIER_MANIFEST).write_text(manifest.model_dump_json(indent=2))


def export_clip(model_dir: Path, out_dir: Path) -> None:
    """An open_clip model's image and text towers, its tokenizer as a `tokenizers` file, its preprocessing."""
    import open_clip
    import torch

    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{model_dir}")
    model = model.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{model_dir}")
    size = model.visual.image_size
    size = size[0] if isinstance(size, tuple | list) else size
    _save_tokenizer(tokenizer, out_dir / TOKENIZER_FILE)
    config = model.visual.preprocess_cfg if hasattr(model.visual, "preprocess_cfg") else {}
    manifest = ClipExport(
        source=str(model_dir),
        revision=weights_revision(model),
        image_size=size,
        image_mean=list(config.get("mean", open_clip.OPENAI_DATASET_MEAN)),
        image_std=list(config.get("std", open_clip.OPENAI_DATASET_STD)),
        context_length=tokenizer.context_length,
        end_of_text_id=tokenizer.eot_token_id,
        logit_scale=float(model.logit_scale.exp()),
    )

    image_tower = _calling(model, lambda model, pixels: model.encode_image(pixels))
    text_tower = _calling(model, lambda model, tokens: model.encode_text(tokens))
    _export(image_tower, torch.rand(1, 3, size, size), out_dir / IMAGE_GRAPH, "pixels", "features")
    _export(text_tower, tokenizer(["a photo of a cat"]), out_dir / TEXT_GRAPH, "tokens", "features")
    (out_dir / TAGGER_MANIFEST).write_text(manifest.model_dump_json(indent=2))


def _save_tokenizer(tokenizer: Any, path: Path) -> None:
    """open_clip's BPE tokenizer as a `tokenizers` file (the same vocabulary, merges and framing)."""
    transformers_clip_tokenizer(tokenizer).backend_tokenizer.save(str(path))


def transformers_clip_tokenizer(tokenizer: Any) -> Any:
    """open_clip's BPE tokenizer as transformers' ``CLIPTokenizer`` (the same vocabulary, merges and framing)."""
    from transformers import CLIPTokenizer

    if not hasattr(tokenizer, "bpe_ranks"):
        raise ModelUnavailable(f"only open_clip's own BPE tokenizer can be exported, not {type(tokenizer).__name__}")
    start, end = tokenizer.decoder[tokenizer.sot_token_id], tokenizer.decoder[tokenizer.eot_token_id]
    merges = [pair for pair, _ in sorted(tokenizer.bpe_ranks.items(), key=lambda item: item[1])]
    # vocab= and merges= as values: transformers 5 builds a near-empty vocabulary from vocab_file=/merges_file=.
    return CLIPTokenizer(
        vocab=dict(tokenizer.encoder), merges=merges, bos_token=start, eos_token=end, unk_token=end, pad_token=end
    )


def _calling(model: Any, call: Callable[[Any, Any], Any]) -> Any:
    """A module whose forward is ``call(model, input)``, with ``model`` a submodule: its weights become the
    graph's parameters, not traced constants."""
    import torch

    class Calling(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return call(self.model, inputs)

    return Calling()


def _export(module: Any, example: Any, path: Path, input_name: str, output_name: str, openvino: bool = False) -> None:
    import torch

    # Not under no_grad: there, CLIP's attention takes a fused kernel that has no ONNX form.
    with torch.enable_grad():
        traced = path.with_suffix(".traced")
        torch.onnx.export(
            module.eval(),
            (example,),
            str(traced),
            input_names=[input_name],
            output_names=[output_name],
            dynamic_axes={input_name: {0: "batch"}, output_name: {0: "batch"}},
            dynamo=False,  # the TorchScript exporter handles both towers; the dynamo one needs onnxscript
            opset_version=17,
        )
    finish_graphs({traced: path}, weights_file(path), openvino=openvino)
