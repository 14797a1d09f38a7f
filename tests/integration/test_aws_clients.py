"""The clients every function makes (shared/aws.py) hold a connection for each of the calls a function makes at once:
sixteen calls side by side, against a service that answers none until all sixteen are in, reuse their connections
instead of discarding six (botocore's default pool holds ten). A stand-in service on 127.0.0.1, stopped at the end."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from shared.aws import PARALLEL_CALLS, client, refresh_clients

POOL_FULL = "Connection pool is full"


@contextmanager
def dynamodb_answering_all_at_once(calls: int) -> Iterator[str]:
    """DynamoDB's ListTables, answered once ``calls`` requests are in at the same time (or 10 s have passed)."""
    everyone_in = threading.Barrier(calls, timeout=10)

    class DynamoDb(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as DynamoDB's endpoint: connections are reused

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with suppress(threading.BrokenBarrierError):
                everyone_in.wait()
            body = json.dumps({"TableNames": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-amz-json-1.0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), DynamoDb)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=30)


def _discarded_connections(make_client: Callable[[], Any], caplog: pytest.LogCaptureFixture) -> int:
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        caplog.clear()
        dynamodb = make_client()
        with ThreadPoolExecutor(PARALLEL_CALLS) as pool:
            answers = list(pool.map(lambda _: dynamodb.list_tables(), range(PARALLEL_CALLS)))
        assert all(answer["TableNames"] == [] for answer in answers)
        return sum(POOL_FULL in record.getMessage() for record in caplog.records)


def test_sixteen_calls_at_once_keep_their_connections_where_botocore_s_default_pool_discards_some(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a DynamoDB that answers only once PARALLEL_CALLS requests are in at the same time
    with dynamodb_answering_all_at_once(PARALLEL_CALLS) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        refresh_clients()
        try:
            # WHEN PARALLEL_CALLS calls are made side by side, through the functions' client and through a client
            # of botocore's defaults
            import boto3

            ours = _discarded_connections(lambda: client("dynamodb"), caplog)
            defaults = _discarded_connections(lambda: boto3.client("dynamodb"), caplog)
        finally:
            refresh_clients()
    # THEN the functions' client kept every connection; the default pool of 10 discarded the calls past it
    assert (ours, defaults) == (0, PARALLEL_CALLS - 10)
