"""SummarizeBatch: failure rows for the groups that did not finish, and the batch's summary."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared.contracts import SummarizeInput
from shared.observability import logger
from shared.pipeline.batch_steps import summarize_batch
from shared.pipeline.dependencies import Step, dependencies_of


@logger.inject_lambda_context(clear_state=True)
@event_parser(model=SummarizeInput)
def handler(event: SummarizeInput, context: LambdaContext) -> dict[str, Any]:
    return summarize_batch(event, dependencies_of(Step.SUMMARIZE_BATCH)).model_dump(mode="json")
