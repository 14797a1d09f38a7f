"""The phone photos `annotate bench-photo` times: stored as a phone stores a portrait, shown upright by the pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from shared.storage.images import decode_image
from tests.conftest import SAMPLES
from tools.bench.photo import ADDED, EXIF_ORIENTATION, PHOTO, markdown_report, phone_photo


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


def test_the_report_has_a_row_per_stage_and_a_column_per_size_and_what_the_photo_adds() -> None:
    report = {
        "sizes": {
            "sample": {"width_height": [451, 300], "median": {"decode": 0.002, "png MB": 0.28, "share of a": 0.004}},
            PHOTO: {"width_height": [3000, 4000], "median": {"decode": 0.05, "png MB": 17.1, "share of a": 0.03}},
        },
        ADDED: {"decode": 0.047, "png MB": 16.8, "share of a": 0.026},
    }
    lines = markdown_report(report).splitlines()
    assert lines[0] == f"| stage | sample (451x300) | 12 MP phone photo (3000x4000) | {ADDED} |"
    assert lines[2:] == [
        "| decode | 0.002 s | 0.050 s | 0.047 s |",
        "| png MB | 0.28 | 17.1 | 16.8 |",
        "| share of a | 0% | 3% | 3% |",
    ]


def test_a_photo_s_seconds_are_the_bench_s_plus_what_the_photo_added_side_by_side() -> None:
    from tools.bench.cost_inputs import BenchSeconds, BulkSeconds
    from tools.bench.photo import DRAWN, ONE_PROCESS, STEP_ROWS, WRITE_RESULT, at_photo_size

    def measured(seconds: float) -> dict[str, float]:
        rows = {WRITE_RESULT: seconds, ONE_PROCESS: 4 * seconds, DRAWN: seconds / 5}
        return {row: seconds for row in STEP_ROWS.values()} | rows

    # the medians' difference (0.5 s a step) is not what is added: the median of the pairs' differences is
    photo = {"measured_at": "2026-12-05T00:00:00+00:00", "sizes": {"sample": {"median": measured(1.0)}}}
    photo["sizes"][PHOTO] = {"median": measured(1.5)}
    photo[ADDED] = measured(0.25)
    steps = {step: {"pipeline_median_s": 2.0, "cold_start_s": 3.0} for step in STEP_ROWS}
    bench = BenchSeconds.model_validate({"steps": steps, "whole_image": {"pipeline_s": 9.0}})
    bulk = BulkSeconds.model_validate(
        {"seconds_per_image": {"worker": 5.0, "one_at_a_time": 5.1}, "cores": 2, "measured_at": "2026-12-05"}
    )
    sized, sized_bulk = at_photo_size(bench, bulk, photo, store_pictures=True)
    # each step 0.25 s more, WriteResult as measured at the photo's size, one process 1 s more
    assert {step: figures.pipeline_median_s for step, figures in sized.steps.items()} == dict.fromkeys(STEP_ROWS, 2.25)
    assert (sized.write_result_s, sized.one_process_s) == (1.5, 10.0)
    assert sized_bulk is not None and (sized_bulk.worker_s, sized_bulk.added_by_photo_s) == (6.0, 1.0)
    # with no picture stored (the default), the photo's picture is not drawn: WriteResult reads no image, and takes
    # the sample's seconds; one process adds what it added less the picture's 0.05 s
    drawn_later, drawn_later_bulk = at_photo_size(bench, bulk, photo, store_pictures=False)
    assert drawn_later.write_result_s == 1.0 and drawn_later.one_process_s == pytest.approx(9.95)
    assert drawn_later_bulk is not None and drawn_later_bulk.added_by_photo_s == pytest.approx(0.95)
    # the reports given are left as they were
    assert bench.steps["detect"].pipeline_median_s == 2.0 and bulk.worker_s == 5.0
