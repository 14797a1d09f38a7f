"""Detect: find the request's phrases in one image with Grounding DINO."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from shared.contracts import ImageTask
from shared.observability import logger
from shared.pipeline import steps
from shared.pipeline.dependencies import Step, dependencies_of
from shared.pipeline.warmup import prepare_function

prepare_function(Step.DETECT)


@logger.inject_lambda_context(clear_state=True)
@event_parser(model=ImageTask)
def handler(event: ImageTask, context: LambdaContext) -> dict[str, Any]:
    return steps.detect(event, dependencies_of(Step.DETECT)).model_dump(mode="json")
