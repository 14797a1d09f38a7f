"""`annotate status`, `export` and `gallery` against a deployed stack, on moto: the stack's outputs say where the
state machine, the results and the tables are."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from PIL import Image
from typer.testing import CliRunner

from shared.contracts import AnnotationRequest, BatchInput, ImageRef, ImageResult, Status
from shared.settings import Settings
from shared.storage import objects as storage
from tools.aws.moto_internals import QueryResults, athena_backends
from tools.cli import app

REGION = "us-east-1"
STACK = "annotate"
BATCH = "b-" + "1" * 20
IMAGES = [ImageRef(image_id=f"{n:016x}", source_uri=f"s3://annotate-input/incoming/{n}.png") for n in range(3)]
PASS = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})
TEMPLATE = {
    "Resources": {
        "InputBucket": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "annotate-input"}},
        "ResultsBucket": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "annotate-results"}},
        "StateMachine": {
            "Type": "AWS::StepFunctions::StateMachine",
            "Properties": {"DefinitionString": PASS, "RoleArn": "arn:aws:iam::123456789012:role/sfn"},
        },
    },
    "Outputs": {
        "ResultsBucketName": {"Value": {"Ref": "ResultsBucket"}},
        "StateMachineArn": {"Value": {"Ref": "StateMachine"}},
        "AthenaWorkGroupName": {"Value": "annotate"},
        "GlueDatabaseName": {"Value": "annotate_annotate"},
    },
}


def annotate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def png(color: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buffer, format="PNG")
    return buffer.getvalue()


def result(image: ImageRef, failed: bool = False) -> ImageResult:
    return ImageResult(
        image_id=image.image_id,
        source_uri=image.source_uri,
        batch_id=BATCH,
        status=Status.FAILED if failed else Status.SUCCEEDED,
        error="detect: ImageRejected: file is empty" if failed else None,
        prompt="dog.",
        annotated_uri=None if failed else f"s3://annotate-results/pictures/{BATCH}/{image.image_id}.png",
        processed_at=datetime.now(UTC),
    )


@pytest.fixture
def stack() -> Iterator[Any]:
    """GIVEN a deployed stack with a batch of three images: one done, one failed, one still to come"""
    with mock_aws():
        storage.refresh_clients()
        cloudformation = boto3.client("cloudformation", region_name=REGION)
        cloudformation.create_stack(StackName=STACK, TemplateBody=json.dumps(TEMPLATE))
        s3 = boto3.client("s3", region_name=REGION)
        batch = BatchInput(
            batch_id=BATCH,
            request=AnnotationRequest(prompt="dog."),
            results_uri="s3://annotate-results",
            planned_at=datetime.now(UTC),
            images=len(IMAGES),
            groups=1,
            group_concurrency=40,
        )
        s3.put_object(Bucket="annotate-results", Key=f"manifests/{BATCH}.json", Body=batch.model_dump_json())
        for image, failed in ((IMAGES[0], False), (IMAGES[1], True)):
            key = f"results/{BATCH}/{image.image_id}"
            s3.put_object(Bucket="annotate-results", Key=f"{key}.json", Body=result(image, failed).model_dump_json())
        s3.put_object(Bucket="annotate-results", Key=f"pictures/{BATCH}/{IMAGES[0].image_id}.png", Body=png("red"))
        s3.put_object(Bucket="annotate-input", Key="incoming/0.png", Body=png("blue"))
        outputs = {
            o["OutputKey"]: o["OutputValue"]
            for o in cloudformation.describe_stacks(StackName=STACK)["Stacks"][0]["Outputs"]
        }
        sfn = boto3.client("stepfunctions", region_name=REGION)
        sfn.start_execution(stateMachineArn=outputs["StateMachineArn"], name=f"{BATCH}-0123456789abcdef", input="{}")
        yield s3
    storage.refresh_clients()


def test_status_of_the_last_execution_reads_its_state_and_the_batchs_results(stack: Any) -> None:
    code, output = annotate("status", "--last", "--stack", STACK)

    # moto leaves a started execution RUNNING: one image is still to come
    assert code == 1, output
    assert f"batch {BATCH}: RUNNING ({BATCH}-0123456789abcdef)" in output
    assert "3 images, 1 done, 1 failed, 1 still running; results in s3://annotate-results/results/" in output
    assert "failed s3://annotate-input/incoming/1.png: detect: ImageRejected: file is empty" in output


def test_status_of_a_batch_that_no_execution_ran_says_so(stack: Any) -> None:
    code, output = annotate("status", "b-" + "2" * 20, "--stack", STACK)
    assert code == 2 and "no batch b-2222" in output


def queue_athena_results(*tables: tuple[list[dict[str, str]], list[list[str | None]]]) -> None:
    """moto's Athena answers queries in order from this queue: (columns, rows) each."""
    backend = athena_backends["123456789012"][REGION]
    for columns, rows in tables:
        header = {"Data": [{"VarCharValue": column["Name"]} for column in columns]}
        data = [{"Data": [{"VarCharValue": value} if value is not None else {} for value in row]} for row in rows]
        backend.query_results_queue.append(QueryResults([header, *data], columns))


def test_an_export_from_athena_reads_the_pictures_from_s3(stack: Any, tmp_path: Path) -> None:
    from shared.pipeline.batches import image_ref
    from shared.storage.objects import store_for

    boto3.client("athena", region_name=REGION).create_work_group(Name="annotate")
    # the picture as ingest named it: by its location and its ETag (the export checks the content is the same)
    image = image_ref(IMAGES[0].source_uri, store_for(IMAGES[0].source_uri).fingerprint(IMAGES[0].source_uri))
    queue_athena_results(
        (
            [
                {"Name": n, "Type": t}
                for n, t in (
                    ("image_id", "varchar"),
                    ("source_uri", "varchar"),
                    ("batch_id", "varchar"),
                    ("status", "varchar"),
                    ("width", "integer"),
                    ("height", "integer"),
                    ("caption", "varchar"),
                    ("annotated_uri", "varchar"),
                    ("error", "varchar"),
                    ("processed_at", "varchar"),
                    ("result_uri", "varchar"),
                    ("prompt", "varchar"),
                    ("content_sha256", "varchar"),
                )
            ],
            [
                [
                    image.image_id,
                    image.source_uri,
                    BATCH,
                    "succeeded",
                    "40",
                    "30",
                    "A dog.",
                    None,
                    None,
                    "2026-11-30 12:00:00.000",
                    None,
                    "dog.",
                    None,
                ]
            ],
        ),
        (
            [
                {"Name": n, "Type": t}
                for n, t in (
                    ("image_id", "varchar"),
                    ("batch_id", "varchar"),
                    ("detection_index", "integer"),
                    ("label", "varchar"),
                    ("score", "double"),
                    ("x0", "double"),
                    ("y0", "double"),
                    ("x1", "double"),
                    ("y1", "double"),
                    ("class_label", "varchar"),
                    ("class_score", "double"),
                )
            ],
            [[image.image_id, BATCH, "0", "dog", "0.9", "4.0", "3.0", "24.0", "27.0", "beagle", "0.7"]],
        ),
        (
            [{"Name": n, "Type": "varchar"} for n in ("image_id", "batch_id", "detection_index", "name", "value")],
            [[image.image_id, BATCH, "0", "color", "brown"]],
        ),
    )

    code, output = annotate("export", "--format", "coco", "--out", str(tmp_path), "--stack", STACK)

    assert code == 0, output
    coco = json.loads((tmp_path / "annotations.json").read_text())
    [annotation] = coco["annotations"]
    assert annotation["bbox"] == [4.0, 3.0, 20.0, 24.0] and annotation["attributes"] == {
        "class": "beagle",
        "color": "brown",
    }
    assert (tmp_path / "images" / f"{image.image_id}.png").read_bytes() == png("blue")  # the source, from S3


def test_the_gallery_of_a_stack_shows_its_pictures_by_presigned_urls(stack: Any, tmp_path: Path) -> None:
    from tools.results.annotations import AnnotatedImage
    from tools.results.gallery import write_gallery

    picture = f"s3://annotate-results/pictures/{BATCH}/{IMAGES[0].image_id}.png"
    shown = AnnotatedImage(
        IMAGES[0].image_id, IMAGES[0].source_uri, BATCH, "succeeded", 40, 30, None, picture, None, ""
    )
    s3 = boto3.client("s3", region_name=REGION)

    def presign(uri: str) -> str:
        bucket, key = storage.split_s3(uri)
        return str(s3.generate_presigned_url("get_object", {"Bucket": bucket, "Key": key}, ExpiresIn=600))

    page = write_gallery([shown], tmp_path, storage.store_for, presign).read_text()

    assert "https://annotate-results.s3.amazonaws.com/pictures/" in page and "Expires=" in page
    assert not (tmp_path / "pictures").exists()  # nothing copied: the page links the bucket, for a while


def test_a_stack_of_another_template_is_named_as_such(stack: Any) -> None:
    other = {"Resources": {"Bucket": {"Type": "AWS::S3::Bucket"}}}
    boto3.client("cloudformation", region_name=REGION).create_stack(StackName="other", TemplateBody=json.dumps(other))

    code, output = annotate("status", "--last", "--stack", "other")

    assert code == 2 and "stack 'other' has no output ResultsBucketName, StateMachineArn" in output


def test_a_search_on_the_stack_ranks_in_athena_with_a_vector_of_the_rows_model(
    stack: Any, tiny_settings: Settings
) -> None:
    import numpy as np

    from shared.models.tagging import load_tagger

    boto3.client("athena", region_name=REGION).create_work_group(Name="annotate")
    tagger = load_tagger(tiny_settings.describe)
    # GIVEN the stack's rows, embedded by the tiny CLIP (32 values), and what Athena answers the ranking
    models = (("model", "varchar"), ("model_revision", "varchar"), ("images", "bigint"), ("length", "integer"))
    columns = [{"Name": n, "Type": t} for n, t in models]
    hits = [{"Name": n, "Type": t} for n, t in (("source_uri", "varchar"), ("score", "double"), ("labels", "varchar"))]
    rows = [["tiny:clip", tagger.revision, "2", "32"]]
    queue_athena_results((columns, rows), (hits, [[IMAGES[0].source_uri, "0.25", "cat"]]))
    # WHEN a phrase is searched on the stack
    code, output = annotate("search", "a cat", "--stack", STACK, "--profile", "tiny", "--format", "json")
    # THEN Athena's answer is printed, typed, and the query it ran holds the tiny CLIP's vector of the phrase
    assert code == 0, output
    assert json.loads(output) == [{"source_uri": IMAGES[0].source_uri, "score": 0.25, "labels": "cat"}]
    executions = athena_backends["123456789012"][REGION].executions.values()
    ranking = next(e.query for e in executions if "zip_with" in e.query)
    assert f"e.model = 'tiny:clip' AND e.model_revision = '{tagger.revision}'" in ranking and "LIMIT 10" in ranking
    written = np.array([float(v) for v in ranking.split("ARRAY[", 1)[1].split("]", 1)[0].split(",")], np.float32)
    assert np.array_equal(written, tagger.embed_texts(["a cat"])[0])
