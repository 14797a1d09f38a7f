"""Label Studio's ML backend routes on fake models and a stand-in for Label Studio's media: every task of a call
gets its answer, in order, in the config's names; one bad task is its own; images annotated before are answered
from their rows; a call answers within its time and leaves the rest for the next."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from PIL import Image
from pydantic import SecretStr

from shared.contracts import Box, Detection
from shared.pipeline.dependencies import Dependencies, Step
from shared.serving.api import create_app
from shared.serving.calls import rows_in_process
from shared.settings import Settings
from shared.storage.objects import store_for
from tests.fakes import FakeDetector, FakeModels
from tests.servers import media_server
from tools.results.annotations import local_annotated_sources
from tools.results.query import run_local_query

DETECTION = """<View>
  <Image name="image" value="$image"/>
  <RectangleLabels name="label" toName="image"><Label value="Dog"/><Label value="Coffee Cup"/></RectangleLabels>
  <Choices name="Coat" toName="image" perRegion="true"><Choice value="kind of dog"/></Choices>
  <Choices name="scene" toName="image"><Choice value="indoors"/><Choice value="outdoors"/></Choices>
</View>"""
DOG = Detection(label="dog", score=0.9, box=Box(x0=4, y0=4, x1=40, y1=30))
KEY = "legacy-key"


def picture(shade: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (shade, 100, 50)).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass
class SlowDetector(FakeDetector):
    seconds: float = 0.0

    def detect(self, image: Image.Image, phrases: list[str], box_threshold: float, text_threshold: float) -> Any:
        time.sleep(self.seconds)
        return super().detect(image, phrases, box_threshold, text_threshold)


@pytest.fixture
def fakes() -> FakeModels:
    return FakeModels(detector=SlowDetector([DOG]))


@pytest.fixture
def uploads() -> dict[str, bytes]:
    return {f"/data/upload/1/0000000{n}-photo{n}.png": picture(20 * n) for n in range(5)}


@pytest.fixture
def answer_within_s() -> float:
    return 80.0


@pytest.fixture
def backend(
    tmp_path: Path, fakes: FakeModels, uploads: dict[str, bytes], answer_within_s: float
) -> Iterator[tuple[TestClient, Settings]]:
    """The API app on the fakes, its rows written to and read from a local data folder, Label Studio's media
    served by the stand-in."""
    with media_server(uploads, KEY) as label_studio:
        settings = Settings(
            data_dir=tmp_path / "data",
            label_studio_url=label_studio,
            label_studio_api_key=SecretStr(KEY),
            label_studio_answer_within_s=answer_within_s,
        )

        def dependencies_of(step: Step) -> Dependencies:
            return replace(fakes.dependencies(step), store_for=store_for)  # the rows go where the tables are

        app = create_app(
            settings,
            dependencies_of,
            rows_in_process(dependencies_of),
            find_annotated=local_annotated_sources(settings.data_dir),
        )
        with TestClient(app, base_url="http://127.0.0.1") as client:
            yield client, settings


def predict(client: TestClient, tasks: list[Any], config: str = DETECTION) -> list[Any]:
    answered = client.post("/predict", json={"tasks": tasks, "label_config": config, "project": "1.1"})
    assert answered.status_code == 200, answered.text
    results: list[Any] = answered.json()["results"]
    assert len(results) == len(tasks)
    return results


def task(path: str, number: int) -> dict[str, Any]:
    return {"id": number, "data": {"image": path}}


def test_setup_says_what_the_models_fill_and_refuses_a_config_they_fill_nothing_of_in_one_line(
    backend: tuple[TestClient, Settings],
) -> None:
    client, _ = backend
    connected = client.post("/setup", json={"project": "1.1", "schema": DETECTION})
    assert connected.status_code == 200 and connected.json() == {
        "model_version": "annotate",
        "fills": ["RectangleLabels 'label'", "Choices 'Coat' (per box)", "Choices 'scene' (the image)"],
        "left_to_people": [],
    }
    polygons = (
        "<View><Image name='i' value='$i'/><PolygonLabels name='p' toName='i'><Label value='a'/></PolygonLabels></View>"
    )
    refused = client.post("/setup", json={"project": "1.1", "schema": polygons})
    message = refused.json()["error"]["message"]
    assert refused.status_code == 400 and "PolygonLabels 'p': the models draw no polygons" in message
    assert "\n" not in message


def test_every_task_gets_its_own_answer_in_the_config_s_names_and_a_bad_one_only_its_own(
    backend: tuple[TestClient, Settings], uploads: dict[str, bytes]
) -> None:
    client, settings = backend
    first = next(iter(uploads))
    # GIVEN a good task between one whose data is not an object and one whose image Label Studio no longer has
    tasks = [{"id": 1, "data": "photo.png"}, task(first, 2), task("/data/upload/1/gone.png", 3), 7]
    # WHEN Label Studio asks for their predictions
    results = predict(client, tasks)
    # THEN the bad tasks get no prediction (Label Studio stores none, and asks again next time), the good one its
    # regions under the config's label and per-region choice, and the whole image's choice
    assert [bool(result) for result in results] == [False, True, False, False]
    regions = results[1]["result"]
    assert [(r["from_name"], r["value"].get("rectanglelabels") or r["value"]["choices"]) for r in regions] == [
        ("label", ["Dog"]),
        ("Coat", ["kind of dog"]),
        ("scene", ["indoors"]),
    ]
    assert results[1]["model_version"] == "annotate" and results[1]["score"] == pytest.approx(0.9)
    # AND what the models found was recorded as any run's rows, under the upload's own name
    [row] = run_local_query("SELECT source_uri, status, prompt FROM images", settings.data_dir).to_pylist()
    assert row["source_uri"].endswith("/photo0.png") and (row["status"], row["prompt"]) == (
        "succeeded",
        "dog. coffee cup.",
    )


def test_images_annotated_before_are_answered_from_their_rows_without_the_models(
    backend: tuple[TestClient, Settings], fakes: FakeModels, uploads: dict[str, bytes]
) -> None:
    client, _ = backend
    paths = list(uploads)
    [before] = predict(client, [task(paths[0], 1)])
    # GIVEN the models failing from now on
    fakes.detector.failure = RuntimeError("the models ran")
    # WHEN the same task is asked for again, and the same picture uploaded again to another project
    again = {**uploads, "/data/upload/2/abcdef01-photo0.png": uploads[paths[0]]}
    uploads.update(again)
    results = predict(client, [task(paths[0], 1), task("/data/upload/2/abcdef01-photo0.png", 9), task(paths[1], 2)])
    # THEN both are answered from the rows: the same regions; the picture never annotated gets none
    assert results[0] == before and results[1]["result"] == before["result"] and results[2] == []
    # AND a file of the same name with other content is not taken for it
    uploads["/data/upload/3/abcdef02-photo0.png"] = uploads[paths[3]]
    assert predict(client, [task("/data/upload/3/abcdef02-photo0.png", 5)]) == [[]]


@pytest.mark.parametrize("answer_within_s", [1.0])
def test_a_call_runs_the_models_only_while_its_time_lasts_and_answers_from_rows_whatever_the_time(
    backend: tuple[TestClient, Settings], fakes: FakeModels, uploads: dict[str, bytes]
) -> None:
    client, _ = backend
    paths = list(uploads)
    predict(client, [task(paths[4], 1)])  # annotated before
    # GIVEN models that take 1.5 s an image, and a call that may run them for 1 s
    assert isinstance(fakes.detector, SlowDetector)
    fakes.detector.seconds = 1.5
    # WHEN three new images are asked for, and the one annotated before, last
    results = predict(client, [task(paths[n], n) for n in (1, 2, 3, 4)])
    # THEN the first new one runs the models, the other two wait for the next call, and the last is answered
    assert [bool(result) for result in results] == [True, False, False, True]


def test_a_page_of_more_tasks_than_a_hundred_gets_an_answer_for_each(
    backend: tuple[TestClient, Settings], uploads: dict[str, bytes]
) -> None:
    client, _ = backend
    first = next(iter(uploads))
    results = predict(client, [task(first, n) for n in range(150)])
    assert all(result and result["result"] for result in results)
