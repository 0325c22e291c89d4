"""One choice's text -> content and tool calls, incrementally. `feed` takes new text and returns
chat deltas; `finish` returns the last ones. A non-streamed response feeds the whole text at once,
so streamed and non-streamed answers carry the same calls and arguments."""
import uuid
from dataclasses import dataclass

from gdserve.entrypoints.openai.tool_parser import TOOL_CALL_TAG, CallScanner, parse_tool_calls
from gdserve.entrypoints.openai.tools import ToolPlan


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    index: int
    name: str
    arguments: str = ""
    id: str = ""
    sent: int = -1  # argument chars streamed; -1: the call's first delta is not sent yet

    def __post_init__(self) -> None:
        self.id = self.id or new_call_id()

    def update(self, raw_arguments: str) -> list[dict]:
        """Deltas for the arguments grown to raw_arguments (stripped: as text only grows, the
        stripped text only grows too, so what was sent stays a prefix)."""
        self.arguments = raw_arguments.strip()
        deltas = []
        if self.sent < 0:
            self.sent = 0
            deltas.append({"index": self.index, "id": self.id, "type": "function",
                           "function": {"name": self.name, "arguments": ""}})
        if len(self.arguments) > self.sent:
            deltas.append({"index": self.index, "function": {"arguments": self.arguments[self.sent:]}})
            self.sent = len(self.arguments)
        return [{"tool_calls": [d]} for d in deltas]

    def message(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class ChoiceTools:
    calls: list[ToolCall]
    content: str | None

    def feed(self, text: str) -> list[dict]:
        raise NotImplementedError

    def finish(self) -> list[dict]:
        return []

    def message(self) -> dict:
        return {"role": "assistant", "content": self.content, "refusal": None,
                "tool_calls": [c.message() for c in self.calls]}

    def finish_reason(self, engine_reason: str | None) -> str | None:
        return "tool_calls" if self.calls and engine_reason == "stop" else engine_reason


class NamedTool(ChoiceTools):
    """The output is the named function's arguments."""

    def __init__(self, name: str):
        self.calls, self.content, self._text = [ToolCall(0, name)], None, ""

    def feed(self, text: str) -> list[dict]:
        self._text += text
        return self.calls[0].update(self._text)


class RequiredTools(ChoiceTools):
    """The output is {"name": ..., "arguments": ...} or a JSON array of them."""

    def __init__(self):
        self.calls, self.content, self._scanner = [], None, CallScanner()

    def feed(self, text: str) -> list[dict]:
        self._scanner.feed(text)
        deltas = []
        for i, scanned in enumerate(self._scanner.calls):
            if scanned.name is None:
                break
            if i == len(self.calls):
                self.calls.append(ToolCall(i, scanned.name))
            deltas += self.calls[i].update(scanned.arguments)
        return deltas


class AutoTools(ChoiceTools):
    """Free text that may hold calls. Content streams as it comes, except a tail that could begin
    a `<tool_call>` tag, and except a reply that begins like JSON: from a tag on, or for a JSON
    reply, the text is held and parsed at the end; what doesn't parse is sent as content then."""

    def __init__(self, plan: ToolPlan):
        self.calls, self.content = [], None
        self._names, self._parallel = plan.names, plan.parallel
        self._text, self._sent, self._hold_from = "", 0, None

    def feed(self, text: str) -> list[dict]:
        self._text += text
        if self._hold_from is None:
            self._hold_from = self._call_start()
        end = self._hold_from if self._hold_from is not None else self._safe_end()
        return self._content(end)

    def finish(self) -> list[dict]:
        calls = parse_tool_calls(self._text[self._hold_from:], self._names) if self._hold_from is not None else None
        if not calls:
            self._hold_from = None
            deltas = self._content(len(self._text))
            self.content = self._text
            return deltas
        head = self._text[:self._hold_from]
        self.content = head if head.strip() else None
        deltas = []
        for i, (name, arguments) in enumerate(calls[:None if self._parallel else 1]):
            self.calls.append(ToolCall(i, name))
            deltas += self.calls[i].update(arguments)
        return deltas

    def _call_start(self) -> int | None:
        if TOOL_CALL_TAG in self._text:
            return self._text.index(TOOL_CALL_TAG)
        stripped = self._text.lstrip()
        if self._sent == 0 and stripped[:1] in ("{", "[", "`"):
            return 0
        return None

    def _safe_end(self) -> int:
        """The end of the text that can't be part of a call: not a tail that may begin the tag,
        and nothing while the reply is only whitespace (it may still turn out to be JSON)."""
        if not self._text[self._sent:].strip() and self._sent == 0:
            return 0
        for k in range(min(len(TOOL_CALL_TAG) - 1, len(self._text)), 0, -1):
            if TOOL_CALL_TAG.startswith(self._text[-k:]):
                return len(self._text) - k
        return len(self._text)

    def _content(self, end: int) -> list[dict]:
        if end <= self._sent:
            return []
        piece, self._sent = self._text[self._sent:end], end
        return [{"content": piece}]


def choice_tools(plan: ToolPlan | None) -> ChoiceTools | None:
    """The handler for one choice, or None when the output is plain content."""
    if plan is None or plan.mode == "none":
        return None
    if plan.mode == "named":
        return NamedTool(plan.named.name)
    return RequiredTools() if plan.mode == "required" else AutoTools(plan)
