"""The Prefect forms: every parameter of every flow a person starts from the UI says what it is (Prefect reads the
docstring's ``Args:`` section into the form)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("name", ["adaptbert_pipeline", "compare_and_promote"])
def test_every_flow_parameter_has_a_description_in_the_form(name: str) -> None:
    from prefect.utilities.callables import parameter_schema

    import flows.pipeline

    schema = parameter_schema(getattr(flows.pipeline, name).fn).model_dump()
    missing = [p for p, spec in schema["properties"].items() if not spec.get("description")]
    assert not missing, f"{name}: no description for {missing} (add them under Args: in its docstring)"
