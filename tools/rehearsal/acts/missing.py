"""Objects that are not there: an image deleted after it was planned, a result document never written."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from tools.rehearsal.report import Report
from tools.rehearsal.stack import DeployedStack

if TYPE_CHECKING:
    from tools.rehearsal.services import InProcessServices


def missing_objects_read_as_missing(services: InProcessServices, stack: DeployedStack, report: Report) -> None:
    """An image deleted after it was planned, and a result document that was never written, are each told as missing
    (a failure that says so, a failure row), not as access denied: S3's 403 to a role that may not list the bucket
    is rehearsed (aws_behaviours)."""
    from shared.contracts import (
        AnnotationRequest,
        Box,
        DescribeInput,
        Detection,
        ImageOutcome,
        ImageRef,
        ImageTask,
        Status,
        WriteGroupTableInput,
    )

    started = time.monotonic()
    request = AnnotationRequest(prompt="cat.")
    results = f"s3://{stack.outputs['ResultsBucketName']}"
    image = ImageRef(image_id="0" * 16, source_uri=f"s3://{stack.outputs['InputBucketName']}/incoming/deleted.jpg")
    task = ImageTask(batch_id="b-missing", request=request, image=image, results_uri=results)
    box = Detection(label="cat", score=0.9, box=Box(x0=0, y0=0, x1=10, y1=10))
    described = DescribeInput(task=task, detections=[box]).model_dump(mode="json")
    for function, payload in (
        ("DetectFunction", task.model_dump(mode="json")),
        ("ClassifyFunction", described),
        ("TagFunction", described),
    ):
        response, failed = services.invoked_by_state_machine(stack.functions[function].arn, None, payload)
        report.check(
            failed and "does not exist" in response.get("errorMessage", ""),
            f"{function} on a deleted image did not say it does not exist: {response.get('errorMessage', response)}",
        )
    outcome = ImageOutcome(image=image, status=Status.SUCCEEDED, result_uri=f"{results}/results/never-written.json")
    group = WriteGroupTableInput(
        batch_id="b-missing",
        group_id="g-000000",
        request=request,
        results_uri=results,
        planned_at=datetime.now(UTC),
        outcomes=[outcome],
    )
    table = stack.functions["WriteGroupTableFunction"].arn
    response, failed = services.invoked_by_state_machine(table, None, group.model_dump(mode="json"))
    report.check(
        not failed and response.get("failed") == 1,
        f"WriteGroupTable did not record a missing result document as a failure row: {response}",
    )
    report.step("a deleted image and an unwritten result document were each told as missing, not as denied", started)
