"""Ingest's X-Ray tracer: a module of its own, since only Ingest traces its calls and importing the X-Ray SDK
took 0.18 s of every model function's cold start."""

from __future__ import annotations

from aws_lambda_powertools import Tracer

tracer = Tracer(service="annotate")  # X-Ray in Lambda; Powertools turns it off elsewhere
