"""Write a gsm8k-format train/test parquet pair of arithmetic word problems, with no download.

With ``--format verl-rl`` (the default) the rows have the shape verl's
``examples/data_preprocess/gsm8k.py`` writes, so ``main_ppo`` and its rule reward for
``openai/gsm8k`` read them unchanged:

    data_source  "openai/gsm8k"
    prompt       [{"role": "user", "content": <question> + INSTRUCTION}]
    ability      "math"
    reward_model {"style": "rule", "ground_truth": <the number after "####", commas removed>}
    extra_info   {"split", "index", "answer", "question"}

``--format verl-sft`` adds what verl's SFT trainers read: ``extra_info`` question and answer
(fsdp_sft_trainer, as the seed's script keys them) and ``messages``, the same exchange as a
conversation (sft_trainer's multi-turn data). ``--format openrlhf-rl`` writes what OpenRLHF's
prompt dataset reads with ``--input_key prompt --label_key label --apply_chat_template``:
``data_source``, ``prompt`` and ``label`` (the ground truth, for the reward function).

The same seed, counts and format give the same rows and, with the same pyarrow, the same bytes.
Runs inside the image (pyarrow comes with the frameworks' dependencies) and on a host with pyarrow:

    python3 gsm8k_synth.py --out DIR [--train 256] [--test 64] [--seed 0] [--format verl-rl]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = ' Let\'s think step by step and output the final answer after "####".'

# Each template draws its numbers from the generator and returns (question, worked answer, result).
Problem = tuple[str, str, int]


def _sold(rng: random.Random) -> Problem:
    per_day, days = rng.randint(12, 60), rng.randint(2, 9)
    sold = rng.randint(1, per_day * days - 1)
    baked = per_day * days
    question = f"A bakery bakes {per_day} loaves of bread every day for {days} days and sells {sold} of them. How many loaves are left?"
    answer = f"The bakery bakes {per_day} * {days} = {baked} loaves.\nAfter selling {sold}, {baked} - {sold} = {baked - sold} are left."
    return question, answer, baked - sold


def _shared(rng: random.Random) -> Problem:
    friends = rng.randint(2, 8)
    each = rng.randint(3, 25)
    extra = rng.randint(0, friends - 1)
    total = friends * each + extra
    question = (
        f"Mia has {total} stickers. She gives the same number to each of her {friends} friends, as many as she can, "
        "and keeps the rest. How many stickers does each friend get?"
    )
    answer = f"{total} divided among {friends} friends is {each} each, with {extra} left over.\nEach friend gets {each}."
    return question, answer, each


def _price(rng: random.Random) -> Problem:
    price, count = rng.randint(2, 40), rng.randint(2, 12)
    cost = price * count
    paid = cost + rng.randint(1, 500)
    question = f"Tom buys {count} notebooks at ${price} each and pays with ${paid:,}. How much change does he get, in dollars?"
    answer = f"The notebooks cost {count} * {price} = {cost} dollars.\nHis change is {paid} - {cost} = {paid - cost} dollars."
    return question, answer, paid - cost


def _distance(rng: random.Random) -> Problem:
    speed, hours = rng.randint(30, 120), rng.randint(2, 20)
    there = speed * hours
    total = there * 2
    question = (
        f"A truck drives at {speed} km per hour for {hours} hours to a warehouse and returns the same way. "
        "How many km does it drive in all?"
    )
    answer = f"One way is {speed} * {hours} = {there} km.\nThere and back is {there} * 2 = {total} km."
    return question, answer, total


def _savings(rng: random.Random) -> Problem:
    weekly, weeks, spent = rng.randint(50, 400), rng.randint(4, 52), rng.randint(100, 2000)
    saved = weekly * weeks
    if spent >= saved:
        spent = saved // 2
    question = f"Lena saves ${weekly} every week for {weeks} weeks, then spends ${spent:,} on a bike. How many dollars does she have left?"
    answer = f"She saves {weekly} * {weeks} = {saved} dollars.\nAfter the bike, {saved} - {spent} = {saved - spent} dollars are left."
    return question, answer, saved - spent


TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (_sold, _shared, _price, _distance, _savings)


FORMATS = ("verl-rl", "verl-sft", "openrlhf-rl")


def rows(split: str, count: int, seed: int, fmt: str = "verl-rl") -> list[dict[str, Any]]:
    """``count`` rows of one split; the split name is part of the seed, so train and test differ.
    The problems depend on the seed alone: every format holds the same ones."""
    rng = random.Random(f"ascendkit-gsm8k-synth/{seed}/{split}")
    result = []
    for index in range(count):
        question, worked, value = rng.choice(TEMPLATES)(rng)
        answer = f"{worked}\n#### {value:,}"  # gsm8k writes thousands with commas after ####
        prompt = [{"role": "user", "content": question + INSTRUCTION}]
        if fmt == "openrlhf-rl":
            result.append({"data_source": DATA_SOURCE, "prompt": prompt, "label": ground_truth(answer)})
            continue
        row: dict[str, Any] = {
            "data_source": DATA_SOURCE,
            "prompt": prompt,
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": ground_truth(answer)},
            "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
        }
        if fmt == "verl-sft":
            row["messages"] = [*prompt, {"role": "assistant", "content": answer}]
        result.append(row)
    return result


def ground_truth(answer: str) -> str:
    """What verl's gsm8k preprocessing keeps: the text after ``####``, commas removed."""
    return answer.split("####")[-1].strip().replace(",", "")


def _schema(fmt: str = "verl-rl") -> Any:
    import pyarrow as pa

    text = pa.string()
    messages = pa.list_(pa.struct([("role", text), ("content", text)]))
    if fmt == "openrlhf-rl":
        return pa.schema([("data_source", text), ("prompt", messages), ("label", text)])
    columns = [
        ("data_source", text),
        ("prompt", messages),
        ("ability", text),
        ("reward_model", pa.struct([("style", text), ("ground_truth", text)])),
        ("extra_info", pa.struct([("split", text), ("index", pa.int64()), ("answer", text), ("question", text)])),
    ]
    if fmt == "verl-sft":
        columns.append(("messages", messages))
    return pa.schema(columns)


def write_split(path: Path, data: list[dict[str, Any]], fmt: str = "verl-rl") -> None:
    """Write one parquet file atomically (a temporary file, then a rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(data, schema=_schema(fmt))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="snappy")
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write gsm8k-format train.parquet and test.parquet of synthetic arithmetic problems.")
    parser.add_argument("--out", type=Path, required=True, help="directory for train.parquet and test.parquet")
    parser.add_argument("--train", type=int, default=256, help="training rows (default 256)")
    parser.add_argument("--test", type=int, default=64, help="test rows (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=FORMATS, default="verl-rl", help="the columns of a framework and job (default verl-rl)")
    args = parser.parse_args(argv)
    if args.train < 1 or args.test < 1:
        parser.error("--train and --test must be at least 1")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        print("gsm8k_synth: pyarrow is not installed (the images carry it; on a host: pip install pyarrow)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", args.train), ("test", args.test)):
        write_split(args.out / f"{split}.parquet", rows(split, count, args.seed, args.format), args.format)
    print(f"gsm8k_synth: wrote {args.train} train and {args.test} test rows ({args.format}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
