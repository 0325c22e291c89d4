"""The plugin as users meet it: inner pytest runs that load it through its entry point."""
import os

import pytest

pytest_plugins = ["pytester"]


def test_marker_parametrizes_over_a_directory(pytester, schema_dir):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.schema("schemas")
        def test_schema(schema):
            assert isinstance(schema, dict)
    """)
    result = pytester.runpytest("-v")
    result.stdout.fnmatch_lines(["*test_schema?flag.json? PASSED*", "*test_schema?point.json? PASSED*"])
    result.assert_outcomes(passed=2)


def test_marker_takes_a_file_and_a_model(pytester, schema_dir):
    pytester.makepyfile("""
        import pytest
        from pydantic import BaseModel

        class Point(BaseModel):
            x: int

        @pytest.mark.schema("schemas/point.json", Point)
        def test_schema(schema):
            assert schema is Point or schema["required"] == ["x"]
    """)
    result = pytester.runpytest("-v")
    result.stdout.fnmatch_lines(["*test_schema?point.json? PASSED*", "*test_schema?Point? PASSED*"])


@pytest.mark.parametrize("test,error", [
    ('@pytest.mark.schema("schemas")\ndef test_x(): pass', "needs a `schema` argument"),
    ('@pytest.mark.schema("nowhere")\ndef test_x(schema): pass', "nowhere' does not exist"),
])
def test_marker_misuse_is_a_clear_error(pytester, schema_dir, test, error):
    pytester.makepyfile(f"import pytest\n\n{test}\n")
    result = pytester.runpytest()
    assert error in result.stdout.str() + result.stderr.str()
    assert result.ret != 0


def test_assert_conforms_failure_shows_the_pointer(pytester, schema_dir):
    pytester.makepyfile("""
        import pytest
        from gdserve.testing import assert_conforms

        @pytest.mark.schema("schemas/point.json")
        def test_conforms(schema):
            assert_conforms('{"x": 1}', schema)
            assert_conforms({"x": {"y": [1, "two"]}}, {"properties": {"x": {"properties": {"y": {
                "items": {"type": "integer"}}}}}})
    """)
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*output does not conform at /x/y/1: 'two' is not of type 'integer'*"])
    result.assert_outcomes(failed=1)


def test_server_fixture_serves_and_stops(pytester, tiny_args):
    pytester.makepyfile("""
        import pathlib, urllib.error, urllib.request

        import pytest

        def test_chat(gdserve_server):
            assert gdserve_server.base_url.startswith("http://127.0.0.1:")
            pathlib.Path("pid").write_text(str(gdserve_server.process.pid))
            r = gdserve_server.client.chat.completions.create(
                model=gdserve_server.model, messages=[{"role": "user", "content": "hi"}],
                max_tokens=4, extra_body={"guided_choice": ["yes", "no"]})
            assert r.choices[0].message.content in ("yes", "no")

        def test_same_server_with_the_flags_passed_through(gdserve_server):
            assert pathlib.Path("pid").read_text() == str(gdserve_server.process.pid)
            with pytest.raises(urllib.error.HTTPError, match="401"):
                urllib.request.urlopen(gdserve_server.base_url + "/models")
    """)
    pytester.runpytest(*tiny_args, "--gdserve-arg=--api-key sekrit").assert_outcomes(passed=2)
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(int((pytester.path / "pid").read_text()), 0)


def test_server_start_failure_fails_with_its_output(pytester, tmp_path):
    pytester.makepyfile("def test_chat(gdserve_server): pass")
    result = pytester.runpytest("--gdserve-model", str(tmp_path / "no-such-model"), "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*gdserve serve exited with code *", "*no-such-model*"])
    result.assert_outcomes(errors=1)


def test_llm_fixture(pytester, tiny_args):
    pytester.makepyfile("""
        from gdserve import SamplingParams

        def test_generate(gdserve_llm):
            params = SamplingParams(max_tokens=4, structured_outputs={"choice": ["yes", "no"]})
            assert gdserve_llm.generate("ok?", params)[0].outputs[0].text in ("yes", "no")
    """)
    pytester.runpytest(*tiny_args).assert_outcomes(passed=1)
