"""The one structured logger (Powertools) and metrics every module and function uses."""

from __future__ import annotations

import logging
import sys

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

# stderr: in Lambda it reaches CloudWatch like stdout; on a terminal it stays out of the command's output.
logger = Logger(service="annotate", logger_handler=logging.StreamHandler(sys.stderr))
# Its records are complete as they are; a root handler that a library installs must not print them twice.
logging.getLogger(logger.name).propagate = False
metrics = Metrics(namespace="Annotate", service="annotate")

__all__ = ["MetricUnit", "logger", "metrics"]
