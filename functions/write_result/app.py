"""WriteResult: write one image's result document and annotated picture, or its failure record."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared.contracts import ImageState
from shared.observability import logger
from shared.pipeline import steps
from shared.pipeline.dependencies import Step, dependencies_of


@logger.inject_lambda_context(clear_state=True)
@event_parser(model=ImageState)
def handler(event: ImageState, context: LambdaContext) -> dict[str, Any]:
    return steps.write_result(event, dependencies_of(Step.WRITE_RESULT)).model_dump(mode="json")
