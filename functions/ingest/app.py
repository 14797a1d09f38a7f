"""Ingest: SQS batches of prompt messages and S3 object-created events become workflow executions."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from shared.observability import logger, metrics
from shared.pipeline.ingest import deployed_starter, ingest_sqs_batch, lambda_pass
from shared.pipeline.tracing import tracer
from shared.settings import get_settings
from shared.storage.objects import store_for


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = get_settings().ingest
    starter = deployed_starter(settings.state_machine_arn)
    return ingest_sqs_batch(
        event,
        settings,
        starter,
        store_for,
        allowed_buckets=settings.input_buckets,
        holder=lambda_pass(context),
    )
