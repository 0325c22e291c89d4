import pytest
from pydantic import BaseModel

from gdserve.testing import load_schemas


class Item(BaseModel):
    sku: str


def test_directory_files_by_name(tmp_path):
    (tmp_path / "b.json").write_text('{"type": "string"}')
    (tmp_path / "a.json").write_text("true")
    (tmp_path / "notes.txt").write_text("not a schema")
    assert load_schemas(tmp_path) == [("a.json", True), ("b.json", {"type": "string"})]


def test_relative_file_and_model(tmp_path):
    (tmp_path / "one.json").write_text("{}")
    assert load_schemas("one.json", base_dir=tmp_path) == [("one.json", {})]
    assert load_schemas(Item) == [("Item", Item)]


@pytest.mark.parametrize("content,error", [("{", "is not JSON"), ("[1]", "holds a list, not a JSON Schema")])
def test_bad_file(tmp_path, content, error):
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(ValueError, match=error):
        load_schemas(tmp_path / "bad.json")


def test_missing_or_empty(tmp_path):
    with pytest.raises(ValueError, match="has no .json files"):
        load_schemas(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_schemas(tmp_path / "nope")
    with pytest.raises(TypeError, match="not int"):
        load_schemas(3)
