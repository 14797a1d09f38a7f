"""Caption: one or two sentences by a small LLM (llama.cpp), grounded in what the vision steps found."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared import steps
from shared.contracts import WriteResultInput
from shared.observability import logger, metrics
from shared.settings import get_settings
from shared.warmup import prepare_function

prepare_function("caption")


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@event_parser(model=WriteResultInput)
def handler(event: WriteResultInput, context: LambdaContext) -> dict[str, Any]:
    return steps.caption(event, get_settings()).model_dump(mode="json")
