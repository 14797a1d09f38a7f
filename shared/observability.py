"""The one structured logger (Powertools) and metrics every module and function uses."""

from __future__ import annotations

import logging
import sys

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted (the CLI and tests replace it)."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _: object) -> None:
        pass


# stderr: in Lambda it reaches CloudWatch like stdout; on a terminal it stays out of the command's output.
logger = Logger(service="annotate", logger_handler=_CurrentStderr())
# Its records are complete as they are; a root handler that a library installs must not print them twice.
logging.getLogger(logger.name).propagate = False
metrics = Metrics(namespace="Annotate", service="annotate")

__all__ = ["MetricUnit", "logger", "metrics"]
