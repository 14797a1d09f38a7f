"""One image in one process gives the workflow's result: the same boxes, classes, attributes and captions for the
same images and request. Real tiny models; the workflow through the local runner, as `annotate run` runs it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shared.contracts import AnnotationRequest, ImageRef, ImageResult, ImageTask, VariantsRequest
from shared.pipeline.dependencies import dependencies_of
from shared.pipeline.one_image import annotate_image
from shared.settings import Settings, use_settings
from tests.conftest import SAMPLES
from tools.cli import app

pytestmark = pytest.mark.slow


def _compared(result: ImageResult) -> dict[str, object]:
    detections = [
        d.model_dump(include={"label", "score", "box", "class_label", "top_k", "attributes"}) for d in result.detections
    ]
    return {"status": result.status, "detections": detections, "caption": result.caption and result.caption.caption}


def test_each_image_in_one_process_is_annotated_as_the_workflow_annotates_it(
    tmp_path: Path, tiny_settings: Settings
) -> None:
    # GIVEN the samples and an empty file annotated through the workflow (captions on)
    images = tmp_path / "images"
    shutil.copytree(SAMPLES, images)
    (images / "empty.jpg").write_bytes(b"")
    workflow_dir = tmp_path / "workflow"
    result = CliRunner().invoke(
        app, ["run", str(images), "--prompt", "dog. cat.", "--profile", "tiny", "--data-dir", str(workflow_dir)]
    )
    assert result.exit_code == 1 and "3 succeeded, 1 failed" in result.output, result.output
    by_workflow = [
        ImageResult.model_validate_json(p.read_text()) for p in (workflow_dir / "results").glob("b-*/*.json")
    ]
    assert len(by_workflow) == 4

    # WHEN each image is annotated in one process with the same request, writing elsewhere
    settings = use_settings(tiny_settings.model_copy(update={"data_dir": tmp_path / "one"}))
    request = AnnotationRequest(prompt="dog. cat.")
    by_one = {
        done.source_uri: annotate_image(
            ImageTask(
                batch_id=done.batch_id,
                request=request,
                image=ImageRef(image_id=done.image_id, source_uri=done.source_uri),
                results_uri=settings.results_root,
            ),
            dependencies_of,
        )
        for done in by_workflow
    }

    # THEN every image has the workflow's boxes, classes, attributes, caption and status (the empty file's failure),
    # and its embedding: the same model's vector, to float32's precision
    for done in by_workflow:
        assert _compared(by_one[done.source_uri]) == _compared(done), done.source_uri
        one, workflow = by_one[done.source_uri].embedding, done.embedding
        assert (one is None) == (workflow is None) == (done.status == "failed"), done.source_uri
        if one is not None and workflow is not None:
            assert one.model == workflow.model and one.vector == pytest.approx(workflow.vector, abs=1e-6)
    assert any(done.detections for done in by_workflow) and any(done.caption for done in by_workflow)
    [failed] = [one for one in by_one.values() if one.status == "failed"]
    assert failed.failed_step == "detect" and failed.error.startswith("detect: ImageRejected")


def test_variants_are_not_made_in_one_process(tiny_settings: Settings) -> None:
    task = ImageTask(
        batch_id="b-0",
        request=AnnotationRequest(prompt="cat.", variants=VariantsRequest(prompt="a watercolor")),
        image=ImageRef(image_id="0" * 16, source_uri=str(SAMPLES / "coffee.webp")),
        results_uri="/unused",
    )
    with pytest.raises(ValueError, match="Fargate task"):
        annotate_image(task, dependencies_of)


def test_a_phone_photo_gets_the_same_boxes_decoded_once_with_a_jpeg_picture_as_decoded_per_step_with_a_png(
    tmp_path: Path, tiny_settings: Settings
) -> None:
    import numpy as np
    from PIL import Image

    from shared.contracts import DescribeInput, DescribeOutput, ImageState, PictureFormat
    from shared.pipeline import steps
    from shared.pipeline.dependencies import Step, build_dependencies
    from tools.bench.photo import phone_photo

    # GIVEN a phone's 12 MP portrait (EXIF orientation 6), and the tiny models
    photo = phone_photo(SAMPLES / "chelsea-the-cat.jpg", tmp_path)
    # (pictures stored, StorePictures=true, to compare the two encodings as written)
    settings = use_settings(tiny_settings.model_copy(update={"data_dir": tmp_path / "data", "store_pictures": True}))
    task = ImageTask(
        batch_id="b-" + "0" * 20,
        request=AnnotationRequest(prompt="dog. cat.", caption=False),
        image=ImageRef(image_id="0" * 16, source_uri=str(photo)),
        results_uri=settings.results_root,
    )
    # WHEN its steps run as the Lambda lane runs them, each decoding it again, with the PNG picture written before
    deps = {step: build_dependencies(step, settings) for step in (Step.DETECT, Step.CLASSIFY, Step.TAG)}
    detection = steps.detect(task, deps[Step.DETECT])
    described = DescribeInput(task=task, detections=detection.detections)
    description = DescribeOutput(
        classify=steps.classify(described, deps[Step.CLASSIFY]), tag=steps.tag(described, deps[Step.TAG])
    )
    as_png = build_dependencies(Step.WRITE_RESULT, settings.model_copy(update={"picture_format": PictureFormat.PNG}))
    per_step = steps.write_result_document(ImageState(task=task, detection=detection, description=description), as_png)
    # AND in one process, decoded once, with the JPEG picture written by default
    once = annotate_image(task, dependencies_of)

    # THEN the rows' boxes, classes and attributes are the same, on the photo shown upright
    assert per_step.detections and (per_step.width, per_step.height) == (3000, 4000)
    assert once.detections == per_step.detections
    # AND the pictures are the same drawing, the JPEG within a few levels of the PNG
    assert once.annotated_uri and per_step.annotated_uri and once.annotated_uri.endswith(".jpg")
    jpeg, png = (np.asarray(Image.open(uri), np.int16) for uri in (once.annotated_uri, per_step.annotated_uri))
    assert jpeg.shape == png.shape == (4000, 3000, 3) and np.abs(jpeg - png).mean() < 2.0
