"""BatchEnded: an execution that ended without its summary (timed out, failed, stopped), as EventBridge reports it,
gets SummarizeBatch's failure rows for its unfinished groups."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared.contracts import ExecutionStatusChange
from shared.observability import logger, metrics
from shared.pipeline.batch_steps import summarize_ended_execution
from shared.pipeline.dependencies import Step, dependencies_of


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@event_parser(model=ExecutionStatusChange)
def handler(event: ExecutionStatusChange, context: LambdaContext) -> dict[str, Any] | None:
    summary = summarize_ended_execution(event, dependencies_of(Step.BATCH_ENDED))
    return summary.model_dump(mode="json") if summary else None
