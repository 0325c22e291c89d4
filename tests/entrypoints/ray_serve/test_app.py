"""gdserve on Ray Serve, end to end on a local cluster: two replicas of the tiny model behind the
ingress answer as `gdserve serve` does, a shared prefix stays on one replica, and a killed replica
fails only its own requests, promptly, and comes back."""
import json
import threading
import time

import pytest

from tests.entrypoints.ray_serve.conftest import PREFIX_CHARS, ray, serve

REPLICA = "x-gdserve-replica"


def chat(client, content: str, system: str | None = None, **extra):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 4,
                                                     **extra})


def test_both_replicas_serve(ray_server):
    with ray_server.client() as client:
        replies = [chat(client, f"{i} distinct question") for i in range(12)]
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert len({r.headers[REPLICA] for r in replies}) == 2


def test_the_endpoints_errors_and_extra_body_of_gdserve_serve(ray_server):
    with ray_server.client() as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
        r = chat(client, "Is the sky green?", guided_choice=["yes", "no"])
        assert r.json()["choices"][0]["message"]["content"] in ("yes", "no")
        bad = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": -1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        unknown = client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        malformed = client.post("/v1/completions", content=b"{", headers={"Content-Type": "application/json"})
        assert malformed.status_code == 422
        too_large = client.post("/v1/completions", content=b"x" * 200_000)
        assert too_large.status_code == 413 and "max-request-bytes" in too_large.json()["error"]["message"]
        assert "gdserve_num_requests_running" in client.get("/metrics").text
    with ray_server.client(api_key=None) as anonymous:
        assert anonymous.get("/health").status_code == 200
        refused = anonymous.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_a_stream_is_relayed_event_by_event(ray_server):
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 8, "stream": True, "ignore_eos": True}
    with ray_server.client() as client, client.stream("POST", "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_shared_prefix_lands_on_one_replica_and_hits_its_cache(ray_server):
    system = "You answer in one short word, always politely."  # longer than PREFIX_CHARS with its role
    assert len(system) > PREFIX_CHARS - len("system:")
    with ray_server.client() as client:
        replies = [chat(client, f"question {i}?", system=system) for i in range(8)]
    assert all(r.status_code == 200 for r in replies)
    assert len({r.headers[REPLICA] for r in replies}) == 1
    cached = [r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies]
    assert all(c > 0 for c in cached[1:]), cached


def _stream_until_end(client, body: dict, started: threading.Event, outcome: dict) -> None:
    try:
        with client.stream("POST", "/v1/completions", json=body) as r:
            outcome["replica"] = r.headers[REPLICA]
            lines = r.iter_lines()
            outcome["events"] = [next(lines)]
            started.set()
            outcome["events"] += [line for line in lines if line.startswith("data: ")]
    except Exception as e:  # noqa: BLE001  (a closed connection is an acceptable end)
        outcome["error"] = e
    finally:
        started.set()
        outcome["ended"] = time.monotonic()


def test_a_killed_replica_fails_only_its_requests_and_is_restarted(ray_server):
    long = {"model": "tiny", "prompt": "a", "max_tokens": 120, "ignore_eos": True, "stream": True, "n": 8}
    with ray_server.client() as client:
        victim = chat(client, "first").headers[REPLICA]
        streams = []
        for i in range(40):  # long streams until one runs on the victim
            started, outcome = threading.Event(), {}
            body = {**long, "prompt": f"{i} long"}
            thread = threading.Thread(target=_stream_until_end, args=(client, body, started, outcome))
            thread.start()
            started.wait(60)
            streams.append((thread, outcome))
            if outcome.get("replica") == victim:
                break
        assert outcome.get("replica") == victim and "ended" not in outcome, "no stream in flight on the victim"
        ray.kill(ray.get_actor(victim, namespace="serve"))
        killed = time.monotonic()
        survivors = [chat(client, f"after the kill {i}") for i in range(6)]
        for thread, _ in streams:
            thread.join(60)
    assert not thread.is_alive() and outcome["ended"] - killed < 30
    # The victim's stream ends with an error event and [DONE] (or, at worst, a closed connection).
    assert "error" in outcome or ('"error"' in outcome["events"][-2] and outcome["events"][-1] == "data: [DONE]")
    assert [r.status_code for r in survivors] == [200] * 6
    assert victim not in {r.headers[REPLICA] for r in survivors}
    _wait_for_a_new_replica(ray_server, {victim, *(r.headers[REPLICA] for r in survivors)})


def _wait_for_a_new_replica(ray_server, seen: set[str]) -> None:
    deadline = time.monotonic() + 120
    with ray_server.client() as client:
        while time.monotonic() < deadline:
            for i in range(8):
                r = chat(client, f"{i} {time.monotonic()} after the restart")
                assert r.status_code == 200, r.text
                if r.headers[REPLICA] not in seen:
                    return
            time.sleep(1)
    pytest.fail(f"no new replica within 120 s: {serve.status().applications['gdserve']}")
