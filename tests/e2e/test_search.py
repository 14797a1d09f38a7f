"""annotate search and annotate duplicates on images annotated through the workflow, with the real tiny CLIP."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from shared.settings import Settings, use_settings
from tests.conftest import SAMPLES
from tools.cli import app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def annotated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The samples and a resized, re-encoded copy of the cat (a JPEG at two thirds of its size, quality 70),
    annotated by `annotate run`, the boxes' embeddings kept too."""
    images = tmp_path_factory.mktemp("images")
    for sample in SAMPLES.iterdir():
        shutil.copy(sample, images / sample.name)
    with Image.open(SAMPLES / "chelsea-the-cat.jpg") as cat:
        cat.resize((cat.width * 2 // 3, cat.height * 2 // 3)).save(images / "cat-copy.jpg", quality=70)
    data_dir = tmp_path_factory.mktemp("data")
    arguments = [
        "run",
        str(images),
        "--prompt",
        "cat. cup.",
        "--profile",
        "tiny",
        "--no-caption",
        "--embeddings",
        "boxes",
    ]
    result = CliRunner().invoke(app, [*arguments, "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    return data_dir


def _json(*arguments: str) -> list:
    result = CliRunner().invoke(app, [*arguments, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_an_image_searched_like_itself_ranks_first_at_one(annotated: Path) -> None:
    # the rows name the model that embedded them (the tiny profile's): the search takes it, no --profile again
    cat = str(SAMPLES / "chelsea-the-cat.jpg")
    hits = _json("search", "--like", cat, "--data-dir", str(annotated))
    assert hits[0]["source_uri"].endswith("/chelsea-the-cat.jpg") and hits[0]["score"] == pytest.approx(1, abs=1e-5)
    assert len(hits) == 4 and [hit["score"] for hit in hits] == sorted((hit["score"] for hit in hits), reverse=True)
    assert all(hit["labels"] for hit in hits)  # each hit says what was found in it


def test_a_box_s_crop_searched_like_itself_ranks_first_among_the_boxes(
    annotated: Path, tmp_path: Path, tiny_settings: Settings
) -> None:
    from shared.contracts import Box
    from shared.pipeline.crops import crop_boxes
    from shared.storage.images import load_image
    from shared.storage.objects import store_for
    from tools.results.query import run_local_query

    # GIVEN a box of the cat's, cropped from the image as Tag crops it, saved as a picture of its own
    [box] = run_local_query(
        "SELECT d.source_uri, d.detection_index, d.x0, d.y0, d.x1, d.y1 FROM box_embeddings b "
        "JOIN detections d USING (image_id, batch_id, detection_index) "
        "WHERE d.source_uri LIKE '%/chelsea-the-cat.jpg' ORDER BY d.detection_index LIMIT 1",
        annotated,
    ).to_pylist()
    image = load_image(box["source_uri"], store_for, tiny_settings.image_limits).pixels
    corners = {name: box[name] for name in ("x0", "y0", "x1", "y1")}
    [crop] = crop_boxes(image, [Box(**corners)], tiny_settings.crop_margin)
    assert not isinstance(crop, str)
    crop.save(tmp_path / "crop.png")
    # WHEN the boxes are searched like it, THEN that box ranks first, at 1
    arguments = ["--boxes", "--profile", "tiny", "--data-dir", str(annotated)]
    hits = _json("search", "--like", str(tmp_path / "crop.png"), *arguments)
    assert (hits[0]["source_uri"], hits[0]["detection_index"]) == (box["source_uri"], box["detection_index"])
    assert hits[0]["score"] == pytest.approx(1, abs=1e-5) and hits[0]["label"]
    assert len({(hit["source_uri"], hit["detection_index"]) for hit in hits}) == len(hits) > 1
    # AND a --where on the box's own columns, unqualified, keeps its boxes only
    cats = _json("search", "a cat", "--where", "label = 'cat'", *arguments)
    assert cats and {hit["label"] for hit in cats} == {"cat"}


def test_a_text_s_vector_is_clip_s_text_tower_output_as_torch_computes_it(tiny_settings: Settings) -> None:
    from tools.models.torch_models import load_torch_tagger
    from tools.results.search import text_vector

    query = text_vector("a cat on a sofa", use_settings(tiny_settings))
    reference = load_torch_tagger(tiny_settings.describe).encode_text(["a cat on a sofa"])[0]
    assert query.model == "tiny:clip" and query.vector.dtype == np.float32
    assert query.vector == pytest.approx(reference / np.linalg.norm(reference), abs=1e-5)


def test_a_resized_re_encoded_copy_is_its_duplicate_and_different_images_are_not(annotated: Path) -> None:
    # the tiny random-weight CLIP puts different images near each other: 0.999 separates them (search.py says so)
    groups = _json("duplicates", "--threshold", "0.999", "--data-dir", str(annotated))
    names = [sorted(Path(source).name for source in group) for group in groups]
    assert names == [["cat-copy.jpg", "chelsea-rotated-exif.jpg", "chelsea-the-cat.jpg"]]


def test_bad_searches_get_one_line_and_exit_2(annotated: Path) -> None:
    runner, data = CliRunner(), ["--profile", "tiny", "--data-dir", str(annotated)]
    for arguments, said in (
        (["search", "  ", *data], "the search text is empty"),
        (["search", "a cat", "--where", "labl = 1", *data], "--where 'labl = 1': Binder Error"),
        (["search", "--like", str(annotated / "missing.jpg"), *data], "missing.jpg does not exist"),
        (["search", "--like", str(SAMPLES / "coffee.webp"), "a cup", *data], "a text, or --like an image"),
        (["search", "--like", "s3://no-such-bucket/cat.jpg", *data], "s3://no-such-bucket/cat.jpg"),
    ):
        result = runner.invoke(app, arguments)
        assert result.exit_code == 2 and said in result.output, (arguments, result.output)


def test_the_label_studio_export_can_keep_one_image_of_each_group_and_the_hits_make_a_gallery(
    annotated: Path, tmp_path: Path
) -> None:
    # WHEN exported for Label Studio with one image of each group of near-duplicates (copies at 0.999, as above)
    out_dir = tmp_path / "ls"
    arguments = ["export", "--format", "labelstudio", "--out", str(out_dir), "--data-dir", str(annotated)]
    result = CliRunner().invoke(app, [*arguments, "--one-per-group", "--threshold", "0.999"])
    assert result.exit_code == 0, result.output
    # THEN the cat's two copies are left out: the coffee and the first of the cat's group remain
    tasks = json.loads((out_dir / "tasks.json").read_text())
    assert "2 near-duplicates left out" in result.output and len(tasks) == 2
    # AND where the group's first is not exported (outside --where), one of the others is kept in its place
    only_copies = "source_uri NOT LIKE '%/cat-copy.jpg'"
    second = ["export", "--format", "labelstudio", "--out", str(tmp_path / "ls2"), "--data-dir", str(annotated)]
    result = CliRunner().invoke(app, [*second, "--where", only_copies, "--one-per-group", "--threshold", "0.999"])
    assert result.exit_code == 0, result.output
    kept = [Path(task["data"]["image"]).name for task in json.loads((tmp_path / "ls2" / "tasks.json").read_text())]
    assert "1 near-duplicates left out" in result.output and len(kept) == 2 and "coffee.webp" in kept
    # AND a search's hits, written as a gallery page, come in the ranking's order
    gallery = tmp_path / "hits"
    like = ["search", "--like", str(SAMPLES / "coffee.webp"), "--limit", "2", "--profile", "tiny"]
    first, second = (Path(hit["source_uri"]).name for hit in _json(*like, "--data-dir", str(annotated)))
    result = CliRunner().invoke(app, [*like, "--data-dir", str(annotated), "--gallery", str(gallery)])
    assert result.exit_code == 0, result.output
    page = (gallery / "index.html").read_text()
    assert first == "coffee.webp" and page.index(first) < page.index(second)
