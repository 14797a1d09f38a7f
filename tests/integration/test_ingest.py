"""The ingest function on moto: S3 events and prompt messages become executions, exactly once each."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pydantic import TypeAdapter

from functions.ingest.app import handler
from shared.contracts import BatchInput, ImageGroup, ImageRef
from shared.pipeline import ingest
from shared.settings import Settings, use_settings
from shared.storage import objects as storage
from tests.conftest import SAMPLES
from tools.local.runner import LocalContext, create_idempotency_table

REGION = "us-east-1"
S3_EVENT = json.loads((Path(__file__).parent.parent / "events" / "s3_object_created_eventbridge.json").read_text())
PASS_DEFINITION = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})


def sqs_event(*bodies: str, message_ids: list[str] | None = None) -> dict[str, Any]:
    ids = message_ids or [str(uuid.uuid4()) for _ in bodies]
    return {
        "Records": [
            {
                "messageId": message_id,
                "receiptHandle": "handle",
                "body": body,
                "attributes": {"ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": f"arn:aws:sqs:{REGION}:123456789012:annotate-prompts",
                "awsRegion": REGION,
            }
            for message_id, body in zip(ids, bodies, strict=True)
        ]
    }


@pytest.fixture
def aws(tiny_settings: Settings) -> Iterator[Any]:
    with mock_aws():
        storage.refresh_clients()
        ingest.refresh_clients()
        s3 = boto3.client("s3", region_name=REGION)
        for bucket in ("annotate-input", "annotate-results"):
            s3.create_bucket(Bucket=bucket)
        create_idempotency_table("annotate-idempotency", REGION)
        cat = (SAMPLES / "chelsea-the-cat.jpg").read_bytes()
        for key in ("incoming/cat.jpg", "incoming/pets/a.jpg", "incoming/pets/b.jpg", "other/c.jpg"):
            s3.put_object(Bucket="annotate-input", Key=key, Body=cat + key.encode())
        sfn = boto3.client("stepfunctions", region_name=REGION)
        arn = sfn.create_state_machine(
            name="annotate", definition=PASS_DEFINITION, roleArn="arn:aws:iam::123456789012:role/sfn"
        )["stateMachineArn"]
        use_settings(
            tiny_settings.model_copy(
                update={
                    "state_machine_arn": arn,
                    "results_uri": "s3://annotate-results",
                    "input_buckets": ["annotate-input"],
                    "idempotency_table": "annotate-idempotency",
                }
            )
        )
        yield sfn, arn
    storage.refresh_clients()
    ingest.refresh_clients()


def invoke(event: dict[str, Any]) -> dict[str, Any]:
    return handler(event, LocalContext(function_name="ingest", aws_request_id=str(uuid.uuid4())))


def executions(aws: Any) -> list[BatchInput]:
    sfn, arn = aws
    listed = sfn.list_executions(stateMachineArn=arn)["executions"]
    return [
        BatchInput.model_validate_json(sfn.describe_execution(executionArn=e["executionArn"])["input"]) for e in listed
    ]


def images_of(batch: BatchInput) -> list[ImageRef]:
    """The images of the batch's groups manifest, as the Distributed Map reads them."""
    body = boto3.client("s3", region_name=REGION).get_object(
        Bucket="annotate-results", Key=f"manifests/{batch.batch_id}.groups.0.json"
    )["Body"]
    return [image for group in TypeAdapter(list[ImageGroup]).validate_json(body.read()) for image in group.images]


def test_an_s3_object_created_event_starts_exactly_one_execution(aws: Any) -> None:
    response = invoke(sqs_event(json.dumps(S3_EVENT)))

    assert response == {"batchItemFailures": []}
    [batch] = executions(aws)
    assert [image.source_uri for image in images_of(batch)] == ["s3://annotate-input/incoming/cat.jpg"]
    assert batch.request.prompt == "dog. cat."
    assert batch.results_uri == "s3://annotate-results"
    stored = boto3.client("s3", region_name=REGION).get_object(
        Bucket="annotate-results", Key=f"manifests/{batch.batch_id}.json"
    )
    assert BatchInput.model_validate_json(stored["Body"].read()) == batch


def test_the_same_event_delivered_twice_starts_one_execution(aws: Any) -> None:
    body = json.dumps(S3_EVENT)
    invoke(sqs_event(body, message_ids=["m-1"]))
    invoke(sqs_event(body, message_ids=["m-2"]))  # EventBridge and SQS both deliver at least once
    assert len(executions(aws)) == 1


def s3_event(key: str) -> str:
    event = json.loads(json.dumps(S3_EVENT))
    event["detail"]["object"]["key"] = key
    event["detail"]["object"]["etag"] = f"etag-of-{key}"
    return json.dumps(event)


def test_s3_events_of_one_sqs_batch_are_grouped_into_one_execution(aws: Any) -> None:
    invoke(sqs_event(s3_event("incoming/pets/a.jpg"), s3_event("incoming/pets/b.jpg")))
    [batch] = executions(aws)
    assert len(images_of(batch)) == 2


def test_an_s3_event_delivered_again_in_another_sqs_batch_starts_nothing_new(aws: Any) -> None:
    # GIVEN an event already started with another in one SQS batch
    invoke(sqs_event(s3_event("incoming/pets/a.jpg"), s3_event("incoming/pets/b.jpg")))
    # WHEN it comes again, in a batch with a new event
    response = invoke(sqs_event(s3_event("incoming/pets/a.jpg"), s3_event("incoming/cat.jpg")))
    # THEN only the new event is started
    assert response == {"batchItemFailures": []}
    started = sorted(image.source_uri for batch in executions(aws) for image in images_of(batch))
    assert started == [
        "s3://annotate-input/incoming/cat.jpg",
        "s3://annotate-input/incoming/pets/a.jpg",
        "s3://annotate-input/incoming/pets/b.jpg",
    ]
    # AND a batch of nothing but events started before starts nothing
    assert invoke(sqs_event(s3_event("incoming/cat.jpg"))) == {"batchItemFailures": []}
    assert len(executions(aws)) == 2


def claimed_by_another_pass(key: str, left_s: float, execution: str = "") -> None:
    """The event of ``key`` claimed by a pass with that much time left (past its deadline, when negative), which
    had named ``execution`` as the one it starts it in."""
    from shared.contracts import AnnotationRequest
    from shared.pipeline.claims import Pass
    from shared.pipeline.ingest import S3Object, claim_table, deployed_starter, event_identity
    from shared.settings import get_settings

    settings = get_settings().ingest
    identity = event_identity(
        S3Object(bucket="annotate-input", key=key, etag=f"etag-of-{key}"),
        AnnotationRequest(prompt=settings.ingest_prompt),
    )
    claims = claim_table(settings, deployed_starter(settings.state_machine_arn))
    first = Pass("another", time.time() + max(left_s, 30))
    assert claims.claim(identity, first) == "new"
    if execution:
        assert claims.intend({execution: [identity]}, first)
    if left_s < 0:  # its deadline passes
        boto3.client("dynamodb", region_name=REGION).update_item(
            TableName="annotate-idempotency",
            Key=claims.key(identity),
            UpdateExpression="SET #until = :past",
            ExpressionAttributeNames={"#until": "until"},
            ExpressionAttributeValues={":past": {"N": str(time.time() + left_s)}},
        )


@pytest.mark.parametrize(("left_s", "retried"), [(60, True), (-1, False)])
def test_an_event_another_invocation_is_starting_is_retried_unless_that_invocation_ran_out_of_time(
    aws: Any, left_s: float, retried: bool
) -> None:
    # GIVEN an invocation that claimed the event and has (or had) that much time left to start it
    claimed_by_another_pass("incoming/pets/a.jpg", left_s)
    # WHEN the event is delivered again to another invocation
    response = invoke(sqs_event(s3_event("incoming/pets/a.jpg"), message_ids=["again"]))
    # THEN it comes back to the queue while the first may still start it, and is started once the first is dead
    assert response == ({"batchItemFailures": [{"itemIdentifier": "again"}]} if retried else {"batchItemFailures": []})
    assert len(executions(aws)) == (0 if retried else 1)


def test_a_pass_that_died_after_starting_its_execution_is_not_started_again_whatever_comes_with_it(aws: Any) -> None:
    # GIVEN a pass that started an execution for an event, and died before marking its claim started
    invoke(sqs_event(s3_event("incoming/pets/b.jpg")))
    [started] = boto3.client("stepfunctions", region_name=REGION).list_executions(stateMachineArn=aws[1])["executions"]
    claimed_by_another_pass("incoming/pets/a.jpg", -1, execution=started["name"])
    # WHEN its event comes back, in another SQS batch than before
    response = invoke(sqs_event(s3_event("incoming/pets/a.jpg"), s3_event("incoming/cat.jpg")))
    # THEN it is taken as started: the other event alone starts a new execution
    assert response == {"batchItemFailures": []}
    started_images = sorted(image.source_uri for batch in executions(aws) for image in images_of(batch))
    assert started_images == ["s3://annotate-input/incoming/cat.jpg", "s3://annotate-input/incoming/pets/b.jpg"]
    # AND a pass that died before starting what it named leaves its event to be started
    claimed_by_another_pass("incoming/other.jpg", -1, execution="never-started")
    assert invoke(sqs_event(s3_event("incoming/other.jpg"))) == {"batchItemFailures": []}
    assert len(executions(aws)) == 3


def test_a_folder_marker_is_no_image_and_an_event_s_etag_spares_a_head(aws: Any) -> None:
    # GIVEN AWS's documented event of an object created, and the event of a console's "Create folder" (0 bytes)
    folder = json.loads(json.dumps(S3_EVENT))
    folder["detail"]["object"] |= {"key": "incoming/summer/", "size": 0, "etag": "d41d8cd98f00b204e9800998ecf8427e"}
    heads: list[str] = []
    boto3.client("s3", region_name=REGION)  # the store's own client is made on first use, after the hook
    storage.refresh_clients()
    client = storage._s3_store()._s3
    client.meta.events.register("before-call.s3.HeadObject", lambda **_: heads.append("HeadObject"))
    # WHEN both arrive
    response = invoke(sqs_event(json.dumps(S3_EVENT), json.dumps(folder), message_ids=["image", "folder"]))
    # THEN the image is started, named by its event's ETag (no HEAD asked), and the folder is acknowledged, not read
    assert response == {"batchItemFailures": []} and heads == []
    [batch] = executions(aws)
    [image] = images_of(batch)
    assert image.source_uri == "s3://annotate-input/incoming/cat.jpg"


def test_events_whose_execution_could_not_start_are_released_for_the_retry(aws: Any) -> None:
    from shared.settings import get_settings

    # GIVEN a workflow that cannot be started
    working = get_settings()
    use_settings(working.model_copy(update={"state_machine_arn": working.state_machine_arn + "-gone"}))
    ingest.refresh_clients()
    body = s3_event("incoming/pets/a.jpg")
    # WHEN its event comes, THEN it is returned to the queue
    assert invoke(sqs_event(body, message_ids=["m-1"])) == {"batchItemFailures": [{"itemIdentifier": "m-1"}]}
    # AND WHEN the retry finds the workflow back, THEN it starts it: the failed attempt's claim was released
    use_settings(working)
    assert invoke(sqs_event(body, message_ids=["m-1"])) == {"batchItemFailures": []}
    assert len(executions(aws)) == 1


def test_a_prompt_message_with_a_prefix_expands_to_the_images_under_it(aws: Any) -> None:
    message = {
        "prompt": "hamster.",
        "images": ["s3://annotate-input/incoming/pets/", "s3://annotate-input/other/c.jpg"],
    }
    assert invoke(sqs_event(json.dumps(message))) == {"batchItemFailures": []}
    [batch] = executions(aws)
    assert sorted(image.source_uri for image in images_of(batch)) == [
        "s3://annotate-input/incoming/pets/a.jpg",
        "s3://annotate-input/incoming/pets/b.jpg",
        "s3://annotate-input/other/c.jpg",
    ]
    assert batch.request.phrases == ["hamster"]


def test_a_redelivered_prompt_message_starts_nothing_new(aws: Any) -> None:
    body = json.dumps({"prompt": "cat.", "images": ["s3://annotate-input/other/c.jpg"]})
    invoke(sqs_event(body, message_ids=["same-message"]))
    invoke(sqs_event(body, message_ids=["same-message"]))
    assert len(executions(aws)) == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json at all", "not JSON"),
        (json.dumps({"prompt": "cat."}), "images: Field required"),
        (json.dumps({"prompt": " . ", "images": ["s3://annotate-input/other/c.jpg"]}), "names nothing to detect"),
        (json.dumps({"prompt": "cat.", "images": ["s3://annotate-input/nothing-here/"]}), "hold no images"),
        # AWS mode: nothing but s3:// locations in the stack's input bucket, refused before anything is read.
        (json.dumps({"prompt": "cat.", "images": ["/etc/passwd"]}), "is not an s3:// location"),
        (json.dumps({"prompt": "cat.", "images": ["../x"]}), "is not an s3:// location"),
        (json.dumps({"prompt": "cat.", "images": ["/var/task/"]}), "is not an s3:// location"),
        (json.dumps({"prompt": "cat.", "images": ["file:///x"]}), "is not an s3:// location"),
        (json.dumps({"prompt": "cat.", "images": ["http://x/y.jpg"]}), "is not an s3:// location"),
        (json.dumps({"prompt": "cat.", "images": ["s3://someone-elses-bucket/a.jpg"]}), "not in an input bucket"),
        (
            json.dumps({"prompt": "cat.", "images": ["s3://annotate-input/other/c.jpg", "/etc/passwd"]}),
            "is not an s3:// location",
        ),
    ],
)
def test_a_malformed_message_fails_alone_with_its_reason(
    aws: Any, body: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = json.dumps({"prompt": "cat.", "images": ["s3://annotate-input/other/c.jpg"]})
    response = invoke(sqs_event(good, body, json.dumps(S3_EVENT), message_ids=["good", "bad", "s3"]))

    assert response == {"batchItemFailures": [{"itemIdentifier": "bad"}]}
    assert len(executions(aws)) == 2  # the good message and the S3 event went on
    rejected = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"message rejected"' in line]
    assert [(r["message_id"], reason in r["reason"]) for r in rejected] == [("bad", True)]


def test_a_message_asking_for_variants_is_refused_by_a_stack_without_them(aws: Any) -> None:
    from shared.settings import get_settings

    use_settings(get_settings().model_copy(update={"variants_enabled": False}))
    plain = {"prompt": "cat.", "images": ["s3://annotate-input/other/c.jpg"]}
    asks_variants = plain | {"variants": {"prompt": "a painting", "count": 1}}

    response = invoke(sqs_event(json.dumps(plain), json.dumps(asks_variants), message_ids=["plain", "variants"]))

    assert response == {"batchItemFailures": [{"itemIdentifier": "variants"}]}
    [started] = executions(aws)
    assert started.request.variants is None


def test_planning_an_s3_prefix_takes_the_etags_from_the_listing_not_a_head_per_object() -> None:
    from collections import Counter

    from shared.contracts import PromptMessage
    from shared.pipeline.batches import image_ref, plan_batches

    with mock_aws():
        # GIVEN 2,500 objects under a prefix (three listing pages) and one object named on its own
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket="annotate-input")
        for index in range(2_500):
            s3.put_object(Bucket="annotate-input", Key=f"big/{index:05d}.jpg", Body=str(index).encode())
        s3.put_object(Bucket="annotate-input", Key="single.jpg", Body=b"one")
        first = "s3://annotate-input/big/00000.jpg"
        expected_id = image_ref(first, s3.head_object(Bucket="annotate-input", Key="big/00000.jpg")["ETag"].strip('"'))
        requests: Counter[str] = Counter()
        s3.meta.events.register("before-call.s3.*", lambda model, **_: requests.update([model.name]))
        store = storage.S3Store(s3)
        message = PromptMessage(prompt="dog.", images=["s3://annotate-input/big/", "s3://annotate-input/single.jpg"])

        # WHEN ingest plans the message
        settings = Settings(results_uri="s3://annotate-results").ingest
        batches = plan_batches(message, settings, lambda uri: store)

    # THEN three listing pages and one HEAD (for the named object) were all it took
    assert requests == Counter({"ListObjectsV2": 3, "HeadObject": 1})
    assert sum(batch.input.images for batch in batches) == 2_501
    # AND an image's id is the one its HEAD's ETag gives
    assert expected_id in [image for batch in batches for group in batch.groups for image in group.images]
