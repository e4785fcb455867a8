"""tinker-cookbook's on-policy distillation against `quartet serve tinker`, offline.

The cookbook's entry point, `tinker_cookbook.distillation.train_on_policy.main(config)` (what
`recipes/distillation/on_policy_distillation.py` runs), runs unchanged. The recipe's own `cli_main` is not
called: its dataset builder knows only DeepMath and Tulu 3, which it downloads. Here the prompts are a local
list given to the cookbook's own `PromptOnlyDataset` (one group of rollouts per prompt, no reward: the
student is pulled to the teacher by the reverse KL alone, the teacher's logprobs coming from
`compute_logprobs` on a sampling client of the teacher's base model).

    python examples/tinker_cookbook/distill_local.py --base-url http://127.0.0.1:8000 --model-name tiny \
        --teacher tiny-teacher --tokenizer /path/to/model_folder --log-path /tmp/distill_run \
        --api-key tml-my-key

Student and teacher must share the tokenizer. Each step writes a line to `LOG_PATH/metrics.jsonl`;
`teacher_kl` is the mean reverse KL (student || teacher) per sampled token.
"""

from __future__ import annotations

import argparse
import asyncio
import random

import chz
from _local import add_service_args, go_local
from tinker_cookbook import renderers
from tinker_cookbook.distillation.datasets import PromptOnlyDataset
from tinker_cookbook.rl.types import RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer


def sum_prompts(count: int, seed: int) -> list[str]:
    """`count` questions "What is a + b?" (one digit each)."""
    rng = random.Random(seed)
    return [f"What is {rng.randint(0, 9)} + {rng.randint(0, 9)}?" for _ in range(count)]


@chz.chz
class LocalPromptsBuilder(RLDatasetBuilder):
    """The cookbook's builder interface over its `PromptOnlyDataset`, on a local prompt list."""

    prompts: list[str]
    groups_per_batch: int
    group_size: int
    model_name_for_tokenizer: str
    renderer_name: str

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        tokenizer = get_tokenizer(self.model_name_for_tokenizer)
        renderer = renderers.get_renderer(self.renderer_name, tokenizer)
        dataset = PromptOnlyDataset(
            self.prompts, self.groups_per_batch, self.group_size, renderer, tokenizer, dataset_name="sums"
        )
        return dataset, None


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    add_service_args(parser)
    parser.add_argument("--teacher", required=True, help="the teacher's base model name, served too")
    parser.add_argument("--steps", type=int, default=10, help="batches of prompts (one optim step each)")
    parser.add_argument("--groups", type=int, default=4, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per prompt")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens sampled per answer")
    parser.add_argument("--learning-rate", type=float, default=2e-2)
    parser.add_argument("--lora-rank", type=int, default=8)
    args = parser.parse_args()
    go_local(args)

    from tinker_cookbook.distillation import train_on_policy
    from tinker_cookbook.distillation.datasets import DistillationDatasetConfig, TeacherConfig

    builder = LocalPromptsBuilder(
        prompts=sum_prompts(args.steps * args.groups, seed=0),
        groups_per_batch=args.groups,
        group_size=args.group_size,
        model_name_for_tokenizer=args.model_name,
        renderer_name=args.renderer,
    )
    dataset = DistillationDatasetConfig(
        dataset_builder=builder,
        teacher_config=TeacherConfig(base_model=args.teacher),
        groups_per_batch=args.groups,
    )
    config = chz.Blueprint(train_on_policy.Config).apply(
        {
            "recipe_name": "recipe_distillation_on_policy",
            "learning_rate": args.learning_rate,
            "dataset_configs": [dataset],
            "model_name": args.model_name,
            "renderer_name": args.renderer,
            "lora_rank": args.lora_rank,
            "max_tokens": args.max_tokens,
            "log_path": str(args.log_path),
            "base_url": args.base_url,
            "eval_every": 0,
            "save_every": 0,
        }
    )
    asyncio.run(train_on_policy.main(config.make()))


if __name__ == "__main__":
    main()
