"""`gdserve bench maskbench`: the harness on a synthetic corpus with a fake backend (every outcome),
and the real gdserve backend on a few MaskBench dev files."""
import importlib.util
import json
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from gdserve.bench.maskbench import (BackendSpec, Case, format_table, load_jsts, load_maskbench,
                                     run_suite)
from gdserve.bench.peers import CompileFailed, make_backend
from gdserve.entrypoints.cli import main
from tests.helpers import CONFORMANCE, require_corpus

EOS = 256          # byte tokens 0-255, then EOS
VOCAB_SIZE = 257


def _clear_bit(bitmask, token_id: int) -> None:
    word, bit = divmod(token_id, 32)
    bitmask[0, word] = int(bitmask[0, word]) & ~(1 << bit)


class FakeMatcher:
    def __init__(self, validator: jsonschema.Draft202012Validator):
        self.validator, self.text = validator, b""

    def fill(self, bitmask) -> None:
        bitmask[0].fill_(-1)
        _clear_bit(bitmask, ord("~"))
        if not self._complete():
            _clear_bit(bitmask, EOS)

    def accept(self, token_id: int) -> bool:
        if self.validator.schema.get("x-raise"):
            raise RuntimeError("fake bug")
        if token_id in (EOS, ord("~")):
            return False
        self.text += bytes([token_id])
        return True

    def _complete(self) -> bool:
        try:
            return self.validator.is_valid(json.loads(self.text))
        except ValueError:
            return False


class FakeBackend:
    """Byte tokens, every byte allowed but "~" (a deliberate gap: valid strings with "~" are
    rejected); EOS once the text is a JSON document valid against the schema with "maximum"
    ignored (a deliberate bug: invalid instances above a maximum are accepted). Compiling a schema
    with "x-unsupported" fails; with "x-hang" it never finishes; with "x-raise" accept raises."""

    def __init__(self, vocab_size: int, eos_token_id: int):
        assert (vocab_size, eos_token_id) == (VOCAB_SIZE, EOS)
        print("fake backend ready", file=sys.stderr, flush=True)
        self.settings = {"whitespace": "any (fake)"}

    def compile(self, schema: dict) -> object:
        if "x-unsupported" in schema:
            raise CompileFailed("x-unsupported is not supported")
        if "x-hang" in schema:
            time.sleep(600)
        return jsonschema.Draft202012Validator({k: v for k, v in schema.items() if k != "maximum"})

    def matcher(self, compiled) -> FakeMatcher:
        return FakeMatcher(compiled)


SYNTHETIC = {
    "a_pass": ({"type": "object", "required": ["n"]},
               [({"n": 1}, True), ({}, False), ([1], False), ({"n": "é"}, True)]),
    "b_hang": ({"x-hang": True}, [({}, True)]),
    "c_wrong": ({"type": "integer", "maximum": 3}, [(2, True), (7, False)]),
    "d_unsupported": ({"x-unsupported": 1}, [(1, True)]),
    "e_tilde": ({"type": "string"}, [("a~b", True)]),
    "f_raise": ({"x-raise": True}, [(1, True)]),
}


def _write_maskbench(directory: Path) -> Path:
    directory.mkdir()
    for name, (schema, tests) in SYNTHETIC.items():
        doc = {"description": name, "meta": {"features": []}, "schema": schema,
               "tests": [{"description": "", "valid": valid, "data": data} for data, valid in tests]}
        (directory / f"{name}.json").write_text(json.dumps(doc))
    return directory


def test_fake_backend_gets_every_outcome(tmp_path):
    cases = load_maskbench(_write_maskbench(tmp_path / "corpus"))
    assert [c.name for c in cases] == [f"{n}.json" for n in SYNTHETIC]
    assert [c.name for c in load_maskbench(tmp_path / "corpus", limit=2, every=2)] == \
        ["a_pass.json", "c_wrong.json"]
    suite = run_suite(cases, [BackendSpec("fake", FakeBackend)], lambda s: list(s.encode()),
                      vocab_size=VOCAB_SIZE, eos_token_id=EOS, timeout_s=3,
                      log_path=str(tmp_path / "workers.log"))
    assert (suite["schemas"], suite["instances"]) == (6, 10)
    fake = suite["backends"]["fake"]
    outcomes = {name: r["outcome"] for name, r in fake["per_schema"].items()}
    assert outcomes == {"a_pass.json": "passing", "b_hang.json": "timeout",
                        "c_wrong.json": "invalidation_error", "d_unsupported.json": "compile_error",
                        "e_tilde.json": "validation_error", "f_raise.json": "crash"}
    assert fake["counts"] == {"passing": 1, "compile_error": 1, "timeout": 1, "validation_error": 1,
                              "invalidation_error": 1, "crash": 1}
    assert fake["percent"]["passing"] == 16.67
    assert "x-unsupported" in fake["per_schema"]["d_unsupported.json"]["detail"]
    assert fake["per_schema"]["e_tilde.json"]["detail"] == "valid instance 0 rejected at token 2 (mask)"
    assert fake["per_schema"]["c_wrong.json"]["detail"] == "invalid instance(s) [1] accepted"
    assert fake["per_schema"]["f_raise.json"]["detail"] == "instance 0: RuntimeError: fake bug"
    assert fake["settings"] == {"whitespace": "any (fake)"}
    assert fake["mask_accept_disagreements"] == 0
    # TTFM for the 4 compiled schemas; a fill per token and EOS check, less each schema's first
    # (part of TTFM): a_pass {"n": 1} = 8 bytes + EOS, ... at least one fill each.
    assert fake["ttfm_ms"]["p50"] is not None and fake["tbm_us"]["fills"] > 20
    # The worker's stderr went to the log; a second worker replaced the one killed at b_hang.
    assert (tmp_path / "workers.log").read_text().count("fake backend ready") == 2
    table = format_table("synthetic", suite)
    assert "invalidation error" in table and "c_wrong.json" in table


def test_jsts_groups_are_cases(tmp_path):
    (tmp_path / "optional").mkdir()
    (tmp_path / "optional" / "skipped.json").write_text("[]")
    groups = [{"description": "g1", "schema": {"type": "integer"},
               "tests": [{"description": "", "data": 1, "valid": True}]},
              {"description": "g2", "schema": True, "tests": []}]
    (tmp_path / "type.json").write_text(json.dumps(groups))
    cases = load_jsts(tmp_path)
    assert [(c.name, c.schema, c.tests) for c in cases] == [
        ("type#0 g1", {"type": "integer"}, [(1, True)]), ("type#1 g2", True, [])]
    assert [c.name for c in load_jsts(tmp_path, limit=1)] == ["type#0 g1"]
    assert [c.name for c in load_jsts(tmp_path, every=2)] == ["type#0 g1"]


def test_missing_corpus_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "maskbench", str(tmp_path / "nowhere")])
    assert e.value.code == 2
    assert f"no corpus at {tmp_path / 'nowhere'}" in capsys.readouterr().err


def test_gdserve_on_maskbench_dev(smollm2_dir):
    corpus = require_corpus(CONFORMANCE / "maskbench-dev")
    if importlib.util.find_spec("gdserve.grammar.json.schema") is None:
        pytest.skip("gdserve.grammar.json.schema is not there yet")
    from gdserve.models import load_tokenizer
    tokenizer = load_tokenizer(smollm2_dir)
    cases = load_maskbench(corpus, limit=5)
    spec = BackendSpec("gdserve", make_backend, {"name": "gdserve", "model_dir": str(smollm2_dir)})
    suite = run_suite(cases, [spec], lambda s: tokenizer.encode(s, add_special_tokens=False),
                      vocab_size=49152, eos_token_id=tokenizer.eos_token_id, timeout_s=30)
    assert not suite["skipped"], suite["skipped"]
    result = suite["backends"]["gdserve"]
    assert result["schemas"] == 5
    assert result["counts"]["invalidation_error"] == 0, result["per_schema"]
    assert result["mask_accept_disagreements"] == 0
    compiled = sum(1 for r in result["per_schema"].values() if "ttfm_ms" in r)
    tally = result["enforcement"]  # the compiled constraints' enforcement reports, tallied
    assert tally["schemas"] == compiled and tally["keywords"]["exact"] > 0
    assert "enforcement report over" in format_table("maskbench-dev", suite)
