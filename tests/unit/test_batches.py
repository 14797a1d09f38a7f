from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter

from shared.contracts import ImageGroup, PromptMessage
from shared.pipeline.batches import expand_locations, plan_batches
from shared.settings import IngestSettings, Settings
from shared.storage.objects import store_for


def ingest_settings(max_images_per_batch: int = 500, images_per_group: int = 10) -> IngestSettings:
    return Settings(
        results_uri="/results", max_images_per_batch=max_images_per_batch, images_per_group=images_per_group
    ).ingest


def make_inputs(folder: Path) -> Path:
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"first")
    (folder / "sub").mkdir()
    (folder / "sub" / "b.png").write_bytes(b"second")
    (folder / ".hidden").write_bytes(b"ignored")
    return folder


def test_folders_expand_to_their_files_and_missing_paths_are_kept(tmp_path: Path) -> None:
    folder = make_inputs(tmp_path / "in")
    found = expand_locations([str(folder), str(tmp_path / "missing.jpg"), str(folder / "a.jpg")], store_for)
    assert list(found) == [str(folder / "a.jpg"), str(folder / "sub" / "b.png"), str(tmp_path / "missing.jpg")]
    assert found[str(tmp_path / "missing.jpg")] == "missing"


def test_the_same_inputs_and_options_name_the_same_batch(tmp_path: Path) -> None:
    folder = make_inputs(tmp_path / "in")
    message = PromptMessage(prompt="dog.", images=[str(folder)])
    first = plan_batches(message, ingest_settings(), store_for)
    again = plan_batches(message, ingest_settings(), store_for)
    assert [b.input.batch_id for b in first] == [b.input.batch_id for b in again]
    assert first[0].groups == again[0].groups


def test_other_options_or_other_content_name_another_batch(tmp_path: Path) -> None:
    folder = make_inputs(tmp_path / "in")
    message = PromptMessage(prompt="dog.", images=[str(folder)])
    [original] = plan_batches(message, ingest_settings(), store_for)
    [other_options] = plan_batches(message.model_copy(update={"box_threshold": 0.5}), ingest_settings(), store_for)
    [for_a_job] = plan_batches(message.model_copy(update={"job_id": "survey-2026"}), ingest_settings(), store_for)
    (folder / "a.jpg").write_bytes(b"changed")
    [other_content] = plan_batches(message, ingest_settings(), store_for)
    ids = {batch.input.batch_id for batch in (original, other_options, for_a_job, other_content)}
    assert len(ids) == 4
    assert original.groups[0].images[1] == other_content.groups[0].images[1]  # the unchanged image keeps its id


def test_large_messages_are_split_into_bounded_batches_of_bounded_groups(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(7):
        (folder / f"{index}.jpg").write_bytes(bytes([index]))
    message = PromptMessage(prompt="dog.", images=[str(folder)])
    batches = plan_batches(message, ingest_settings(max_images_per_batch=5, images_per_group=2), store_for)
    assert [batch.input.images for batch in batches] == [5, 2]
    assert [[len(group.images) for group in batch.groups] for batch in batches] == [[2, 2, 1], [2]]
    assert [batch.input.groups for batch in batches] == [3, 1]
    assert [group.group_id for group in batches[0].groups] == ["g-000000", "g-000001", "g-000002"]


def test_the_bulk_lane_groups_more_images_per_table_file_and_runs_its_groups_as_jobs(tmp_path: Path) -> None:
    # GIVEN seven images, groups of two in the Lambda lane and of three in the bulk lane, two groups a job
    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(7):
        (folder / f"{index}.jpg").write_bytes(bytes([index]))
    settings = Settings(
        results_uri="/results", images_per_group=2, bulk_images_per_group=3, groups_per_bulk_job=2, bulk_concurrency=1
    ).ingest
    # WHEN the same images are planned for each lane
    [in_lambda] = plan_batches(PromptMessage(prompt="dog.", images=[str(folder)], lane="lambda"), settings, store_for)
    [in_bulk] = plan_batches(PromptMessage(prompt="dog.", images=[str(folder)], lane="bulk"), settings, store_for)
    # THEN each lane's groups are its own size, and the bulk lane's make jobs of at most two groups
    assert [len(group.images) for group in in_lambda.groups] == [2, 2, 2, 1]
    assert [len(group.images) for group in in_bulk.groups] == [3, 3, 1]
    assert (in_bulk.input.groups, in_bulk.input.bulk_jobs, in_bulk.groups_per_job) == (3, 2, 2)
    assert [ref for group in in_bulk.groups for ref in group.images] == [
        ref for group in in_lambda.groups for ref in group.images
    ]


def test_the_groups_manifest_is_the_json_array_the_distributed_map_reads(tmp_path: Path) -> None:
    folder = make_inputs(tmp_path / "in")
    [batch] = plan_batches(
        PromptMessage(prompt="dog.", images=[str(folder)]), ingest_settings(images_per_group=1), store_for
    )
    assert TypeAdapter(list[ImageGroup]).validate_json(batch.groups_manifest()) == batch.groups
    assert len(batch.groups) == 2


def test_a_lambda_lane_batch_is_planned_within_the_accounts_concurrency(tmp_path: Path) -> None:
    from shared.pipeline.batches import INVOCATIONS_PER_IMAGE, lambda_fan_out

    # GIVEN the template's defaults (groups of 10, 40 at once), on accounts from a new one's 10 to the default 1,000
    for quota in (2, 3, 10, 25, 100, 1000, 5000):
        settings = Settings(results_uri="/results", lambda_concurrency=quota).ingest
        images, groups = lambda_fan_out(settings)
        # THEN a batch's invocations in flight, and Ingest's, stay within the quota; groups are never larger than
        # asked, and as many run as fit
        assert images * groups * INVOCATIONS_PER_IMAGE + 1 <= max(quota, INVOCATIONS_PER_IMAGE + 1), quota
        assert 1 <= images <= 10 and 1 <= groups <= 40
    assert lambda_fan_out(Settings(results_uri="/r", lambda_concurrency=1000).ingest) == (10, 40)  # as deployed
    assert lambda_fan_out(Settings(results_uri="/r", lambda_concurrency=10).ingest) == (4, 1)
    # AND the plan takes it: 100 images on a new account run in groups of 4, one at a time
    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(100):
        (folder / f"{index}.jpg").write_bytes(str(index).encode())
    message = PromptMessage(prompt="cat.", images=[str(folder)])
    [planned] = plan_batches(message, Settings(results_uri="/r", lambda_concurrency=10).ingest, store_for)
    assert planned.input.group_concurrency == 1 and {len(group.images) for group in planned.groups} == {4}


def test_a_bulk_lane_batch_runs_no_more_tasks_at_once_than_the_accounts_fargate_vcpus_hold() -> None:
    from shared.pipeline.batches import bulk_tasks_at_once

    # a new account's 6 Spot vCPUs hold three tasks of 2 vCPUs; the default 200 hold the template's 100
    assert bulk_tasks_at_once(Settings(results_uri="/r", fargate_vcpus=6).ingest) == 3
    assert bulk_tasks_at_once(Settings(results_uri="/r", fargate_vcpus=6, bulk_task_cpu=4096).ingest) == 1
    assert bulk_tasks_at_once(Settings(results_uri="/r", fargate_vcpus=1, bulk_task_cpu=4096).ingest) == 1
    assert bulk_tasks_at_once(Settings(results_uri="/r").ingest) == 100


def test_a_batch_with_variants_runs_no_more_variants_tasks_at_once_than_the_accounts_fargate_vcpus_hold(
    tmp_path: Path,
) -> None:
    from shared.pipeline.batches import variants_tasks_at_once

    # GIVEN 20 images asking for variants, each made by a Variants task of 4 vCPUs (the template's VariantsCpu)
    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(20):
        (folder / f"{index}.jpg").write_bytes(str(index).encode())
    message = PromptMessage(prompt="cat.", images=[str(folder)], variants={"prompt": "a watercolor"})
    for vcpus, tasks in ((6, 1), (16, 4), (200, 50)):
        settings = Settings(results_uri="/r", fargate_vcpus=vcpus).ingest
        assert variants_tasks_at_once(settings) == tasks
        # WHEN the batch is planned
        [planned] = plan_batches(message, settings, store_for)
        # THEN at most that many of its images run at once (ECS would refuse a task past the vCPUs)
        at_once = planned.input.group_concurrency * max(len(group.images) for group in planned.groups)
        assert at_once <= tasks and sum(len(group.images) for group in planned.groups) == 20, vcpus
    # AND without variants the same account's batch is planned by its Lambda concurrency alone
    [lambda_only] = plan_batches(PromptMessage(prompt="cat.", images=[str(folder)]), settings, store_for)
    assert (lambda_only.input.group_concurrency, len(lambda_only.groups[0].images)) == (40, 10)
