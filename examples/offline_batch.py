"""The offline `LLM` API on a batch, every answer constrained to one pydantic schema; no server.

    python examples/offline_batch.py [MODEL] [--num N]    # default: smollm2-135m-instruct, all 4
"""
import argparse
import time
from typing import Literal

from pydantic import BaseModel, Field

from gdserve import LLM, SamplingParams
from gdserve.sampling_params import StructuredOutputsParams


class Product(BaseModel):
    name: str = Field(max_length=40)
    category: Literal["food", "electronics", "clothing", "toys"]
    price_usd: float = Field(ge=0, le=10000)
    in_stock: bool


DESCRIPTIONS = ["a red wool sweater for 45 dollars, sold out",
                "noise-cancelling headphones at 199 dollars, available",
                "a box of 12 chocolate cookies for 6 dollars, available",
                "a wooden train set for kids at 35 dollars, available"]


def main(model: str, num: int) -> None:
    llm = LLM(model)
    params = SamplingParams(max_tokens=96, temperature=0.0, structured_outputs=StructuredOutputsParams(json=Product))
    conversations = [[{"role": "user", "content": f"Describe this product as JSON: {d}."}] for d in DESCRIPTIONS[:num]]
    start = time.perf_counter()
    outputs = llm.chat(conversations, params)
    seconds = time.perf_counter() - start
    tokens = 0
    for description, out in zip(DESCRIPTIONS, outputs):
        product = Product.model_validate_json(out.outputs[0].text)  # raises if the schema did not hold
        tokens += len(out.outputs[0].token_ids)
        print(f"{description[:44]:<44} -> {product.model_dump()}")
    print(f"{len(outputs)} valid products, {tokens} tokens in {seconds:.1f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    parser.add_argument("--num", type=int, default=len(DESCRIPTIONS), help="how many of the descriptions")
    args = parser.parse_args()
    main(args.model, args.num)
