"""Secrets Manager values a function reads once per process: the API's key, the Label Studio key."""

from __future__ import annotations

import functools


@functools.cache
def secret_value(secret_id: str) -> str:
    import boto3

    return str(boto3.client("secretsmanager").get_secret_value(SecretId=secret_id)["SecretString"])
