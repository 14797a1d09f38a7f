"""What a user's odd folders, signals and disks do to `annotate run`, `export` and `gallery`: every image ends with
its row or is said to be not annotated, nothing the tool did not write is touched, and each mistake is one line."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shared.settings import Settings
from tests.conftest import SAMPLES
from tests.e2e.test_local_workflow import annotate, annotate_tiny, rows

pytestmark = pytest.mark.slow
ANNOTATE = str(Path(sys.executable).parent / "annotate")


def _photos(folder: Path, count: int, size: tuple[int, int] = (96, 64)) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    noise = np.random.default_rng(3)
    paths = []
    for index in range(count):
        path = folder / f"photo-{index:03d}.png"
        Image.fromarray(noise.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def test_a_folder_run_twice_never_annotates_its_own_data_folder_hidden_folders_or_a_symlink_loop(
    tmp_path: Path, tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a folder of photos, with thumbnails in a hidden folder, a symlink loop, and pictures too thin to detect in
    folder = tmp_path / "photos"
    _photos(folder, 2)
    _photos(folder / ".thumbs", 1)
    (folder / "loop.jpg").symlink_to(folder / "loop.jpg")
    for width, height in ((10000, 1), (10000, 2), (1, 10000)):
        Image.new("RGB", (width, height), "white").save(folder / f"thin-{width}x{height}.png")
    monkeypatch.chdir(folder)

    # WHEN `annotate run .` runs there twice, with the default data folder inside it, and the loop is named too
    first = annotate("run", ".", "loop.jpg", "--prompt", "cat.", "--profile", "tiny", "--no-caption")
    second = annotate("run", ".", "loop.jpg", "--prompt", "cat.", "--profile", "tiny", "--no-caption")

    # THEN both runs annotate the same six inputs: the photos, the thin pictures and the loop, never the outputs
    for code, output in (first, second):
        assert code == 1 and "2 succeeded, 4 failed" in output and "Traceback" not in output, output
    found = {Path(row["source_uri"]).name: row for row in rows("SELECT * FROM images_latest", folder / "annotate-data")}
    assert sorted(found) == sorted(
        ["photo-000.png", "photo-001.png", "loop.jpg", *(p.name for p in folder.glob("thin-*"))]
    )
    assert "symlink loop" in found["loop.jpg"]["error"]
    for name in ("thin-10000x1.png", "thin-10000x2.png", "thin-1x10000.png"):  # refused before any model ran
        assert found[name]["failed_step"] == "detect" and "too thin to detect in" in found[name]["error"], found[name]


def _run_in_process(folder: Path, data_dir: Path, store_pictures: bool = False) -> subprocess.Popen[str]:
    command = [ANNOTATE, "run", str(folder), "--prompt", "cat.", "--profile", "tiny", "--no-caption"]
    return subprocess.Popen(
        [*command, "--data-dir", str(data_dir)],
        env=os.environ | {"ANNOTATE_STORE_PICTURES": str(store_pictures).lower()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _results(data_dir: Path) -> int:
    return len(list((data_dir / "results").rglob("*.json")))


def _stop_after_next_result(folder: Path, data_dir: Path, signum: int) -> tuple[int, str]:
    """Run `annotate run` on ``folder`` and send it ``signum`` as soon as it has annotated one more image."""
    before = _results(data_dir)
    process = _run_in_process(folder, data_dir)
    deadline = time.monotonic() + 180
    while _results(data_dir) == before and process.poll() is None:
        assert time.monotonic() < deadline, "no image was annotated in time"
        time.sleep(0.05)
    os.killpg(process.pid, signum)
    output, _ = process.communicate(timeout=120)
    return process.returncode, output


def test_ctrl_c_or_sigterm_stops_a_run_cleanly_status_says_what_is_left_and_running_again_finishes_it(
    tmp_path: Path, tiny_settings: Settings
) -> None:
    # GIVEN a run of 40 photos
    folder, data_dir = tmp_path / "photos", tmp_path / "data"
    _photos(folder, 40)

    # WHEN SIGTERM, then (running it again) Ctrl-C, stops it once its first image is done
    for signum, expected in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        code, output = _stop_after_next_result(folder, data_dir, signum)

        # THEN it exits with the signal's code, saying what is done and how to finish, and never aborts
        assert code == expected, output
        assert "stopped:" in output and "run the same command again" in output, output
        assert not any(word in output for word in ("terminate called", "Traceback", "Aborted")), output
        status = annotate("status", "--data-dir", str(data_dir), "--last")
        assert status[0] == 1 and "ABORTED" in status[1] and "not annotated yet" in status[1], status[1]
        assert "0 still running" in status[1], status[1]
    assert not list(data_dir.rglob("*.partial"))
    # AND a run killed outright is not said to be running for ever
    assert _stop_after_next_result(folder, data_dir, signal.SIGKILL)[0] == -signal.SIGKILL
    status = annotate("status", "--data-dir", str(data_dir), "--last")
    assert "ABORTED" in status[1] and "0 still running" in status[1], status[1]

    # AND running it again finishes the rest: one row per photo
    code, output = annotate_tiny(folder, "cat.", data_dir, "--no-caption")
    assert code == 0 and "40 succeeded, 0 failed" in output, output
    assert rows("SELECT count(*) AS n, count(DISTINCT source_uri) AS d FROM images_latest", data_dir) == [
        {"n": 40, "d": 40}
    ]


@pytest.fixture
def small_disk(tmp_path: Path) -> Path:
    """A 20 MB tmpfs (as root, as CI runs), unmounted after the test."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root")
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_disk_is_said_in_one_line_leaves_no_partial_file_and_every_image_is_accounted_for(
    tmp_path: Path, small_disk: Path, tiny_settings: Settings
) -> None:
    # GIVEN twelve large photos and a data folder on a 20 MB disk (their annotated pictures need more: a JPEG of
    # noise keeps about a byte a pixel)
    folder = tmp_path / "photos"
    _photos(folder, 12, size=(2400, 1800))

    # WHEN they are annotated there, their pictures stored (StorePictures=true)
    process = _run_in_process(folder, small_disk / "data", store_pictures=True)
    output, _ = process.communicate(timeout=600)

    # THEN the run fails saying the disk is full and where, in a line, with no stack or log record
    assert process.returncode in (1, 2), output
    assert "disk is full" in output and str(small_disk) in " ".join(output.split()), output
    assert not any(word in output for word in ("Traceback", '{"', "stackTrace")), output
    assert not list(small_disk.rglob("*.partial"))
    # AND every photo has its row (a failure's says the disk was full) or is counted as not annotated
    summary = re.search(r"(\d+) succeeded, (\d+) failed(?:, (\d+) not annotated)?", output)
    assert summary, output
    succeeded, failed, not_annotated = (int(count or 0) for count in summary.groups())
    assert succeeded + failed + not_annotated == 12, summary[0]
    table = rows("SELECT status, count(*) AS n FROM images_latest GROUP BY status", small_disk / "data")
    assert {row["status"]: row["n"] for row in table} == {
        status: n for status, n in (("succeeded", succeeded), ("failed", failed)) if n
    }

    # AND once there is room, the same command annotates them all
    subprocess.run(["mount", "-o", "remount,size=400m", str(small_disk)], check=True)
    code, output = annotate_tiny(folder, "cat.", small_disk / "data", "--no-caption")
    assert code == 0 and "12 succeeded, 0 failed" in output, output


def test_export_never_touches_a_folder_it_did_not_write_and_refuses_the_data_folder(
    tmp_path: Path, tiny_settings: Settings
) -> None:
    # GIVEN annotated samples, and a YOLO dataset made by hand
    data_dir = tmp_path / "data"
    assert annotate_tiny(SAMPLES, "cat.", data_dir, "--no-caption", "--box-threshold", "0")[0] == 0
    handmade = tmp_path / "my-dataset"
    (handmade / "images").mkdir(parents=True)
    (handmade / "labels").mkdir()
    (handmade / "images" / "mine.jpg").write_bytes((SAMPLES / "chelsea-the-cat.jpg").read_bytes())
    (handmade / "labels" / "mine.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (handmade / "notes.md").write_text("labelled by hand\n")
    before = {path: path.read_bytes() for path in handmade.rglob("*") if path.is_file()}
    tables = sorted((data_dir / "tables").rglob("*"))

    # WHEN it is exported into the hand-made folder, and into the data folder's own tables
    into_handmade = annotate("export", "--format", "yolo", "--out", str(handmade), "--data-dir", str(data_dir))
    into_tables = annotate("export", "--format", "yolo", "--out", str(data_dir / "tables"), "--data-dir", str(data_dir))

    # THEN both are refused in one line, and nothing there changed
    assert into_handmade[0] == 2 and "did not write" in " ".join(into_handmade[1].split()), into_handmade[1]
    assert into_tables[0] == 2 and "inside the data folder" in " ".join(into_tables[1].split()), into_tables[1]
    assert {path: path.read_bytes() for path in handmade.rglob("*") if path.is_file()} == before
    assert sorted((data_dir / "tables").rglob("*")) == tables

    # AND an export into a new folder, made again into the same folder, replaces only what it wrote
    out = tmp_path / "yolo"
    for _ in range(2):
        code, output = annotate("export", "--format", "yolo", "--out", str(out), "--data-dir", str(data_dir))
        assert code == 0, output
    assert len(list((out / "images").iterdir())) == len(list(SAMPLES.iterdir()))
    (out / "labels" / "added-by-hand.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    code, output = annotate("export", "--format", "yolo", "--out", str(out), "--data-dir", str(data_dir))
    assert code == 2 and "added-by-hand.txt" in output
    assert (out / "labels" / "added-by-hand.txt").is_file()


@pytest.mark.parametrize("out", ["/dev/null/x", "/proc/annotate-x"])
def test_an_unwritable_out_folder_is_one_line(out: str, tmp_path: Path, results_with_rows: Path) -> None:
    for command in (["export", "--format", "coco"], ["gallery"]):
        code, output = annotate(*command, "--out", out, "--data-dir", str(results_with_rows))
        assert code == 2 and "cannot write into" in output and "Traceback" not in output, output


def test_exporting_or_showing_nothing_says_so_and_fails(tmp_path: Path) -> None:
    for command in (["export", "--format", "coco"], ["gallery"]):
        code, output = annotate(*command, "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "mistyped"))
        assert code == 2 and "nothing to" in output and "holds no results" in " ".join(output.split()), output
    assert not (tmp_path / "out").exists()


def test_a_first_run_s_export_says_so_in_a_line_and_shows_none_of_torch_s_known_warnings(tmp_path: Path) -> None:
    # GIVEN a machine whose model cache is empty (a newcomer's first `make demo`)
    environment = {**os.environ, "ANNOTATE_MODEL_CACHE_DIR": str(tmp_path / "cache")}

    # WHEN the tiny models are built and exported
    done = subprocess.run(
        [ANNOTATE, "models", "export", "--profile", "tiny"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )

    # THEN it says once that it exports and how long that took, and prints no warning
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("exporting the models to ONNX") == 1, done.stderr
    assert "models exported in" in done.stderr
    assert not any(word in done.stderr for word in ("Warning", "warn(", "Traceback")), done.stderr


def test_an_export_folder_whose_list_was_edited_is_refused_in_one_line(tmp_path: Path, results_with_rows: Path) -> None:
    # GIVEN a folder that looks like an earlier export, its list of files no longer readable
    out = tmp_path / "coco"
    out.mkdir()
    (out / "annotations.json").write_text("{}")
    (out / ".annotate-export.json").write_text("not json")

    # WHEN an export is made into it THEN it is refused in one line, and the folder is as it was
    code, output = annotate("export", "--format", "coco", "--out", str(out), "--data-dir", str(results_with_rows))
    assert code == 2 and "did not write" in " ".join(output.split()) and "Traceback" not in output, output
    assert (out / "annotations.json").read_text() == "{}" and (out / ".annotate-export.json").read_text() == "not json"
