"""Label Studio at the size people use it: a real Label Studio (the one `make install` puts in .venv-labelstudio),
a project of N uploaded photos, and `annotate serve`'s app as its ML backend, driven through Label Studio's own
REST API as its UI's Retrieve Predictions drives it (select all, the retrieve_tasks_predictions action).

Two projects of the same uploads:
- "from rows": the photos annotated before by `annotate run` (the tiny models) into a data folder the backend reads,
  and a detector the backend cannot load: every answer comes from the rows, in as few calls as it takes;
- "new": a data folder with no rows: the models run, and Retrieve Predictions is chosen again until every task has a
  prediction (or --new-retrieves times: each call then shows its progress, and the rest is the same again).

Each call's seconds (Label Studio waits ML_TIMEOUT_PREDICT, 100 s) and how many tasks it left with a prediction go
to the report:

    .venv/bin/python scripts/label_studio_at_scale.py --tasks 10000 --out bench/label-studio-at-scale.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image
from pydantic import SecretStr
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from shared.serving.api import serving_app  # noqa: E402
from shared.settings import Profile, use_settings  # noqa: E402
from tests.integration.test_label_studio import api, personal_access_token  # noqa: E402
from tests.integration.test_label_studio_templates import shipped_templates  # noqa: E402
from tests.servers import (  # noqa: E402
    LABEL_STUDIO_PASSWORD,
    LABEL_STUDIO_USER,
    answering,
    label_studio_process,
    serving_in_thread,
)
from tools.cli import app  # noqa: E402
from tools.results.annotations import local_annotated_sources  # noqa: E402

# Label Studio takes at most DATA_UPLOAD_MAX_NUMBER_FILES files a request (100 by default: its settings/base.py)
UPLOADS_PER_IMPORT = 100
MOST_RETRIEVES = 60
LABEL_STUDIO_WAITS_S = 100  # ML_TIMEOUT_PREDICT's default


def photos(folder: Path, count: int) -> Path:
    """``count`` 320x240 JPEGs of their own (a gradient and noise), about 20 kB each."""
    folder.mkdir(parents=True, exist_ok=True)
    for number in range(count):
        rng = np.random.default_rng(number)
        gradient = np.linspace(0, 255, 320, dtype=np.float32)[None, :, None] * rng.random(3)[None, None, :]
        pixels = (gradient + rng.integers(0, 40, (240, 320, 3))).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"photo-{number:05}.jpg", quality=85)
    return folder


def uploaded(ls: FreshApi, title: str, config: str, folder: Path) -> int:
    project = int(ls.post("/api/projects", json={"title": title, "label_config": config}).json()["id"])
    paths = sorted(folder.iterdir())
    for start in range(0, len(paths), UPLOADS_PER_IMPORT):
        chunk = paths[start : start + UPLOADS_PER_IMPORT]
        files = [(f"file{n}", (path.name, path.read_bytes())) for n, path in enumerate(chunk)]
        answer = ls.post(f"/api/projects/{project}/import", files=files)
        assert answer.status_code == 201, answer.text
    return project


class FreshApi:
    """Label Studio's REST API with a new access token for each request: its access tokens last minutes, and a call
    of ten thousand tasks takes longer."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def get(self, path: str, **options: Any) -> httpx.Response:
        with api(self.url, self.token) as client:
            return client.get(path, **options)

    def post(self, path: str, **options: Any) -> httpx.Response:
        with api(self.url, self.token) as client:
            return client.post(path, **options)


def predicted_tasks(ls: FreshApi, project: int) -> int:
    tasks = ls.get("/api/projects/" + str(project)).json()
    return int(tasks.get("total_predictions_number") or 0)


def retrieve_until_done(
    ls: FreshApi, project: int, backend: str, tasks: int, most: int = MOST_RETRIEVES
) -> list[dict[str, Any]]:
    connected = ls.post("/api/ml", json={"project": project, "url": backend, "title": "annotate"})
    assert connected.status_code == 201 and connected.json()["readable_state"] == "Connected", connected.text
    calls: list[dict[str, Any]] = []
    before = predicted_tasks(ls, project)
    while before < tasks and len(calls) < most:
        asked = {"selectedItems": {"all": True, "excluded": []}}
        started = time.monotonic()
        answer = ls.post("/api/dm/actions", params={"id": "retrieve_tasks_predictions", "project": project}, json=asked)
        seconds = time.monotonic() - started
        after = predicted_tasks(ls, project)
        calls.append({"seconds": round(seconds, 1), "status": answer.status_code, "new_predictions": after - before})
        print(f"  call {len(calls)}: {seconds:.1f} s, {after - before} new predictions, {after} of {tasks}", flush=True)
        if after == before:
            break  # no progress: the report says so
        before = after
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "label-studio-at-scale.json")
    parser.add_argument("--answer-within-s", type=float, default=80.0)
    parser.add_argument("--new-retrieves", type=int, default=MOST_RETRIEVES)
    parser.add_argument("--match-by-name", action="store_true", help="ANNOTATE_LABEL_STUDIO_MATCH_BY_NAME")
    parser.add_argument("--only-from-rows", action="store_true", help="Leave out the project the models annotate")
    parser.add_argument("--root", type=Path, help="A folder of an earlier run: its photos and rows are reused")
    arguments = parser.parse_args()
    root = arguments.root or Path(tempfile.mkdtemp(prefix="label-studio-at-scale-"))
    run_s = 0.0
    if (root / "rows" / "tables").is_dir():
        images = root / "images"
        print(f"reusing the photos and rows in {root}", flush=True)
    else:
        images = photos(root / "images", arguments.tasks)
        started = time.monotonic()
        run = ["run", str(images), "--prompt", "airplane. car.", "--profile", "tiny", "--no-caption"]
        result = CliRunner().invoke(app, [*run, "--data-dir", str(root / "rows")])
        assert result.exit_code == 0, result.output
        run_s = time.monotonic() - started
        print(f"annotate run of {arguments.tasks} photos: {run_s:.0f} s", flush=True)
    config = shipped_templates()["computer-vision/object-detection-with-bounding-boxes"]
    report: dict[str, Any] = {"tasks": arguments.tasks, "annotate_run_s": round(run_s), "label_studio_waits_s": 100}
    report["match_by_name"] = arguments.match_by_name
    shutil.rmtree(root / "label-studio", ignore_errors=True)
    shutil.rmtree(root / "new", ignore_errors=True)
    (root / "label-studio").mkdir()
    with label_studio_process(root / "label-studio", LABEL_STUDIO_USER, LABEL_STUDIO_PASSWORD) as started_ls:
        url = answering(started_ls)
        token = personal_access_token(url)
        ls = FreshApi(url, token)
        for name, data, detector in (
            ("from rows", root / "rows", str(root / "no-detector-here")),
            *([] if arguments.only_from_rows else [("new", root / "new", None)]),
        ):
            settings = use_settings(
                profile=Profile.TINY,
                data_dir=data,
                label_studio_url=url,
                label_studio_api_key=SecretStr(token),
                label_studio_answer_within_s=arguments.answer_within_s,
                label_studio_match_by_name=arguments.match_by_name,
                **({"detector_model": detector} if detector else {}),
            )
            upload_started = time.monotonic()
            project = uploaded(ls, name, config, images)
            print(f"{name}: {arguments.tasks} uploaded in {time.monotonic() - upload_started:.0f} s", flush=True)
            backend_app = serving_app(settings, find_annotated=local_annotated_sources(data))
            with serving_in_thread(backend_app) as backend:
                most = MOST_RETRIEVES if name == "from rows" else arguments.new_retrieves
                calls = retrieve_until_done(ls, project, backend, arguments.tasks, most)
            report[name] = {
                "calls": calls,
                "predicted": predicted_tasks(ls, project),
                "longest_call_s": max(call["seconds"] for call in calls),
            }
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
