"""Caption: one or two sentences by a small LLM (llama.cpp), grounded in what the vision steps found."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared.contracts import ImageState
from shared.observability import logger, metrics
from shared.pipeline import steps
from shared.pipeline.dependencies import Step, dependencies_of
from shared.pipeline.warmup import prepare_function

prepare_function(Step.CAPTION)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@event_parser(model=ImageState)
def handler(event: ImageState, context: LambdaContext) -> dict[str, Any]:
    return steps.caption(event, dependencies_of(Step.CAPTION)).model_dump(mode="json")
