"""Routing replay beyond one batch call: a two-turn agent loop over the OpenAI server's token endpoint, and a
weight sync between two turns (a partial rollout across versions).

The record of every token the trainer forwards must reach the batch: the prompt, both model turns and the
simulated user's turn between them. Each trajectory's record is checked three ways: against what the
engine returned for each turn (the rule of `quartet.agents.routing_track`, written out here position by
position), against transformers' own top-k on the final ids, and against the experts the trainer's routers
are handed under replay.

The turns are kept short by stop strings over most single characters (after `min_tokens`), so each ends
with "stop" and the game goes on to a second turn whatever the random model writes.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from routing_cases import moe_folder

from quartet.agents.runner import AgentRunner
from quartet.config import Dtype
from quartet.config.rollout import MultiTurnConfig
from quartet.core.batch import Batch
from quartet.core.routing import ROUTED_EXPERTS
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.inputs import build_inputs
from quartet.models.loading import load_causal_lm, load_tokenizer
from quartet.models.moe import moe_routers
from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine
from quartet.rollout.types import GenerationOutput
from quartet.serving import HttpReplicaClient, OpenAIServer, ServerThread
from quartet.serving.errors import ReplicaError

TOP_K = 2
STOPS = tuple("abcdefghijklmnopqrstuvwxyz0123456789 .,:;!?'\"()[]{}<>|/\\-_+=*&#@\n\ufffd")[:64]
"""Stop strings (at most the server's 64): nearly every token of the tiny vocabulary holds one."""


def sampling(seed: int, n: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, n=n, max_new_tokens=12, seed=seed, min_tokens=3, stop=STOPS)


def game_rows(targets: Sequence[int]) -> Batch:
    """Guessing-game rows for the `user_sim` loop (the prompt columns are rebuilt by the runner)."""
    rows = len(targets)
    return Batch(
        {
            "prompts": torch.ones(rows, 2, dtype=torch.int64),
            "attention_mask": torch.ones(rows, 2, dtype=torch.int64),
        },
        {
            "raw_prompt": [[{"role": "user", "content": "Guess my number from 1 to 100."}]] * rows,
            "agent_name": ["user_sim"] * rows,
            "extra_info": [
                {"interaction_kwargs": {"name": "guessing_game", "target": t, "low": 1, "high": 100}}
                for t in targets
            ],
        },
    )


def two_turn_runner(tokenizer: Any) -> AgentRunner:
    mt = MultiTurnConfig(
        enable=True, interactions=("guessing_game",), max_assistant_turns=2, max_user_turns=2
    )
    return AgentRunner.from_config(mt, tokenizer, max_response_tokens=64)


class Recorder:
    """A `generate_tokens` that keeps every call's prompt and the outputs it got back."""

    def __init__(self, inner: Any, before: Any = None) -> None:
        self.inner = inner
        self.before = before
        self.calls: list[tuple[list[int], GenerationOutput]] = []

    async def __call__(
        self, prompt_ids: Sequence[int], params: SamplingParams, **kw: Any
    ) -> list[GenerationOutput]:
        if self.before is not None:
            self.before(len(self.calls))
        outs: list[GenerationOutput] = await self.inner(prompt_ids, params, **kw)
        self.calls += [(list(prompt_ids), o) for o in outs]
        return outs


def row_ids(batch: Batch, row: int) -> list[int]:
    mask = batch["attention_mask"][row] != 0
    ids = torch.cat([batch["prompts"][row], batch["responses"][row]])
    return [int(t) for t in ids[mask]]


def row_record(batch: Batch, row: int) -> torch.Tensor:
    return batch[ROUTED_EXPERTS][row][batch["attention_mask"][row] != 0]


def expected_record(
    ids: list[int], calls: list[tuple[list[int], GenerationOutput]]
) -> tuple[torch.Tensor, list[int]]:
    """The rule, written out: a model token fed by a decode step keeps that step's record; every other
    position takes the record of the last call whose prompt covered it. Also the positions of those model
    tokens."""
    mine: dict[int, tuple[list[int], GenerationOutput]] = {}
    for p, o in calls:  # by prompt length: two samples that wrote the same turn share the first match
        if ids[: len(p) + len(o.token_ids)] == p + list(o.token_ids):
            mine.setdefault(len(p), (p, o))
    assert len(mine) == 2, f"{len(mine)} engine calls match this trajectory"
    (p1, o1), (p2, o2) = (mine[n] for n in sorted(mine))
    assert o1.routed_experts is not None and o2.routed_experts is not None
    assert len(ids) == len(p2) + len(o2.token_ids)  # the trajectory ends with the second model turn
    want = o2.routed_experts.clone()
    decoded = list(range(len(p1), len(p1) + len(o1.token_ids) - 1))
    want[decoded] = o1.routed_experts[decoded]
    return want, decoded


def hf_topk(model: torch.nn.Module, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' top-k [T, L, k] of `ids` and the gap between the k-th and (k+1)-th probability."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_router_logits=True)
    probs = torch.stack([torch.softmax(r.float(), dim=-1) for r in out.router_logits], dim=1)
    ranked = probs.sort(dim=-1, descending=True).values
    return probs.topk(TOP_K, dim=-1).indices, ranked[..., TOP_K - 1] - ranked[..., TOP_K]


def same_sets(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[T, L] True where the top-k sets agree."""
    return (a.long().sort(-1).values == b.long().sort(-1).values).all(-1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return moe_folder(tmp_path_factory.mktemp("moe_turns"), "plain")


@pytest.fixture(scope="module")
def served(folder: Path) -> Iterator[tuple[OpenAIServer, str]]:
    """A float32 engine recording routing behind the OpenAI server: (server, base url)."""
    engine = TorchRolloutEngine.from_pretrained(folder, max_num_seqs=4, record_routing=True, num_threads=1)
    server = OpenAIServer(engine, load_tokenizer(folder), "policy", request_timeout_s=60)
    thread = ServerThread(server)
    url = thread.start()
    yield server, url
    thread.stop()
    engine.shutdown()


@pytest.fixture(scope="module")
def http_rollout(folder: Path, served: tuple[OpenAIServer, str]) -> tuple[Batch, Recorder]:
    """Two guessing-game rows x 2 samples, two model turns each, every turn through the token endpoint:
    the agent batch and the engine calls it came from."""
    _, url = served

    async def client_call(
        prompt_ids: Sequence[int], params: SamplingParams, **kw: Any
    ) -> list[GenerationOutput]:
        async with HttpReplicaClient(url, routed_experts=True) as client:
            return await client.generate_tokens(prompt_ids, params, **kw)

    recorder = Recorder(client_call)
    batch = two_turn_runner(load_tokenizer(folder)).run(game_rows([37, 80]), sampling(3, n=2), recorder, 0)
    return batch, recorder


def test_two_turns_over_http_carry_every_token_s_routing_into_the_batch(
    folder: Path, http_rollout: tuple[Batch, Recorder]
) -> None:
    batch, recorder = http_rollout
    assert ROUTED_EXPERTS in batch and batch[ROUTED_EXPERTS].dtype == torch.uint8
    assert "rollout_versions" in batch  # the per-token weight versions travel over HTTP too
    model = load_causal_lm(folder).eval()
    for row in range(len(batch)):
        spans = batch.non_tensors["turn_spans"][row]
        assert [s[0] for s in spans] == ["assistant", "user", "assistant"]
        ids = row_ids(batch, row)
        got = row_record(batch, row)
        want, decoded = expected_record(ids, recorder.calls)
        # every real token but the last (sampled, never fed) has exactly the engine's record; pads hold 0
        assert torch.equal(got[:-1], want) and not got[-1].any()
        assert len(decoded) >= 2
        assert not batch[ROUTED_EXPERTS][row][batch["attention_mask"][row] == 0].any()
        # one set of weights: prefill and decode records are transformers' own routing of the final ids
        topk, gap = hf_topk(model, ids[:-1])
        same = same_sets(got[:-1], topk)
        assert bool((same | (gap < 1e-5)).all()) and float(same.float().mean()) > 0.95


def test_the_replaying_trainer_routes_the_agent_batch_as_the_engine_did(
    folder: Path, http_rollout: tuple[Batch, Recorder]
) -> None:
    """Every router is handed the batch's record, and the log-probs are the engine's."""
    batch, _ = http_rollout
    trainer = TrainingEngine(
        EngineSpec(
            str(folder),
            ModelKind.CAUSAL_LM,
            mixed_precision=Dtype.FLOAT32,
            routing_replay=True,
            fused_head=False,
        )
    )
    handed: list[torch.Tensor] = []
    hooks = [
        r.register_forward_hook(lambda m, a, out: handed.append(out[2].detach().clone()))
        for r in moe_routers(trainer.module)
    ]
    try:
        out = trainer.forward_policy(batch, 1.0, MicroSpec(size=len(batch)))
    finally:
        for h in hooks:
            h.remove()
    record = build_inputs(batch).routing  # the columns the pass keeps (padding in every row trimmed)
    assert record is not None and len(handed) == record.shape[2]
    for layer, indices in enumerate(handed):
        assert torch.equal(indices, record[:, :, layer].reshape(-1, TOP_K).long())
    # past min_tokens (whose masked stop ids shift the engine's log-probs), the log-probs are the engine's
    mask = batch["response_mask"] != 0
    for row, spans in enumerate(batch.non_tensors["turn_spans"]):
        for _, start, _ in spans:
            mask[row, start : start + 3] = False
    assert out.logprobs is not None and int(mask.sum()) > 0
    torch.testing.assert_close(out.logprobs[mask], batch["rollout_logprobs"][mask], atol=2e-4, rtol=0)


def test_a_weight_sync_between_turns_keeps_each_model_token_s_routing(folder: Path) -> None:
    """Turn 1 under version 0, then new router weights (version 1), then turn 2: turn 1's model tokens keep
    version 0's routing; the prompt and the user turn take version 1's prefill, as turn 2 saw them."""
    old = load_causal_lm(folder).eval()
    new = copy.deepcopy(old)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for router in moe_routers(new):
            router.weight.normal_(0.0, 3.0 / router.weight.shape[1] ** 0.5, generator=gen)
    routers = {n: p.detach().clone() for n, p in new.named_parameters() if n.endswith("mlp.gate.weight")}
    engine = TorchRolloutEngine.from_pretrained(folder, max_num_seqs=2, record_routing=True, num_threads=1)

    def sync_before_second_turn(calls: int) -> None:
        if calls == 1:
            engine.load_weights(list(routers.items()), version=1)

    async def in_process(
        prompt_ids: Sequence[int], params: SamplingParams, **kw: Any
    ) -> list[GenerationOutput]:
        return await engine.generate_one(GenerationRequest(tuple(prompt_ids), params))

    recorder = Recorder(in_process, before=sync_before_second_turn)
    try:
        batch = two_turn_runner(load_tokenizer(folder)).run(game_rows([37]), sampling(11, n=1), recorder, 0)
    finally:
        engine.shutdown()
    ids, got = row_ids(batch, 0), row_record(batch, 0)
    want, decoded = expected_record(ids, recorder.calls)
    assert torch.equal(got[:-1], want)
    spans = batch.non_tensors["turn_spans"][0]
    prompt = int(batch["attention_mask"][0, : batch["prompts"].shape[1]].sum())
    versions = batch["rollout_versions"][0]
    assert set(versions[spans[0][1] : spans[0][2]].tolist()) == {0}
    assert set(versions[spans[2][1] : spans[2][2]].tolist()) == {1}
    # independently: turn 1's fed model tokens route as the OLD weights did on turn 1's context ...
    first_turn = ids[: prompt + spans[0][2] - 1]
    old_topk, old_gap = hf_topk(old, first_turn)
    same_old = same_sets(got[decoded], old_topk[decoded])
    assert bool((same_old | (old_gap[decoded] < 1e-5)).all())
    # ... every other position as the NEW weights do on the whole conversation
    new_topk, new_gap = hf_topk(new, ids[:-1])
    others = [i for i in range(len(ids) - 1) if i not in decoded]
    same_new = same_sets(got[others], new_topk[others])
    assert bool((same_new | (new_gap[others] < 1e-5)).all())
    # and the two versions route those model tokens differently, so keeping the first one mattered
    assert float(same_sets(new_topk[decoded], old_topk[decoded]).float().mean()) < 0.9


def test_routing_is_never_taken_from_a_client_and_a_bad_record_fails_its_call_alone(
    served: tuple[OpenAIServer, str],
) -> None:
    """A request carrying routing is refused (the server takes routing from its engine only); a replica
    answer with a malformed record fails that call, while a concurrent call gets its record."""
    import httpx
    from aiohttp import web

    _, url = served
    good = {"prompt_token_ids": [5, 6, 7], "sampling": {"max_new_tokens": 3}, "return_routed_experts": True}
    forged = {**good, "routed_experts": {"shape": [2, 2, 2], "dtype": "uint8", "data": "AAAAAAAAAAA="}}
    with httpx.Client(timeout=60) as http:
        refused = http.post(f"{url}/quartet/generate", json=forged)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "routed_experts"
        answer = http.post(f"{url}/quartet/generate", json=good)
    assert answer.status_code == 200
    real = answer.json()["outputs"][0]
    assert set(real["routed_experts"]) == {"shape", "dtype", "data"}

    broken = [
        {**real, "routed_experts": {**real["routed_experts"], "data": "!!!!"}},
        {**real, "routed_experts": {**real["routed_experts"], "shape": [1, 2, 2]}},
        {**real, "routed_experts": None},
    ]

    async def scenario() -> tuple[list[BaseException | list[GenerationOutput]], list[GenerationOutput]]:
        async def fake(request: web.Request) -> web.Response:
            index = int((await request.json())["sampling"]["seed"])
            return web.json_response({"request_id": "x", "outputs": [broken[index]]})

        app = web.Application()
        app.router.add_post("/v1/quartet/generate", fake)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        params = SamplingParams(max_new_tokens=3)
        try:
            async with (
                HttpReplicaClient(f"http://127.0.0.1:{port}/v1", routed_experts=True) as bad,
                HttpReplicaClient(url, routed_experts=True) as ok,
            ):
                calls = [
                    bad.generate_tokens([5, 6, 7], SamplingParams(max_new_tokens=3, seed=i)) for i in range(3)
                ]
                results = await asyncio.gather(
                    *calls, ok.generate_tokens([5, 6, 7], params), return_exceptions=True
                )
        finally:
            await runner.cleanup()
        *failed, fine = results
        assert isinstance(fine, list)
        return list(failed), fine

    failed, fine = asyncio.run(scenario())
    assert all(isinstance(f, ReplicaError) and "malformed answer" in str(f) for f in failed), failed
    assert fine[0].routed_experts is not None
    assert fine[0].routed_experts.shape[0] == 3 + len(fine[0].token_ids) - 1
