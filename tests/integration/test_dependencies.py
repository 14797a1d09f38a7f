"""Each step's dependencies are built from the table of step ports (shared/pipeline/dependencies.py): a step gets
its own model and no other, on the tiny models."""

from __future__ import annotations

import dataclasses

import pytest

from shared.pipeline.dependencies import STEP_PORTS, Dependencies, Step, build_dependencies
from shared.settings import Settings

PORTS = ("detector", "classifier", "tagger", "segmenter", "captioner", "generator")
OWN_PORT = {
    Step.DETECT: "detector",
    Step.CLASSIFY: "classifier",
    Step.TAG: "tagger",
    Step.SEGMENT: "segmenter",
    Step.CAPTION: "captioner",
    Step.VARIANTS: "generator",
}

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("step", list(Step), ids=str)
def test_a_step_gets_its_own_model_and_no_other(step: Step, tiny_settings: Settings) -> None:
    built = build_dependencies(step, tiny_settings)
    filled = {port for port in PORTS if getattr(built, port) is not None}
    assert filled == ({OWN_PORT[step]} if step in OWN_PORT else set())
    # what every step shares comes from the settings, whichever step it is
    assert (built.image_limits, built.picture_format) == (tiny_settings.image_limits, tiny_settings.picture_format)


def test_every_port_of_the_dependencies_is_some_step_s() -> None:
    fields = {field.name for field in dataclasses.fields(Dependencies)}
    assert set(PORTS) <= fields and {port.fills for port in STEP_PORTS.values()} == set(PORTS)
    assert {step: STEP_PORTS[step].fills for step in OWN_PORT} == OWN_PORT


def test_the_fakes_give_a_step_its_own_port_only_as_the_real_dependencies_do() -> None:
    from tests.fakes import FakeModels

    fakes = FakeModels()
    for step in Step:
        built = fakes.dependencies(step)
        filled = {port for port in PORTS if getattr(built, port) is not None}
        assert filled == ({OWN_PORT[step]} if step in OWN_PORT else set()), step
