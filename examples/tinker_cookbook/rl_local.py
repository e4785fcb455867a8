"""tinker-cookbook's RL recipe (`recipes/rl_basic.py`) against `quartet serve tinker`, offline.

The cookbook's RL entry point, `tinker_cookbook.rl.train.main(config)` (what `rl_basic.main` runs), runs
unchanged; `rl_basic` itself is not imported: its module imports the GSM8K env, which needs the cookbook's
`math-rl` extra (sympy, pylatexenc, math-verify), kept out of quartet's install. The config differs from
rl_basic's only in: the model is the one the service serves, the renderer is `--renderer` (default
`qwen3_instruct`: ChatML, the tiny tokenizer's template), and the data is a task built here from the
cookbook's own classes instead of GSM8K (which rl_basic downloads): `ProblemEnv` (one question, one
answer, reward 1 or 0), `ProblemGroupBuilder` (a group of rollouts of one question, the GRPO group) and an
`RLDataset` of them.

The task, "digits": the user asks for a number; the reward is 1 when the answer holds a digit, else 0. A
tiny random model writes a digit in a few tokens now and then (10 of its 512 tokens are digits), so the
reward starts above 0 and can only rise by learning to prefer digits. On quartet's default tiny model it
barely can: its output head is its input embedding (std 0.02), which no LoRA adapter changes, and with
the final norm fixed that head cannot give the digits more than 3% of a token's probability (2% at the
start). With that embedding 5 times larger the same LoRA run goes from ~0.05 to 0.6-0.97 in 10 steps (4
seeds, measured with torch directly); tests/serving_tinker/test_cookbook.py serves such a model.

    python examples/tinker_cookbook/rl_local.py --base-url http://127.0.0.1:8000 --model-name tiny \
        --tokenizer /path/to/model_folder --log-path /tmp/rl_run --api-key tml-my-key

Each step writes a line to `LOG_PATH/metrics.jsonl`; `env/all/reward/total` is the mean reward.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from functools import partial

import chz
from _local import add_service_args, go_local
from tinker_cookbook import renderers
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

QUESTIONS = ("Give me a number.", "What number do you pick?", "Say a number.", "Write any number.")


class DigitEnv(ProblemEnv):
    """One question; the answer earns 1 when it holds a digit (format reward off: rewards are 1 or 0)."""

    def __init__(self, renderer: renderers.Renderer, question: str):
        super().__init__(renderer, format_coef=0.0)
        self.question = question

    def get_question(self) -> str:
        return self.question

    def check_answer(self, sample_str: str) -> bool:
        return any(c.isdigit() for c in sample_str)

    def check_format(self, sample_str: str) -> bool:
        return True

    def get_reference_answer(self) -> str:
        return "any text with a digit"


class DigitDataset(RLDataset):
    """`batches` batches of `groups` groups, each group `group_size` rollouts of one question."""

    def __init__(self, renderer: renderers.Renderer, batches: int, groups: int, group_size: int):
        self.renderer, self.batches, self.groups, self.group_size = renderer, batches, groups, group_size

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        questions = [QUESTIONS[(index * self.groups + g) % len(QUESTIONS)] for g in range(self.groups)]
        return [
            ProblemGroupBuilder(partial(DigitEnv, self.renderer, q), self.group_size, dataset_name="digits")
            for q in questions
        ]

    def __len__(self) -> int:
        return self.batches


@chz.chz
class DigitDatasetBuilder(RLDatasetBuilder):
    """The cookbook's builder interface over `DigitDataset` (no test set)."""

    model_name_for_tokenizer: str
    renderer_name: str
    batches: int = 10
    groups: int = 4
    group_size: int = 8

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.model_name_for_tokenizer))
        return DigitDataset(renderer, self.batches, self.groups, self.group_size), None


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    add_service_args(parser)
    parser.add_argument("--steps", type=int, default=10, help="batches of groups (one optim step each)")
    parser.add_argument("--groups", type=int, default=4, help="questions per step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per question")
    parser.add_argument("--max-tokens", type=int, default=6, help="tokens sampled per answer")
    parser.add_argument("--learning-rate", type=float, default=2e-2)
    parser.add_argument("--lora-rank", type=int, default=8)
    args = parser.parse_args()
    go_local(args)

    from tinker_cookbook.rl import train

    builder = DigitDatasetBuilder(
        model_name_for_tokenizer=args.model_name,
        renderer_name=args.renderer,
        batches=args.steps,
        groups=args.groups,
        group_size=args.group_size,
    )
    config = chz.Blueprint(train.Config).apply(
        {
            "model_name": args.model_name,
            "recipe_name": "recipe_rl_basic",
            "renderer_name": args.renderer,
            "log_path": str(args.log_path),
            "dataset_builder": builder,
            "learning_rate": args.learning_rate,
            "max_tokens": args.max_tokens,
            "lora_rank": args.lora_rank,
            "base_url": args.base_url,
            "eval_every": 0,
            "save_every": 0,
        }
    )
    asyncio.run(train.main(config.make()))


if __name__ == "__main__":
    main()
