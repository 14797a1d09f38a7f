"""A Label Studio label config read as what the models fill in it, in the config's own names; what they cannot fill
left to people, or refused in one line when nothing is left for them."""

from __future__ import annotations

import pytest

from shared.contracts import Box
from shared.errors import RequestRejected
from shared.serving.label_studio import LabelledBox, attribute_name, original_name, read_label_config
from shared.serving.label_studio_results import image_choice_results, label_config, region_results

PETS = """<View>
  <Image name="photo" value="$picture"/>
  <RectangleLabels name="animal" toName="photo"><Label value="dog"/><Label value="cat"/></RectangleLabels>
  <Choices name="class" toName="photo" perRegion="true"><Choice value="beagle"/></Choices>
  <Choices name="color" toName="photo" perRegion="true"><Choice value="black"/><Choice value="white"/></Choices>
  <Choices name="quality" toName="photo"><Choice value="blurry"/><Choice value="sharp" hint="a sharp photo"/></Choices>
  <TextArea name="notes" toName="photo"/>
</View>"""


def box(label: str, **attributes: str) -> LabelledBox:
    return LabelledBox(
        label, 0.9, Box(x0=10, y0=20, x1=30, y1=60), attributes.pop("class_label", None), None, attributes
    )


def test_the_config_s_controls_name_the_request_and_the_results() -> None:
    project = read_label_config(PETS)
    assert (project.image, project.image_key, project.boxes, project.caption) == ("photo", "picture", "animal", "notes")
    request = project.request("ignored.")
    # the labels are the prompt; per-region choices but the class are vocabularies; a whole-image choice is CLIP's
    assert request.prompt == "dog. cat." and request.attributes == {"color": ["black", "white"]} and request.caption
    [quality] = project.image_choices
    assert [(option.text, option.stored) for option in quality.options] == [
        ("blurry", "blurry"),
        ("a sharp photo", "sharp"),
    ]
    assert project.left_to_people == ()
    assert read_label_config(label_config(project)) == project  # what the export writes reads back the same


def test_labels_come_back_spelled_as_the_config_spells_them() -> None:
    # GIVEN labels with capitals, two words, a period (which separates a prompt's phrases) and an alias
    project = read_label_config(
        "<View><Image name='i' value='$i'/><RectangleLabels name='b' toName='i'><Label value='Cat'/>"
        "<Label value='Coffee Cup'/><Label value='st. bernard'/><Label value='Airplane' alias='plane'/>"
        "</RectangleLabels></View>"
    )
    # THEN the detector looks for their phrases
    assert project.request("x.").prompt == "cat. coffee cup. st bernard. airplane."
    # AND its boxes come back under the config's labels, as Label Studio stores them (an alias where there is one)
    found = [box("cat"), box("coffee cup"), box("st bernard"), box("airplane"), box("hamster")]
    regions = region_results(found, 100, 100, project, "image-1")
    assert [r["value"]["rectanglelabels"] for r in regions] == [["Cat"], ["Coffee Cup"], ["st. bernard"], ["plane"]]


def test_attributes_are_named_as_the_tables_allow_and_come_back_under_their_controls() -> None:
    project = read_label_config(
        "<View><Image name='i' value='$img'/><RectangleLabels name='b' toName='i'><Label value='dog'/>"
        "</RectangleLabels><Choices name='Fur Colour' toName='i' perRegion='true'><Choice value='brown'/>"
        "<Choice value='black' alias='BLK'/></Choices><Choices name='label' toName='i' perRegion='true'>"
        "<Choice value='good'/></Choices></View>"
    )
    assert project.request("x.").attributes == {"fur_colour": ["brown", "black"], "label_a": ["good"]}
    regions = region_results([box("dog", fur_colour="black", label_a="good")], 100, 100, project, "k")
    assert [(r["from_name"], r["value"].get("choices")) for r in regions] == [
        ("b", None),
        ("Fur Colour", ["BLK"]),
        ("label", ["good"]),
    ]
    assert all(r["id"] == regions[0]["id"] for r in regions)  # one region: its box and its choices
    assert attribute_name("9 lives") == "a_9_lives" and attribute_name("Class") == "class_a"


def test_a_whole_image_choice_is_the_likeliest_or_each_likely_enough_where_several_are_taken() -> None:
    project = read_label_config(
        "<View><Image name='i' value='$i'/><Choices name='one' toName='i'><Choice value='a'/><Choice value='b' "
        "alias='B'/></Choices><Choices name='many' toName='i' choice='multiple'><Choice value='x'/>"
        "<Choice value='y'/><Choice value='z'/></Choices></View>"
    )
    assert not project.runs_pipeline and project.fills() == ["Choices 'one' (the image)", "Choices 'many' (the image)"]
    results = image_choice_results(project, {"one": [0.3, 0.7], "many": [0.5, 0.1, 0.4]}, 0.25, "k")
    assert [(r["from_name"], r["value"]["choices"], r["score"]) for r in results] == [
        ("one", ["B"], 0.7),
        ("many", ["x", "z"], 0.4),
    ]
    assert image_choice_results(project, {"many": [0.2, 0.2, 0.2]}, 0.25, "k") == []  # none likely enough


def test_what_the_models_cannot_fill_is_left_to_people_and_said() -> None:
    # GIVEN Label Studio's OCR-style config: boxes, and a transcription per box, and a polygon tool
    project = read_label_config(
        "<View><Image name='image' value='$ocr'/><RectangleLabels name='label' toName='image'><Label value='Text'/>"
        "</RectangleLabels><Polygon name='poly' toName='image'/><TextArea name='transcription' toName='image' "
        "perRegion='true'/></View>"
    )
    assert project.fills() == ["RectangleLabels 'label'"]
    assert project.left_to_people == (
        "Polygon 'poly': the models draw no unlabelled polygons",
        "TextArea 'transcription': a text per region (a transcription) is not a caption",
    )


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("<View", "not XML"),
        ("<View><Text name='t' value='$t'/></View>", "has no Image"),
        ("<View><Image name='a' value='$a'/><Image name='b' value='$b'/></View>", "has 2 Image objects"),
        ("<View><Image name='p' valueList='$pages'/></View>", "takes pages ($pages)"),
        ("<View><Image name='i' value='$i'/></View>", "(no control)"),
        (
            "<View><Image name='i' value='$i'/><Polygon name='p' toName='i'/><Brush name='b' toName='i'/></View>",
            "Polygon 'p': the models draw no unlabelled polygons; Brush 'b': the models draw no unlabelled masks",
        ),
        (
            "<View><Image name='i' value='$i'/><RectangleLabels name='r' toName='i' value='$regions'/></View>",
            "its labels come from each task ($regions)",
        ),
        (
            "<View><Image name='i' value='$i'/><Text name='t' value='$t'/><Choices name='c' toName='t'>"
            "<Choice value='x'/></Choices></View>",
            "on 't', not the image",
        ),
        (
            "<View><Image name='i' value='$i'/><Choices name='c' toName='i' perRegion='true'><Choice value='x'/>"
            "</Choices></View>",
            "per region, and the models draw no region here",
        ),
    ],
)
def test_a_config_the_models_fill_nothing_of_is_refused_in_one_line_saying_why_and_what_they_fill(
    config: str, said: str
) -> None:
    with pytest.raises(RequestRejected) as refused:
        read_label_config(config)
    assert said in str(refused.value) and "\n" not in str(refused.value)
    if "nothing" in str(refused.value):
        assert (
            "they fill RectangleLabels (boxes), BrushLabels (masks), PolygonLabels (outlines), per-region Choices"
            in str(refused.value)
        )


def test_labels_that_make_a_bad_prompt_are_refused_in_one_line() -> None:
    many = "".join(f"<Label value='thing {n}'/>" for n in range(40))
    config = f"<View><Image name='i' value='$i'/><RectangleLabels name='b' toName='i'>{many}</RectangleLabels></View>"
    with pytest.raises(RequestRejected, match="40 labels, the detector looks for at most 32"):
        read_label_config(config)
    control = "<View><Image name='i' value='$i'/><RectangleLabels name='b' toName='i'><Label value='a\x7fb'/>"
    with pytest.raises(RequestRejected, match="cannot give: prompt: Value error") as refused:
        read_label_config(control + "</RectangleLabels></View>").request("x.")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("location", "name"),
    [
        ("/data/upload/3/abcd1234-cat.jpg", "cat.jpg"),
        ("http://ls:8080/data/upload/3/abcd1234-my-dog.png?x=1", "my-dog.png"),
        ("/data/local-files/?d=pets/abcd1234-cat.jpg", "abcd1234-cat.jpg"),
        ("s3://bucket/incoming/cat.jpg", "cat.jpg"),
        ("/data/upload/3/..", ""),
        ("data:image/png;base64,iVBORw0", ""),
    ],
)
def test_a_task_s_image_is_named_as_it_was_before_label_studio_kept_it(location: str, name: str) -> None:
    assert original_name(location) == name


@pytest.mark.parametrize(
    ("task", "label_studio_url", "said"),
    [
        ({"data": {}}, "http://ls.example:8080", "no 'image' in its data"),
        ({"data": "cat.jpg"}, "http://ls.example:8080", r"data is not an object \(str\)"),
        ("cat.jpg", "http://ls.example:8080", r"data is not an object \(NoneType\)"),
        ({"data": {"image": "/data/upload/1/cat.jpg"}}, "", "set LABEL_STUDIO_URL"),
        ({"data": {"image": "http://elsewhere.example/cat.jpg"}}, "http://ls.example:8080", "neither on Label Studio"),
        (
            {"data": {"image": "http://ls.example:8080.evil.example/cat.jpg"}},
            "http://ls.example:8080",
            "neither on Label Studio",
        ),
        (
            {"data": {"image": "s3://someone-elses/cat.jpg"}},
            "http://ls.example:8080",
            "not in a bucket this deployment reads",
        ),
    ],
)
def test_a_task_s_image_is_read_only_from_label_studio_or_the_input_buckets(
    task: object, label_studio_url: str, said: str
) -> None:
    from shared.serving.label_studio_media import task_image
    from shared.settings import Settings

    project = read_label_config("<View><Image name='image' value='$image'/><TextArea name='c' toName='image'/></View>")
    with pytest.raises(RequestRejected, match=said):
        task_image(task, project, Settings(label_studio_url=label_studio_url))


def test_label_studio_s_key_is_not_sent_on_to_where_it_redirects() -> None:
    # GIVEN Label Studio answering a media request with a redirect to another host (a cloud storage's presigned URL)
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from shared.serving.label_studio_media import _download

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
