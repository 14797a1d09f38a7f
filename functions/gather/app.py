"""Gather: once a minute (the stack's MaxWaitMinutes above 0), start the dropped images whose wait is up."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared.observability import logger, metrics
from shared.pipeline.gathering import deployed_gatherer, gather_drops
from shared.pipeline.ingest import deployed_starter, lambda_pass
from shared.settings import get_settings
from shared.storage.objects import store_for


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    scheduled = parse(event=event, model=EventBridgeModel)
    settings = get_settings().ingest
    queue, clock = deployed_gatherer(settings.drops_queue_url, settings.idempotency_table)
    report = gather_drops(
        queue,
        clock,
        settings,
        deployed_starter(settings.state_machine_arn),
        store_for,
        now=scheduled.time,
        allowed_buckets=settings.input_buckets,
        holder=lambda_pass(context),
    )
    return report.model_dump()
