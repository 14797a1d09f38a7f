"""Grounding DINO exported once to ONNX, at fixed image sizes, for the torch-free Detect
(shared/models/grounding_onnx.py).

The text encoder (BERT) is exported as a graph of its own, which the runtime runs once per prompt, and each size's
graph takes its output: OpenVINO keeps a compiled copy of each graph's weights. The transformers class traces with
the TorchScript exporter after five changes, each made only while exporting: the text encoder's output becomes a
graph input; the text self-attention mask and position ids become graph inputs (in the graph they are built with
`isin` and `cummax`, which the exporter cannot translate, and a traced loop would freeze the export prompt's phrase
count); the encoder's reference points are built with `arange + 0.5` rather than a float64 `linspace`; the encoder's
proposals look their centres up in a table divided here, by torch, rather than dividing in the graph (a proposal is
kept if its centre is below 0.99, and OpenVINO divides as a multiplication by the reciprocal: its 49.5 / 50 is
0.98999995, below the cut-off, where torch's is 0.99000001, and it decoded other queries); and the deformable
attention sums each feature level's samples as it takes them rather than stacking all four levels first (the same
sum in another order: one fewer copy of the largest tensor in the encoder), each level sampled point-major
(`deformable_attention`). The model keeps the attention it loads with: in transformers 5.23 its eager attention
gives other outputs than SDPA for Grounding DINO's boolean text mask, so an eager export would not match the model
it came from. Tracing freezes every size computed from the image (Swin's window padding, the feature maps' shapes),
so each export takes exactly one image size: the runtime pads to it, and ONNX Runtime refuses any other. The sizes'
graphs are optimized here and share one weights file (tools/models/onnx_graphs.py).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.detector_geometry import ImageSize
from shared.models.grounding_onnx import (
    EXPORT_MANIFEST,
    TEXT_GRAPH,
    WEIGHTS_FILE,
    ExportManifest,
    export_file_name,
    export_key,
    is_omdet_turbo,
)
from shared.models.omdet_onnx import OMDET_MANIFEST
from shared.observability import logger
from shared.settings import DetectionSettings
from tools.models.onnx_graphs import finish_graphs
from tools.models.torch_models import export_once, prepare_torch

# Outputs of every export. ``selection_scores`` is each encoder position's best text score, which picks the
# decoder's queries: equal selection scores show the graph equal to torch before the (tie-sensitive) top-k.
OUTPUT_NAMES = ["logits", "pred_boxes", "selection_scores"]
INPUT_NAMES = ["pixel_values", "pixel_mask", "text_hidden", "attention_mask", "text_mask", "position_ids"]
# The text encoder (BERT, two thirds of the weights file) is a graph of its own, run once per prompt: in every
# size's graph, OpenVINO kept its own compiled copy of BERT's weights (0.2 GB a size)
TEXT_INPUT_NAMES = ["input_ids", "token_type_ids", "text_mask", "position_ids"]
TEXT_OUTPUT_NAMES = ["text_hidden"]
TOKEN_AXES = {"text_mask": {1: "tokens", 2: "tokens"}}  # every other text input's axis 1
IMAGE_INPUTS = {"pixel_values", "pixel_mask"}  # fixed: one graph per size


def exported_detector_dir(settings: DetectionSettings) -> Path:
    """The export of ``settings.detector_model`` (at the settings' sizes for Grounding DINO's family; OmDet-Turbo's
    takes its one size), made here unless it is there already."""
    if is_omdet_turbo(settings):
        from tools.models.omdet_export import export_omdet_turbo

        def export_omdet(checkpoint: Path, folder: Path) -> None:
            export_omdet_turbo(checkpoint, folder)

        return export_once(settings.detector_model, settings, OMDET_MANIFEST, export_omdet)

    def export(checkpoint: Path, folder: Path) -> None:
        export_grounding_dino(
            checkpoint,
            folder,
            settings.export_sizes(),
            settings.detection_short_side,
            int8=settings.detector_int8,
            max_queries=settings.detector_max_queries,
        )

    return export_once(settings.detector_model, settings, EXPORT_MANIFEST, export, export_key(settings))


def export_grounding_dino(
    model_dir: Path,
    out_dir: Path,
    sizes: list[ImageSize],
    short_side: int,
    int8: bool = False,
    max_queries: int = 900,
) -> ExportManifest:
    """Export the Grounding DINO in ``model_dir`` once per image size into the folder ``out_dir``, with its
    tokenizer and a manifest (lossy: ``int8``, its weights quantized; ``max_queries`` below the model's own)."""
    import torch
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    prepare_torch(0)
    model = AutoModelForZeroShotObjectDetection.from_pretrained(model_dir).eval()
    keep_queries(model, max_queries)
    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    text = processor.tokenizer("a cat. a remote control.", return_tensors="pt")
    text_mask, position_ids = phrase_masks(text["input_ids"], model.model.special_tokens)

    text_backbone = model.model.text_backbone  # the size graphs are traced with it replaced (_exportable)

    class TracedText(torch.nn.Module):
        """The text encoder as Grounding DINO calls it: the phrases' mask, as one attention head's."""

        def __init__(self) -> None:
            super().__init__()
            self.text_backbone = text_backbone

        def forward(self, input_ids: Any, token_type_ids: Any, text_mask: Any, position_ids: Any) -> Any:
            return self.text_backbone(input_ids, text_mask[:, None], token_type_ids, position_ids).last_hidden_state

    class Traceable(torch.nn.Module):
        """The graph's inputs and outputs: the encoded text, mask and position ids in, the selection scores out."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(
            self,
            pixel_values: Any,
            pixel_mask: Any,
            text_hidden: Any,
            attention_mask: Any,
            text_mask: Any,
            position_ids: Any,
        ) -> tuple[Any, Any, Any]:
            _TracedInputs.text_mask, _TracedInputs.position_ids = text_mask, position_ids
            _TracedInputs.text_hidden = text_hidden
            outputs = self.model(
                pixel_values=pixel_values,
                pixel_mask=pixel_mask,
                input_ids=attention_mask,  # only its shape is read: the text encoder's output is given
                attention_mask=attention_mask,
            )
            return outputs.logits, outputs.pred_boxes, outputs.enc_outputs_class.max(-1).values

    traced_graphs = {}
    with _exportable(model):
        text_example = (text["input_ids"], text["token_type_ids"], text_mask, position_ids)
        text_graph = out_dir / TEXT_GRAPH
        traced = _traced(TracedText(), text_example, text_graph, TEXT_INPUT_NAMES, TEXT_OUTPUT_NAMES, int8)
        traced_graphs[traced] = text_graph
        text_hidden = TracedText()(*text_example)
        for height, width in sizes:
            example = (
                torch.zeros(1, 3, height, width),
                torch.ones(1, height, width, dtype=torch.int64),
                text_hidden,
                text["attention_mask"],
                text_mask,
                position_ids,
            )
            path = out_dir / export_file_name((height, width))
            traced_graphs[_traced(Traceable(), example, path, INPUT_NAMES, OUTPUT_NAMES, int8)] = path
            logger.info("detector exported", extra={"size": f"{height}x{width}", "path": str(path), "int8": int8})
    finish_graphs(traced_graphs, out_dir / WEIGHTS_FILE, openvino=True)
    image = processor.image_processor
    manifest = ExportManifest(
        source=str(model_dir),
        sizes=sizes,
        short_side=short_side,
        longest_edge=image.size["longest_edge"] * short_side // image.size["shortest_edge"],
        image_mean=list(image.image_mean),
        image_std=list(image.image_std),
        special_token_ids=[int(i) for i in model.model.special_tokens.tolist()],
        max_text_len=model.config.max_text_len,
        int8=int8,
        max_queries=max_queries,
    )
    (out_dir / EXPORT_MANIFEST).write_text(manifest.model_dump_json(indent=2))
    return manifest


def keep_queries(model: Any, max_queries: int) -> None:
    """Let the decoder take only the encoder's ``max_queries`` best proposals (fewer than the model's own is
    lossy: the kept queries attend to one another in the decoder, and no longer to the dropped ones)."""
    import torch

    if max_queries >= model.config.num_queries:
        return
    embeddings = model.model.query_position_embeddings
    embeddings.weight = torch.nn.Parameter(embeddings.weight[:max_queries].detach().clone())
    embeddings.num_embeddings = max_queries
    model.config.num_queries = max_queries


def phrase_masks(input_ids: Any, special_tokens: Any) -> tuple[Any, Any]:
    """The text self-attention mask and position ids that Grounding DINO builds in its forward, as torch
    tensors (the reference the numpy version in shared/models/grounding_onnx.py is tested against)."""
    from transformers.models.grounding_dino import modeling_grounding_dino

    return modeling_grounding_dino.generate_masks_with_special_tokens_and_transfer_map(input_ids, special_tokens)


def _traced(module: Any, example: tuple, path: Path, inputs: list[str], outputs: list[str], int8: bool) -> Path:
    """``module`` traced on ``example`` into a file beside ``path`` (the prompt's length left free), quantized if
    ``int8``: the graph that tools/models/onnx_graphs.py finishes as ``path``."""
    import torch

    traced = path.with_suffix(".traced")
    torch.onnx.export(
        module.eval(),
        example,
        str(traced),
        input_names=inputs,
        output_names=outputs,
        dynamic_axes={name: TOKEN_AXES.get(name, {1: "tokens"}) for name in inputs if name not in IMAGE_INPUTS},
        dynamo=False,  # the dynamo exporter fails on Swin's views and on cummax
        opset_version=17,
    )
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantized = path.with_suffix(".int8")
        quantize_dynamic(traced, quantized, weight_type=QuantType.QInt8)
        quantized.replace(traced)
    return traced


class _TracedInputs:
    """The mask, position ids and encoded text of the forward being traced, handed to the model in place of its
    own."""

    text_mask: Any = None
    position_ids: Any = None
    text_hidden: Any = None


@contextlib.contextmanager
def _exportable(model: Any) -> Iterator[None]:
    """The export-time changes (module docstring), undone afterwards."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    # Grounding DINO's module, or MM Grounding DINO's (LLMDet's too): the same functions, each module its own copy
    gd: Any = sys.modules[type(model.model).__module__]

    def given_masks(input_ids: Any, special_tokens: Any) -> tuple[Any, Any]:
        return _TracedInputs.text_mask, _TracedInputs.position_ids

    def reference_points(spatial_shapes_list: Any, valid_ratios: Any, device: Any) -> Any:
        points = []
        for level, (height, width) in enumerate(spatial_shapes_list):
            ref_y, ref_x = torch.meshgrid(
                torch.arange(height, dtype=torch.float32, device=device) + 0.5,
                torch.arange(width, dtype=torch.float32, device=device) + 0.5,
                indexing="ij",
            )
            ref_y = ref_y.reshape(-1)[None] / (valid_ratios[:, None, level, 1] * height)
            ref_x = ref_x.reshape(-1)[None] / (valid_ratios[:, None, level, 0] * width)
            points.append(torch.stack((ref_x, ref_y), -1))
        return torch.cat(points, 1)[:, :, None] * valid_ratios[:, None]

    class GivenText(torch.nn.Module):
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return BaseModelOutput(last_hidden_state=_TracedInputs.text_hidden)

    text_backbone = model.model.text_backbone
    model.model.text_backbone = GivenText()
    encoder, grounding_dino = type(model.model.encoder), type(model.model)
    attention: Any = gd.MultiScaleDeformableAttention
    saved = (
        gd.generate_masks_with_special_tokens_and_transfer_map,
        encoder.get_reference_points,
        grounding_dino.generate_encoder_output_proposals,
        attention.forward,
    )
    gd.generate_masks_with_special_tokens_and_transfer_map = given_masks
    encoder.get_reference_points = staticmethod(reference_points)
    grounding_dino.generate_encoder_output_proposals = encoder_output_proposals
    attention.forward = deformable_attention
    try:
        # Tracing warns at every size check it freezes: expected, as each export takes one image size.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            yield
    finally:
        model.model.text_backbone = text_backbone
        gd.generate_masks_with_special_tokens_and_transfer_map = saved[0]
        encoder.get_reference_points = staticmethod(saved[1])
        grounding_dino.generate_encoder_output_proposals = saved[2]
        attention.forward = saved[3]


def encoder_output_proposals(model: Any, enc_output: Any, padding_mask: Any, spatial_shapes_list: Any) -> tuple:
    """``GroundingDinoModel.generate_encoder_output_proposals`` with each centre, (cell + 0.5) / valid cells,
    looked up in a table that torch divides while exporting, so that every runtime keeps the same proposals."""
    import torch

    batch_size = enc_output.shape[0]
    proposals, start = [], 0
    for level, (height, width) in enumerate(spatial_shapes_list):
        padding = padding_mask[:, start : start + height * width].view(batch_size, height, width)
        start += height * width
        valid_height, valid_width = (~padding[:, :, 0]).sum(1), (~padding[:, 0, :]).sum(1)
        cells = max(height, width)
        # centres[valid, cell] = (cell + 0.5) / valid for every count of valid cells (0: inf, as torch divides it)
        centres = (torch.arange(cells, dtype=torch.float32) + 0.5)[None] / torch.arange(cells + 1)[:, None]
        x = centres[valid_width][:, None, :width].expand(-1, height, -1)
        y = centres[valid_height][:, :height, None].expand(-1, -1, width)
        size = torch.full_like(x, 0.05 * 2.0**level)
        proposals.append(torch.stack((x, y, size, size), -1).view(batch_size, -1, 4))
    output_proposals = torch.cat(proposals, 1)
    valid = ((output_proposals > 0.01) & (output_proposals < 0.99)).all(-1, keepdim=True)
    output_proposals = torch.log(output_proposals / (1 - output_proposals))  # inverse sigmoid
    output_proposals = output_proposals.masked_fill(padding_mask.unsqueeze(-1), float("inf"))
    output_proposals = output_proposals.masked_fill(~valid, float("inf"))
    object_query = enc_output.masked_fill(padding_mask.unsqueeze(-1), 0.0).masked_fill(~valid, 0.0)
    return model.enc_output_norm(model.enc_output(object_query)), output_proposals


def deformable_attention(
    attention: Any,
    value: Any,
    value_spatial_shapes: Any,
    value_spatial_shapes_list: Any,
    level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
    im2col_step: int,
) -> Any:
    """``MultiScaleDeformableAttention.forward`` (the pure-torch one) summing each level's weighted samples as it
    takes them, rather than stacking the four levels' samples (a copy of 0.3 GB at 800x1200) and summing once; and
    sampling each level point-major, (point, query), so that the sum over a query's 4 points adds 4 contiguous
    planes instead of reducing an innermost axis of 4, which OpenVINO did slowly (the same sums: its outputs are the
    same bits, and Detect 1.05-1.13x faster on it by size; no change on ONNX Runtime; measured side by side)."""
    import torch

    batch_size, _, heads, head_dim = value.shape
    queries = sampling_locations.shape[1]
    values = value.split([height * width for height, width in value_spatial_shapes_list], dim=1)
    # (batch x heads, level, point, query, xy) and (batch x heads, level, point, query)
    grids = (2 * sampling_locations - 1).permute(0, 2, 3, 4, 1, 5).flatten(0, 1)
    weights = attention_weights.permute(0, 2, 3, 4, 1).flatten(0, 1)
    output: Any = None
    for level, (height, width) in enumerate(value_spatial_shapes_list):
        level_value = values[level].flatten(2).transpose(1, 2).reshape(batch_size * heads, head_dim, height, width)
        samples = torch.nn.functional.grid_sample(
            level_value, grids[:, level], mode="bilinear", padding_mode="zeros", align_corners=False
        )
        weighted = (samples * weights[:, level, None]).sum(2)
        output = weighted if output is None else output + weighted
    return output.view(batch_size, heads * head_dim, queries).transpose(1, 2).contiguous()
