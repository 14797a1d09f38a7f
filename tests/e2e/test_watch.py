"""`annotate watch`: images dropped into a folder over time are gathered as the stack's dial gathers them, each
annotated once, within the wait, in the lane the rule picks; SIGTERM stops the watch cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shared.contracts import BatchInput
from shared.pipeline.batches import gathered_lane
from shared.settings import Settings
from tests.e2e.test_local_workflow import rows
from tools.local.watch import FolderDrops, annotated_image_ids

pytestmark = pytest.mark.slow
ANNOTATE = str(Path(sys.executable).parent / "annotate")
WAIT_S, LOOK_S = 6.0, 1.0
# A laptop's figures for the rule, so that the bulk lane can end within a 6 s wait: a 1 s task start, 0.5 s an image
RULE_FIGURES = {"ANNOTATE_BULK_TASK_START_S": "1", "ANNOTATE_BULK_SECONDS_PER_IMAGE": "0.5"}


def drop(folder: Path, name: str, seed: int) -> float:
    """A picture written elsewhere and moved in, as a copy lands; when it landed."""
    pixels = np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    partial = folder.parent / f"{name}.partial.png"
    Image.fromarray(pixels).save(partial)
    partial.replace(folder / name)
    return time.time()


def wait_for(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.5)


def annotated(data_dir: Path) -> dict[str, int]:
    if not (data_dir / "tables").is_dir():
        return {}
    found = rows("SELECT source_uri, count(*) AS n FROM images GROUP BY source_uri", data_dir)
    return {Path(row["source_uri"]).name: row["n"] for row in found}


def test_drops_are_gathered_within_the_wait_each_once_in_the_lane_the_rule_picks(
    tmp_path: Path, tiny_settings: Settings
) -> None:
    folder, data_dir = tmp_path / "drops", tmp_path / "data"
    folder.mkdir()
    command = [ANNOTATE, "watch", str(folder), "--prompt", "cat.", "--max-wait", str(WAIT_S / 60)]
    command += ["--profile", "tiny", "--no-caption", "--data-dir", str(data_dir)]
    watcher = subprocess.Popen(
        command, env=os.environ | RULE_FIGURES, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        # GIVEN the watch looking (its first line says so), three pictures dropped at once, then, once they are
        # annotated, a fourth alone
        assert watcher.stdout is not None and watcher.stdout.readline().startswith("watching")
        dropped = {f"first-{n}.png": drop(folder, f"first-{n}.png", n) for n in range(3)}
        wait_for(lambda: len(annotated(data_dir)) == 3, 180)
        dropped["alone.png"] = drop(folder, "alone.png", 9)
        wait_for(lambda: len(annotated(data_dir)) == 4, 180)
    finally:
        # WHEN the watch gets SIGTERM
        watcher.send_signal(signal.SIGTERM)
        output, _ = watcher.communicate(timeout=60)

    # THEN it stopped cleanly, with the shell's code for SIGTERM
    assert watcher.returncode == 128 + signal.SIGTERM and "Traceback" not in output, output
    # AND each picture was annotated once
    assert annotated(data_dir) == dict.fromkeys(dropped, 1)
    # AND each batch started within the wait of its pictures' drop (a look a second, and one more to see a drop
    # settle), in the lane the rule picks for its size: three in one bulk task, the lone one on Lambda
    settings = Settings(**{key.removeprefix("ANNOTATE_").lower(): value for key, value in RULE_FIGURES.items()})
    inputs = [path for path in (data_dir / "manifests").glob("b-*.json") if path.name.count(".") == 1]
    batches = [BatchInput.model_validate_json(path.read_text()) for path in inputs]
    assert sorted((batch.images, batch.lane) for batch in batches) == [(1, "lambda"), (3, "bulk")]
    for batch in batches:
        names = [name for name in dropped if name.startswith("alone" if batch.images == 1 else "first")]
        waited = batch.planned_at.timestamp() - max(dropped[name] for name in names)
        assert waited <= WAIT_S + 2 * LOOK_S + 1, (batch.images, waited)
        assert batch.lane_reason == gathered_lane(batch.images, settings.ingest, WAIT_S).reason
    assert "gathered 3 (every 0.1 min): bulk lane" in output and "gathered 1 (every 0.1 min): lambda lane" in output
    # AND a watch started again on the folder gathers none of them again: each already has its row
    drops = FolderDrops(folder, data_dir, annotated_image_ids(data_dir))
    assert drops.look() == [] and drops.look() == [] and drops.not_gathered() == []
