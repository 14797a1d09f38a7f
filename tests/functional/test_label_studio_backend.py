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
from tests.conftest import SAMPLES, phone_photo
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
def media_latency_s() -> list[float]:
    """The stand-in's seconds per file, which a test may change as it goes."""
    return [0.0]


@pytest.fixture
def media_requests() -> list[str]:
    return []


@pytest.fixture
def match_by_name() -> bool:
    return False


@pytest.fixture
def backend(
    tmp_path: Path,
    fakes: FakeModels,
    uploads: dict[str, bytes],
    answer_within_s: float,
    media_latency_s: list[float],
    media_requests: list[str],
    match_by_name: bool,
) -> Iterator[tuple[TestClient, Settings]]:
    """The API app on the fakes, its rows written to and read from a local data folder, Label Studio's media
    served by the stand-in."""
    with media_server(uploads, KEY, media_latency_s, media_requests) as label_studio:
        settings = Settings(
            data_dir=tmp_path / "data",
            label_studio_url=label_studio,
            label_studio_api_key=SecretStr(KEY),
            label_studio_answer_within_s=answer_within_s,
            label_studio_match_by_name=match_by_name,
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
    outlined = client.post("/setup", json={"project": "1.1", "schema": polygons})
    assert outlined.status_code == 200 and outlined.json()["fills"] == ["PolygonLabels 'p'"]
    unlabelled = "<View><Image name='i' value='$i'/><Polygon name='p' toName='i'/></View>"
    refused = client.post("/setup", json={"project": "1.1", "schema": unlabelled})
    message = refused.json()["error"]["message"]
    assert refused.status_code == 400 and "Polygon 'p': the models draw no unlabelled polygons" in message
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


def many_uploads(count: int) -> dict[str, bytes]:
    """``count`` pictures of their own, as Label Studio names uploads."""
    return {f"/data/upload/1/{n:08x}-photo{n}.png": picture_of(n) for n in range(count)}


def picture_of(number: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (number % 256, number // 256, 50)).save(buffer, format="PNG")
    return buffer.getvalue()


def retrieve_until_done(client: TestClient, tasks: list[dict[str, Any]], config: str = DETECTION) -> list[int]:
    """Retrieve Predictions as Label Studio repeats it: each time for the tasks still without a prediction; the
    number each call answered."""
    answered, waiting = [], tasks
    while waiting and len(answered) < 40:
        results = predict(client, waiting, config)
        answered.append(sum(1 for result in results if result))
        waiting = [task for task, result in zip(waiting, results, strict=True) if not result]
    assert not waiting, answered
    return answered


@pytest.mark.parametrize(("uploads", "answer_within_s", "media_latency_s"), [(many_uploads(40), 1.0, [0.05])])
def test_a_page_slower_to_read_than_a_call_lasts_gets_answers_at_every_retrieve_until_all_are_done(
    backend: tuple[TestClient, Settings], uploads: dict[str, bytes]
) -> None:
    client, _ = backend
    # GIVEN 40 new pictures that Label Studio serves in 50 ms each (2 s to read them all) and calls of 1 s
    tasks = [task(path, number) for number, path in enumerate(uploads)]
    # WHEN Retrieve Predictions is chosen again and again for the tasks still without predictions
    answered = retrieve_until_done(client, tasks)
    # THEN every call answers some (the models run on what they reach, nothing is read ahead of them), and all end
    assert all(answered) and sum(answered) == 40 and len(answered) > 1


@pytest.mark.parametrize(("uploads", "answer_within_s"), [(many_uploads(60), 3.0)])
def test_a_page_the_pipeline_annotated_before_is_answered_in_one_call_each_image_read_once_and_the_rows_files_never(
    backend: tuple[TestClient, Settings],
    fakes: FakeModels,
    uploads: dict[str, bytes],
    media_requests: list[str],
    media_latency_s: list[float],
) -> None:
    client, settings = backend
    tasks = [task(path, number) for number, path in enumerate(uploads)]
    first = retrieve_until_done(client, tasks)
    assert sum(first) == 60
    # GIVEN the rows of 60 pictures, whose recorded files are gone since, and the models failing from now on
    sources = run_local_query("SELECT source_uri FROM images", settings.data_dir).column(0).to_pylist()
    recorded = [Path(uri) for uri in sources]
    for path in recorded:
        path.unlink()
    fakes.detector.failure = RuntimeError("the models ran")
    # WHEN the same pictures are uploaded to another project (another prefix) and all 60 asked for in a call of
    # 3 s, while Label Studio takes 100 ms a file (6 s one after another)
    again = {path.replace("/upload/1/", "/upload/2/"): data for path, data in uploads.items()}
    uploads.update(again)
    media_requests.clear()
    media_latency_s[0] = 0.1
    results = predict(client, [task(path, number) for number, path in enumerate(again)])
    # THEN every task is answered from the rows at once, each image read once, none of the rows' files
    assert all(result and result["result"] for result in results)
    assert sorted(media_requests) == sorted(again)


def test_rows_that_lack_what_the_config_asks_for_are_not_reused_and_the_models_fill_it(
    backend: tuple[TestClient, Settings], fakes: FakeModels, uploads: dict[str, bytes]
) -> None:
    client, _ = backend
    path = next(iter(uploads))
    # GIVEN rows made for a config without a caption
    predict(client, [task(path, 1)])
    # WHEN the task is asked for by a config that also wants a caption
    with_caption = DETECTION.replace("</View>", '<TextArea name="caption" toName="image"/></View>')
    [answer] = predict(client, [task(path, 1)], with_caption)
    # THEN the models ran again and the caption is there
    assert [r["value"]["text"] for r in answer["result"] if r["type"] == "textarea"] == [["Found 1 dog."]]


@pytest.mark.parametrize(
    "uploads",
    [
        {
            "/data/upload/1/7c04a148-caf%C3%A9.png": picture(10),
            "/data/upload/2/1234abcd-caf%C3%A9.png": picture(10),
            "/data/upload/1/0badcafe-my%20photo%20%C3%A9t%C3%A9.png": picture(30),
        }
    ],
)
def test_names_label_studio_keeps_percent_encoded_are_read_as_written_and_a_task_s_odd_url_is_only_its_own(
    backend: tuple[TestClient, Settings], fakes: FakeModels
) -> None:
    client, settings = backend
    # GIVEN an upload named café.png as Label Studio keeps it, and a task whose URL holds spaces and accents as is
    tasks = [
        task("/data/upload/1/7c04a148-caf%C3%A9.png", 1),
        task("/data/upload/1/0badcafe-my photo été.png", 2),
        task("/data/upload/1/\u0000-bad.png", 3),
    ]
    # WHEN predicted
    results = predict(client, tasks)
    # THEN the first two are answered, the row under the name as it was uploaded; the bad one only gets none
    assert [bool(result) for result in results] == [True, True, False]
    sources = run_local_query("SELECT source_uri FROM images ORDER BY source_uri", settings.data_dir).column(0)
    assert sorted(Path(uri).name for uri in sources.to_pylist()) == ["café.png", "my photo été.png"]
    # AND the same picture uploaded to another project is answered from that row
    fakes.detector.failure = RuntimeError("the models ran")
    [again] = predict(client, [task("/data/upload/2/1234abcd-caf%C3%A9.png", 4)])
    assert again["result"] == results[0]["result"]


def test_two_controls_of_one_name_leave_the_second_to_people_and_every_task_is_answered(
    backend: tuple[TestClient, Settings], uploads: dict[str, bytes]
) -> None:
    client, _ = backend
    config = (
        "<View><Image name='image' value='$image'/><Choices name='scene' toName='image'><Choice value='indoors'/>"
        "<Choice value='outdoors'/></Choices><Choices name='scene' toName='image'><Choice value='day'/>"
        "<Choice value='night'/><Choice value='dusk'/></Choices></View>"
    )
    connected = client.post("/setup", json={"project": "1.1", "schema": config}).json()
    assert connected["fills"] == ["Choices 'scene' (the image)"]
    assert connected["left_to_people"] == [
        "Choices 'scene': an earlier control has this name, and a result names its control"
    ]
    results = predict(client, [task(path, n) for n, path in enumerate(uploads)], config)
    assert all(result["result"][0]["value"]["choices"] == ["indoors"] for result in results)


@pytest.mark.parametrize(
    "uploads", [{"/data/upload/1/0a1b2c3d-IMG_0001.HEIC": phone_photo(SAMPLES / "chelsea-rotated-exif.jpg")}]
)
def test_an_iphone_photo_uploaded_as_heic_is_pre_annotated_upright(backend: tuple[TestClient, Settings]) -> None:
    client, _ = backend
    [answer] = predict(client, [task("/data/upload/1/0a1b2c3d-IMG_0001.HEIC", 1)])
    [region, *_] = answer["result"]
    assert (region["original_width"], region["original_height"]) == (451, 300)


@pytest.mark.parametrize(("uploads", "match_by_name"), [(many_uploads(30), True)])
def test_matched_by_name_a_page_annotated_before_is_answered_without_reading_a_picture_of_a_name_only_one_has(
    backend: tuple[TestClient, Settings], fakes: FakeModels, uploads: dict[str, bytes], media_requests: list[str]
) -> None:
    client, _ = backend
    boxes_only = DETECTION.split('  <Choices name="scene"')[0] + "</View>"  # no whole-image choice: no pixels needed
    retrieve_until_done(client, [task(path, number) for number, path in enumerate(uploads)], boxes_only)
    # GIVEN rows of 30 pictures of their own names, and two pictures of one name (as iOS names every upload)
    uploads["/data/upload/1/aaaaaaaa-image.jpg"] = picture_of(500)
    uploads["/data/upload/1/bbbbbbbb-image.jpg"] = picture_of(501)
    named_alike = [task("/data/upload/1/aaaaaaaa-image.jpg", 90), task("/data/upload/1/bbbbbbbb-image.jpg", 91)]
    predict(client, named_alike, boxes_only)
    fakes.detector.failure = RuntimeError("the models ran")
    # WHEN the same pictures are uploaded to another project, and one more picture named image.jpg
    again = {path.replace("/upload/1/", "/upload/2/"): data for path, data in uploads.items()}
    uploads.update(again)
    media_requests.clear()
    results = predict(client, [task(path, number) for number, path in enumerate(again)], boxes_only)
    # THEN every one is answered from the rows; only the pictures of the shared name were read, to tell them apart
    assert all(result and result["result"] for result in results)
    assert sorted(media_requests) == ["/data/upload/2/aaaaaaaa-image.jpg", "/data/upload/2/bbbbbbbb-image.jpg"]
