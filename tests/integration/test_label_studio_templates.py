"""Every labelling template Label Studio ships, read from its installed package (not copies): each the models can
fill gets predictions on a real image, which Label Studio's own SDK finds valid for that template (its control
names, its labels as it spells them); each the models cannot fill is refused in one line saying what they fill.
A Label Studio upgrade that adds or changes a template is tested by the same test."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from shared.errors import RequestRejected
from shared.serving.api import serving_app
from shared.serving.label_studio import read_label_config
from shared.settings import Settings
from tests.conftest import REPO, SAMPLES

pytestmark = pytest.mark.slow

LABEL_STUDIO_PYTHON = REPO / ".venv-labelstudio" / "bin" / "python"
# The computer-vision templates of Label Studio 1.23.2 the models fill; any other is refused, or filled and checked
FILLED_COMPUTER_VISION = {
    "image-captioning",
    "image-classification",
    "medical-image-classification-with-bboxes",
    "object-detection-with-bounding-boxes",
    "semantic-segmentation-with-masks",
    "semantic-segmentation-with-polygons",
}
# Label Studio's own check of a prediction against a config (label_studio_sdk, installed beside Label Studio)
VALIDATE = """
import json, sys
from label_studio_sdk.label_interface import LabelInterface
for line in sys.stdin:
    asked = json.loads(line)
    print(json.dumps(LabelInterface(asked["config"]).validate_prediction(asked["prediction"], return_errors=True)))
"""


def shipped_templates() -> dict[str, str]:
    """Each template's label config, by its group and folder, from the installed Label Studio package."""
    [package] = (REPO / ".venv-labelstudio" / "lib").glob("python3*/site-packages/label_studio/annotation_templates")
    return {
        str(path.parent.relative_to(package)): yaml.safe_load(path.read_text())["config"]
        for path in sorted(package.glob("*/*/config.yml"))
    }


def label_studio_finds(configs_and_predictions: list[tuple[str, dict[str, Any]]]) -> list[list[str]]:
    """Label Studio's SDK's errors for each prediction against its config (none: valid)."""
    asked = "".join(json.dumps({"config": c, "prediction": p}) + "\n" for c, p in configs_and_predictions)
    checked = subprocess.run(
        [str(LABEL_STUDIO_PYTHON), "-c", VALIDATE], input=asked, capture_output=True, text=True, timeout=300
    )
    assert checked.returncode == 0, checked.stderr[-2000:]
    return [json.loads(line) for line in checked.stdout.splitlines()]


# Label Studio's own decoder of a brush result's RLE (label_studio_sdk's converter)
DECODE_BRUSH = """
import json, sys
import numpy as np
from label_studio_sdk.converter.brush import decode_rle
for line in sys.stdin:
    result = json.loads(line)
    pixels = decode_rle(result["value"]["rle"]).reshape(result["original_height"], result["original_width"], 4)
    print(json.dumps(int((pixels[..., 3] > 0).sum())))
"""


def brush_masks_decode(results: list[dict[str, Any]]) -> bool:
    """Whether Label Studio's SDK decodes each brush result to a mask of the picture's size with pixels in it."""
    decoded = subprocess.run(
        [str(LABEL_STUDIO_PYTHON), "-c", DECODE_BRUSH],
        input="".join(json.dumps(result) + "\n" for result in results),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert decoded.returncode == 0, decoded.stderr[-2000:]
    return bool(results) and all(int(line) > 0 for line in decoded.stdout.splitlines())


def test_every_template_label_studio_ships_is_filled_in_its_own_names_or_refused_in_one_line(
    tiny_settings: Settings,
) -> None:
    templates = shipped_templates()
    assert len(templates) > 50  # the package's templates were found, not an empty folder
    photo = "data:image/jpeg;base64," + base64.b64encode((SAMPLES / "chelsea-the-cat.jpg").read_bytes()).decode()
    filled, refused = {}, {}
    for name, config in templates.items():
        try:
            filled[name] = read_label_config(config)
        except RequestRejected as error:
            refused[name] = str(error)
    # GIVEN every template the models fill, connected and asked for a prediction of the same photo
    checked = []
    with TestClient(serving_app(tiny_settings), base_url="http://127.0.0.1") as backend:
        for name, project in filled.items():
            config = templates[name]
            assert backend.post("/setup", json={"project": "1.1", "schema": config}).status_code == 200, name
            task = {"id": 1, "data": {project.image_key: photo}}
            answered = backend.post("/predict", json={"tasks": [task], "label_config": config})
            [prediction] = answered.json()["results"]
            # THEN each gets a prediction whose results are all in the controls the models fill, the whole image's
            # choices and the caption always among them
            filled_controls = {fill.split("'")[1] for fill in project.fills()}
            always = {choices.name for choices in project.image_choices} | {project.caption} - {None}
            assert always <= {result["from_name"] for result in prediction["result"]} <= filled_controls, name
            checked.append((name, config, prediction))
    # AND Label Studio's own SDK finds every one valid for its template
    errors = label_studio_finds([(config, prediction) for _, config, prediction in checked])
    assert {name: found for (name, _, _), found in zip(checked, errors, strict=True) if found} == {}
    # AND the templates that take boxes got some (the check saw regions, not only empty predictions)
    assert any(r["type"] == "rectanglelabels" for _, _, p in checked for r in p["result"])
    # AND the segmentation templates got masks and outlines, each mask Label Studio's SDK decodes to one in its box
    shapes = [r for _, _, p in checked for r in p["result"] if r["type"] in ("brushlabels", "polygonlabels")]
    assert {r["type"] for r in shapes} == {"brushlabels", "polygonlabels"}
    assert brush_masks_decode([r for r in shapes if r["type"] == "brushlabels"])
    assert {name.split("/")[1] for name in filled if name.startswith("computer-vision/")} == FILLED_COMPUTER_VISION
    # AND every other template is refused in one line: why, and (where nothing is left) what the models fill
    for name, reason in refused.items():
        assert "\n" not in reason, name
        assert "Image" in reason or "they fill RectangleLabels" in reason, (name, reason)


def test_with_a_vision_language_model_the_question_answering_and_captioning_templates_are_filled_validly(
    tiny_settings: Settings,
) -> None:
    from tools.models.tiny_models import build_vision_captioner

    # GIVEN the backend on the tiny vision-language model (annotate serve --caption-vision)
    settings = tiny_settings.model_copy(update={"caption_vision": True, "caption_max_tokens": 8})
    build_vision_captioner(settings)
    templates = shipped_templates()
    vqa = templates["computer-vision/visual-question-answering"]
    captioning = templates["computer-vision/image-captioning"]
    photo = "data:image/jpeg;base64," + base64.b64encode((SAMPLES / "chelsea-the-cat.jpg").read_bytes()).decode()
    questions = {"q1": "What animal is this?", "q2": "What color is it?", "q3": "Where is it?", "q4": ""}
    with TestClient(serving_app(settings), base_url="http://127.0.0.1") as backend:
        connected = backend.post("/setup", json={"project": "1.1", "schema": vqa}).json()
        # WHEN Label Studio's Visual Question Answering task (its image and its questions) is asked for
        answered = backend.post(
            "/predict", json={"tasks": [{"id": 1, "data": {"image": photo, **questions}}], "label_config": vqa}
        )
        [answers] = answered.json()["results"]
        [caption] = backend.post(
            "/predict", json={"tasks": [{"id": 2, "data": {"captioning": photo}}], "label_config": captioning}
        ).json()["results"]
    # THEN each question the task holds is answered in its own TextArea; the empty one is not
    assert connected["fills"] == [f"TextArea 'answer{n}' (answers Text 'q{n}')" for n in (1, 2, 3, 4)]
    assert [(r["from_name"], r["to_name"]) for r in answers["result"]] == [
        ("answer1", "q1"),
        ("answer2", "q2"),
        ("answer3", "q3"),
    ]
    assert all(r["value"]["text"][0] for r in answers["result"])
    assert [r["type"] for r in caption["result"]] == ["textarea"]
    # AND Label Studio's own SDK finds both valid for their templates
    assert label_studio_finds([(vqa, answers), (captioning, caption)]) == [[], []]


def test_the_export_fills_a_project_s_own_config(tmp_path: Path, tiny_settings: Settings) -> None:
    """`annotate export --format labelstudio --label-config FILE`: tasks in the names of the user's own project,
    valid for it by Label Studio's SDK."""
    from typer.testing import CliRunner

    from tools.cli import app

    config = shipped_templates()["computer-vision/object-detection-with-bounding-boxes"]
    config = config.replace('value="Airplane"', 'value="Cat"')  # a label the samples hold
    (tmp_path / "config.xml").write_text(config)
    data, out = tmp_path / "data", tmp_path / "ls"
    run = ["run", str(SAMPLES), "--prompt", "cat. car.", "--profile", "tiny", "--data-dir", str(data), "--no-caption"]
    assert CliRunner().invoke(app, run).exit_code == 0
    exported = ["export", "--format", "labelstudio", "--out", str(out), "--data-dir", str(data)]
    result = CliRunner().invoke(app, [*exported, "--label-config", str(tmp_path / "config.xml")])
    assert result.exit_code == 0, result.output
    assert (out / "label_config.xml").read_text() == config
    tasks = json.loads((out / "tasks.json").read_text())
    predictions = [prediction for task in tasks for prediction in task["predictions"]]
    assert all(set(task["data"]) == {"image"} for task in tasks)
    assert label_studio_finds([(config, prediction) for prediction in predictions]) == [[]] * len(predictions)
    labels = {r["value"]["rectanglelabels"][0] for p in predictions for r in p["result"]}
    assert labels <= {"Cat", "Car"} and labels
