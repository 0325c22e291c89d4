"""Reading tool calls out of model text.

`parse_tool_calls` (tool_choice "auto"): the model was told to write
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (one block per call, the Hermes / Qwen
format). Also accepted: a missing closing tag at the end, `parameters` for `arguments`, arguments
as a JSON string, an OpenAI-shaped `{"function": {...}}` wrapper, and a reply that is nothing but
such a JSON object, or a list of them, maybe in a ``` fence. Anything else stays content.

`CallScanner` (tool_choice "required"): follows the constrained `{"name": N, "arguments": A}` (or a
JSON array of them) character by character, so the arguments can stream as they are generated.
"""
import json
import re
from dataclasses import dataclass

TOOL_CALL_TAG = "<tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"\A```[a-zA-Z]*\s*(.*?)\s*```\Z", re.DOTALL)


def parse_tool_calls(text: str, names: set[str]) -> list[tuple[str, str]] | None:
    """[(name, arguments as a JSON string)] or None when the text holds no well-formed call to a
    known function."""
    if TOOL_CALL_TAG in text:
        calls = []
        for block in _BLOCK.findall(text[text.index(TOOL_CALL_TAG):]):
            found = _calls(_loads(block), names)
            if found is None:
                return None
            calls += found
        return calls or None
    return _calls(_loads(text), names)


def _loads(text: str):
    text = text.strip()
    if fenced := _FENCE.match(text):
        text = fenced.group(1)
    try:
        return json.loads(text)
    except ValueError:
        return None


def _calls(value, names: set[str]) -> list[tuple[str, str]] | None:
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, names) for item in items]
    return calls if calls and all(c is not None for c in calls) else None


def _call(obj, names: set[str]) -> tuple[str, str] | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if name not in names or not isinstance(args, dict):
        return None
    return name, json.dumps(args, ensure_ascii=False)


@dataclass
class ScannedCall:
    name: str | None = None
    arguments: str = ""  # raw text of the arguments value so far


class CallScanner:
    """Tracks nesting and strings; a call is an object at the top level (or inside the top-level
    array); inside it, the string after key "name" is the name and the value after key
    "arguments" is captured verbatim."""

    def __init__(self):
        self.calls: list[ScannedCall] = []
        self._depth = 0
        self._call_depth: int | None = None  # nesting depth directly inside a call object
        self._in_string = self._escape = False
        self._role: str | None = None        # of the current string: "key" | "name" | None
        self._buf: list[str] = []
        self._key: str | None = None
        self._after_colon = self._in_args = False

    def feed(self, text: str) -> None:
        for ch in text:
            if self._in_string:
                self._string_char(ch)
            else:
                self._char(ch)

    def _string_char(self, ch: str) -> None:
        if self._in_args:
            self.calls[-1].arguments += ch
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            self._in_string = False
            self._end_string()
            return
        if self._role is not None:
            self._buf.append(ch)

    def _end_string(self) -> None:
        if self._role is None:
            return
        value = json.loads('"' + "".join(self._buf) + '"')
        if self._role == "key":
            self._key = value
        else:
            self.calls[-1].name = value
        self._role, self._buf = None, []

    def _char(self, ch: str) -> None:
        level = self._depth  # before this character
        if ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
        if self._call_depth is None and not ch.isspace():
            self._call_depth = 1 if ch == "{" else 2
        if ch == "{" and level == self._call_depth - 1:
            self.calls.append(ScannedCall())
        if self._in_args and level == self._call_depth and ch in ",}":
            self._in_args = False
        if self._in_args:
            self.calls[-1].arguments += ch
            self._in_string = ch == '"'
            return
        if level != self._call_depth:
            return
        if ch == ":":
            self._after_colon = True
        elif self._after_colon and not ch.isspace():
            self._after_colon = False
            self._value_start(ch)
        elif ch == '"':
            self._in_string, self._role = True, "key"

    def _value_start(self, ch: str) -> None:
        if self._key == "arguments":
            self._in_args = True
            self.calls[-1].arguments += ch
            self._in_string = ch == '"'
        elif ch == '"':
            self._in_string = True
            self._role = "name" if self._key == "name" else None
