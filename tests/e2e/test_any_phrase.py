"""Any phrase a prompt may hold works in every place it reaches: a YOLO dataset's names and the gallery's filter,
for phrases with the characters those formats use themselves. Real tiny models, the CLI as a user runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import SAMPLES
from tools.cli import app
from tools.results.query import run_local_query

pytestmark = pytest.mark.slow
PHRASES = ["cat|dog", "🐶 puppy"]  # the gallery's old separator; a character past U+FFFF


def annotate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def annotated(tmp_path_factory: pytest.TempPathFactory, tiny_settings: object) -> Path:
    """GIVEN the samples annotated with those phrases, every box kept (the tiny model's scores are random)"""
    data_dir = tmp_path_factory.mktemp("data")
    prompt = ". ".join(PHRASES) + "."
    code, output = annotate(
        "run", str(SAMPLES), "--prompt", prompt, "--profile", "tiny", "--data-dir", str(data_dir), "--no-caption",
        "--box-threshold", "0", "--text-threshold", "0",
    )  # fmt: skip
    assert code == 0, output
    labels = {row["label"] for row in run_local_query("SELECT DISTINCT label FROM detections", data_dir).to_pylist()}
    assert labels == set(PHRASES), labels
    return data_dir


def test_yolo_names_read_back_exactly_through_a_yaml_reader(annotated: Path, tmp_path: Path) -> None:
    code, output = annotate("export", "--format", "yolo", "--out", str(tmp_path / "yolo"), "--data-dir", str(annotated))

    assert code == 0, output
    names = yaml.safe_load((tmp_path / "yolo" / "data.yaml").read_text(encoding="utf-8"))["names"]
    assert sorted(names.values()) == sorted(PHRASES)


def test_the_gallery_filters_by_a_phrase_holding_its_old_separator(annotated: Path, tmp_path: Path) -> None:
    from tests.browser import chromium_page

    code, output = annotate("gallery", "--out", str(tmp_path), "--data-dir", str(annotated))
    assert code == 0, output
    having = run_local_query(
        "SELECT count(DISTINCT image_id) AS n FROM detections WHERE label = 'cat|dog'", annotated
    ).to_pylist()[0]["n"]

    with chromium_page() as (page, errors):
        page.goto((tmp_path / "index.html").as_uri())
        page.get_by_role("button", name="cat|dog", exact=True).click()
        visible = page.locator(".card:visible").count()
    assert having > 0 and visible == having and errors == []
