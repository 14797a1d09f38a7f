"""The ML backend against a real Label Studio: a project made from the `labelstudio` export's config, its own
uploads as tasks, `annotate serve`'s app connected as the backend, and the regions Label Studio stored compared
with the pipeline's rows. Label Studio is driven through its REST API (the calls label-studio-sdk makes; the SDK
pins a numpy older than ours, so it is not installed beside the project)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from pydantic import SecretStr
from typer.testing import CliRunner

from shared.serving.api import serving_app
from shared.serving.label_studio import read_label_config
from shared.settings import Settings
from tests.browser import chromium_page
from tests.conftest import REPO, SAMPLES
from tests.integration.test_label_studio_templates import shipped_templates
from tests.servers import LABEL_STUDIO_PASSWORD as PASSWORD
from tests.servers import LABEL_STUDIO_USER as USER
from tests.servers import answering, label_studio_process, serving_in_thread
from tools.cli import app
from tools.results.annotations import local_annotated_sources
from tools.results.query import run_local_query

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="session")
def label_studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Label Studio's URL and a personal access token of its first user (made as a person makes one: logged in,
    on the account page's API)."""
    with label_studio_process(tmp_path_factory.mktemp("label-studio"), USER, PASSWORD) as started:
        url = answering(started)
        yield url, personal_access_token(url)


def personal_access_token(url: str) -> str:
    with httpx.Client(base_url=url, follow_redirects=True, timeout=60) as browser:
        browser.get("/user/login/")
        login = {"email": USER, "password": PASSWORD, "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
        browser.post("/user/login/", data=login, headers={"Referer": f"{url}/user/login/"})
        made = browser.post("/api/token/", headers={"X-CSRFToken": browser.cookies["csrftoken"], "Referer": url})
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def api(url: str, token: str) -> httpx.Client:
    access = httpx.post(f"{url}/api/token/refresh/", json={"refresh": token}, timeout=60).json()["access"]
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {access}"}, timeout=300)


def uploaded_project(ls: httpx.Client, title: str, config: str, pictures: Path) -> int:
    """A new project with ``config``, each picture of the folder uploaded as a task; its id."""
    project = int(ls.post("/api/projects", json={"title": title, "label_config": config}).json()["id"])
    uploads = [(f"file{n}", (path.name, path.read_bytes())) for n, path in enumerate(sorted(pictures.iterdir()))]
    assert ls.post(f"/api/projects/{project}/import", files=uploads).status_code == 201
    return project


def retrieved_predictions(ls: httpx.Client, project: int, backend: str) -> list[dict[str, Any]]:
    """The backend connected to the project (Label Studio checks /health and /setup), every task selected and
    Retrieve Predictions chosen; the tasks."""
    connected = ls.post("/api/ml", json={"project": project, "url": backend, "title": "annotate"})
    assert connected.status_code == 201 and connected.json()["readable_state"] == "Connected", connected.text
    tasks: list[dict[str, Any]] = ls.get("/api/tasks", params={"project": project, "page_size": 1000}).json()["tasks"]
    asked = {"selectedItems": {"all": False, "included": [task["id"] for task in tasks]}}
    retrieved = ls.post("/api/dm/actions", params={"id": "retrieve_tasks_predictions", "project": project}, json=asked)
    assert retrieved.status_code == 200, retrieved.text
    return tasks


@pytest.fixture(scope="module")
def exported(tiny_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The samples annotated by the pipeline, and its `labelstudio` export: (data folder, export folder)."""
    root = tmp_path_factory.mktemp("label-studio-run")
    images, data, export = root / "images", root / "data", root / "export"
    shutil.copytree(SAMPLES, images)
    run = ["run", str(images), "--prompt", "cat. cup.", "--profile", "tiny", "--data-dir", str(data)]
    result = CliRunner().invoke(app, [*run, "--attribute", "color=black,brown,white,red"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(
        app, ["export", "--format", "labelstudio", "--out", str(export), "--data-dir", str(data)]
    )
    assert result.exit_code == 0, result.output
    return data, export


def test_a_project_from_the_export_s_config_shows_the_backend_s_pre_annotations_equal_to_the_pipeline_s_rows(
    label_studio: tuple[str, str], exported: tuple[Path, Path], tiny_settings: Settings, tmp_path: Path
) -> None:
    url, token = label_studio
    data, export = exported
    # GIVEN a Label Studio project made with the export's label config, the samples uploaded as its tasks, and a
    # task whose image Label Studio no longer has
    settings = tiny_settings.model_copy(
        update={"data_dir": tmp_path / "backend", "label_studio_url": url, "label_studio_api_key": SecretStr(token)}
    )
    with api(url, token) as ls, serving_in_thread(serving_app(settings)) as backend:
        config = (export / "label_config.xml").read_text()
        # (the config offers the run's whole vocabulary, not only the values its boxes took)
        offered = read_label_config(config).region_choices["color"]
        assert [option.text for option in offered] == ["black", "brown", "white", "red"]
        project = uploaded_project(ls, "pets", config, SAMPLES)
        missing = [{"image": f"/data/upload/{project}/gone.jpg"}]
        assert ls.post(f"/api/projects/{project}/import", json=missing).status_code == 201

        # WHEN the backend is connected (Label Studio checks /health and /setup) and asked for predictions
        tasks = retrieved_predictions(ls, project, backend)

        # THEN every readable task holds one prediction whose regions are the pipeline's rows for that image: the
        # same labels and boxes, with the class and attributes the config lists, and a score per region
        stored = {task["id"]: ls.get("/api/predictions", params={"task": task["id"]}).json() for task in tasks}
    rows = pipeline_boxes(data)
    by_name = {Path(task["data"]["image"]).name.split("-", 1)[-1]: task["id"] for task in tasks}
    for name, boxes in rows.items():
        [prediction] = stored[by_name[name]]
        regions = [r for r in prediction["result"] if r["type"] == "rectanglelabels"]
        assert [r["value"]["rectanglelabels"] for r in regions] == [[box["label"]] for box in boxes], name
        for region, box in zip(regions, boxes, strict=True):
            width, height = region["original_width"], region["original_height"]
            corners = [region["value"][k] for k in ("x", "y", "width", "height")]
            expected = [100 * box["x0"] / width, 100 * box["y0"] / height]
            expected += [100 * (box["x1"] - box["x0"]) / width, 100 * (box["y1"] - box["y0"]) / height]
            assert corners == pytest.approx(expected, abs=1e-6) and region["score"] == pytest.approx(box["score"])
        choices = {(r["id"], r["from_name"], r["choices"][0]) for r in map(flat, prediction["result"]) if r["choices"]}
        assert choices == {
            (region["id"], name, value)
            for region, box in zip(regions, boxes, strict=True)
            for name, value in [("class", box["class_label"]), ("color", box["color"])]
            if value
        }
        assert prediction["model_version"] == "annotate"
    # AND the task whose image is gone has no prediction (Label Studio asks again next time): its error did not
    # sink the others
    [gone] = [task["id"] for task in tasks if task["data"]["image"].endswith("/gone.jpg")]
    assert stored[gone] == []
    # AND a person who opens the first task sees the regions (the README's picture)
    with chromium_page() as (page, _):
        page.goto(f"{url}/user/login/")
        page.fill("input[name=email]", USER)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_load_state("networkidle")
        page.goto(f"{url}/projects/{project}/data?task={by_name['chelsea-the-cat.jpg']}")
        page.get_by_text("Regions").first.wait_for(timeout=60_000)
        page.wait_for_load_state("networkidle")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "label-studio.png"))


def flat(result: dict[str, Any]) -> dict[str, Any]:
    return {"id": result["id"], "from_name": result["from_name"], "choices": result["value"].get("choices")}


def pipeline_boxes(data: Path) -> dict[str, list[dict[str, Any]]]:
    """The detections table's boxes by the image's file name, in detection order."""
    rows = run_local_query(
        "SELECT i.source_uri, d.label, d.score, d.x0, d.y0, d.x1, d.y1, d.class_label, d.color "
        "FROM detections d JOIN images i USING (image_id, batch_id) ORDER BY i.source_uri, d.detection_index",
        data,
    ).to_pylist()
    boxes: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        boxes.setdefault(Path(row["source_uri"]).name, []).append(row)
    return boxes


@pytest.fixture(scope="module")
def a_hundred_annotated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A hundred pictures, annotated by the pipeline for the object detection template's labels: (their folder, the
    data folder)."""
    root = tmp_path_factory.mktemp("a-hundred")
    images, data = root / "images", root / "data"
    images.mkdir()
    for n in range(100):
        pixels = np.random.default_rng(n).integers(0, 255, (48, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"photo-{n:03}.png")
    run = ["run", str(images), "--prompt", "airplane. car.", "--profile", "tiny", "--data-dir", str(data)]
    result = CliRunner().invoke(app, [*run, "--no-caption"])
    assert result.exit_code == 0, result.output
    return images, data


def test_the_object_detection_template_gets_a_page_of_predictions_from_the_rows_and_evaluate_reads_the_review(
    label_studio: tuple[str, str], a_hundred_annotated: tuple[Path, Path], tiny_settings: Settings, tmp_path: Path
) -> None:
    url, token = label_studio
    images, data = a_hundred_annotated
    # GIVEN a project made from Label Studio's own "Object Detection with Bounding Boxes" template, the hundred
    # pictures uploaded as its tasks, and the backend serving the data folder the pipeline annotated them into, with
    # no detector it could load (so what it answers comes from the rows)
    config = shipped_templates()["computer-vision/object-detection-with-bounding-boxes"]
    settings = tiny_settings.model_copy(
        update={
            "data_dir": data,
            "label_studio_url": url,
            "label_studio_api_key": SecretStr(token),
            "detector_model": str(tmp_path / "no-detector-here"),
        }
    )
    backend_app = serving_app(settings, find_annotated=local_annotated_sources(data))
    with api(url, token) as ls, serving_in_thread(backend_app) as backend:
        project = uploaded_project(ls, "a page", config, images)

        # WHEN a person selects the page and chooses Retrieve Predictions
        tasks = retrieved_predictions(ls, project, backend)
        assert len(tasks) == 100

        # THEN Label Studio stored a prediction for every one of the hundred tasks, each the pipeline's rows for its
        # picture under the template's own labels
        stored = {task["id"]: ls.get("/api/predictions", params={"task": task["id"]}).json() for task in tasks}
        assert all(len(predictions) == 1 for predictions in stored.values())
        rows = pipeline_boxes(data)
        labels = {"airplane": "Airplane", "car": "Car"}
        for task in tasks:
            [prediction] = stored[task["id"]]
            name = Path(task["data"]["image"]).name.split("-", 1)[-1]
            regions = [r["value"]["rectanglelabels"] for r in prediction["result"]]
            assert regions == [[labels[box["label"]]] for box in rows.get(name, [])], name

        # AND once people reviewed them (each prediction accepted, one false box deleted), Label Studio's export is
        # scored against what the backend predicted, its uploads matched by their own names
        corrected = next(task["id"] for task in tasks if stored[task["id"]][0]["result"])
        for task in tasks:
            result = stored[task["id"]][0]["result"][1 if task["id"] == corrected else 0 :]
            assert ls.post(f"/api/tasks/{task['id']}/annotations", json={"result": result}).status_code == 201
        export = ls.get(f"/api/projects/{project}/export", params={"exportType": "JSON"})
        assert export.status_code == 200
    (tmp_path / "reviewed.json").write_text(export.text)
    evaluated = CliRunner().invoke(
        app, ["evaluate", "--truth", str(tmp_path / "reviewed.json"), "--data-dir", str(data), "--format", "json"]
    )
    assert evaluated.exit_code == 0, evaluated.output
    scores = json.loads(evaluated.output)
    boxes = sum(len(boxes) for boxes in rows.values())
    assert scores["images"] == 100 and scores["recall"] == 1.0
    assert scores["precision"] == pytest.approx((boxes - 1) / boxes)
