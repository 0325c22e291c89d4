"""The constraint of a forced tool_choice (a named function, "required"): the functions' parameter
schemas, each enforced exactly unless its function says "strict": false (then compiled leniently,
and what was relaxed is reported). A schema that does not compile is a 400 naming its function."""
import asyncio

from gdserve.entrypoints.openai.errors import bad_request
from gdserve.entrypoints.openai.serving import ServingContext, compile_guided
from gdserve.entrypoints.openai.structured import Constraint
from gdserve.entrypoints.openai.tools import Function, ToolPlan
from gdserve.grammar import GrammarError
from gdserve.sampling_params import StructuredOutputsParams


async def compile_tools(ctx: ServingContext, plan: ToolPlan) -> Constraint:
    """named: the function's parameters. required: a call of any function (plan.schema()). The
    combined schema compiles leniently when a function is lenient, so each function first compiles
    on its own: the strict ones exactly, the lenient ones to report what they relax."""
    if plan.mode == "named":
        return await _compile_function(ctx, plan.named)
    lenient = any(f.strict is False for f in plan.functions)
    own = await _each_function(ctx, plan.functions) if lenient else []
    try:
        grammar = await compile_guided(ctx, StructuredOutputsParams(json=plan.schema(), lenient=lenient))
    except GrammarError as e:
        if not lenient:
            await _each_function(ctx, plan.functions)  # a 400 naming the function at fault, if one is
        raise bad_request(f"cannot build the tool_choice constraint: {e}", "tools") from None
    return Constraint(grammar, {where: relaxed for c in own for where, relaxed in c.relaxed.items()})


async def _each_function(ctx: ServingContext, functions: list[Function]) -> list[Constraint]:
    """Every function's parameters compiled on their own, concurrently; the first in request order
    that fails is the 400."""
    results = await asyncio.gather(*(_compile_function(ctx, f) for f in functions), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def _compile_function(ctx: ServingContext, f: Function) -> Constraint:
    lenient = f.strict is False
    try:
        grammar = await compile_guided(ctx, StructuredOutputsParams(json=f.parameters, lenient=lenient))
    except GrammarError as e:
        raise bad_request(f"invalid {f.where} (function '{f.name}'): {e}", "tools") from None
    return Constraint(grammar, {f.where: list(grammar.relaxed)} if lenient else {})
