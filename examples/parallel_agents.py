"""Several agents, each with its own pydantic output schema, firing at once through AsyncOpenAI;
every answer is parsed and validated by its model (the server constrains each to its schema).

    make serve                       # in another shell
    python examples/parallel_agents.py [--rounds 2]
"""
import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from typing import Literal

from openai import AsyncOpenAI
from pydantic import BaseModel, Field

BASE_URL = os.environ.get("GDSERVE_BASE_URL", "http://127.0.0.1:8000/v1")
REVIEW = "The battery lasts two days and the screen is bright, but the camera is slow. 4 out of 5."


class Sentiment(BaseModel):
    sentiment: Literal["positive", "negative", "mixed"]
    stars: int = Field(ge=1, le=5)


class Aspects(BaseModel):
    liked: list[Literal["battery", "screen", "camera", "price", "design"]] = Field(max_length=3)
    disliked: list[Literal["battery", "screen", "camera", "price", "design"]] = Field(max_length=3)


class Reply(BaseModel):
    subject: str = Field(max_length=60)
    apologize: bool


class Triage(BaseModel):
    team: Literal["hardware", "software", "support"]
    priority: Literal["low", "medium", "high"]


@dataclass
class Agent:
    name: str
    instructions: str
    schema: type[BaseModel]


AGENTS = [
    Agent("sentiment", "Rate the review's sentiment and its stars.", Sentiment),
    Agent("aspects", "List the product aspects the reviewer liked and disliked.", Aspects),
    Agent("reply", "Draft the subject line of our reply to the reviewer.", Reply),
    Agent("triage", "Route the review to a team with a priority.", Triage),
]


async def run_agent(client: AsyncOpenAI, model: str, agent: Agent, text: str, seed: int) -> BaseModel:
    completion = await client.chat.completions.parse(
        model=model, response_format=agent.schema, temperature=0.7, seed=seed, max_tokens=96,
        messages=[{"role": "system", "content": f"You are the {agent.name} agent. {agent.instructions} Answer in JSON."},
                  {"role": "user", "content": text}])
    parsed = completion.choices[0].message.parsed
    return agent.schema.model_validate(parsed.model_dump())  # validated twice: by the SDK, and here


async def main(rounds: int) -> None:
    client = AsyncOpenAI(base_url=BASE_URL, api_key="EMPTY")
    model = (await client.models.list()).data[0].id
    jobs = [(agent, r) for r in range(rounds) for agent in AGENTS]
    start = time.perf_counter()
    results = await asyncio.gather(*(run_agent(client, model, agent, REVIEW, seed) for agent, seed in jobs))
    seconds = time.perf_counter() - start
    for (agent, seed), result in zip(jobs, results):
        assert isinstance(result, agent.schema)
        print(f"{agent.name:>9} #{seed}: {result.model_dump_json()}")
    print(f"{len(jobs)} agent calls in parallel, all valid, in {seconds:.1f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2, help="how many times each agent runs (different seeds)")
    asyncio.run(main(parser.parse_args().rounds))
