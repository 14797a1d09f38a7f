"""The phone photos `annotate bench-photo` times: stored as a phone stores a portrait, shown upright by the pipeline."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from shared.storage.images import decode_image
from tests.conftest import SAMPLES
from tools.bench.photo import EXIF_ORIENTATION, markdown_report, phone_photo


def test_a_phone_photo_is_12_mp_on_its_side_with_the_orientation_that_shows_it_upright(tmp_path: Path) -> None:
    path = phone_photo(SAMPLES / "chelsea-the-cat.jpg", tmp_path)
    with Image.open(path) as stored:
        assert (stored.format, stored.size, stored.getexif()[EXIF_ORIENTATION]) == ("JPEG", (4000, 3000), 6)
    assert 2_000_000 < path.stat().st_size < 6_000_000  # a phone's 3-5 MB, about
    shown = decode_image(path.read_bytes(), max_pixels=40_000_000).pixels
    assert shown.size == (3000, 4000)
    # the sample's top-left corner (its upper rows) is the shown picture's top, not a side
    with Image.open(SAMPLES / "chelsea-the-cat.jpg") as sample:
        expected = sample.convert("RGB").resize((30, 40)).getpixel((15, 2))
    found = shown.resize((30, 40)).getpixel((15, 2))
    assert all(abs(a - b) < 40 for a, b in zip(found, expected, strict=True)), (found, expected)


def test_the_report_has_a_row_per_stage_and_a_column_per_size() -> None:
    report = {
        "sizes": {
            "sample": {"width_height": [451, 300], "median": {"decode": 0.002, "png MB": 0.28}},
            "12 MP phone photo": {"width_height": [3000, 4000], "median": {"decode": 0.05, "png MB": 17.1}},
        }
    }
    lines = markdown_report(report).splitlines()
    assert lines[0] == "| stage | sample (451x300) | 12 MP phone photo (3000x4000) |"
    assert lines[2:] == ["| decode | 0.002 s | 0.050 s |", "| png MB | 0.28 | 17.1 |"]
