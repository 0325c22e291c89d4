"""best_of on /v1/completions: the n best of best_of candidates, every candidate in usage."""
import re

import pytest

BODY = {"model": "test-model", "prompt": "hi there", "max_tokens": 5, "temperature": 1.0, "seed": 5,
        "ignore_eos": True}


def _cumulative(choice: dict) -> float:
    return sum(choice["logprobs"]["token_logprobs"])


def test_best_of_returns_the_best_candidates(tiny_server):
    status, everyone = tiny_server.post("/v1/completions", {**BODY, "n": 3, "logprobs": 0})
    assert status == 200
    status, best = tiny_server.post("/v1/completions", {**BODY, "n": 2, "best_of": 3})
    assert status == 200, best
    ranked = sorted(everyone["choices"], key=_cumulative, reverse=True)
    assert [c["index"] for c in best["choices"]] == [0, 1]
    assert [c["text"] for c in best["choices"]] == [c["text"] for c in ranked[:2]]
    assert best["usage"]["completion_tokens"] == 15  # all three candidates' tokens


def test_best_of_guided_candidates_all_match(tiny_server):
    body = {**BODY, "n": 2, "best_of": 4, "max_tokens": 8, "ignore_eos": False, "guided_regex": "[0-9]{2,5}"}
    status, out = tiny_server.post("/v1/completions", body)
    assert status == 200, out
    assert len(out["choices"]) == 2 and all(re.fullmatch("[0-9]{2,5}", c["text"]) for c in out["choices"])


@pytest.mark.parametrize("extra, message", [
    ({"n": 3, "best_of": 2}, "best_of must be an integer >= n (3), got 2"),
    ({"n": 1, "best_of": 2, "stream": True}, "best_of > n is not supported with stream"),
    ({"n": 1, "best_of": 17}, "best_of must be <= 16"),
])
def test_best_of_errors_name_the_field(tiny_server, extra, message):
    status, out = tiny_server.post("/v1/completions", {**BODY, **extra})
    assert status == 400
    assert out["error"]["param"] == "best_of" and message in out["error"]["message"]


def test_best_of_equal_to_n_streams(tiny_server):
    stream = tiny_server.client().completions.create(model="test-model", prompt="hi", max_tokens=3, n=2, best_of=2,
                                                     stream=True)
    assert {c.choices[0].index for c in stream if c.choices} == {0, 1}
