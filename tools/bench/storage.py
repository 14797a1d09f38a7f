"""`annotate cost`'s bytes: what the results take in S3 under the template's lifecycle rules, and what a Fargate
task's bytes cost on their way in each network a user may put the tasks in.

Every option writes the same results, so storage is priced once, apart from the options. The bytes an image leaves
are measured on the samples: each file's own bytes, and its annotated picture as WriteResult draws it.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from shared.contracts import PictureFormat
from tools.bench.cost_inputs import HOURS_PER_MONTH, SCENARIOS, BenchSeconds, BulkSeconds, Prices, Scenario, deployment
from tools.bench.cost_lanes import ATHENA_BYTES_PER_IMAGE, bulk_jobs, bulk_lane

GB = 1e9
MONTHS_OF_DOCUMENTS = 12  # documents and tables are kept for good: priced as they stand a year in
# The photo priced: a phone's 12 MP (the pixel bound is 40 MP). A larger photo of a scene holds less detail per
# pixel than the samples do, so their bytes per pixel make the figures upper bounds.
PHOTO_MEGAPIXELS = 12.0
# A result document: make demo's are 11 to 14 kB (2026-12-02; the tiny models find many boxes), and its embedding
# as WriteResult writes it (embedding_bytes_per_image). Tables: the images' and detections' Parquet per image,
# cost_lanes.ATHENA_BYTES_PER_IMAGE, and the embeddings', measured (embedding_bytes_per_image).
DOCUMENT_BYTES = 14_000
# The default tagger's vectors (Marqo-fashionSigLIP, ViT-B-16-SigLIP: 768 values; the fallback ViT-B/32's are 512).
EMBEDDING_VALUES = 768
# Read by each bulk task from S3 as it starts, estimates: its image (about 1.3 GB, as cost_lanes.TASK_START_S says) and
# the models (Detect's export 0.93 GB as DetectMemorySize's description measures it, ConvNeXt, CLIP and the 0.24 GB
# caption GGUF: about 2 GB).
IMAGE_PULL_GB, TASK_MODELS_GB = 1.3, 2.0
# Interface endpoints a task needs without a NAT gateway: ECR's API and registry, and CloudWatch Logs; one per zone.
INTERFACE_ENDPOINTS, ZONES = ("ecr.api", "ecr.dkr", "logs"), 2
SMALLER_PICTURES = 2048  # the PictureMaxSide priced beside the default (each image's own size)


@dataclass(frozen=True)
class Retention:
    """How long the template's lifecycle rules keep each thing, in days, by default."""

    inputs: int
    pictures: int
    noncurrent_pictures: int  # an expired picture's noncurrent version goes this much later (ExpirePictures' rule)


def retention() -> Retention:
    deployed = deployment()
    rules = deployed.template["Resources"]["ResultsBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    [pictures] = [rule for rule in rules if rule["Id"] == "ExpirePictures"]
    return Retention(
        inputs=deployed.parameter("InputRetentionDays"),
        pictures=deployed.parameter("PictureRetentionDays"),
        noncurrent_pictures=int(pictures["NoncurrentVersionExpiration"]["NoncurrentDays"]),
    )


def picture_share(max_side: int, megapixels: float = PHOTO_MEGAPIXELS) -> float:
    """The share of a 4:3 photo's pixels an annotated picture keeps at ``max_side`` (0: all)."""
    width = math.sqrt(megapixels * 1e6 * 4 / 3)
    return min(1.0, max_side / width) ** 2 if max_side else 1.0


@dataclass(frozen=True)
class BytesPerImage:
    """What one image leaves in S3: the dropped file, its annotated picture, its document and its table rows."""

    source: float
    picture: float
    embedding: float  # its row of the embeddings table
    document: float  # its result document, its embedding's values in it
    tables: float = ATHENA_BYTES_PER_IMAGE

    @property
    def results(self) -> float:
        return self.picture + self.document + self.tables + self.embedding


def measured_bytes_per_image(
    samples: list[Path], megapixels: float = PHOTO_MEGAPIXELS, picture_format: PictureFormat = PictureFormat.JPEG
) -> BytesPerImage:
    """The samples' mean bytes per pixel, for a photo of ``megapixels``: each file's own, and its annotated picture's
    as WriteResult draws it in ``picture_format`` (a box with its caption across the middle)."""
    from shared.contracts import AttributeScore, Box, Detection
    from shared.storage.render import draw_detections

    source, picture = [], []
    for path in samples:
        data = path.read_bytes()
        with Image.open(io.BytesIO(data)) as opened:
            pixels = opened.convert("RGB")
        width, height = pixels.size
        box = Box(x0=width / 4, y0=height / 4, x1=width * 3 / 4, y1=height * 3 / 4)
        attributes = [AttributeScore(name="color", value="orange", score=0.9)]
        drawn = Detection(label="cat", score=0.9, box=box, class_label="tabby", attributes=attributes)
        source.append(len(data) / (width * height))
        picture.append(len(draw_detections(pixels, [drawn], picture_format=picture_format)) / (width * height))
    per_photo = megapixels * 1e6
    row, in_document = embedding_bytes_per_image()
    return BytesPerImage(
        source=per_photo * sum(source) / len(source),
        picture=per_photo * sum(picture) / len(picture),
        embedding=row,
        document=DOCUMENT_BYTES + in_document,
    )


def embedding_bytes_per_image(values: int = EMBEDDING_VALUES, images: int = 1000) -> tuple[float, float]:
    """What an image's embedding (a unit vector of ``values`` float32) adds to storage, over ``images`` of them: its
    row of the embeddings table, as WriteGroupTable writes it (zstd), which is also what it adds to a search's bytes
    scanned; and its values in its result document, as WriteResult writes it."""
    from datetime import UTC, datetime

    import numpy as np

    from shared.contracts import ImageEmbedding, ImageResult, Status, float32_values
    from shared.storage.tables import embeddings_table, parquet_bytes

    vectors = np.random.default_rng(0).normal(size=(images, values))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    results = [
        ImageResult(
            image_id=f"{index:016x}",
            source_uri=f"s3://input/incoming/{index:08d}.jpg",
            batch_id="b-" + "0" * 20,
            status=Status.SUCCEEDED,
            prompt="dog. cat.",
            embedding=ImageEmbedding(
                model="Marqo/marqo-fashionSigLIP", revision="0" * 16, vector=float32_values(vector)
            ),
            processed_at=datetime.now(UTC),
        )
        for index, vector in enumerate(vectors)
    ]
    in_documents = sum(len(r.document()) - len(r.model_copy(update={"embedding": None}).document()) for r in results)
    return len(parquet_bytes(embeddings_table(results))) / images, in_documents / images


def storage_month(
    per_image: BytesPerImage,
    prices: Prices,
    scenario: Scenario,
    picture_days: int | None = None,
    picture_max_side: int = 0,
    store_pictures: bool | None = None,
) -> dict[str, float]:
    """A month's S3 storage of ``scenario`` by part, as the template's rules keep it: dropped images
    ``InputRetentionDays``, pictures ``PictureRetentionDays`` and a day (or ``picture_days``), documents and tables
    for good (as they stand a year in); pictures downscaled to ``picture_max_side`` (PictureMaxSide) by their pixels,
    and only where they are stored (``store_pictures``; None: StorePictures as deployed)."""
    from tools.bench.cost_inputs import deployment

    per_day, kept = scenario.images_per_month / 30, retention()
    days = kept.pictures + kept.noncurrent_pictures if picture_days is None else picture_days
    stored = deployment().stores_pictures if store_pictures is None else store_pictures
    held = {
        "dropped images": per_day * kept.inputs * per_image.source,
        "pictures": stored * per_day * days * per_image.picture * picture_share(picture_max_side),
        "documents and tables": scenario.images_per_month
        * MONTHS_OF_DOCUMENTS
        * (per_image.document + per_image.tables + per_image.embedding),
    }
    return {part: stored / GB * prices.s3.standard_gb_month for part, stored in held.items()}


def storage_table(per_image: BytesPerImage, prices: Prices) -> str:
    """Each scenario's storage a month, by part, as deployed and with pictures stored (StorePictures=true: kept
    PictureRetentionDays, downscaled, kept for good)."""
    kept = retention()
    lines = [
        f"Storage (every option writes the same results; a {PHOTO_MEGAPIXELS:g} MP photo: {per_image.source / 1e6:.1f} "
        f"MB dropped, a {per_image.picture / 1e6:.1f} MB annotated picture (a JPEG, PictureFormat's default), "
        f"{per_image.document / 1e3:.0f} kB document, {per_image.tables / 1e3:.0f} kB of table rows and "
        f"{per_image.embedding / 1e3:.1f} kB of embedding; the samples' bytes per pixel, an upper bound), at "
        f"${prices.s3.standard_gb_month} a GB-month:",
        "",
        f"| scenario | dropped images ({kept.inputs} days) | documents and tables, a year in | per month (pictures "
        f"drawn when looked at, as deployed) | pictures stored (StorePictures=true, {kept.pictures} days and "
        f"{kept.noncurrent_pictures}) | stored at PictureMaxSide={SMALLER_PICTURES} | stored for good, a year in |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario in SCENARIOS[1:]:
        parts = storage_month(per_image, prices, scenario, store_pictures=False)
        stored, smaller, kept_for_good = (
            storage_month(per_image, prices, scenario, store_pictures=True, **option)["pictures"]
            for option in ({}, {"picture_max_side": SMALLER_PICTURES}, {"picture_days": 365})
        )
        lines.append(
            f"| {scenario.name} | ${parts['dropped images']:,.2f} | ${parts['documents and tables']:,.2f} | "
            f"${sum(parts.values()):,.2f} | +${stored:,.2f} | +${smaller:,.2f} | +${kept_for_good:,.2f} |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class NetworkPath:
    """Where the bulk lane's tasks run and how they reach ECR and S3: its cost for ``images`` and a month's fixed
    hours."""

    name: str
    per_images: float
    fixed_month: float


def network_paths(
    bench: BenchSeconds, bulk: BulkSeconds, prices: Prices, per_image: BytesPerImage, images: int
) -> list[NetworkPath]:
    """The bulk lane's tasks for ``images`` in each network: public subnets (a public IPv4 address per task, as
    deployed), private ones through a NAT gateway (each task's image and models and each image's bytes at its
    per-GB price), the same with the stack's S3 gateway endpoint (S3's bytes, image layers included, free), and
    without NAT (interface endpoints for ECR and Logs, the gateway endpoint for S3)."""
    vpc = prices.vpc
    jobs, _ = bulk_jobs(images)
    moved_gb = jobs * (IMAGE_PULL_GB + TASK_MODELS_GB) + images * (per_image.source + per_image.results) / GB
    nat_month = ZONES * vpc.nat_gateway_hour * HOURS_PER_MONTH
    endpoints_month = len(INTERFACE_ENDPOINTS) * ZONES * vpc.interface_endpoint_hour * HOURS_PER_MONTH
    return [
        NetworkPath(
            "public subnets (TaskPublicIp=ENABLED, as deployed)",
            bulk_lane(images, bench, bulk, prices).parts["public IPv4"],
            0.0,
        ),
        NetworkPath("private subnets through a NAT gateway", moved_gb * vpc.nat_gateway_per_gb, nat_month),
        NetworkPath("private, NAT gateway and S3GatewayRouteTables (the stack's S3 endpoint)", 0.0, nat_month),
        NetworkPath(
            "private, no NAT: S3GatewayRouteTables and interface endpoints for ECR and Logs", 0.0, endpoints_month
        ),
        # An egress-only internet gateway has no hourly or per-GB charge (Amazon VPC pricing lists none), ECR
        # charges nothing more over IPv6 ("There are no additional charges for accessing Amazon ECR over IPv6", ECR
        # user guide, Making requests to Amazon ECR registries), and S3 rides its free gateway endpoint.
        NetworkPath(
            "private dual-stack subnets: IPv6 through an egress-only internet gateway to ECR's and Logs' dual-stack "
            "endpoints, S3GatewayRouteTables (not rehearsed: see docs/deploy.md)",
            0.0,
            0.0,
        ),
    ]


def network_table(bench: BenchSeconds, bulk: BulkSeconds, prices: Prices, per_image: BytesPerImage) -> str:
    """Each network path of the bulk lane: per 1,000 images, for a million, and its fixed hours a month."""
    images = 1_000_000
    lines = [
        f"The bulk lane's network (each task reads its image, about {IMAGE_PULL_GB:g} GB, and the models, about "
        f"{TASK_MODELS_GB:g} GB, both estimates; each image its {(per_image.source + per_image.results) / 1e6:.1f} "
        "MB in and out). ECR keeps image layers in S3, so the S3 endpoint carries them too; what is left through the "
        "NAT (ECR's manifests, the logs) is a few MB a task:",
        "",
        "| network | per 1,000 images | a million images | fixed a month |",
        "|---|---:|---:|---:|",
    ]
    paths = network_paths(bench, bulk, prices, per_image, images)
    for path in paths:
        fixed = f"${path.fixed_month:,.2f} ({ZONES} zones)" if path.fixed_month else "$0.00"
        lines.append(f"| {path.name} | ${path.per_images / images * 1000:.4f} | ${path.per_images:,.2f} | {fixed} |")
    public, endpoints = paths[0], paths[3]
    break_even = endpoints.fixed_month / public.per_images * images
    lines += [
        "",
        f"The endpoints' fixed ${endpoints.fixed_month:,.2f} a month cost less than the tasks' public addresses "
        f"above {break_even / 1e6:.1f} million images a month; below that, public subnets are the cheapest of the "
        "rehearsed networks, and the only one a new account's default VPC (IPv4 only, public subnets) gives without "
        "a VPC of its own.",
    ]
    return "\n".join(lines) + "\n"


def search_line(per_image: BytesPerImage, prices: Prices) -> str:
    """What finding images by meaning scans and costs on Athena: a query over a million images' embeddings (a
    --where adds the columns it reads of the other tables)."""
    images, athena = 1_000_000, prices.athena
    scanned = images * per_image.embedding
    price = max(scanned, athena.minimum_mb_per_query * 1e6) / 1e12 * athena.per_tb_scanned
    return (
        f"Search (the embeddings table, which annotate search and annotate duplicates read): each image's embedding "
        f"({EMBEDDING_VALUES} float32 values, the default tagger's) is {per_image.embedding / 1e3:.2f} kB of Parquet; "
        f"a query over a million images' embeddings scans {scanned / 1e9:.2f} GB on Athena, ${price:.4f} a query."
    )
