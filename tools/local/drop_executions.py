"""The executions of the exactly-once checker's world (tools/local/drop_world.py): the groups each round of a batch
runs (as its Distributed Map read them when the round began), each round's end as SummarizeBatch's own code makes it
(groups written, or one job or group not; handed back, or ended), an execution that times out at its TimeoutSeconds
(its status change then delivered to BatchEnded's own code, as EventBridge would, retried until it is taken), and the
rows all of them wrote: one table file per group, and a batch's failure rows."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.storage import layout

RESULTS_BUCKET = "once-results"


class Broken(AssertionError):
    """An invariant broken: what, and after which step."""


@dataclass
class Run:
    """A running execution: its input in the round it runs, the groups that round's Map read, when it started."""

    batch: Any  # BatchInput
    groups: list[Any]  # ImageGroup
    started_at: float


@dataclass
class Executions:
    """The executions started in ``machine``, those running, and what every one of them wrote."""

    s3: Any
    sfn: Any
    machine: str
    clock: Callable[[], float]
    running: dict[str, Run] = field(default_factory=dict)  # execution ARN -> its run
    seen: set[str] = field(default_factory=set)  # executions ever started
    ended: dict[str, str] = field(default_factory=dict)  # execution ARN -> how it ended
    waiting_events: dict[str, float] = field(default_factory=dict)  # ARN -> when it ended without its summary
    # the rows of each table file: (batch id, file stem) -> the images (URIs) it holds, as last written
    table_files: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    planned: dict[str, set[str]] = field(default_factory=dict)  # batch id -> every image any of its rounds named

    def _groups(self, batch: Any) -> list[Any]:
        """The groups the batch's round runs: its groups manifest's, or its bulk jobs'."""
        from shared.contracts import BulkJob, BulkJobRef, ImageGroup

        if batch.lane == "bulk":
            refs = [BulkJobRef.model_validate(ref) for ref in self.read_json(layout.bulk_manifest(batch))]
            return [group for ref in refs for group in BulkJob.model_validate(self.read_json(ref.job_uri)).groups]
        return [ImageGroup.model_validate(group) for group in self.read_json(layout.round_groups(batch))]

    def read_json(self, uri: str) -> Any:
        _, key = uri.split(f"s3://{RESULTS_BUCKET}/", 1)
        return json.loads(self.s3.get_object(Bucket=RESULTS_BUCKET, Key=key)["Body"].read())

    def discover(self) -> None:
        """The executions started since the last step join the running ones; each one's Map reads its groups now."""
        from shared.contracts import BatchInput

        for execution in self.sfn.list_executions(stateMachineArn=self.machine)["executions"]:
            if execution["executionArn"] not in self.seen:
                self.seen.add(execution["executionArn"])
                described = self.sfn.describe_execution(executionArn=execution["executionArn"])
                batch = BatchInput.model_validate_json(described["input"])
                self._begin_round(execution["executionArn"], batch, self.clock())

    def _begin_round(self, arn: str, batch: Any, started_at: float) -> None:
        groups = self._groups(batch)
        self.running[arn] = Run(batch, groups, started_at)
        self.planned.setdefault(batch.batch_id, set()).update(i.source_uri for g in groups for i in g.images)

    def end(self, arn: str, fails: bool = False) -> None:
        """The execution's round ends: each of its groups written (or, if it ``fails``, all but its last job's or
        group's), then SummarizeBatch's code hands the rest back (the execution runs on) or ends it."""
        from shared.contracts import GroupSummary, SummarizeInput
        from shared.pipeline.batch_steps import summarize_batch
        from shared.pipeline.dependencies import Dependencies
        from shared.settings import Settings
        from shared.storage.objects import store_for

        run = self.running.pop(arn)
        batch = run.batch
        for group in run.groups[: -1 if fails else None]:
            self.table_files[(batch.batch_id, group.group_id)] = [image.source_uri for image in group.images]
            uri = layout.group_summary(batch.results_uri, batch.batch_id, group.group_id)
            summary = GroupSummary(
                batch_id=batch.batch_id,
                group_id=group.group_id,
                succeeded=len(group.images),
                failed=0,
                images_table_uri="",
                detections_table_uri="",
            )
            store_for(uri).write_bytes(uri, summary.model_dump_json().encode(), "application/json")
        deps = Dependencies(store_for=store_for, image_limits=Settings().image_limits)
        state = SummarizeInput.model_validate(batch.model_dump())
        handed_back = summarize_batch(state, deps).handed_back
        self._read_failure_rows(batch)
        if handed_back:
            self._begin_round(arn, batch.model_copy(update={"round": handed_back.round}), run.started_at)
        else:
            self.ended[arn] = "SUCCEEDED"

    def time_out(self, arn: str) -> None:
        """The execution reaches its TimeoutSeconds: Step Functions ends it, and runs none of its states any more."""
        self.running.pop(arn)
        self.ended[arn] = "TIMED_OUT"
        self.waiting_events[arn] = self.clock()

    def deliver_ended(self, arn: str, delivered: bool) -> None:
        """BatchEnded took the execution's status change (its rows written), or its delivery is given up on."""
        self.waiting_events.pop(arn)
        if delivered:
            self._read_failure_rows(self._input_of(arn))

    def status_change(self, arn: str) -> dict[str, Any]:
        """The event Step Functions sends EventBridge on the execution's end (it timed out)."""
        from tools.local.step_functions import status_change_event

        described = self.sfn.describe_execution(executionArn=arn)
        ended = {"status": self.ended[arn], "error": "States.Timeout", "cause": "the execution timed out"}
        return status_change_event(described | ended)

    def _input_of(self, arn: str) -> Any:
        from shared.contracts import BatchInput

        return BatchInput.model_validate_json(self.sfn.describe_execution(executionArn=arn)["input"])

    def _read_failure_rows(self, batch: Any) -> None:
        """The batch's failure rows as the table file summarizing wrote them (or deleted them) holds them."""
        import io

        import pyarrow.parquet as pq

        from shared.storage.tables import table_file_uris

        uri = table_file_uris(batch.results_uri, f"{batch.batch_id}-unfinished", batch.planned_at)["images"]
        _, key = uri.split(f"s3://{RESULTS_BUCKET}/", 1)
        try:
            body = self.s3.get_object(Bucket=RESULTS_BUCKET, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            self.table_files.pop((batch.batch_id, "unfinished"), None)
            return
        rows = pq.read_table(io.BytesIO(body), columns=["source_uri"]).column("source_uri").to_pylist()
        self.table_files[(batch.batch_id, "unfinished")] = rows

    def rows(self) -> dict[str, Counter[str]]:
        """Each batch's rows: image URI -> how many rows of that batch name it."""
        found: dict[str, Counter[str]] = {}
        for (batch_id, _), images in self.table_files.items():
            found.setdefault(batch_id, Counter()).update(images)
        return found

    def check_rows(self) -> None:
        """Every image any round of a batch named has exactly one row of that batch: a result, or a failure."""
        rows = self.rows()
        for batch_id, images in sorted(self.planned.items()):
            counted = rows.get(batch_id, Counter())
            none = sorted(image for image in images if counted[image] == 0)
            twice = sorted(image for image in images if counted[image] > 1)
            if none or twice:
                raise Broken(f"batch {batch_id}: images with no row: {none}; with more than one: {twice}")
