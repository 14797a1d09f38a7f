"""WriteTable: gather a batch's results into the Parquet tables `images` and `detections`."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared import steps
from shared.contracts import WriteTableInput
from shared.dependencies import Step, dependencies_of
from shared.observability import logger


@logger.inject_lambda_context(clear_state=True)
@event_parser(model=WriteTableInput)
def handler(event: WriteTableInput, context: LambdaContext) -> dict[str, Any]:
    return steps.write_table(event, dependencies_of(Step.WRITE_TABLE)).model_dump(mode="json")
