"""The synchronous API on real tiny models: OpenAI's own client for chat, models and images; httpx for annotations;
hostile inputs each answered with its status and OpenAI's error shape; the key, the queue and unavailable models.

One piece: every test here calls the one server its module starts, with the models loaded once; split, each file would
load them again (tests run a file per worker).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image
from pydantic import SecretStr
from typer.testing import CliRunner

from shared.errors import ModelUnavailable
from shared.pipeline.dependencies import Dependencies, Step, build_dependencies
from shared.pipeline.one_image import annotate_image
from shared.serving.api import create_app, serving_app
from shared.serving.calls import DependenciesOf, rows_in_process
from shared.settings import Settings
from tests.conftest import SAMPLES, encode
from tests.servers import serving_in_thread
from tools.cli import app as cli
from tools.results.query import run_local_query

pytestmark = pytest.mark.slow
CAT = (SAMPLES / "chelsea-the-cat.jpg").read_bytes()


@pytest.fixture(scope="module")
def api_settings(tiny_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return tiny_settings.model_copy(
        update={"data_dir": tmp_path_factory.mktemp("api-data"), "api_max_body_bytes": 1_000_000}
    )


@pytest.fixture(scope="module")
def models(api_settings: Settings) -> DependenciesOf:
    return functools.partial(build_dependencies, settings=api_settings)


@pytest.fixture(scope="module")
def base_url(api_settings: Settings) -> Iterator[str]:
    with serving_in_thread(serving_app(api_settings)) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=120) as session:
        yield session


def _picture(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def test_the_openai_client_embeds_texts_and_images_as_the_pipeline_does(
    client: openai.OpenAI, models: DependenciesOf
) -> None:
    import numpy as np

    from shared.pipeline.dependencies import Step
    from shared.storage.images import decode_image

    tagger = models(Step.TAG).tagger
    assert tagger is not None and tagger.name in [model.id for model in client.models.list()]
    # WHEN OpenAI's client embeds a text and an image given as a data URL (its default answer: base64 of float32)
    data_url = "data:image/jpeg;base64," + base64.b64encode(CAT).decode()
    answer = client.embeddings.create(model=tagger.name, input=["a cat on a sofa", data_url])
    text, image = (np.array(item.embedding) for item in answer.data)
    # THEN each is the Tag model's vector, as the embeddings table holds them; floats too, where asked
    assert text == pytest.approx(tagger.embed_texts(["a cat on a sofa"])[0], abs=1e-6)
    assert image == pytest.approx(tagger.embed_images([decode_image(CAT, max_pixels=10**8).pixels])[0], abs=1e-6)
    floats = client.embeddings.create(model=tagger.name, input="a cat on a sofa", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(text.tolist(), abs=1e-6) and answer.model == tagger.name
    # AND dimensions of the model's own length are taken, as OpenAI takes them
    own = client.embeddings.create(model=tagger.name, input="a cat on a sofa", dimensions=len(text))
    assert len(own.data[0].embedding) == len(text)
    # AND a model it does not have is not found; a length of its own, an empty text and a broken image are each a 400
    with pytest.raises(openai.NotFoundError, match="text-embedding-3-small"):  # as OpenAI answers a model it lacks
        client.embeddings.create(model="text-embedding-3-small", input="a cat")
    for arguments, said in (
        ({"model": tagger.name, "input": "a cat", "dimensions": 8}, "dimensions"),
        ({"model": tagger.name, "input": ""}, "a text is 1 to"),
        ({"model": tagger.name, "input": "data:image/png;base64,iVBORw0K"}, "image"),
    ):
        with pytest.raises(openai.BadRequestError, match=said):
            client.embeddings.create(**arguments)


def test_only_the_clip_model_that_loaded_is_listed_and_embeds(api_settings: Settings) -> None:
    from fastapi.testclient import TestClient

    # GIVEN a first CLIP model that does not load, then one that does
    loaded = api_settings.tagger_models[0]
    settings = api_settings.model_copy(update={"tagger_models": ["no-such-org/no-such-clip", loaded]})
    with TestClient(serving_app(settings), base_url="http://127.0.0.1") as http:
        listed = [model["id"] for model in http.get("/v1/models").json()["data"]]
        refused = http.post("/v1/embeddings", json={"model": "no-such-org/no-such-clip", "input": "a cat"})
    # THEN the list names the one that loaded, and the other is not found, as OpenAI answers a model it lacks
    assert loaded in listed and "no-such-org/no-such-clip" not in listed
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"


def test_the_openai_client_lists_the_models_and_gets_the_same_chat_plain_and_streamed(
    client: openai.OpenAI, api_settings: Settings
) -> None:
    # GIVEN the server's models
    ids = [model.id for model in client.models.list()]
    assert api_settings.caption_model in ids and api_settings.variants_model in ids

    # WHEN one chat is asked for whole and as a stream (greedy, so the same text)
    asked = {"model": ids[0], "messages": [{"role": "user", "content": "Name a cat."}], "max_tokens": 16}
    whole = client.chat.completions.create(**asked, temperature=0)
    streamed = client.chat.completions.create(**asked, temperature=0, stream=True)
    pieces = [chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices]

    # THEN the model wrote text, and the stream is the same text
    assert whole.choices[0].message.content and whole.usage and whole.usage.completion_tokens >= 1
    assert whole.model == api_settings.caption_model
    assert "".join(pieces) == whole.choices[0].message.content


def test_the_openai_client_generates_and_edits_pictures_as_b64_json(client: openai.OpenAI) -> None:
    generated = client.images.generate(prompt="a red cat", n=2, size="128x128", response_format="b64_json")
    edited = client.images.edit(
        image=("cat.jpg", CAT, "image/jpeg"), prompt="a cat in snow", size="128x128", response_format="b64_json"
    )
    assert len(generated.data) == 2 and len(edited.data) == 1
    for picture in [*generated.data, *edited.data]:
        assert picture.b64_json and _picture(picture.b64_json).size == (128, 128)
    assert generated.data[0].b64_json != generated.data[1].b64_json  # two seeds, two pictures


def test_an_annotation_by_upload_or_json_is_the_one_image_path_s_result(
    http: httpx.Client, models: DependenciesOf, tmp_path: Path
) -> None:
    # GIVEN a photo and the options of a prompt message
    request = {
        "prompt": "dog. cat.",
        "attributes": {"color": ["black", "orange", "white"]},
        "top_k": 2,
        "masks": True,
    }

    # WHEN it is sent as multipart and as JSON (base64, with the picture)
    uploaded = http.post("/v1/annotations", files={"image": ("cat.jpg", CAT)}, data={"request": json.dumps(request)})
    as_json = http.post("/v1/annotations", json={**request, "image": base64.b64encode(CAT).decode(), "picture": True})

    # THEN both are the result document the one-image path writes for the same image and request
    assert uploaded.status_code == as_json.status_code == 200, uploaded.text
    from shared.contracts import AnnotationRequest, ImageRef, ImageTask

    (tmp_path / "cat.jpg").write_bytes(CAT)
    expected = annotate_image(
        ImageTask(
            batch_id="b-" + "0" * 20,
            request=AnnotationRequest(**request),
            image=ImageRef(image_id="0" * 16, source_uri=str(tmp_path / "cat.jpg")),
            results_uri=str(tmp_path / "results"),
        ),
        models,
    )
    compared = ("detections", "masks", "status", "width", "height")
    for answer in (uploaded.json(), as_json.json()):
        assert {k: answer.get(k) for k in compared} == expected.model_dump(mode="json", include=set(compared))
        assert answer["caption"]["caption"] == expected.caption.caption  # type: ignore[union-attr]
        assert answer["result_uri"] is None  # nothing was kept
    assert expected.detections, "the tiny detector finds boxes in the sample"
    assert expected.masks and all(expected.masks.masks), "a mask for each box"
    assert uploaded.json()["picture_base64"] is None
    assert _picture(as_json.json()["picture_base64"]).size == (expected.width, expected.height)
    assert as_json.json()["picture_media_type"] == "image/jpeg"


def _recorded_cat(http: httpx.Client) -> dict[str, Any]:
    """The cat annotated with record=true: kept where the workflow keeps results, with its rows."""
    body = {"prompt": "cat.", "caption": False, "record": True, "image": base64.b64encode(CAT).decode()}
    return dict(http.post("/v1/annotations", json=body).json())


def test_a_recorded_annotation_is_kept_where_the_workflow_keeps_results_and_query_finds_it(
    http: httpx.Client, api_settings: Settings
) -> None:
    answer = _recorded_cat(http)

    # (the picture is drawn when asked for, not stored: store_pictures is off)
    assert Path(answer["result_uri"]).is_file() and answer["annotated_uri"] is None
    assert Path(answer["source_uri"]).read_bytes() == CAT  # the upload is kept under uploads/
    rows = run_local_query(
        f"SELECT image_id, status FROM images WHERE batch_id = '{answer['batch_id']}'", api_settings.data_dir
    ).to_pylist()
    assert rows == [{"image_id": answer["image_id"], "status": "succeeded"}]


def test_the_playground_s_search_finds_the_recorded_images_by_meaning(
    http: httpx.Client, api_settings: Settings
) -> None:
    from tools.results.search import local_similar

    # GIVEN an image recorded, with its embedding, in the server's data dir
    recorded = _recorded_cat(http)
    assert recorded["embedding"]["model"] == "tiny:clip"
    # WHEN a server that searches that data dir (as annotate serve does) is asked for a phrase
    app = serving_app(api_settings, find_similar=local_similar(api_settings.data_dir))
    with serving_in_thread(app) as url, httpx.Client(base_url=url, timeout=120) as searching:
        answer = searching.post("/v1/search", json={"query": "a cat on a sofa", "limit": 100})
        refused = searching.post("/v1/search", json={"query": "  "})
    # THEN the recorded image is among the hits, each with its similarity, and a blank query is refused
    assert answer.status_code == 200 and answer.json()["model"] == "tiny:clip"
    assert recorded["source_uri"] in [hit["source_uri"] for hit in answer.json()["data"]]
    assert all(-1 <= hit["score"] <= 1 for hit in answer.json()["data"]) and refused.status_code == 400
    # AND a server with no data dir to search (the Lambda API) says so
    assert http.post("/v1/search", json={"query": "a cat"}).status_code == 501


HOSTILE = {
    "undecodable image": (
        {"json": {"prompt": "cat.", "image": base64.b64encode(b"GIF89a not really").decode()}},
        400,
        "invalid_image",
    ),
    "decompression bomb": (
        {
            "files": {"image": ("bomb.png", encode(Image.new("1", (9000, 9000)), "PNG"))},
            "data": {"request": '{"prompt": "cat."}'},
        },
        400,
        "invalid_image",
    ),
    "unknown field": ({"json": {"prompt": "cat.", "image": "AAAA", "colour": "red"}}, 400, "invalid_value"),
    "over-long prompt": ({"json": {"prompt": "cat. " * 200, "image": "AAAA"}}, 400, "invalid_value"),
    "not base64": ({"json": {"prompt": "cat.", "image": "not base64!"}}, 400, "invalid_value"),
    "a bucket not allowed": ({"json": {"prompt": "cat.", "image": "s3://elsewhere/cat.jpg"}}, 400, "invalid_value"),
    "deep JSON": ({"content": b"[" * 100_000, "headers": {"content-type": "application/json"}}, 400, "invalid_value"),
    "no file part": ({"files": {"picture": ("x.jpg", CAT)}}, 400, "missing_file"),
    "variants asked here": (
        {"json": {"prompt": "cat.", "image": "AAAA", "variants": {"prompt": "snow"}}},
        400,
        "invalid_value",
    ),
    "a data: URI without a comma": (
        {"json": {"prompt": "cat.", "image": "data:image/png;base64"}},
        400,
        "invalid_value",
    ),
    "s3:// with no bucket": ({"json": {"prompt": "cat.", "image": "s3://"}}, 400, "invalid_value"),
    "s3:// with no key": ({"json": {"prompt": "cat.", "image": "s3://bucket"}}, 400, "invalid_value"),
    "a text/plain body, as a web page elsewhere sends one": (
        {
            "content": json.dumps({"prompt": "cat.", "image": base64.b64encode(CAT).decode()}),
            "headers": {"content-type": "text/plain"},
        },
        415,
        "unsupported_media_type",
    ),
    "body over the limit": (
        {"content": b"x" * 1_200_000, "headers": {"content-type": "application/json"}},
        413,
        "body_too_large",
    ),
    "body over the limit, sent chunked (no Content-Length)": (
        {"content": iter([b"x" * 200_000] * 6), "headers": {"content-type": "application/json"}},
        413,
        "body_too_large",
    ),
}


def _local_address(response: httpx.Response) -> Any:
    """The client side of the connection that carried ``response``: the same for two responses on one connection."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_annotation_gets_its_status_and_openai_s_error_shape(http: httpx.Client, case: str) -> None:
    arguments, status, code = HOSTILE[case]
    response = http.post("/v1/annotations", **arguments)  # type: ignore[arg-type]
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code and error["message"]
    health = http.get("/health")
    assert health.json()["status"] == "UP"  # the server is still there
    if status < 413:  # a caller's mistake leaves the keep-alive connection up (413 closes it: its body is unread)
        assert _local_address(health) == _local_address(response)


def _damaged_header(image_format: str) -> bytes:
    """The sample with bytes of its header changed, the first way (by seed) that Pillow's opening refuses with an
    error other than "not an image" (a truncated read, no decoder, a bad struct)."""
    import random

    from PIL import UnidentifiedImageError

    good = encode(Image.open(io.BytesIO(CAT)).convert("RGB").resize((64, 48)), image_format)
    for seed in range(5000):
        draw, damaged = random.Random(seed), bytearray(good)
        for _ in range(3):
            damaged[draw.randrange(64)] = draw.randrange(256)
        try:
            Image.open(io.BytesIO(bytes(damaged))).load()
        except UnidentifiedImageError:
            continue
        except Exception:
            return bytes(damaged)
    raise AssertionError(f"no damaged {image_format} header found")


@pytest.mark.parametrize("image_format", ["BMP", "JPEG", "PNG", "WEBP"])
def test_an_image_whose_header_pillow_refuses_gets_400_on_a_connection_that_stays_up(
    http: httpx.Client, image_format: str
) -> None:
    body = {"prompt": "cat.", "image": base64.b64encode(_damaged_header(image_format)).decode()}
    response = http.post("/v1/annotations", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_image"
    assert _local_address(http.get("/health")) == _local_address(response)


def test_calls_a_web_page_elsewhere_could_make_are_refused_and_write_nothing(
    http: httpx.Client, api_settings: Settings
) -> None:
    uploads = api_settings.data_dir / "uploads"
    before = sorted(uploads.rglob("*")) if uploads.exists() else []
    body = {"prompt": "cat.", "caption": False, "record": True, "image": base64.b64encode(CAT).decode()}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    port = http.base_url.port

    answers = {
        "another site's page": http.post("/v1/annotations", json=body, headers={"origin": "https://evil.example"}),
        "a multipart form from elsewhere": http.post(
            "/v1/annotations", files={"image": ("cat.jpg", CAT)}, headers={"origin": "http://evil.example"}
        ),
        "a chat as text/plain": http.post(
            "/v1/chat/completions", content=json.dumps(chat), headers={"content-type": "text/plain"}
        ),
        "a rebound DNS name": http.post("/v1/annotations", json=body, headers={"host": f"evil.example:{port}"}),
        "a rebound name reading the models": http.get("/v1/models", headers={"host": "evil.example"}),
    }

    assert {case: answer.status_code for case, answer in answers.items()} == {
        "another site's page": 403,
        "a multipart form from elsewhere": 403,
        "a chat as text/plain": 415,
        "a rebound DNS name": 403,
        "a rebound name reading the models": 403,
    }
    assert all(set(answer.json()["error"]) == {"message", "type", "param", "code"} for answer in answers.values())
    assert (sorted(uploads.rglob("*")) if uploads.exists() else []) == before  # nothing was recorded
    # the server's own page, by any of its names, is answered
    own = http.post(
        "/v1/chat/completions", json=chat, headers={"origin": f"http://localhost:{port}", "host": f"localhost:{port}"}
    )
    assert own.status_code == 200, own.text


@pytest.mark.parametrize("stream", [False, True])
def test_chat_mistakes_are_400s_the_openai_client_raises_as_bad_requests_streamed_or_not(
    client: openai.OpenAI, stream: bool
) -> None:
    hi = [{"role": "user", "content": "hi"}]
    mistakes: dict[str, dict[str, Any]] = {
        "content": {"messages": [{"role": "user", "content": None}]},
        "grammar": {"messages": hi, "extra_body": {"grammar": 'root ::= "a"'}},
        "logprobs": {"messages": hi, "logprobs": True, "top_logprobs": 2},
        "max_completion_tokens": {"messages": hi, "max_completion_tokens": 100_000},
    }
    for param, call in mistakes.items():
        with pytest.raises(openai.BadRequestError, match=param):
            answer = client.chat.completions.create(model="m", stream=stream, **call)
            list(answer) if stream else None  # type: ignore[call-overload]


def test_a_stream_that_fails_once_started_ends_with_an_error_event_and_frees_the_model(
    api_settings: Settings, models: DependenciesOf
) -> None:
    # GIVEN a model whose stream breaks after its first chunk (the real model's first chunk, then a fault)
    from dataclasses import replace

    from shared.models.captioning import LlamaCaptioner

    real = models(Step.CAPTION).captioner
    assert isinstance(real, LlamaCaptioner)

    class BreaksMidStream:
        def create_chat_completion(self, **arguments: Any) -> Iterator[dict[str, Any]]:
            yield next(iter(real.llm.create_chat_completion(**arguments)))
            raise RuntimeError("llama_decode returned -1")

    breaking = LlamaCaptioner(BreaksMidStream(), real.model_name, real.max_tokens)

    def dependencies(step: Step) -> Dependencies:
        return replace(models(step), captioner=breaking) if step is Step.CAPTION else models(step)

    with serving_in_thread(create_app(api_settings, dependencies, rows_in_process(models))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
        )
        # WHEN it is read THEN the client gets the first chunk, then OpenAI's error event as an APIError
        with pytest.raises(openai.APIError, match="the stream failed"):
            for _ in stream:
                pass
        assert httpx.get(f"{url}/health").json()["calls_held"] == 0


def test_a_twelve_megapixel_photo_s_whole_picture_fits_lambda_s_6_mb_and_a_7_mb_upload_is_refused_in_openai_s_shape(
    api_settings: Settings, models: DependenciesOf
) -> None:
    # GIVEN the server with the body limit it has by default, and a 4000x3000 photo
    settings = api_settings.model_copy(update={"api_max_body_bytes": Settings().api_max_body_bytes})
    import numpy as np

    smooth = np.asarray(Image.open(io.BytesIO(CAT)).convert("RGB").resize((4000, 3000), Image.Resampling.BICUBIC))
    grain = np.random.default_rng(0).integers(-6, 7, smooth.shape)  # a camera's: its PNG is 20 MB, not 5
    photo = Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8))
    with serving_in_thread(create_app(settings, models, rows_in_process(models))) as url:
        # WHEN it is annotated with its picture, and a 7 MB body is sent
        body = {
            "prompt": "cat.",
            "caption": False,
            "picture": True,
            "image": base64.b64encode(encode(photo, "JPEG")).decode(),
        }
        answer = httpx.post(f"{url}/v1/annotations", json=body, timeout=120)
        too_large = httpx.post(
            f"{url}/v1/annotations", files={"image": ("big.png", b"\x89PNG" + bytes(7_000_000))}, timeout=60
        )

    # THEN the answer, picture and all, is under Lambda's 6 MB, its picture whole (a JPEG: its PNG is 20 MB)
    assert answer.status_code == 200, answer.text
    assert len(answer.content) < 6 * 2**20
    picture = _picture(answer.json()["picture_base64"])
    assert (picture.format, picture.size, answer.json()["picture_scale"]) == ("JPEG", (4000, 3000), 1.0)
    # AND the 7 MB body gets the app's 413 in OpenAI's shape
    assert too_large.status_code == 413
    assert too_large.json()["error"]["code"] == "body_too_large"


def test_max_completion_tokens_bounds_the_answer(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Tell me a long story."}], max_completion_tokens=3
    )
    assert answer.usage and answer.usage.completion_tokens <= 3


def test_an_image_size_that_is_not_ascii_digits_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="square"):
        client.images.generate(prompt="a cat", size="\u00b2x\u00b2")  # type: ignore[arg-type]


def test_a_stream_abandoned_mid_way_releases_the_model_at_once_and_ctrl_c_stops_the_server(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.servers import free_port, serving_in_process

    # GIVEN `annotate serve` in its own process, as a user runs it
    port = free_port()
    command = [str(Path(sys.executable).parent / "annotate"), "serve", "--port", str(port), "--profile", "tiny"]
    with serving_in_process([*command, "--data-dir", str(tmp_path)], port) as server:
        url = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        story = [{"role": "user", "content": "Tell me a long story about a cat."}]

        # WHEN three streamed chats are each left after two chunks (the client closes the stream)
        for _ in range(3):
            stream = client.chat.completions.create(model="m", messages=story, max_tokens=300, stream=True)
            chunks = [chunk for chunk, _ in zip(stream, range(2), strict=False)]
            stream.close()
            assert len(chunks) == 2 and not any(c.choices and c.choices[0].finish_reason for c in chunks)

        # THEN the model is free within moments: the server holds no call, a chat and an annotation are answered
        deadline = time.monotonic() + 5
        while httpx.get(f"{url}/health").json()["calls_held"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(f"{url}/health").json()["calls_held"] == 0
        assert client.chat.completions.create(model="m", messages=story, max_tokens=4).choices[0].message.content
        body = {"prompt": "cat.", "caption": False, "image": base64.b64encode(CAT).decode()}
        assert httpx.post(f"{url}/v1/annotations", json=body, timeout=30).status_code == 200

        # AND as Label Studio's backend it says in its log what /setup found and why a task got no prediction
        config = "<View><Image name='i' value='$i'/><TextArea name='c' toName='i'/></View>"
        assert httpx.post(f"{url}/setup", json={"schema": config}, timeout=30).status_code == 200
        bad = {"tasks": [{"id": 7, "data": {"i": "/data/upload/1/x.jpg"}}], "label_config": config}
        assert httpx.post(f"{url}/predict", json=bad, timeout=30).json()["results"] == [[]]

        # AND Ctrl-C stops the server
        os.killpg(server.pid, signal.SIGINT)
        try:
            assert server.wait(timeout=15) == 0
        except subprocess.TimeoutExpired:
            pytest.fail("the server did not stop on Ctrl-C")
        log = server.stdout.read().decode()  # type: ignore[union-attr]
        assert '"message":"project connected"' in log and '"fills":["TextArea \'c\'"]' in log
        assert '"message":"task not pre-annotated"' in log and "LABEL_STUDIO_URL" in log


def test_hostile_chat_and_image_calls_are_refused_by_the_openai_client(client: openai.OpenAI) -> None:
    message = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="m", messages=message, max_tokens=100_000)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="characters in all"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "cat " * 5000}])
    with pytest.raises(openai.BadRequestError, match="one choice"):
        client.chat.completions.create(model="m", messages=message, n=2)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="square"):
        client.images.generate(prompt="a cat", size="256x128")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="outside 128"):
        client.images.generate(prompt="a cat", size="4096x4096")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="count"):
        client.images.generate(prompt="a cat", n=50, size="128x128")
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="m", input="a cat")


def test_the_playground_shows_the_boxes_of_an_uploaded_picture_in_headless_chromium(base_url: str) -> None:
    from tests.browser import chromium_page
    from tests.e2e.test_results_where_people_use_them import ARTIFACTS

    with chromium_page() as (page, errors):
        page.goto(base_url + "/")
        page.set_input_files("#file", str(SAMPLES / "chelsea-the-cat.jpg"))
        page.get_by_role("button", name="Annotate").click()
        page.wait_for_selector("#boxes tbody tr", timeout=120_000)

        assert page.locator("#canvas").is_visible()
        assert page.locator("#boxes tbody tr").count() >= 1
        assert page.locator("#status").inner_text().startswith("Found")
        assert page.locator("#caption").inner_text()
        assert json.loads(page.locator("#json").text_content() or "{}")["status"] == "succeeded"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)
    assert errors == []


def test_the_playground_downsizes_a_photo_over_the_servers_body_bound_before_sending_it(
    base_url: str, api_settings: Settings, tmp_path: Path
) -> None:
    import numpy as np

    from tests.browser import chromium_page

    # GIVEN a grainy 3000x2000 photo, larger than the server's body bound (1 MB here)
    smooth = np.asarray(Image.open(io.BytesIO(CAT)).convert("RGB").resize((3000, 2000)))
    grain = np.random.default_rng(1).integers(-6, 7, smooth.shape)
    photo = tmp_path / "large.jpg"
    Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8)).save(photo, quality=95)
    assert photo.stat().st_size > api_settings.api_max_body_bytes

    # WHEN it is annotated in the playground
    with chromium_page() as (page, errors):
        page.goto(base_url + "/")
        page.set_input_files("#file", str(photo))
        page.get_by_role("button", name="Annotate").click()
        page.wait_for_function("document.querySelector('#status').textContent.match(/^(Found|\\d)/)", timeout=120_000)

        # THEN it was sent downscaled, aspect kept, and annotated
        assert page.locator("#status").inner_text().startswith("Found"), page.locator("#status").inner_text()
        answer = json.loads(page.locator("#json").text_content() or "{}")
    assert answer["status"] == "succeeded" and answer["width"] < 3000
    assert abs(answer["width"] / answer["height"] - 1.5) < 0.01
    assert errors == []


# --- the key, the queue and unavailable models, each on an app of its own ------------------------------------


def test_with_a_key_set_a_call_without_it_or_with_another_gets_401(
    api_settings: Settings, models: DependenciesOf
) -> None:
    settings = api_settings.model_copy(update={"api_key": SecretStr("s3cret-key")})
    with serving_in_thread(create_app(settings, models, rows_in_process(models))) as url:
        for key in ("wrong", ""):
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=f"{url}/v1", api_key=key or "x", max_retries=0).models.list()
        assert httpx.post(f"{url}/v1/annotations", json={}).status_code == 401
        # RFC 6750: the scheme is case-insensitive, and a bare key is not a Bearer credential
        assert httpx.get(f"{url}/v1/models", headers={"authorization": "bearer s3cret-key"}).status_code == 200
        assert httpx.get(f"{url}/v1/models", headers={"authorization": "s3cret-key"}).status_code == 401
        models = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret-key", max_retries=0).models.list()
        assert len(models.data) == 4  # the caption model, annotate, the CLIP model, the image model
        assert httpx.get(f"{url}/health").status_code == 200  # health needs no key


def test_a_call_past_the_queue_gets_429_with_retry_after_and_the_running_one_still_answers(
    api_settings: Settings, models: DependenciesOf
) -> None:
    # GIVEN a server with no queue, whose first call is held inside the model step
    release, entered = threading.Event(), threading.Event()

    def held(step: Step) -> Dependencies:
        if step is Step.DETECT:
            entered.set()
            release.wait(timeout=60)
        return models(step)

    settings = api_settings.model_copy(update={"api_queue_size": 0})
    with serving_in_thread(create_app(settings, held, rows_in_process(models))) as url:
        body = {"prompt": "cat.", "caption": False, "image": base64.b64encode(CAT).decode()}
        answers: list[httpx.Response] = []
        first = threading.Thread(
            target=lambda: answers.append(httpx.post(f"{url}/v1/annotations", json=body, timeout=120))
        )
        first.start()
        assert entered.wait(timeout=60)

        # WHEN a second call comes
        refused = httpx.post(f"{url}/v1/annotations", json=body, timeout=30)
        release.set()
        first.join(timeout=120)

    # THEN it is refused at once with a time to come back, and the first is answered
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert answers[0].status_code == 200


def test_a_model_that_cannot_load_gets_503_and_the_server_keeps_answering(
    api_settings: Settings, models: DependenciesOf
) -> None:
    def unavailable(step: Step) -> Dependencies:
        raise ModelUnavailable(f"s3://models/{step} is not there: run annotate models push")

    with serving_in_thread(create_app(api_settings, unavailable, rows_in_process(models))) as url:
        answer = httpx.post(
            f"{url}/v1/annotations", json={"prompt": "cat.", "image": base64.b64encode(CAT).decode()}, timeout=30
        )
        chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert httpx.get(f"{url}/health").status_code == 200
    assert answer.status_code == chat.status_code == 503
    assert answer.json()["error"]["code"] == "model_unavailable" and "models push" in answer.json()["error"]["message"]


def test_serving_beyond_this_machine_without_a_key_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0", "--profile", "tiny", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "ANNOTATE_API_KEY" in result.output


def test_twenty_annotations_at_concurrency_four_get_no_5xx_and_the_server_s_memory_stays_bounded(
    api_settings: Settings, tmp_path: Path
) -> None:
    import asyncio
    import statistics
    import sys
    import time

    from tests.servers import free_port, rss_mb, serving_in_process

    # GIVEN `annotate serve` in its own process (tiny models, captions on), warmed by one call
    port = free_port()
    command = [str(Path(sys.executable).parent / "annotate"), "serve", "--port", str(port), "--profile", "tiny"]
    body = {"prompt": "dog. cat.", "image": base64.b64encode(CAT).decode()}
    with serving_in_process([*command, "--data-dir", str(tmp_path)], port) as server:
        url = f"http://127.0.0.1:{port}/v1/annotations"
        assert httpx.post(url, json=body, timeout=120).status_code == 200
        before = rss_mb(server.pid)

        # WHEN 20 calls come, four at a time (more than the queue of eight holds at once, twice over)
        async def load() -> list[tuple[int, float]]:
            gate = asyncio.Semaphore(4)
            async with httpx.AsyncClient(timeout=120) as session:

                async def one() -> tuple[int, float]:
                    async with gate:
                        started = time.perf_counter()
                        response = await session.post(url, json=body)
                        return response.status_code, time.perf_counter() - started

                return await asyncio.gather(*(one() for _ in range(20)))

        answers = asyncio.run(load())
        after = rss_mb(server.pid)

    # THEN every call is answered (the queue holds four), none with a 5xx, and memory does not grow with the calls
    seconds = sorted(s for _, s in answers)
    print(
        f"20 calls at concurrency 4: p50 {statistics.median(seconds):.2f} s, p95 {seconds[18]:.2f} s; "
        f"server RSS {before:.0f} MB before, {after:.0f} MB after"
    )
    assert [status for status, _ in answers] == [200] * 20
    assert after < before * 1.25 + 100, (before, after)
