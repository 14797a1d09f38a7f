"""WriteResult: write one image's result document and annotated picture, or its failure record."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared import steps
from shared.contracts import WriteResultInput
from shared.observability import logger
from shared.settings import get_settings


@logger.inject_lambda_context(clear_state=True)
@event_parser(model=WriteResultInput)
def handler(event: WriteResultInput, context: LambdaContext) -> dict[str, Any]:
    return steps.write_result(event, get_settings()).model_dump(mode="json")
