"""`annotate models`: the model files a deployed stack reads, built, exported and pushed."""

from __future__ import annotations

from typing import Annotated

import typer

from shared.settings import Profile, use_settings
from tools.cli.common import fail, out, quiet_logs

models = typer.Typer(help="Model files for the deployed stack")


@models.command("push")
def models_push(
    stack: Annotated[str, typer.Option(help="The deployed stack's name (sam deploy's stack_name)")],
    profile: Annotated[Profile, typer.Option(help="Which models to push")] = Profile.DEFAULT,
) -> None:
    """Upload the profile's models (from the Hugging Face cache, local folders or packages) to the stack.

    Where each goes is the stack's own outputs (DetectorModelUri, ...), so the stack's model parameters decide.
    The region is boto3's (AWS_REGION, or the profile's).
    """
    from shared.errors import ModelUnavailable, RequestRejected
    from tools.models.push import push_models, stack_model_uris

    quiet_logs(False)
    try:
        pushed = push_models(use_settings(profile=profile), stack_model_uris(stack))
    except (ModelUnavailable, RequestRejected) as error:
        raise fail(str(error)) from None
    for model in pushed:
        line = f"{model.output}: {model.source} -> {model.uri} ({model.files} files, {model.bytes / 1e6:.1f} MB)"
        out.print(line, soft_wrap=True, highlight=False)


@models.command("export")
def models_export(
    profile: Annotated[Profile, typer.Option(help="Whose models to export")] = Profile.DEFAULT,
    short_side: Annotated[int, typer.Option(help="The detection short side the detector is exported for")] = 800,
    masks: Annotated[bool, typer.Option(help="The segmenter too (EdgeTAM: what Segment runs)")] = True,
) -> None:
    """Export the profile's Grounding DINO (once per image size, see detector_aspect_ratios), ConvNeXt, CLIP and
    EdgeTAM to ONNX, into the model cache: what Detect, Classify, Tag and Segment run. `annotate models push`
    uploads them."""
    from shared.errors import ModelUnavailable
    from tools.models.tiny_models import build_named_models

    quiet_logs(False)
    settings = use_settings(profile=profile, detection_short_side=short_side)
    try:
        build_named_models(settings, masks=masks)
    except ModelUnavailable as error:
        raise fail(str(error)) from None
    sizes = ", ".join(f"{height}x{width}" for height, width in settings.detection.export_sizes())
    out.print(
        f"exported into {settings.model_cache_dir / 'onnx'}: {settings.detector_model} at {sizes}; "
        f"{settings.classifier_model}; {', '.join(settings.tagger_models or [])}"
        + (f"; {settings.segment_model}" if masks else ""),
        soft_wrap=True,
        highlight=False,
    )


@models.command("build")
def models_build(
    profile: Annotated[Profile, typer.Option(help="Whose tiny: and random: models to build")] = Profile.TINY,
    variants: Annotated[bool, typer.Option(help="The diffusion model too (0.85 GB at full size)")] = False,
    masks: Annotated[bool, typer.Option(help="The segmenter too")] = True,
) -> None:
    """Build the profile's random-weight models (tiny:, random:) into the model cache, offline."""
    from tools.models.tiny_models import build_named_models

    quiet_logs(False)
    settings = use_settings(profile=profile)
    build_named_models(settings, variants=variants, masks=masks)
    out.print(f"built into {settings.model_cache_dir / 'tiny'}", highlight=False)
