"""tinker-cookbook's supervised recipe (`recipes/sl_basic.py`) against `quartet serve tinker`, offline.

The recipe's own entry point, `tinker_cookbook.recipes.sl_basic.main(config)`, runs unchanged; only the
config differs from sl_basic's: the model is the one the service serves, the renderer is `--renderer`
(default `qwen3_instruct`: ChatML without think tags, the tiny tokenizer's template), and the data is a
JSONL file of conversations this script writes, read by the cookbook's own `FromConversationFileBuilder`
(sl_basic downloads NoRobots).
Periodic checkpoints and evaluations are off; the recipe's final checkpoint (`save_state` and
`save_weights_for_sampler`) is always taken and cannot be turned off.

    python examples/tinker_cookbook/sl_local.py --base-url http://127.0.0.1:8000 --model-name tiny \
        --tokenizer /path/to/model_folder --log-path /tmp/sl_run --api-key tml-my-key

The recipe writes one line per step to `LOG_PATH/metrics.jsonl`; `train_mean_nll` is the loss.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from _local import add_service_args, go_local


def write_conversations(path: Path, count: int, seed: int) -> None:
    """`count` one-turn conversations (a sum and its answer) in the cookbook's JSONL conversation format."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            messages = [
                {"role": "user", "content": f"What is {a} + {b}?"},
                {"role": "assistant", "content": f"The answer is {a + b}."},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    add_service_args(parser)
    parser.add_argument("--conversations", type=int, default=32, help="rows of the JSONL file")
    parser.add_argument("--batch-size", type=int, default=8, help="conversations per step")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=5e-3)
    parser.add_argument("--lora-rank", type=int, default=8)
    args = parser.parse_args()
    go_local(args)

    import chz
    from tinker_cookbook.recipes import sl_basic
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    data = args.log_path.with_name(args.log_path.name + ".conversations.jsonl")
    write_conversations(data, args.conversations, seed=0)
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=args.model_name,
        renderer_name=args.renderer,
        max_length=128,
        batch_size=args.batch_size,
        train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES,
    )
    config = chz.Blueprint(train.Config).apply(
        {
            "log_path": str(args.log_path),
            "model_name": args.model_name,
            "recipe_name": "recipe_sl_basic",
            "renderer_name": args.renderer,
            "dataset_builder": FromConversationFileBuilder(common_config=common, file_path=str(data)),
            "learning_rate": args.learning_rate,
            "lr_schedule": "constant",
            "num_epochs": args.epochs,
            "lora_rank": args.lora_rank,
            "base_url": args.base_url,
            "save_every": 0,
            "eval_every": 0,
        }
    )
    sl_basic.main(config.make())


if __name__ == "__main__":
    main()
