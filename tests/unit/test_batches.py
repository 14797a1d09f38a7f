from __future__ import annotations

from pathlib import Path

from shared.batches import expand_locations, plan_batches
from shared.contracts import PromptMessage
from shared.storage import store_for


def make_inputs(folder: Path) -> Path:
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"first")
    (folder / "sub").mkdir()
    (folder / "sub" / "b.png").write_bytes(b"second")
    (folder / ".hidden").write_bytes(b"ignored")
    return folder


def test_folders_expand_to_their_files_and_missing_paths_are_kept(tmp_path: Path) -> None:
    folder = make_inputs(tmp_path / "in")
    found = expand_locations([str(folder), str(tmp_path / "missing.jpg"), str(folder / "a.jpg")], store_for)
    assert list(found) == [str(folder / "a.jpg"), str(folder / "sub" / "b.png"), str(tmp_path / "missing.jpg")]
    assert found[str(tmp_path / "missing.jpg")] == "missing"


def test_the_same_inputs_and_options_name_the_same_batch(tmp_path: Path) -> None:
    folder = make_inputs(tmp_path / "in")
    message = PromptMessage(prompt="dog.", images=[str(folder)])
    first = plan_batches(message, 500, "/results", store_for)
    again = plan_batches(message, 500, "/results", store_for)
    assert [b.batch_id for b in first] == [b.batch_id for b in again]
    assert first[0].images == again[0].images


def test_other_options_or_other_content_name_another_batch(tmp_path: Path) -> None:
    folder = make_inputs(tmp_path / "in")
    message = PromptMessage(prompt="dog.", images=[str(folder)])
    [original] = plan_batches(message, 500, "/results", store_for)
    [other_options] = plan_batches(message.model_copy(update={"box_threshold": 0.5}), 500, "/results", store_for)
    (folder / "a.jpg").write_bytes(b"changed")
    [other_content] = plan_batches(message, 500, "/results", store_for)
    assert len({original.batch_id, other_options.batch_id, other_content.batch_id}) == 3
    assert original.images[1] == other_content.images[1]  # the unchanged image keeps its id


def test_large_messages_are_split_into_bounded_batches(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(5):
        (folder / f"{index}.jpg").write_bytes(bytes([index]))
    batches = plan_batches(PromptMessage(prompt="dog.", images=[str(folder)]), 2, "/r", store_for)
    assert [len(batch.images) for batch in batches] == [2, 2, 1]
