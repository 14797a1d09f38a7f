"""WriteGroupTable: gather a group's results into its files of the Parquet tables `images` and `detections`."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared.contracts import WriteGroupTableInput
from shared.observability import logger
from shared.pipeline import steps
from shared.pipeline.dependencies import Step, dependencies_of


@logger.inject_lambda_context(clear_state=True)
@event_parser(model=WriteGroupTableInput)
def handler(event: WriteGroupTableInput, context: LambdaContext) -> dict[str, Any]:
    return steps.write_group_table(event, dependencies_of(Step.WRITE_GROUP_TABLE)).model_dump(mode="json")
