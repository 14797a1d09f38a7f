"""annotate cost's bytes (tools/bench/storage.py) against cases computed by hand, on the real samples."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from shared.contracts import PictureFormat
from tests.conftest import REPO
from tools.bench.cost_inputs import SCENARIOS, BenchSeconds, BulkSeconds, load_prices
from tools.bench.cost_lanes import bulk_jobs, bulk_task_hours
from tools.bench.storage import (
    BytesPerImage,
    measured_bytes_per_image,
    network_paths,
    picture_share,
    storage_month,
)

PRICES = load_prices()
_, STEADY, BURSTS = SCENARIOS
STEPS = ("detect", "classify", "tag", "caption")
BENCH_REPORT = {
    "steps": {step: {"pipeline_median_s": 1.0, "cold_start_s": 3.0} for step in STEPS},
    "whole_image": {"pipeline_s": 4.0},
}
BULK_REPORT = {"seconds_per_image": {"worker": 4.0}, "cores": 2, "measured_at": "2026-12-01T00:00:00+00:00"}
BENCH, BULK = BenchSeconds.model_validate(BENCH_REPORT), BulkSeconds.model_validate(BULK_REPORT)
SAMPLE = REPO / "samples" / "chelsea-the-cat.jpg"


def test_an_image_s_bytes_are_its_file_s_and_its_drawn_picture_s_per_pixel_scaled_to_the_photo() -> None:
    # GIVEN one sample (451 x 300 pixels)
    with Image.open(SAMPLE) as opened:
        width, height = opened.size
    # WHEN its bytes are measured for a 12 MP photo, with the picture as WriteResult writes it and as a PNG
    measured = measured_bytes_per_image([SAMPLE], megapixels=12)
    as_png = measured_bytes_per_image([SAMPLE], megapixels=12, picture_format=PictureFormat.PNG)
    # THEN the source is the file's bytes per pixel, at 12 MP
    assert measured.source == pytest.approx(SAMPLE.stat().st_size / (width * height) * 12e6)
    # AND the picture is a JPEG about the size of the JPEG it was drawn on; its PNG far larger, under raw RGB
    assert measured.source / 2 < measured.picture < 2 * measured.source
    assert 3 * measured.source < as_png.picture < 3 * 12e6


def test_a_steady_month_keeps_30_days_of_drops_31_of_pictures_and_a_year_of_documents() -> None:
    per_image = BytesPerImage(source=2e6, picture=10e6, embedding=3_000, document=10_000, tables=17_000)
    parts = storage_month(per_image, PRICES, STEADY, store_pictures=True)
    # 17,000 images a day: 30 days of 2 MB drops (InputRetentionDays), 30 days and the noncurrent day of 10 MB
    # pictures (PictureRetentionDays, ExpirePictures' NoncurrentDays), 12 months of 30 kB documents, rows, embeddings
    assert parts["dropped images"] == pytest.approx(17_000 * 30 * 2e6 / 1e9 * 0.023)
    assert parts["pictures"] == pytest.approx(17_000 * 31 * 10e6 / 1e9 * 0.023)
    assert parts["documents and tables"] == pytest.approx(510_000 * 12 * 30_000 / 1e9 * 0.023)
    # AND a picture at most 2,048 px on its longest side keeps 2048 x 1536 of a 4:3 12 MP photo's pixels
    assert picture_share(2048) == pytest.approx(2048 * 1536 / 12e6)
    smaller = storage_month(per_image, PRICES, STEADY, picture_max_side=2048, store_pictures=True)
    assert smaller["pictures"] == pytest.approx(parts["pictures"] * 2048 * 1536 / 12e6)
    # AND as deployed (StorePictures=false) no picture is kept: it is drawn when looked at
    assert storage_month(per_image, PRICES, STEADY)["pictures"] == 0.0
    assert picture_share(0) == picture_share(8000) == 1.0


def test_an_embedding_is_its_float32_values_in_parquet_and_a_search_scans_the_table() -> None:
    from tools.bench.storage import embedding_bytes_per_image, search_line

    # float32 values barely compress: 768 of them are about 3 kB, with the row's keys
    per_image, in_document = embedding_bytes_per_image(768, images=200)
    assert 0.85 * 768 * 4 < per_image < 1.15 * 768 * 4
    assert embedding_bytes_per_image(512, images=200)[0] < per_image
    # in the indented document a value a line, each at most float32's 9 digits: under 20 bytes (float64's 17: 28)
    assert 768 * 12 < in_document < 768 * 20
    # a million images' embeddings at 3 kB: 3 GB scanned, at $5 a TB
    line = search_line(BytesPerImage(source=0, picture=0, embedding=3_000, document=10_000), PRICES)
    assert "scans 3.00 GB on Athena, $0.0150 a query" in line


def test_the_bulk_lane_s_network_paths_match_the_hand_computation() -> None:
    per_image = BytesPerImage(source=2e6, picture=10e6, embedding=3_000, document=10_000, tables=17_000)
    public, nat, nat_and_endpoint, endpoints, dual_stack = network_paths(BENCH, BULK, PRICES, per_image, 1_000_000)
    # Public subnets: each task's address for its hours
    assert public.per_images == pytest.approx(bulk_task_hours(1_000_000, BENCH, BULK) * 0.005)
    assert public.fixed_month == 0
    # Through a NAT: each task's image and models (1.3 + 2 GB) and each image's 12.03 MB, at $0.045 a GB, and a NAT
    # gateway's hours in each of two zones
    jobs, _ = bulk_jobs(1_000_000)
    assert nat.per_images == pytest.approx((jobs * 3.3 + 1_000_000 * 12.03e6 / 1e9) * 0.045)
    assert nat.fixed_month == pytest.approx(2 * 0.045 * 720)
    # With the S3 endpoint those bytes are free; without a NAT, three interface endpoints in two zones
    assert nat_and_endpoint.per_images == endpoints.per_images == 0
    assert endpoints.fixed_month == pytest.approx(3 * 2 * 0.01 * 720)
    # IPv6 through an egress-only gateway and S3 through its endpoint: nothing a task, nothing a month
    assert dual_stack.per_images == dual_stack.fixed_month == 0


def test_annotate_cost_prices_storage_and_the_bulk_lane_s_network(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from tools.cli import app

    (tmp_path / "bench.json").write_text(json.dumps(BENCH_REPORT))
    (tmp_path / "bulk.json").write_text(json.dumps(BULK_REPORT))
    result = CliRunner().invoke(app, ["cost", "--bench", str(tmp_path / "bench.json"), "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "cost.md").read_text()
    assert "| steady: 17,000 a day | $" in report and "stored at PictureMaxSide=2048" in report
    assert "| private subnets through a NAT gateway | $" in report


def test_a_picture_downscaled_to_its_max_side_keeps_its_boxes_where_they_were() -> None:
    from shared.contracts import Box, Detection
    from shared.storage.render import draw_detections

    image = Image.new("RGB", (400, 200), "white")
    box = Detection(label="dog", score=0.9, box=Box(x0=100, y0=100, x1=300, y1=180))
    # WHEN drawn at its own size and at 100 px on its longest side (lossless, to compare pixels)
    full = Image.open(io.BytesIO(draw_detections(image, [box], picture_format=PictureFormat.PNG)))
    small = Image.open(io.BytesIO(draw_detections(image, [box], max_side=100, picture_format=PictureFormat.PNG)))
    # THEN the small one is a quarter of each side, its box's corner a quarter as far, in the box's color
    assert (full.size, small.size) == ((400, 200), (100, 50))
    assert full.getpixel((100, 150)) == small.getpixel((25, 37)) != (255, 255, 255)
    # AND a max side above the image's own changes nothing
    assert draw_detections(image, [box], max_side=1000) == draw_detections(image, [box])
