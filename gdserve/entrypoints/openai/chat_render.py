"""Chat messages (+ tools) -> prompt text through the chat template.

Templates that know tools (their source mentions `tools`) get them as `tools=`; for the others the
tools go into the system prompt, with the call format the parser reads. Assistant `tool_calls` go
to templates that mention `tool_calls` (arguments as objects, as templates expect); others get the
calls written into the content in the same `<tool_call>` format. `tool` messages keep their role;
a template that refuses it gets them as user messages.
"""
import json
import re

from gdserve.entrypoints.openai.errors import bad_request
from gdserve.entrypoints.openai.protocol import ChatMessage
from gdserve.entrypoints.openai.tools import Function, ToolPlan


def render_chat(tokenizer, template: str | None, messages: list[ChatMessage], plan: ToolPlan | None,
                add_generation_prompt: bool = True, kwargs: dict | None = None) -> str:
    source = _template_source(tokenizer, template)
    dicts = [_message_dict(m, i, "tool_calls" in source) for i, m in enumerate(messages)]
    tools = None
    if plan is not None and re.search(r"\btools\b", source):
        tools = plan.tools
    elif plan is not None and plan.mode != "none":
        dicts = _with_system(dicts, tools_prompt(plan))
    render = lambda ms: tokenizer.apply_chat_template(  # noqa: E731
        ms, chat_template=template, tools=tools, tokenize=False,
        add_generation_prompt=add_generation_prompt, **(kwargs or {}))
    try:
        try:
            return render(dicts)
        except Exception:
            if not any(d["role"] == "tool" for d in dicts):
                raise
            return render([_tool_as_user(d) for d in dicts])
    except Exception as e:  # no template, or the template rejects the conversation
        raise bad_request(f"cannot apply the chat template: {e}", "messages") from None


def _template_source(tokenizer, template: str | None) -> str:
    source = template if template is not None else getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):  # named templates
        source = source.get("tool_use") or source.get("default") or ""
    return source or ""


def _message_dict(m: ChatMessage, i: int, template_knows_calls: bool) -> dict:
    """A message as the template sees it: content flattened to text; developer -> system
    (templates know system; OpenAI's developer role replaces it)."""
    d = m.model_dump(exclude_none=True)
    d["role"] = "system" if m.role == "developer" else m.role
    d["content"] = _text(m.content, i)
    if m.tool_calls:
        calls = [_call_for_template(c, i) for c in m.tool_calls]
        if template_knows_calls:
            d["tool_calls"] = calls
        else:
            del d["tool_calls"]
            written = "\n".join(format_call(c["function"]["name"], c["function"]["arguments"]) for c in calls)
            d["content"] = f"{d['content']}\n{written}" if d["content"] else written
    return d


def _call_for_template(call: dict, i: int) -> dict:
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(f"messages[{i}].tool_calls: each call needs function.name", f"messages[{i}].tool_calls")
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise bad_request(f"messages[{i}].tool_calls: function.arguments is not valid JSON",
                              f"messages[{i}].tool_calls") from None
    return {**call, "type": "function", "function": {**fn, "arguments": arguments}}


def format_call(name: str, arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}</tool_call>"


def _tool_as_user(d: dict) -> dict:
    if d["role"] != "tool":
        return d
    return {"role": "user", "content": f"<tool_response>{d['content']}</tool_response>"}


def _with_system(dicts: list[dict], text: str) -> list[dict]:
    if dicts and dicts[0]["role"] == "system":
        return [{**dicts[0], "content": f"{dicts[0]['content']}\n\n{text}"}] + dicts[1:]
    return [{"role": "system", "content": text}] + dicts


def tools_prompt(plan: ToolPlan) -> str:
    """The system-prompt description of the tools for templates that don't take `tools=`."""
    listed = "\n".join(_describe(f) for f in plan.functions)
    head = f"You have access to these functions:\n{listed}\n\n"
    if plan.mode == "named":
        return head + f"Call the function {plan.named.name}: reply with its arguments as a JSON object."
    if plan.mode == "required":
        many = " or a JSON list of such calls" if plan.parallel else ""
        return head + ('Call a function: reply with {"name": <function name>, "arguments": <the arguments '
                       f"as a JSON object>}}{many}.")
    return head + ("To call a function, reply with <tool_call>{\"name\": <function name>, \"arguments\": "
                   "<the arguments as a JSON object>}</tool_call> (one block per call) and nothing else. "
                   "If no function fits, answer normally.")


def _describe(f: Function) -> str:
    entry = {"name": f.name, **({"description": f.description} if f.description else {}), "parameters": f.parameters}
    return json.dumps(entry, ensure_ascii=False)


def _text(content, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"messages[{i}]: only text content parts are supported, got "
                              f"{part.get('type')!r}", f"messages[{i}].content")
        parts.append(part["text"])
    return "".join(parts)
