"""The executions of the exactly-once checker's world (tools/local/drop_world.py): the groups each round of a batch
runs (as its Distributed Map read them when the round began), and each round's end as SummarizeBatch's own code makes
it (groups written, or one job or group not; handed back, or ended)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from shared.storage import layout

RESULTS_BUCKET = "once-results"


class Broken(AssertionError):
    """An invariant broken: what, and after which step."""


class Executions:
    """The executions started in ``machine``, those running and those ended; ``settings`` are the world's."""

    def __init__(self, s3: Any, sfn: Any, machine: str, settings: Callable[[], Any]) -> None:
        self.s3, self.sfn, self.machine, self.settings = s3, sfn, machine, settings
        self.running: dict[str, Any] = {}  # execution ARN -> its BatchInput, in the round it runs
        self.seen: set[str] = set()  # executions ever started
        self.ended: set[str] = set()  # executions that ended

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
        """The executions started since the last step join the running ones."""
        from shared.contracts import BatchInput

        for execution in self.sfn.list_executions(stateMachineArn=self.machine)["executions"]:
            if execution["executionArn"] not in self.seen:
                self.seen.add(execution["executionArn"])
                described = self.sfn.describe_execution(executionArn=execution["executionArn"])
                self.running[execution["executionArn"]] = BatchInput.model_validate_json(described["input"])

    def end(self, arn: str, fails: bool = False) -> None:
        """The execution's round ends: each of its groups written (or, if it ``fails``, all but its last job's or
        group's), then SummarizeBatch's code hands the rest back (the execution runs on) or ends it."""
        from shared.contracts import GroupSummary, SummarizeInput
        from shared.pipeline.batch_steps import summarize_batch
        from shared.pipeline.dependencies import Dependencies
        from shared.settings import Settings
        from shared.storage.objects import store_for

        batch = self.running.pop(arn)
        groups = self._groups(batch)
        for group in groups[: -1 if fails else None]:
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
        if handed_back:
            self.running[arn] = batch.model_copy(update={"round": handed_back.round})
        else:
            self.ended.add(arn)
