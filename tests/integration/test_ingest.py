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


def test_a_prompt_delivered_again_under_other_settings_is_started_as_it_was_planned_first(aws: Any) -> None:
    from shared.settings import get_settings

    # GIVEN a message whose pass wrote its batch's manifests and input, and died before the poller deleted it
    body = json.dumps({"prompt": "hamster.", "images": ["s3://annotate-input/incoming/pets/"]})
    invoke(sqs_event(body, message_ids=["m-1"]))
    [first] = executions(aws)
    groups = images_of(first)
    # WHEN the stack is deployed again with groups of one, and the message is delivered again
    working = get_settings()
    use_settings(working.model_copy(update={"images_per_group": 1}))
    assert invoke(sqs_event(body, message_ids=["m-1"])) == {"batchItemFailures": []}
    # THEN its execution is the one started (StartExecution of the same name and input), and the manifest the
    # execution's Map and SummarizeBatch read is the first's: written once ("If-None-Match", S3's conditional write)
    [again] = executions(aws)
    assert again == first and images_of(again) == groups
    manifest = boto3.client("s3", region_name=REGION).get_object(
        Bucket="annotate-results", Key=f"manifests/{first.batch_id}.groups.0.json"
    )
    assert len(TypeAdapter(list[ImageGroup]).validate_json(manifest["Body"].read())) == first.groups == 1


def test_a_pass_out_of_time_between_two_batches_starts_no_more_and_frees_only_the_unstarted_events(aws: Any) -> None:
    from shared.contracts import AnnotationRequest
    from shared.pipeline.claims import Pass
    from shared.pipeline.ingest import PASS_MARGIN_S, S3Object, claim_table, deployed_starter, event_identity
    from shared.settings import get_settings

    # GIVEN batches of at most one image, and a pass whose clock reaches its last 30 s once its first batch started
    use_settings(get_settings().model_copy(update={"max_images_per_batch": 1}))
    settings = get_settings().ingest
    now = [1_000.0]
    holder = Pass(id="late", deadline=1_000.0 + 2 * PASS_MARGIN_S, clock=lambda: now[0])
    starter = deployed_starter(settings.state_machine_arn)
    start = starter.start

    def slow_start(batch: BatchInput, name: str) -> str:
        started = start(batch, name)
        now[0] += PASS_MARGIN_S + 1  # StartExecution and its retries took 31 s
        return started

    starter.start = slow_start  # type: ignore[method-assign]
    keys = ["incoming/pets/a.jpg", "incoming/pets/b.jpg"]
    try:
        # WHEN it takes two events, one batch each
        response = ingest.ingest_sqs_batch(
            sqs_event(*(s3_event(key) for key in keys), message_ids=["a", "b"]),
            settings,
            starter,
            storage.store_for,
            settings.input_buckets,
            holder,
        )
    finally:
        starter.start = start  # type: ignore[method-assign]
    # THEN it started the first, and left the second for another pass: its record comes back, its claim released
    [batch] = executions(aws)
    started = images_of(batch)[0].source_uri.rsplit("/", 1)[-1]
    unstarted = {"a.jpg": "b", "b.jpg": "a"}[started]
    assert response == {"batchItemFailures": [{"itemIdentifier": unstarted}]}
    claims = claim_table(settings, starter)
    request = AnnotationRequest(prompt=settings.ingest_prompt)
    identities = {key: event_identity(S3Object("annotate-input", key, f"etag-of-{key}"), request) for key in keys}
    later = Pass(id="later", deadline=time.time() + 300)
    # AND the started event's claim is marked started; the other's is anyone's
    assert claims.claim(identities[f"incoming/pets/{started}"], later) == "started"
    assert claims.claim(identities[f"incoming/pets/{'b.jpg' if started == 'a.jpg' else 'a.jpg'}"], later) == "new"


def test_a_dead_pass_s_execution_is_asked_of_step_functions_once_and_a_throttle_leaves_its_events_in_flight(
    aws: Any,
) -> None:
    from botocore.exceptions import ClientError

    from shared.pipeline.claims import Pass
    from shared.pipeline.ingest import claim_table, deployed_starter
    from shared.settings import get_settings

    # GIVEN three events a dead pass claimed for one execution it named
    keys = ["incoming/pets/a.jpg", "incoming/pets/b.jpg", "incoming/cat.jpg"]
    for key in keys:
        claimed_by_another_pass(key, -1, execution="named-by-the-dead-pass")
    settings = get_settings().ingest
    asked: list[str] = []

    def throttled(name: str) -> bool:
        asked.append(name)
        error = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}
        raise ClientError(error, "DescribeExecution")  # type: ignore[arg-type]

    claims = claim_table(settings, deployed_starter(settings.state_machine_arn))
    claims.execution_exists = throttled
    from shared.contracts import AnnotationRequest
    from shared.pipeline.ingest import S3Object, event_identity

    request = AnnotationRequest(prompt=settings.ingest_prompt)
    identities = [event_identity(S3Object("annotate-input", key, f"etag-of-{key}"), request) for key in keys]
    # WHEN a pass meets them while Step Functions throttles DescribeExecution past botocore's retries
    found = claims.claim_all(identities, Pass(id="next", deadline=time.time() + 300))
    # THEN it asked once for the one execution (its throttle is the answer for this pass), and the events stay in
    # flight for a later pass: the pass itself goes on
    assert asked == ["named-by-the-dead-pass"]
    assert set(found.values()) == {"in flight"}


def test_an_expired_claim_is_no_claim_whether_dynamodb_s_ttl_deleted_it_yet_or_not(aws: Any) -> None:
    from shared.contracts import AnnotationRequest
    from shared.pipeline.claims import Pass
    from shared.pipeline.ingest import S3Object, claim_table, deployed_starter, event_identity
    from shared.settings import get_settings

    settings = get_settings().ingest
    claims = claim_table(settings, deployed_starter(settings.state_machine_arn))
    identity = event_identity(S3Object("annotate-input", "incoming/cat.jpg", "e"), AnnotationRequest(prompt="cat."))
    # GIVEN an event started long ago, its claim past its expiration but not yet deleted ("Items that have expired,
    # but haven't yet been deleted by TTL, still appear in reads", DynamoDB's TTL guide)
    first = Pass(id="first", deadline=time.time() + 300)
    assert claims.claim(identity, first) == "new"
    claims.started([identity], first)
    claims.clock = lambda: time.time() + settings.idempotency_expiry_s + 1
    # THEN it is claimed anew, as if TTL had deleted it
    assert claims.claim(identity, Pass(id="later", deadline=claims.clock() + 300)) == "new"


def test_claims_outlive_every_copy_of_an_event_the_stack_can_hold() -> None:
    from tools.aws.sam_template import load_template

    # A copy of an event waits at most the day EventBridge retries it, then the ingest queue's retention, then one
    # visibility timeout in flight: the claim must still be there, or the copy starts its image again
    resources = load_template()["Resources"]
    [target] = resources["InputObjectCreatedRule"]["Properties"]["Targets"]
    queue = resources["IngestQueue"]["Properties"]
    longest = (
        target["RetryPolicy"]["MaximumEventAgeInSeconds"] + queue["MessageRetentionPeriod"] + queue["VisibilityTimeout"]
    )
    assert Settings(results_uri="/r").idempotency_expiry_s > longest


@pytest.mark.parametrize(("size", "accepted"), [(300 * 1024, True), (1024 * 1024 + 1, False)])
def test_a_message_sqs_accepts_is_read_up_to_1_mb(aws: Any, size: int, accepted: bool) -> None:
    # SQS, EventBridge and Lambda's SQS source carry up to 1 MB since 2026-01-29 (AWS Compute Blog)
    body = json.dumps({"prompt": "cat.", "images": ["s3://annotate-input/other/c.jpg"]})
    body = body[:-1] + " " * (size - len(body)) + "}"  # JSON's whitespace: a message of that size, valid
    assert len(body.encode()) == size
    good = json.dumps({"prompt": "dog.", "images": ["s3://annotate-input/other/c.jpg"]})
    response = invoke(sqs_event(body, good, message_ids=["big", "good"]))
    assert response == ({"batchItemFailures": []} if accepted else {"batchItemFailures": [{"itemIdentifier": "big"}]})
