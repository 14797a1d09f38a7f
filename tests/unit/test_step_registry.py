"""Every list of steps is the step registry's (shared/pipeline/dependencies.py, STEP_PORTS): a step added there, or
one of these lists written by hand again, fails here until each place that must know it does."""

from __future__ import annotations

from shared.contracts import AnnotationRequest
from shared.pipeline.dependencies import ANNOTATION_MODEL_STEPS, STEP_PORTS, Dependencies, Step, steps_wanted
from shared.storage.tables import IMAGES_SCHEMA, MADE_BY_ROLES
from tests.fakes import FakeModels


def test_the_annotation_steps_are_the_registry_s_in_the_order_an_image_meets_them() -> None:
    assert ANNOTATION_MODEL_STEPS == (Step.DETECT, Step.CLASSIFY, Step.TAG, Step.SEGMENT, Step.CAPTION)


def test_chaos_the_bench_and_the_cost_count_the_registry_s_steps() -> None:
    from tools.bench.cost_lanes import MODEL_STEPS as PRICED
    from tools.bench.models import STEP_LOADERS
    from tools.local.chaos_faults import MODEL_STEPS as FAULTED

    names = [step.value for step in ANNOTATION_MODEL_STEPS]
    assert sorted(FAULTED) == sorted(names) and list(STEP_LOADERS) == names
    # the cost prices what a request with the defaults runs (masks, an option, apart)
    default = [step.value for step in steps_wanted(AnnotationRequest(prompt="cat.")) if step is not Step.WRITE_RESULT]
    assert list(PRICED) == default == [name for name in names if name != "segment"]


def test_a_call_loads_the_steps_its_request_wants() -> None:
    everything = steps_wanted(AnnotationRequest(prompt="cat.", caption=True, masks=True))
    without_caption = steps_wanted(AnnotationRequest(prompt="cat.", caption=False, masks=True))
    without_masks = steps_wanted(AnnotationRequest(prompt="cat.", caption=True))
    assert everything == [*ANNOTATION_MODEL_STEPS, Step.WRITE_RESULT]
    assert without_caption == [step for step in everything if step is not Step.CAPTION]
    assert without_masks == [step for step in everything if step is not Step.SEGMENT]


def test_each_annotation_step_has_its_seconds_and_where_it_says_so_its_model_in_the_images_row() -> None:
    columns = set(IMAGES_SCHEMA.names)
    assert {f"{step.value}_ms" for step in ANNOTATION_MODEL_STEPS} <= columns
    named = {step.value: port.fills for step, port in STEP_PORTS.items() if port.row_names_model}
    assert named == MADE_BY_ROLES and {f"{role}_model" for role in named.values()} <= columns


def test_the_fakes_stand_in_for_every_port_of_the_registry() -> None:
    fakes = FakeModels()
    for step, port in STEP_PORTS.items():
        dependencies = fakes.dependencies(step)
        assert isinstance(dependencies, Dependencies) and getattr(dependencies, port.fills) is not None, step
