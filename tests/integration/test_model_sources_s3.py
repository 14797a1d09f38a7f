"""Models read from S3 into memory files load through the same folder code path as local ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from PIL import Image

from shared.errors import ModelUnavailable
from shared.models.grounding_onnx import export_dir, export_file_name, load_detector
from shared.models.sources import resolve_model_dir
from shared.settings import Settings
from shared.storage import objects as storage
from tests.conftest import SAMPLES

pytestmark = pytest.mark.slow


@pytest.fixture
def s3() -> Iterator[object]:
    with mock_aws():
        storage.refresh_clients()
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="models")
        yield client
    storage.refresh_clients()


def upload_folder(client: object, folder: Path, prefix: str) -> None:
    for path in folder.rglob("*"):
        if path.is_file() and not path.name.startswith("."):
            client.put_object(Bucket="models", Key=f"{prefix}{path.relative_to(folder)}", Body=path.read_bytes())


def test_an_s3_prefix_is_read_into_memory_and_loads(s3: object, tiny_settings: Settings, tmp_path: Path) -> None:
    # GIVEN the detector's export pushed to S3, as `annotate models push` does
    upload_folder(s3, export_dir(tiny_settings.detection), "models/gd/")
    settings = tiny_settings.model_copy(
        update={"detector_model": "s3://models/models/gd/", "model_cache_dir": tmp_path}
    )

    folder = resolve_model_dir(settings.detector_model, settings.model_files)

    graph = folder / export_file_name(settings.detection.export_sizes()[0])
    assert graph.is_symlink() and str(graph.readlink()).startswith("/proc/self/fd/")
    assert resolve_model_dir(settings.detector_model, settings.model_files) == folder  # read once per process
    cat = Image.open(SAMPLES / "chelsea-the-cat.jpg").convert("RGB")
    detections = load_detector(settings.detection).detect(cat, ["cat"], 0.0, 0.0)  # weights read from the memory files
    assert detections and all(d.box.x1 <= cat.width for d in detections)


def test_an_empty_s3_prefix_says_to_upload_first(s3: object, tmp_path: Path) -> None:
    settings = Settings(model_cache_dir=tmp_path)
    with pytest.raises(ModelUnavailable, match="annotate models push"):
        resolve_model_dir("s3://models/nothing-here/", settings.model_files)
