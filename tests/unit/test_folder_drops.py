"""`annotate watch`'s drops: a file is dropped once it settles as a whole picture, and a drop is its content."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from tools.local.watch import FolderDrops


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def test_a_copy_paused_halfway_is_not_a_drop_until_it_is_whole(tmp_path: Path) -> None:
    folder = tmp_path / "drops"
    folder.mkdir()
    drops = FolderDrops(folder, tmp_path / "data", incomplete_wait_s=60)
    whole = png(1)
    # GIVEN a copy that stops halfway, for as many looks as it takes
    (folder / "a.png").write_bytes(whole[: len(whole) // 2])
    # THEN it settles, but is no drop while it is no whole picture
    assert [drops.look() for _ in range(3)] == [[], [], []]
    # AND once the copy ends, the whole file is dropped when it settles
    (folder / "a.png").write_bytes(whole)
    assert drops.look() == [] and drops.look() == [folder / "a.png"]


def test_a_file_that_never_becomes_whole_is_taken_as_it_is_after_its_wait(tmp_path: Path) -> None:
    folder = tmp_path / "drops"
    folder.mkdir()
    drops = FolderDrops(folder, tmp_path / "data", incomplete_wait_s=0)
    (folder / "cut.png").write_bytes(png(2)[:200])
    (folder / "notes.txt").write_text("not a picture: its row says so")
    assert drops.look() == [] and drops.look() == [folder / "cut.png", folder / "notes.txt"]


def test_new_content_under_an_old_name_is_a_new_drop(tmp_path: Path) -> None:
    folder = tmp_path / "drops"
    folder.mkdir()
    drops = FolderDrops(folder, tmp_path / "data")
    (folder / "a.png").write_bytes(png(1))
    assert drops.look() == [] and drops.look() == [folder / "a.png"]
    drops.gathered([folder / "a.png"])
    assert drops.look() == [] and drops.not_gathered() == []
    # WHEN the file is replaced by another picture of the same name
    (folder / "a.png").write_bytes(png(3))
    # THEN it is dropped again once it settles
    assert drops.look() == [] and drops.look() == [folder / "a.png"]
    assert drops.not_gathered() == [folder / "a.png"]
