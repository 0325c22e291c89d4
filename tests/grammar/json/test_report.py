"""The enforcement report: every assertion keyword in exactly one of exact, approximated, ignored."""
from gdserve.grammar.json.report import enforcement_report
from gdserve.grammar.json.schema import compile_json_schema


def report(schema, lenient=False):
    compiled = compile_json_schema(schema, lenient=lenient)
    return enforcement_report(schema, compiled.relaxed, compiled.narrowed)


def test_a_format_outside_the_vocabularies_is_ignored_not_exact():
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": "semver"},
                                               "d": {"type": "string", "format": "date"}},
              "required": ["v", "d"]}
    r = report(schema)
    assert r["ignored"] == ["format 'semver' at /properties/v (not a JSON Schema format: an annotation)"]
    assert "format at /properties/v" not in r["exact"]
    assert {"format at /properties/d", "type at /properties/v", "required at /"} <= set(r["exact"])


def test_a_pointer_that_extends_another_is_not_confused_with_it():
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "format": "semver"},
        "ab": {"type": "string", "format": "ipv4"}}}
    r = report(schema)
    assert "format at /properties/ab" in r["exact"]
    assert "format at /properties/a" not in r["exact"]


def test_lenient_drops_and_narrowings_leave_exact():
    schema = {"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 1000},
        "n": {"type": "number", "multipleOf": 1.5}}, "required": ["s"]}
    r = report(schema, lenient=True)
    assert any(m.startswith("multipleOf at /properties/n") for m in r["ignored"])
    assert any(m.startswith("at /properties/s:") for m in r["approximated"])
    assert "multipleOf at /properties/n" not in r["exact"]
    assert "maxLength at /properties/s" not in r["exact"]
    assert {"type at /properties/n", "type at /properties/s", "required at /"} <= set(r["exact"])
