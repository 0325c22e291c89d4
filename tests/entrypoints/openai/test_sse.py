"""SSE frames: one line per event for every line splitter clients use (httpx's aiter_lines splits
at U+0085, U+2028 and U+2029 as str.splitlines does), the same JSON once decoded."""
import json

from gdserve.entrypoints.openai.sse import frame


def test_generated_line_separators_do_not_cut_a_frame():
    data = {"choices": [{"text": "a\u2028b\x85c\u2029d\n\r\x1c\"é"}]}
    text = frame(data)
    lines = text.splitlines()
    assert lines[0].startswith("data: ") and lines[1:] == [""]
    assert json.loads(lines[0][len("data: "):]) == data
