"""Segment: a mask for each of an image's boxes (EdgeTAM), where the request asks for masks: one image encoding,
the boxes decoded in one batch."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared.contracts import DescribeInput
from shared.observability import logger
from shared.pipeline import steps
from shared.pipeline.dependencies import Step, dependencies_of
from shared.pipeline.warmup import prepare_function

prepare_function(Step.SEGMENT)


@logger.inject_lambda_context(clear_state=True)
@event_parser(model=DescribeInput)
def handler(event: DescribeInput, context: LambdaContext) -> dict[str, Any]:
    return steps.segment(event, dependencies_of(Step.SEGMENT)).model_dump(mode="json")
