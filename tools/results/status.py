"""What became of what was sent: per batch, its execution's state and how many images are done, failed (with
reasons) and still to come, read from where the results are written (result documents beside the manifest),
and the executions' states from the local runs' records or from Step Functions."""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from shared.contracts import BatchInput, ImageResult, Status
from shared.errors import ImageRejected, RequestRejected
from shared.storage import layout
from shared.storage.objects import StoreFor

RUNS_FOLDER = "runs"


class RunRecord(BaseModel):
    """One local execution, written when it starts and again when it ends (``DATA_DIR/runs/<name>.json``)."""

    execution_name: str
    batch_id: str
    delivery: str = Field(description="What started it: the message file, or the command line")
    images: int
    started_at: datetime
    status: str = "RUNNING"
    ended_at: datetime | None = None
    error: str | None = None
    pid: int | None = Field(None, description="The process running it: one that is gone ended it unrecorded")


def record_run(data_dir: Path, record: RunRecord) -> None:
    folder = data_dir / RUNS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{record.execution_name}.json").write_text(record.model_dump_json(indent=2))


def local_runs(data_dir: Path) -> list[RunRecord]:
    """The local runs' records, oldest first."""
    records = [RunRecord.model_validate_json(p.read_text()) for p in (data_dir / RUNS_FOLDER).glob("*.json")]
    return sorted(records, key=lambda record: record.started_at)


def last_local_batches(data_dir: Path) -> list[str]:
    """The batches of the newest delivery (a message may start several).

    Raises:
        RequestRejected: nothing has run here yet.
    """
    records = local_runs(data_dir)
    if not records:
        raise RequestRejected(f"nothing has run with --data-dir {data_dir} yet")
    last = records[-1].delivery
    return list(dict.fromkeys(record.batch_id for record in records if record.delivery == last))


class Failure(BaseModel):
    source_uri: str
    reason: str


class BatchStatus(BaseModel):
    batch_id: str
    execution: str | None = Field(description="The newest execution of the batch, by name")
    state: str = Field(description="RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ABORTED, or NOT_STARTED")
    images: int
    done: int
    failed: int
    failures: list[Failure]
    results: str = Field(description="Where the batch's result documents are")
    lane: str = "lambda"
    lane_reason: str = Field("", description="Why that lane (the rule that chose it)")

    @property
    def still_running(self) -> int:
        """Images without a result yet, while the execution runs (after it, they are missing)."""
        return self.images - self.done - self.failed if self.state == "RUNNING" else 0

    @property
    def missing(self) -> int:
        """Images without a result document once the execution is over: not done, whatever the execution says."""
        return 0 if self.state == "RUNNING" else self.images - self.done - self.failed

    @property
    def all_done(self) -> bool:
        return self.state == "SUCCEEDED" and not self.failed and not self.missing


def batch_status(
    batch_id: str, results_root: str, store_for: StoreFor, execution: tuple[str, str] | None
) -> BatchStatus:
    """The batch's progress from its manifest and its result documents; ``execution`` is (name, state).

    Raises:
        RequestRejected: no batch of that id was ever planned under ``results_root``.
    """
    input_uri = layout.batch_input(results_root, batch_id)
    try:
        batch = BatchInput.model_validate_json(store_for(input_uri).read_bytes(input_uri))
    except ImageRejected as error:
        raise RequestRejected(f"no batch {batch_id} under {results_root} (no {input_uri})") from error
    folder = layout.batch_results(results_root, batch_id)
    results = [_result(store_for, uri) for uri in store_for(folder).list_uris(folder) if layout.is_result_document(uri)]
    failures = [
        Failure(source_uri=result.source_uri, reason=result.error or "failed")
        for result in results
        if result.status is Status.FAILED
    ]
    name, state = execution or (None, "NOT_STARTED")
    return BatchStatus(
        batch_id=batch_id,
        execution=name,
        state=state,
        images=batch.images,
        done=len(results) - len(failures),
        failed=len(failures),
        failures=sorted(failures, key=lambda failure: failure.source_uri),
        results=folder,
        lane=batch.lane,
        lane_reason=batch.lane_reason,
    )


def _result(store_for: StoreFor, uri: str) -> ImageResult:
    return ImageResult.model_validate_json(store_for(uri).read_bytes(uri))


def local_execution(data_dir: Path, batch_id: str) -> tuple[str, str] | None:
    """The batch's newest local run: (name, state); a RUNNING run whose process is gone (killed) is ABORTED."""
    records = [record for record in local_runs(data_dir) if record.batch_id == batch_id]
    if not records:
        return None
    last = records[-1]
    if last.status == "RUNNING" and last.pid is not None and not _alive(last.pid):
        return last.execution_name, "ABORTED"
    return last.execution_name, last.status


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def step_functions_executions(sfn: Any, state_machine_arn: str) -> list[dict[str, Any]]:
    """The state machine's executions, newest first (Step Functions keeps 90 days of them)."""
    pages = sfn.get_paginator("list_executions").paginate(stateMachineArn=state_machine_arn)
    executions = [execution for page in pages for execution in page["executions"]]
    return sorted(executions, key=lambda execution: execution["startDate"], reverse=True)


def deployed_execution(executions: Iterable[dict[str, Any]], batch_id: str) -> tuple[str, str] | None:
    """The newest execution of the batch: execution names are ``<batch_id>-<delivery hash>``."""
    for execution in executions:
        if execution["name"].startswith(f"{batch_id}-"):
            return execution["name"], execution["status"]
    return None


def batch_of_execution(name: str) -> str:
    return name.rsplit("-", 1)[0]


def now() -> datetime:
    return datetime.now(UTC)
