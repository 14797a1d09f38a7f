"""Fixtures shared by every test layer: settings in force, sample images, hostile files."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from shared.settings import Profile, Settings, use_settings

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"


@pytest.fixture(scope="session")
def tiny_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """The tiny profile, with the machine's model cache (tiny models are built once per machine)."""
    settings = use_settings(profile=Profile.TINY, data_dir=tmp_path_factory.mktemp("annotate-data"))
    yield settings


@pytest.fixture
def settings_in(tmp_path: Path, tiny_settings: Settings) -> Iterator[Settings]:
    """The tiny profile writing into this test's own folder."""
    settings = use_settings(tiny_settings.model_copy(update={"data_dir": tmp_path / "data"}))
    yield settings
    use_settings(tiny_settings)


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
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
