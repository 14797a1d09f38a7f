"""What a batch's end does: SummarizeBatch's summary, failure rows and hand-backs, and the same rows for an execution
that ended without reaching it (timed out, failed or stopped), as EventBridge reports it."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from pydantic import TypeAdapter

from shared.aws import PARALLEL_CALLS
from shared.contracts import (
    MAX_LISTED_GROUPS,
    BatchInput,
    BatchSummary,
    ExecutionStatusChange,
    FailedStep,
    GroupSummary,
    HandBack,
    ImageGroup,
    ImageResult,
    Status,
    StepFailure,
    SummarizeInput,
)
from shared.observability import MetricUnit, logger, metrics
from shared.pipeline.batches import PlannedBatch
from shared.pipeline.dependencies import Dependencies
from shared.storage import layout


def summarize_batch(state: SummarizeInput, deps: Dependencies, hand_backs_left: bool = True) -> BatchSummary:
    """The batch's summary from its groups' summaries. Groups that wrote none (their child workflow failed or timed
    out) are handed back to a later round while the batch has rounds left (:func:`hand_back`; none when
    ``hand_backs_left`` is False: no state of the execution runs any more); after its last, each of their images gets
    a failure row, so that every image of the batch ends as one row. Idempotent: run again, it writes the same."""
    from shared.storage.tables import table_file_uris, tables_written, write_table_files

    groups_uri = layout.all_groups(state)
    groups = TypeAdapter(list[ImageGroup]).validate_json(deps.store_for(groups_uri).read_bytes(groups_uri))
    summaries_root = layout.group_summaries(state.results_uri, state.batch_id)
    summary_uris = list(deps.store_for(summaries_root).list_uris(summaries_root))
    with ThreadPoolExecutor(max_workers=PARALLEL_CALLS) as pool:  # one GET each: S3 answers them side by side
        documents = pool.map(lambda uri: deps.store_for(uri).read_bytes(uri), summary_uris)
        finished = {summary.group_id: summary for summary in map(GroupSummary.model_validate_json, documents)}
    unfinished = [group for group in groups if group.group_id not in finished]
    handed_back = hand_back(state, unfinished, deps) if unfinished and hand_backs_left else None
    rows = [] if handed_back else _unfinished_rows(state, unfinished)
    stem = f"{state.batch_id}-unfinished"
    if rows:
        # failure rows: no masks (and no masks file, whatever the request)
        write_table_files(rows, state.results_uri, stem, state.planned_at, deps.store_for, tables_written(False))
        logger.warning("groups did not finish", extra={"batch_id": state.batch_id, "groups": len(unfinished)})
    elif not handed_back:  # a rerun that finished every group: the earlier run's failure rows are no longer true
        for table in tables_written(False):
            uri = table_file_uris(state.results_uri, stem, state.planned_at)[table]
            deps.store_for(uri).delete(uri)
    uri = layout.batch_summary(state.results_uri, state.batch_id)
    summary = BatchSummary(
        batch_id=state.batch_id,
        images=state.images,
        succeeded=sum(group.succeeded for group in finished.values()),
        failed=sum(group.failed for group in finished.values()) + len(rows),
        groups=state.groups,
        unfinished=len(unfinished),
        unfinished_groups=[group.group_id for group in unfinished[:MAX_LISTED_GROUPS]],
        error=state.error,
        summary_uri=uri,
        handed_back=handed_back,
    )
    deps.store_for(uri).write_bytes(uri, summary.model_dump_json(indent=2).encode(), "application/json")
    logger.info("batch summarized", extra=summary.model_dump(exclude={"unfinished_groups", "error"}))
    return summary


def summarize_ended_execution(event: ExecutionStatusChange, deps: Dependencies) -> BatchSummary | None:
    """An execution that ended without its own last word: it timed out (the workflow's TimeoutSeconds), failed
    past SummarizeBatch's retries, or was stopped. Step Functions runs no state of it any more, so its unfinished
    groups' images get their failure rows here, as SummarizeBatch would after the last round. An execution that is
    not a batch's (another input) is logged and left."""
    try:
        batch = BatchInput.model_validate_json(event.detail.input or "")
    except ValueError:
        logger.warning("an ended execution that is no batch", extra={"execution": event.detail.execution_arn})
        return None
    reason = f"the execution {event.detail.name} {event.detail.status.lower().replace('_', ' ')}"
    cause = event.detail.cause or event.detail.error or ""
    failure = StepFailure(Error=event.detail.error or event.detail.status, Cause=f"{reason}: {cause}".rstrip(": "))
    state = SummarizeInput.model_validate(batch.model_dump() | {"error": failure.model_dump(by_alias=True)})
    metrics.add_metric(name="ExecutionsEndedWithoutSummary", unit=MetricUnit.Count, value=1)
    logger.warning("an execution ended without its summary", extra={"execution": event.detail.name, "reason": reason})
    return summarize_batch(state, deps, hand_backs_left=False)


# The longest wait before a round: each round waits twice the one before, from the batch's hand_back_wait_s
MAX_HAND_BACK_WAIT_S = 900


def hand_back(state: SummarizeInput, unfinished: list[ImageGroup], deps: Dependencies) -> HandBack | None:
    """The next round of a batch with rounds left: its manifest (the ``unfinished`` groups; in the bulk lane, as
    jobs of them) written, and the parent's wait before it, doubling each round and jittered, so that batches
    throttled together do not come back together. None when the batch has no round left."""
    if state.round >= state.hand_backs:
        return None
    next_round = state.round + 1
    batch = BatchInput.model_validate(state.model_dump(include=set(BatchInput.model_fields)) | {"round": next_round})
    planned = PlannedBatch(input=batch, groups=unfinished)
    if state.lane == "bulk":
        planned.write_bulk_jobs(deps.store_for)
    else:
        round_groups = layout.round_groups(batch)
        deps.store_for(round_groups).write_bytes(round_groups, planned.groups_manifest(), "application/json")
    longest = min(MAX_HAND_BACK_WAIT_S, state.hand_back_wait_s * 2**state.round)
    wait = random.randint(-(-longest // 2), longest)
    handed_back = HandBack(round=next_round, groups=len(unfinished), wait_seconds=wait)
    logger.warning("groups handed back", extra={"batch_id": state.batch_id, **handed_back.model_dump()})
    return handed_back


def _unfinished_rows(state: SummarizeInput, unfinished: list[ImageGroup]) -> list[ImageResult]:
    """A failure row for each image of the groups that did not finish in the batch's last round."""
    reason = state.error.reason if state.error else "its child workflow ended without writing the group's rows"
    if state.round:
        reason += f" (in each of {state.round + 1} rounds)"
    now = datetime.now(UTC)
    return [
        ImageResult(
            image_id=image.image_id,
            source_uri=image.source_uri,
            batch_id=state.batch_id,
            job_id=state.request.job_id,
            status=Status.FAILED,
            error=f"group {group.group_id} did not finish: {reason}",
            failed_step=FailedStep.GROUP,
            prompt=state.request.prompt,
            processed_at=now,
        )
        for group in unfinished
        for image in group.images
    ]
