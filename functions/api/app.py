"""Api: the synchronous API (shared/serving/api.py) behind a Function URL.

Mangum turns each Function URL event into an ASGI call to the same app `annotate serve` runs, so the routes,
bounds and error shapes are one code path (Powertools' event handler would mean a second set of routes).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from shared.observability import logger, metrics
from shared.pipeline.dependencies import DEFAULT_MODEL_STEPS
from shared.pipeline.warmup import prepare_function
from shared.serving.api import lambda_adapter

prepare_function(*DEFAULT_MODEL_STEPS)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics  # the steps' metrics of this call, as EMF
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return lambda_adapter()(event, context)  # type: ignore[no-any-return]
