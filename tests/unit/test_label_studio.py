"""A Label Studio label config read as the request the models fill, and the configs they cannot fill refused."""

from __future__ import annotations

import pytest

from shared.errors import RequestRejected
from shared.serving.label_studio import Project, label_config, read_label_config

PETS = """<View>
  <Image name="photo" value="$picture"/>
  <RectangleLabels name="animal" toName="photo"><Label value="dog"/><Label value="cat"/></RectangleLabels>
  <Choices name="class" toName="photo" perRegion="true"><Choice value="beagle"/></Choices>
  <Choices name="color" toName="photo" perRegion="true"><Choice value="black"/><Choice value="white"/></Choices>
  <Choices name="quality" toName="photo"><Choice value="blurry"/></Choices>
  <TextArea name="notes" toName="photo"/>
</View>"""


def test_the_config_s_controls_name_the_request_and_the_results() -> None:
    project = read_label_config(PETS)
    assert (project.image, project.image_key, project.boxes, project.caption) == ("photo", "picture", "animal", "notes")
    request = project.request()
    # the labels are the prompt; per-region choices but the class are vocabularies; a whole-task choice is not
    assert request.prompt == "dog. cat." and request.attributes == {"color": ["black", "white"]} and request.caption
    assert read_label_config(label_config(project)) == project  # what the export writes reads back the same


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("<View", "not XML"),
        ("<View><Text name='t' value='$t'/></View>", "0 Image objects"),
        ("<View><Image name='i' value='$i'/></View>", "0 RectangleLabels"),
        ("<View><Image name='i' value='$i'/><RectangleLabels name='b' toName='i'/></View>", "no Label"),
        (
            "<View><Image name='i' value='$i'/><RectangleLabels name='b' toName='i'><Label value='a'/>"
            "</RectangleLabels><PolygonLabels name='p' toName='i'><Label value='a'/></PolygonLabels></View>",
            "PolygonLabels",
        ),
        (
            "<View><Image name='i' value='$i'/><Text name='t' value='$t'/><RectangleLabels name='b' toName='i'>"
            "<Label value='a'/></RectangleLabels><Choices name='c' toName='t' perRegion='true'><Choice value='x'/>"
            "</Choices></View>",
            "not on the Image",
        ),
    ],
)
def test_a_config_the_models_cannot_fill_is_refused_saying_why(config: str, said: str) -> None:
    with pytest.raises(RequestRejected, match=said):
        read_label_config(config)


def test_labels_that_make_a_bad_prompt_are_refused() -> None:
    project = Project(image="i", image_key="i", boxes="b", labels=("a" * 400,))
    with pytest.raises(RequestRejected, match="cannot give"):
        project.request()


@pytest.mark.parametrize(
    ("data", "label_studio_url", "said"),
    [
        ({}, "http://ls.example:8080", "no 'image' in its data"),
        ({"image": "/data/upload/1/cat.jpg"}, "", "set LABEL_STUDIO_URL"),
        ({"image": "http://elsewhere.example/cat.jpg"}, "http://ls.example:8080", "neither on Label Studio"),
        ({"image": "http://ls.example:8080.evil.example/cat.jpg"}, "http://ls.example:8080", "neither on Label Studio"),
        ({"image": "s3://someone-elses/cat.jpg"}, "http://ls.example:8080", "not in a bucket this deployment reads"),
    ],
)
def test_a_task_s_image_is_read_only_from_label_studio_or_the_input_buckets(
    data: dict[str, str], label_studio_url: str, said: str
) -> None:
    from shared.serving.label_studio_backend import task_image
    from shared.settings import Settings

    project = read_label_config(label_config(Project(image="image", image_key="image", boxes="b", labels=("a",))))
    with pytest.raises(RequestRejected, match=said):
        task_image({"id": 1, "data": data}, project, Settings(label_studio_url=label_studio_url))


def test_label_studio_s_key_is_not_sent_on_to_where_it_redirects() -> None:
    # GIVEN Label Studio answering a media request with a redirect to another host (a cloud storage's presigned URL)
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from shared.serving.label_studio_backend import _download

    seen: dict[str, str | None] = {}

    class Storage(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen["storage"] = self.headers.get("Authorization")
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"picture")

        def log_message(self, *_: object) -> None:
            pass

    class LabelStudio(Storage):
        def do_GET(self) -> None:
            seen["label studio"] = self.headers.get("Authorization")
            self.send_response(303)
            self.send_header("Location", f"http://localhost:{storage.server_port}/presigned?signature=x")
            self.end_headers()

    storage, label_studio = (
        ThreadingHTTPServer(("127.0.0.1", 0), Storage),
        ThreadingHTTPServer(("127.0.0.1", 0), LabelStudio),
    )
    for server in (storage, label_studio):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # WHEN the backend reads the task's image from Label Studio
        data = _download(f"http://127.0.0.1:{label_studio.server_port}/tasks/1/presign/", "Token key", 1000)
    finally:
        for server in (storage, label_studio):
            server.shutdown()
    # THEN Label Studio got the key, and the storage it redirected to did not
    assert data == b"picture" and seen == {"label studio": "Token key", "storage": None}
