import json

import pytest
from pydantic import BaseModel, Field

from gdserve.testing import assert_conforms

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}},
                                           "email": {"type": "string", "format": "email"}},
          "required": ["name"], "additionalProperties": False}


class Person(BaseModel):
    name: str
    age: int = Field(ge=0)


@pytest.mark.parametrize("output", ['{"name": "ada", "tags": ["x"]}', b'{"name": "ada"}', {"name": "ada"}])
def test_conforming_output_passes_and_is_returned_parsed(output):
    assert assert_conforms(output, SCHEMA)["name"] == "ada"


def test_failure_names_the_pointer_and_the_offending_text():
    with pytest.raises(AssertionError) as e:
        assert_conforms({"name": "ada", "tags": ["ok", "toolong"]}, SCHEMA)
    assert "at /tags/1:" in str(e.value) and '"toolong"' in str(e.value)


def test_formats_are_checked():
    with pytest.raises(AssertionError, match="at /email: 'nope' is not a 'email'"):
        assert_conforms({"name": "ada", "email": "nope"}, SCHEMA)


def test_error_at_the_root_and_error_count():
    with pytest.raises(AssertionError) as e:
        assert_conforms({"tags": [1]}, SCHEMA)
    assert "2 errors in all" in str(e.value)
    with pytest.raises(AssertionError, match="the whole output"):
        assert_conforms("[1]", SCHEMA)


def test_text_that_is_not_json_fails_with_the_position():
    with pytest.raises(AssertionError, match=r"not JSON: .* column 10\n  offending text: 'oops}'"):
        assert_conforms('{"name": oops}', SCHEMA)


def test_pydantic_model():
    person = assert_conforms('{"name": "ada", "age": 36}', Person)
    assert person == Person(name="ada", age=36)
    with pytest.raises(AssertionError, match=r"at /age: Input should be greater than or equal to 0\n.*-1"):
        assert_conforms({"name": "ada", "age": -1}, Person)


def test_schema_file(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCHEMA))
    assert_conforms('{"name": "a"}', path)


@pytest.mark.parametrize("schema,error", [({"type": "nope"}, "invalid JSON Schema at /type"),
                                          ("missing.json", "does not exist")])
def test_bad_schema_is_a_clear_error(schema, error):
    with pytest.raises(ValueError, match=error):
        assert_conforms("{}", schema)


def test_schema_of_a_wrong_type():
    with pytest.raises(TypeError, match="not list"):
        assert_conforms("{}", [])


def test_first_error_in_document_order():
    schema = {"properties": {"tags": {"items": {"type": "string", "maxLength": 3}}}}
    with pytest.raises(AssertionError, match=r"at /tags/0: 'toolong' is too long\n.*\n  \(2 errors in all\)"):
        assert_conforms({"tags": ["toolong", 5]}, schema)


def test_any_of_names_the_likeliest_branch():
    schema = {"properties": {"id": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^x"}]}}}
    with pytest.raises(AssertionError, match="at /id: "):
        assert_conforms({"id": "y"}, schema)
