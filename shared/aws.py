"""The AWS clients every function makes, configured once: their retries and their connection pools."""

from __future__ import annotations

import functools
from typing import Any

# AWS calls one function makes at once (the claims of a gathering of 10,000 events, a batch's summaries): botocore's
# pool holds 10 connections by default ("max_pool_connections ... If this value is not set, the default value of 10 is
# used", botocore's Config), and a call past it waits for one and logs "Connection pool is full"
PARALLEL_CALLS = 16

# Throttles and the like, as each service names them: what botocore's own retries gave up on. Surfaced as such to
# the caller, who reads them as "later" (a claim still in flight, a TransientError the workflow retries).
THROTTLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "LimitExceededException",
        "SlowDown",
        "ServiceUnavailable",
        "InternalFailure",
        "InternalServerError",
    }
)


def is_throttle(error: Exception) -> bool:
    """Whether ``error`` is a service saying "not now" (a throttle or a 5xx) past botocore's retries."""
    from botocore.exceptions import ClientError

    if not isinstance(error, ClientError):
        return False
    code = error.response.get("Error", {}).get("Code", "")
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return code in THROTTLE_CODES or status >= 500


@functools.cache
def client(service: str) -> Any:
    """One client per service and process. The region is boto3's own resolution (Lambda sets AWS_REGION to the
    function's). botocore's "standard" retry mode retries throttles and transient errors with exponential backoff
    and jitter, up to ``max_attempts`` ("Retries", AWS SDKs and Tools reference guide)."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=PARALLEL_CALLS + 4)
    return boto3.client(service, config=config)


def refresh_clients() -> None:
    """New clients on next use (a test's or the rehearsal's fresh moto, or a new region)."""
    client.cache_clear()
