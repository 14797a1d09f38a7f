"""Where everything lives under the results root (a local folder or an S3 prefix): each key or prefix a function of
what names it, here and nowhere else. The template's lifecycle rules and Glue tables, and the ASL's ItemReader, name
the same prefixes; tests keep them equal."""

from __future__ import annotations

from shared.contracts import BatchInput, PictureFormat
from shared.storage.objects import join_uri

RESULTS = "results"  # per image its result document (and its variants')
# Per image its annotated picture and variants: apart from the documents, so that the template's lifecycle rule can
# expire them (PictureRetentionDays), as the largest part of what is stored.
PICTURES = "pictures"
BATCHES = "batches"  # per batch its groups' summaries and its own
MANIFESTS = "manifests"  # per batch its input, its rounds' groups and bulk jobs
TABLES = "tables"  # the Parquet tables, a folder each, partitioned by day
UPLOADS = "uploads"  # the API's uploaded pictures whose results were recorded
DEAD_LETTER = "dead-letter"  # local mode's malformed messages, each with its reason


def result_document(root: str, batch_id: str, image_id: str) -> str:
    return join_uri(root, RESULTS, batch_id, image_id) + ".json"


STEP_DOCUMENT_SUFFIXES = (".variants.json", ".boxes.json", ".masks.json")  # what steps write beside a result document


def is_result_document(uri: str) -> bool:
    """Whether ``uri``, in a batch's results folder, is an image's result document (not a step's beside it)."""
    return uri.endswith(".json") and not uri.endswith(STEP_DOCUMENT_SUFFIXES)


def batch_results(root: str, batch_id: str) -> str:
    """The folder of a batch's result documents, with its trailing slash."""
    return join_uri(root, RESULTS, batch_id) + "/"


def picture(root: str, batch_id: str, image_id: str, picture_format: PictureFormat) -> str:
    return join_uri(root, PICTURES, batch_id, image_id) + picture_format.suffix


def variants_document(root: str, batch_id: str, image_id: str) -> str:
    """Beside the image's own result document."""
    return join_uri(root, RESULTS, batch_id, image_id) + STEP_DOCUMENT_SUFFIXES[0]


def box_embeddings_document(root: str, batch_id: str, image_id: str) -> str:
    """Beside the image's own result document: Tag writes it, WriteResult reads it in."""
    return join_uri(root, RESULTS, batch_id, image_id) + STEP_DOCUMENT_SUFFIXES[1]


def masks_document(root: str, batch_id: str, image_id: str) -> str:
    """Beside the image's own result document: Segment writes it, WriteResult reads it in."""
    return join_uri(root, RESULTS, batch_id, image_id) + STEP_DOCUMENT_SUFFIXES[2]


def variant_picture(root: str, batch_id: str, image_id: str, index: int) -> str:
    """Beside the image's annotated picture (and expiring with it)."""
    return join_uri(root, PICTURES, batch_id, image_id) + f".variant-{index}.png"


def group_summaries(root: str, batch_id: str) -> str:
    return join_uri(root, BATCHES, batch_id, "groups")


def group_summary(root: str, batch_id: str, group_id: str) -> str:
    return join_uri(group_summaries(root, batch_id), f"{group_id}.json")


def batch_summary(root: str, batch_id: str) -> str:
    return join_uri(root, BATCHES, batch_id, "summary.json")


def batch_input(root: str, batch_id: str) -> str:
    """A batch's input as ingest planned it (what ``annotate status`` reads)."""
    return join_uri(root, MANIFESTS, f"{batch_id}.json")


def groups_manifest(root: str, batch_id: str, round: int = 0) -> str:
    """A round's groups: round 0's holds every group of the batch, a later round's those handed back to it. The ASL's
    ItemReader names the same key."""
    return join_uri(root, MANIFESTS, f"{batch_id}.groups.{round}.json")


def round_groups(batch: BatchInput) -> str:
    """The groups the batch's round runs: all of them, then those handed back."""
    return groups_manifest(batch.results_uri, batch.batch_id, batch.round)


def all_groups(batch: BatchInput) -> str:
    """Every group of the batch (round 0's manifest)."""
    return groups_manifest(batch.results_uri, batch.batch_id)


def bulk_manifest(batch: BatchInput) -> str:
    """The bulk lane's jobs of the batch's round, a JSON array of job references its Distributed Map reads (round
    0's, every job; a later round's, jobs of the groups handed back)."""
    return join_uri(batch.results_uri, MANIFESTS, f"{batch.batch_id}.bulk.{batch.round}.json")


def bulk_job(root: str, batch_id: str, job: int, round: int = 0) -> str:
    return join_uri(root, MANIFESTS, f"{batch_id}.bulk.{round}", f"{job:06d}.json")


def table_folder(root: str, table: str) -> str:
    return join_uri(root, TABLES, table)


def table_file(root: str, table: str, partition: str, file_stem: str) -> str:
    return join_uri(table_folder(root, table), partition, f"{file_stem}.parquet")


def upload(root: str, name: str) -> str:
    """An uploaded picture kept with its recorded result, under a name that holds its digest."""
    return join_uri(root, UPLOADS, name)


def dead_letter(root: str, digest: str) -> str:
    return join_uri(root, DEAD_LETTER, f"{digest}.json")
