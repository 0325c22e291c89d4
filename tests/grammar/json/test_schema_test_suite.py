"""The official JSON-Schema-Test-Suite (draft 2020-12, non-optional) against the schema compiler:
every test instance is matched against the compiled constraint (the regex path, or the grammar
path's Lark grammar for recursive schemas) and scored. Strict mode must never accept an invalid
instance; the outcome of every test is pinned in schema_test_suite_baseline.json, which may
only improve (GDSERVE_UPDATE_BASELINE=1 rewrites it after an improvement)."""
import json
import os
import re
from collections import Counter
from pathlib import Path

import lark
import pytest

from gdserve.grammar.errors import (GrammarError, RecursiveSchemaError, RegexTooLargeError,
                                    UnsatisfiableSchemaError)
from gdserve.grammar.json.schema import compile_json_schema
from gdserve.grammar.json.schema_cfg import schema_to_grammar
from tests.helpers import CONFORMANCE, require_corpus

SUITE = CONFORMANCE / "json-schema-test-suite" / "tests" / "draft2020-12"
BASELINE = Path(__file__).with_name("schema_test_suite_baseline.json")
EXACT = "exact"                     # accepted iff valid
REJECTED_VALID = "rejected-valid"   # a valid instance rejected (incomplete, sound)
UNSUPPORTED = "unsupported"         # the schema does not compile (a clear error)
ACCEPTED_INVALID = "accepted-invalid"  # unsound: never allowed in strict mode


def compiled_matcher(schema):
    """instance text -> accepted?  None: the schema does not compile. JSON Schema semantics:
    open_objects (undeclared keys wherever the schema admits them)."""
    try:
        rx = re.compile(compile_json_schema(schema, open_objects=True).regex)
        return lambda text: rx.fullmatch(text) is not None
    except UnsatisfiableSchemaError:
        return lambda text: False  # refused as unsatisfiable: nothing is ever accepted
    except (RecursiveSchemaError, RegexTooLargeError):
        pass  # the grammar path
    except GrammarError:
        return None
    try:
        parser = lark.Lark(schema_to_grammar(schema, open_objects=True).lark, parser="earley", lexer="dynamic_complete")
    except GrammarError:
        return None

    def accepts(text: str) -> bool:
        try:
            parser.parse(text)
            return True
        except lark.exceptions.LarkError:
            return False
    return accepts


def outcomes() -> dict[str, str]:
    results = {}
    for f in sorted(SUITE.glob("*.json")):
        for ci, case in enumerate(json.loads(f.read_text())):
            accepts = compiled_matcher(case["schema"])
            for ti, test in enumerate(case["tests"]):
                key = f"{f.stem}#{ci}.{ti}: {case['description']} / {test['description']}"
                if accepts is None:
                    results[key] = UNSUPPORTED
                    continue
                hit = accepts(json.dumps(test["data"]))
                results[key] = EXACT if hit == test["valid"] else REJECTED_VALID if test["valid"] else ACCEPTED_INVALID
    return results


def test_json_schema_test_suite_only_improves():
    require_corpus(SUITE)
    results = outcomes()
    counts = Counter(results.values())
    print(f"JSON-Schema-Test-Suite draft2020-12: {counts[EXACT]}/{len(results)} exact "
          f"({counts[EXACT] / len(results):.1%}), {dict(counts)}")
    unsound = [k for k, v in results.items() if v == ACCEPTED_INVALID]
    assert not unsound, f"invalid instances accepted in strict mode: {unsound[:10]}"
    if os.environ.get("GDSERVE_UPDATE_BASELINE"):
        BASELINE.write_text(json.dumps(results, indent=0, sort_keys=True) + "\n")
    baseline = json.loads(BASELINE.read_text())
    regressed = [k for k, v in baseline.items() if v == EXACT and results.get(k) != EXACT]
    assert not regressed, f"{len(regressed)} tests no longer exact: {regressed[:10]}"
    improved = sum(1 for k, v in results.items() if v == EXACT and baseline.get(k) != EXACT)
    assert not improved, (f"{improved} more tests are exact than the baseline holds: "
                          "rerun with GDSERVE_UPDATE_BASELINE=1 to pin them")
