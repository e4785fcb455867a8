"""Agent loops whose tool returns an image, through the real loop and the built-in engine, in process and
over HTTP: the response mask is 1 exactly on the engine's tokens (against a reconstruction from the
engine's outputs and the chat template alone), each row ends holding all its images in order (prompt's,
then the zooms), and the trainer's fp32 log-probs of the model's tokens equal the engine's."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from agent_cases import ZoomEveryTurn, pixels, rows, tool_turn_ids, zoomed

from quartet.agents.runner import AgentRunner, trajectory_seed
from quartet.agents.tools.zoom import ZoomTool
from quartet.config.data import DataConfig
from quartet.config.model import Dtype
from quartet.config.rollout import MultiTurnConfig
from quartet.core.batch import Batch
from quartet.data.images import ImageInputs
from quartet.data.prompts import PromptDataset
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.models.loading import load_causal_lm, load_image_processor, load_tokenizer
from quartet.rollout import SamplingParams, TorchRolloutEngine
from quartet.rollout.types import GenerationOutput
from quartet.serving import HttpReplicaClient, OpenAIServer, RequestScheduler, ServerThread
from quartet.serving.images import multi_modal_to_json

TURNS = 3  # model turns per trajectory: zoom, zoom, then the turn limit
WIDTH = 192
SEED = 7


class Setup:
    """The tiny VLM's tokenizer, images, a fresh engine behind an in-process server, and the calls it saw."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tokenizer = load_tokenizer(folder)
        self.processor = load_image_processor(folder)
        self.images = ImageInputs.of(self.processor, self.tokenizer)
        # every odd id ends a turn (and the end-of-turn token): a random model's turns then end by STOP
        # after a few tokens, as a trained model's would at its end of turn
        stops = {*range(1, len(self.tokenizer), 2), self.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        model = load_causal_lm(folder)
        self.engine = TorchRolloutEngine(
            model, self.tokenizer, max_num_seqs=4, num_threads=1, eos_token_ids=stops
        )
        self.server = OpenAIServer(self.engine, self.tokenizer, "policy", request_timeout_s=120)
        self.calls: dict[tuple[tuple[int, ...], int | None], GenerationOutput] = {}
        self.stopped = False

    def record(
        self, prompt_ids: Sequence[int], params: SamplingParams, outs: list[GenerationOutput]
    ) -> list[GenerationOutput]:
        """Keep each answer by its prompt and seed."""
        self.calls[tuple(prompt_ids), params.seed] = outs[0]
        return outs

    def runner(self) -> AgentRunner:
        mt = MultiTurnConfig(enable=True, tools=("zoom",), max_assistant_turns=TURNS)
        runner = AgentRunner.from_config(mt, self.tokenizer, WIDTH, image_processor=self.processor)
        runner.env.parser = ZoomEveryTurn()
        return runner

    def prompts(self) -> Batch:
        cfg, tools = DataConfig(max_prompt_length=256), [ZoomTool().schema]
        data = PromptDataset.from_rows(rows(), cfg, self.tokenizer, "rows.jsonl", tools, images=self.images)
        return data.batch([0, 1])

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=1.0, n=2, max_new_tokens=WIDTH, seed=SEED)


@pytest.fixture
def setup(tiny_vlm_dir: Path) -> Iterator[Setup]:
    made = Setup(tiny_vlm_dir)
    yield made
    if not made.stopped:
        asyncio.run(made.server.stop())
    made.engine.shutdown()


def _expected(setup: Setup, prompt: list[int], row: int, sample: int) -> tuple[list[int], list[int]]:
    """Response and mask rebuilt from the engine's outputs and the chat template: model turn k is what
    the engine answered to the history so far with the turn's seed; each but the last is followed by a
    zoom's tool turn."""
    eot = setup.tokenizer.convert_tokens_to_ids("<|im_end|>")
    response: list[int] = []
    mask: list[int] = []
    for turn in range(TURNS):
        out = setup.calls[tuple(prompt + response), trajectory_seed(SEED, row, sample, 2, turn)]
        assert out.finish_reason.value == "stop"
        response += list(out.token_ids)
        mask += [1] * len(out.token_ids)
        if turn < TURNS - 1:
            env = tool_turn_ids(setup.tokenizer, setup.images, ended=out.token_ids[-1] == eot)
            response += env
            mask += [0] * len(env)
    return response, mask


def _check(setup: Setup, prompts: Batch, batch: Batch) -> None:
    size = int(batch["prompts"].shape[1])
    assert len(batch) == 4
    trainer = TrainingEngine(EngineSpec(str(setup.folder), ModelKind.CAUSAL_LM, Dtype.FLOAT32))
    columns = ("prompts", "responses", "response_mask", "attention_mask")
    logprobs, _ = trainer.forward_logprobs(
        batch.select(*columns, "multi_modal_inputs"), 1.0, MicroSpec(size=1)
    )
    for row in range(4):
        source = row // 2
        given = prompts["prompts"][source][prompts["attention_mask"][source] == 1].tolist()
        prompt = batch["prompts"][row][batch["attention_mask"][row, :size] == 1].tolist()
        assert prompt == given  # the loop renders the prompt (tools and images) as the data loader did
        response, mask = _expected(setup, prompt, source, row % 2)
        assert batch["responses"][row, : len(response)].tolist() == response
        assert batch["response_mask"][row].tolist() == mask + [0] * (WIDTH - len(mask))
        # images: the prompt's, then one zoom per tool turn, each the corner of the first image, doubled
        blobs = batch.non_tensors["images"][row]
        first = list(prompts.non_tensors["images"][source])
        assert blobs[: len(first)] == first and len(blobs) == len(first) + TURNS - 1
        for blob in blobs[len(first) :]:
            assert (pixels(blob) == zoomed(first[0])).all()
        inputs = batch.non_tensors["multi_modal_inputs"][row]
        reference = setup.images.process(blobs)
        assert torch.equal(inputs["image_grid_thw"], reference["image_grid_thw"])
        assert torch.equal(inputs["pixel_values"], reference["pixel_values"])
        # the trainer's log-probs of the model's tokens are the engine's
        written = batch["response_mask"][row] == 1
        diff = (logprobs[row] - batch["rollout_logprobs"][row]).abs()[written]
        assert int(written.sum()) >= TURNS and float(diff.max()) <= 1e-5
        assert batch.non_tensors["finish_reason"][row] == "max_turns"
        assert batch.non_tensors["agent_metrics"][row]["tool/calls"] == TURNS - 1


def test_tool_images_in_process(setup: Setup) -> None:
    scheduler = RequestScheduler([setup.server], max_outstanding_per_replica=8, queue_timeout_s=60.0)

    async def generate(ids: Sequence[int], params: SamplingParams, multi_modal: Any = None) -> Any:
        outs = await scheduler.generate_tokens(ids, params, multi_modal=multi_modal)
        return setup.record(ids, params, outs)

    prompts = setup.prompts()
    batch = setup.runner().run(prompts, setup.sampling(), generate, setup.tokenizer.pad_token_id)
    _check(setup, prompts, batch)


def test_tool_images_over_http(setup: Setup) -> None:
    with ServerThread(setup.server) as thread:
        url = thread.start()

        async def generate(ids: Sequence[int], params: SamplingParams, multi_modal: Any = None) -> Any:
            async with HttpReplicaClient(url, timeout_s=120) as client:
                return setup.record(ids, params, await client.generate_tokens(ids, params, multi_modal))

        prompts = setup.prompts()
        batch = setup.runner().run(prompts, setup.sampling(), generate, setup.tokenizer.pad_token_id)
    setup.stopped = True
    _check(setup, prompts, batch)


def _post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/quartet/generate", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:  # noqa: S310 - our own local server
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _bad_bodies(prompt: list[int], good: dict[str, Any], pad: int) -> dict[str, dict[str, Any]]:
    """Malformed image payloads for a prompt of one 4-token image, by what is wrong with them."""
    pixels_json = good["pixel_values"]
    shape = pixels_json["shape"]
    nan = base64.b64encode(np.full(shape[0] * shape[1], np.nan, dtype="<f4").tobytes()).decode()
    text_only = [t for t in prompt if t != pad]
    return {
        "not an object": {"multi_modal": "image.png"},
        "unknown key": {"multi_modal": {**good, "video": 1}},
        "not base64": {"multi_modal": {**good, "pixel_values": {**pixels_json, "data": "%%%"}}},
        "short data": {
            "multi_modal": {**good, "pixel_values": {**pixels_json, "shape": [shape[0] + 1, shape[1]]}}
        },
        "NaN pixels": {"multi_modal": {**good, "pixel_values": {**pixels_json, "data": nan}}},
        "float16": {"multi_modal": {**good, "pixel_values": {**pixels_json, "dtype": "float16"}}},
        "grid patches": {"multi_modal": {**good, "image_grid_thw": [[1, 4, 8]]}},
        "grid merge": {"multi_modal": {**good, "image_grid_thw": [[1, 1, 16]]}},
        "grid huge": {"multi_modal": {**good, "image_grid_thw": [[1, 2**40, 2]]}},
        "grid text": {"multi_modal": {**good, "image_grid_thw": [["1", 4, 4]]}},
        "extra slot": {"prompt_token_ids": [*prompt, pad]},
        "no slots": {"prompt_token_ids": text_only},
        "mask length": {"multi_modal": {**good, "image_mask": [1, 0]}},
        "mask on text": {"multi_modal": {**good, "image_mask": [1] * len(prompt)}},
        "pixel width": {
            "multi_modal": {
                **good,
                "pixel_values": {**pixels_json, "shape": [shape[0] * 2, shape[1] // 2]},
            }
        },
    }


def _junk(good: dict[str, Any]) -> list[tuple[str, Any]]:
    """Each field of a good payload replaced by values of the wrong type or range, seeded."""
    rng = np.random.default_rng(0)
    values: list[Any] = [None, "", "x", [], {}, -1, 0, 2**70, 1.5, True, [[]], [None], [[1, 2]], {"a": 1}]
    values += [[[int(v) for v in rng.integers(-3, 3, size=3)]] for _ in range(4)]
    values += [{**good["pixel_values"], "shape": [int(rng.integers(-2, 5)), 1176]} for _ in range(2)]
    fields = ("pixel_values", "image_grid_thw", "image_mask")
    return [(f, v) for f in fields for v in values if not (f == "image_mask" and v is None)]  # mask: optional


def test_malformed_images_get_400_and_others_go_on(setup: Setup) -> None:
    prompts = setup.prompts()
    prompt = prompts["prompts"][0][prompts["attention_mask"][0] == 1].tolist()
    good = multi_modal_to_json(setup.images.process(prompts.non_tensors["images"][0]))
    sampling = {"max_new_tokens": 4, "seed": 1}
    base = {"prompt_token_ids": prompt, "sampling": sampling, "multi_modal": good}
    bodies = _bad_bodies(prompt, good, setup.images.image_token_id)
    with ServerThread(setup.server) as thread:
        url = thread.start()
        for why, change in bodies.items():
            status, answer = _post(url, {**base, **change})
            assert status == 400, (why, answer)
            assert "multi_modal" in answer["error"]["message"] or answer["error"]["param"], why
        for field, junk in _junk(good):
            status, answer = _post(url, {**base, "multi_modal": {**good, field: junk}})
            assert status == 400, (field, junk, answer)
        # a good request beside a bad one: the bad one is refused before the engine, the good one answered
        with ThreadPoolExecutor(2) as pool:
            ok = pool.submit(_post, url, base)
            refused = pool.submit(_post, url, {**base, **bodies["extra slot"]})
            assert refused.result()[0] == 400
            status, answer = ok.result()
        assert status == 200 and len(answer["outputs"][0]["token_ids"]) >= 1
        # in process the same check raises ValueError, and the engine goes on
        mm = setup.images.process(prompts.non_tensors["images"][0])
        params = SamplingParams(max_new_tokens=4, seed=1)
        with pytest.raises(ValueError, match="image slots"):
            thread.call(setup.server.generate_tokens([*prompt, setup.images.image_token_id], params, mm))
        outs = thread.call(setup.server.generate_tokens(prompt, params, mm))
        assert outs[0].token_ids == tuple(answer["outputs"][0]["token_ids"])
    setup.stopped = True


@pytest.mark.slow  # builds a second tiny tokenizer (~25 s on a loaded 2-core box)
def test_tool_images_qwen2_5_vl(tmp_path: Path) -> None:
    """The same loop on Qwen2.5-VL (windowed vision tower, its own rope index)."""
    from quartet.config import TinyModelConfig
    from quartet.config.model import TinyArch
    from quartet.models.tiny import ensure_tiny_model

    setup = Setup(ensure_tiny_model(TinyModelConfig(arch=TinyArch.QWEN2_5_VL), tmp_path))
    try:
        test_tool_images_in_process(setup)
    finally:
        asyncio.run(setup.server.stop())
        setup.engine.shutdown()
