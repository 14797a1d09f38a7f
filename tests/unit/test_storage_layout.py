"""Where everything lives under the results root (shared/storage/layout.py): every key is under one of its prefixes,
and no two things share a key."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

from shared.contracts import AnnotationRequest, BatchInput, PictureFormat
from shared.storage import layout

ROOT = "s3://bucket/root"
BATCH = BatchInput(
    batch_id="b-" + "0" * 20,
    request=AnnotationRequest(prompt="cat."),
    results_uri=ROOT,
    planned_at=datetime(2026, 12, 5, tzinfo=UTC),
    images=1,
    groups=1,
    group_concurrency=1,
    round=2,
)
PREFIXES = (
    layout.RESULTS,
    layout.PICTURES,
    layout.BATCHES,
    layout.MANIFESTS,
    layout.TABLES,
    layout.UPLOADS,
    layout.DEAD_LETTER,
)
ARGUMENTS = {
    "root": ROOT,
    "batch_id": BATCH.batch_id,
    "image_id": "0123456789abcdef",
    "group_id": "g-000001",
    "picture_format": PictureFormat.JPEG,
    "index": 1,
    "round": 3,
    "job": 7,
    "table": "images",
    "partition": "dt=2026-12-05",
    "file_stem": "g-000001",
    "name": "0123/photo.jpg",
    "digest": "feed",
    "batch": BATCH,
}


def _keys() -> dict[str, str]:
    """Every key function of the layout (not its predicates), called with typed arguments."""
    keys = {}
    for name, function in inspect.getmembers(layout, inspect.isfunction):
        if function.__module__ == layout.__name__ and not name.startswith("is_"):
            keys[name] = function(
                **{parameter: ARGUMENTS[parameter] for parameter in inspect.signature(function).parameters}
            )
    return keys


def test_every_key_is_under_the_root_and_one_of_its_prefixes() -> None:
    keys = _keys()
    assert len(keys) >= 18
    for name, key in keys.items():
        relative = key.removeprefix(ROOT + "/")
        assert relative != key and relative.split("/")[0] in PREFIXES, (name, key)


def test_no_two_things_share_a_key_and_a_batch_s_round_names_its_own_manifests() -> None:
    keys = _keys()
    assert len(set(keys.values())) == len(keys), keys
    assert layout.round_groups(BATCH) == layout.groups_manifest(ROOT, BATCH.batch_id, 2) != layout.all_groups(BATCH)
    assert layout.bulk_manifest(BATCH).endswith(f"/{BATCH.batch_id}.bulk.2.json")
    assert layout.picture(ROOT, BATCH.batch_id, "i", PictureFormat.PNG).endswith("/i.png")


def test_a_result_document_is_told_from_the_steps_documents_beside_it() -> None:
    image = (ROOT, BATCH.batch_id, "0123456789abcdef")
    assert layout.is_result_document(layout.result_document(*image))
    assert not layout.is_result_document(layout.variants_document(*image))
    assert not layout.is_result_document(layout.box_embeddings_document(*image))
