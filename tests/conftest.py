"""Fixtures shared by every test layer: settings in force, sample images, hostile files."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from shared.observability import logger
from shared.settings import Profile, Settings, use_settings

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"


INITIAL_LOG_LEVEL = logger.log_level  # before any test quiets it


@pytest.fixture(autouse=True, scope="session")
def _an_aws_region_is_configured() -> Iterator[None]:
    """As on a developer's machine or in Lambda: the code lets boto3 find the region; tests pick us-east-1."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_DEFAULT_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        yield


@pytest.fixture(autouse=True)
def _settings_are_restored_after_each_test() -> Iterator[None]:
    from shared import settings

    before = settings.get_settings()
    yield
    use_settings(before)


@pytest.fixture(autouse=True)
def _log_level_is_restored_after_each_test() -> Iterator[None]:
    """The CLI quiets the shared logger for its own process (a module's fixture may run it before the test starts):
    after each test the level is the one the tests began with, so a later test still sees its records."""
    yield
    logger.setLevel(INITIAL_LOG_LEVEL)


@pytest.fixture(scope="session")
def tiny_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The tiny profile, with the machine's model cache (tiny models are built once per machine), the diffusion
    model's too: whichever test needs a model may run first, in either test worker."""
    from tools.models.tiny_models import build_named_models

    settings = Settings(profile=Profile.TINY, data_dir=tmp_path_factory.mktemp("annotate-data"))
    build_named_models(settings, variants=True, masks=True)
    return settings


@pytest.fixture
def settings_in(tmp_path: Path, tiny_settings: Settings) -> Settings:
    """The tiny profile writing into this test's own folder, in force for this test."""
    return use_settings(tiny_settings.model_copy(update={"data_dir": tmp_path / "data"}))


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def phone_photo(path: Path, fmt: str = "HEIF") -> bytes:
    """The JPEG at ``path`` as a phone stores a photo: HEIC (an iPhone's default; pillow-heif's encoder, x265) or AVIF,
    its pixels as the sensor read them and its EXIF orientation carried over (HEIC writes it as the container's
    rotation, as iPhones do)."""
    import pillow_heif

    stored = Image.open(path)
    exif = stored.info.get("exif", b"")
    if fmt == "AVIF":
        return encode(stored.convert("RGB"), "AVIF", exif=exif, quality=90)
    # The pixels as stored (sideways), with the EXIF orientation written as the container's rotation (irot), as an
    # iPhone does; from_pillow is given bare pixels, as it would turn an image that carries its EXIF upright first
    buffer = io.BytesIO()
    sideways = Image.frombytes("RGB", stored.size, stored.convert("RGB").tobytes())
    pillow_heif.from_pillow(sideways).save(buffer, format="HEIF", exif=exif, quality=90)
    return buffer.getvalue()


@pytest.fixture
def hostile_folder(tmp_path: Path) -> Path:
    """Two good images beside an empty, a truncated, a non-image and an oversized (in pixels) file."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    good = Image.open(SAMPLES / "chelsea-the-cat.jpg")
    (folder / "cat.jpg").write_bytes((SAMPLES / "chelsea-the-cat.jpg").read_bytes())
    (folder / "cat.png").write_bytes(encode(good, "PNG"))
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "truncated.jpg").write_bytes((SAMPLES / "chelsea-the-cat.jpg").read_bytes()[:4000])
    (folder / "notes.txt").write_text("not an image\n")
    (folder / "huge.png").write_bytes(encode(Image.new("1", (9000, 9000)), "PNG"))  # 81 MP, 10 kB
    return folder


@pytest.fixture(scope="session")
def results_with_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Local tables holding a succeeded image with a described, captioned 'dog' box and a failed image."""
    from datetime import UTC, datetime

    from shared.contracts import (
        AttributeScore,
        Box,
        CaptionOutput,
        ClassScore,
        Detection,
        ImageEmbedding,
        ImageResult,
        Status,
    )
    from shared.storage.objects import store_for
    from shared.storage.tables import write_table_files

    root = tmp_path_factory.mktemp("tables")
    now = datetime.now(UTC)
    dog = Detection(
        label="dog",
        score=0.8,
        box=Box(x0=1, y0=2, x1=30, y1=40),
        class_label="beagle",
        class_score=0.6,
        top_k=[ClassScore(label="beagle", score=0.6)],
        attributes=[
            AttributeScore(name="color", value="brown", score=0.7),
            AttributeScore(name="pattern", value="spotted", score=0.5),
        ],
    )
    caption = CaptionOutput(
        caption="A brown beagle.",
        model="m",
        ttft_ms=20.0,
        tokens_per_s=50.0,
        prompt_tokens=200,
        completion_tokens=6,
        peak_rss_mb=500.0,
    )
    results = [
        ImageResult(
            image_id="a" * 16,
            source_uri="s3://in/dog.jpg",
            batch_id="b-" + "1" * 20,
            status=Status.SUCCEEDED,
            width=64,
            height=48,
            prompt="dog.",
            detections=[dog],
            caption=caption,
            embedding=ImageEmbedding(model="m", revision="r", vector=[0.6, 0.8]),
            annotated_uri="s3://out/a.png",
            processed_at=now,
        ),
        ImageResult(
            image_id="b" * 16,
            source_uri="s3://in/empty.jpg",
            batch_id="b-" + "1" * 20,
            status=Status.FAILED,
            error="detect: ImageRejected: file is empty",
            failed_step="detect",
            prompt="dog.",
            processed_at=now,
        ),
    ]
    write_table_files(results, str(root), "b-" + "1" * 20, now, store_for)
    return root
