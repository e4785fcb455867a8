"""Checkpoints of `quartet serve tinker`, driven by the official `tinker` SDK (issue 51, items 2 and 4).

A real `TinkerServer` on a local port with a `state_dir`, the real `tinker.ServiceClient` / `RestClient`, the
tiny model. Bitwise claims are checked on the numbers the SDK hands back (a loss and logprobs equal to the
last bit) and on the saved tensors; the expected values of a fresh model and of a step after a load without
optimizer come from torch directly on a model built with the same spec. Hostile paths are sent raw over
HTTP, and the file system outside the store is checked to be untouched.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
from tinker import types  # noqa: E402

from quartet.serving.tinker.adapters import AdapterSpec, reference_model  # noqa: E402
from quartet.serving.tinker.checkpoints import CheckpointStore  # noqa: E402
from quartet.serving.tinker.server import TinkerServer  # noqa: E402

KEY = "tml-quartet-ckpt-key"
RANK, SEED = 4, 7
TOKENS = [5, 17, 33, 2, 9, 41]
TARGETS = [17, 33, 2, 9, 41, 8]
ADAM = types.AdamParams(learning_rate=0.05)


@pytest.fixture(autouse=True)
def _quiet_sdk() -> Iterator[None]:
    """The SDK warns (FutureWarning) on its deprecated load_state*; these tests call them on purpose."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(state_dir, a folder beside it holding a secret file that no request may read or change)."""
    top = tmp_path_factory.mktemp("tinker-ckpt")
    outside = top / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not for the service")
    return top / "state", outside


@pytest.fixture(scope="module")
def service(tiny_model_dir: Path, folders: tuple[Path, Path]) -> Iterator[str]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: the service's threads stay responsive
    server = TinkerServer({"tiny": tiny_model_dir}, api_key=KEY, state_dir=folders[0])
    url = server.start_in_thread()
    yield url
    server.stop_thread()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def client(service: str) -> Any:
    client = tinker.ServiceClient(base_url=service, api_key=KEY)
    yield client
    client.close("success").result(timeout=30)  # ends its session and heartbeat thread


def _trainer(client: Any) -> Any:
    return client.create_lora_training_client(base_model="tiny", rank=RANK, seed=SEED).result()


def _datum() -> Any:
    inputs = {"target_tokens": TARGETS, "weights": [1.0] * len(TARGETS)}
    return types.Datum(model_input=types.ModelInput.from_ints(TOKENS), loss_fn_inputs=inputs)


def _step(trainer: Any) -> tuple[float, np.ndarray]:
    """One forward_backward + optim_step, then the loss and logprobs a forward sees."""
    trainer.forward_backward([_datum()], "cross_entropy").result()
    trainer.optim_step(ADAM).result()
    return _forward(trainer)


def _forward(trainer: Any) -> tuple[float, np.ndarray]:
    out = trainer.forward([_datum()], "cross_entropy").result()
    return out.metrics["loss:sum"], out.loss_fn_outputs[0]["logprobs"].to_numpy()


def _reference(model_dir: Path) -> torch.nn.Module:
    return reference_model(model_dir, AdapterSpec(RANK, SEED))  # the SDK's defaults: attn, mlp, unembed


def _trained(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The reference's adapter parameters by peft's saved names (without the adapter name `default`)."""
    return {n.replace(".default.", "."): p for n, p in module.named_parameters() if p.requires_grad}


def _torch_loss(module: torch.nn.Module) -> torch.Tensor:
    logits = module(input_ids=torch.tensor([TOKENS])).logits[0].float()
    return -torch.log_softmax(logits, -1)[torch.arange(len(TARGETS)), torch.tensor(TARGETS)].sum()


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")
            if p.is_file()}  # fmt: skip


def test_save_state_writes_the_models_parameters_bitwise(
    client: Any, folders: tuple[Path, Path], tiny_model_dir: Path
) -> None:
    trainer = _trainer(client)
    saved = trainer.save_state("fresh").result()
    assert saved.path == f"tinker://{trainer.model_id}/weights/fresh"
    adapter, optimizer, _ = CheckpointStore(folders[0]).load(saved.path)
    expected = _trained(_reference(tiny_model_dir))
    assert sorted(adapter) == sorted(expected)
    assert all(torch.equal(adapter[k], expected[k].detach()) for k in expected)
    assert optimizer is not None and optimizer["state"] == {}  # no step yet: AdamW holds nothing


def test_load_with_optimizer_continues_bitwise_and_without_it_restarts_adam(
    client: Any, folders: tuple[Path, Path], tiny_model_dir: Path
) -> None:
    first = _trainer(client)
    _step(first)
    path = first.save_state("after-one").result().path
    expected_now = _forward(first)
    expected_next = _step(first)  # the client that never stopped

    resumed = client.create_training_client_from_state_with_optimizer(path).result()
    now = _forward(resumed)
    assert now[0] == expected_now[0] and np.array_equal(now[1], expected_now[1])
    copy = resumed.save_state("resumed-copy").result().path
    store = CheckpointStore(folders[0])
    original, copied = store.load(path), store.load(copy)
    assert all(torch.equal(original[0][k], copied[0][k]) for k in original[0])
    after = _step(resumed)
    assert after[0] == expected_next[0] and np.array_equal(after[1], expected_next[1])

    fresh_adam = client.create_training_client_from_state(path).result()
    restarted = _step(fresh_adam)
    module = _reference(tiny_model_dir)
    with torch.no_grad():
        for name, param in _trained(module).items():
            param.copy_(original[0][name])
    params = [p for p in module.parameters() if p.requires_grad]
    adamw = torch.optim.AdamW(params, lr=0.05, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    _torch_loss(module).backward()
    adamw.step()
    with torch.no_grad():
        assert restarted[0] == pytest.approx(float(_torch_loss(module)), rel=1e-5)
    assert abs(restarted[0] - expected_next[0]) > 1e-4, "the reset optimizer must take another step"


def test_async_save_and_load_in_both_forms_continue_bitwise(client: Any, service: str) -> None:
    """The same calls awaited: load_state_with_optimizer into an existing client (of another seed) and
    create_training_client_from_state_with_optimizer both take the step the saving client takes."""

    async def step(trainer: Any) -> Any:
        await trainer.forward_backward([_datum()], "cross_entropy")
        await trainer.optim_step(ADAM)
        return await trainer.forward([_datum()], "cross_entropy")

    async def run() -> tuple[Any, list[Any], Any]:
        source = await client.create_lora_training_client(base_model="tiny", rank=RANK, seed=SEED)
        await step(source)
        saved = await source.save_state("async-one")
        expected = await step(source)
        target = await client.create_lora_training_client(base_model="tiny", rank=RANK, seed=SEED + 1)
        await target.load_state_with_optimizer(saved.path)
        created = await client.create_training_client_from_state_with_optimizer(saved.path)
        listed = await tinker.RestClient(base_url=service, api_key=KEY).list_checkpoints(source.model_id)
        return expected, [await step(target), await step(created)], listed

    expected, results, listed = asyncio.run(run())
    for got in results:
        assert got.metrics["loss:sum"] == expected.metrics["loss:sum"]
        got_logprobs = got.loss_fn_outputs[0]["logprobs"].to_numpy()
        assert np.array_equal(got_logprobs, expected.loss_fn_outputs[0]["logprobs"].to_numpy())
    assert [c.checkpoint_id for c in listed.checkpoints] == ["weights/async-one"]


def test_list_info_overwrite_and_delete_through_the_rest_client(
    client: Any, service: str, folders: tuple[Path, Path]
) -> None:
    metadata = {"team": "a", "n": 3}  # CreateModelRequest takes any values; TrainingRun shows strings
    trainer = client.create_lora_training_client(
        "tiny", rank=RANK, seed=SEED, user_metadata=metadata
    ).result()
    run_id = trainer.model_id
    training = trainer.save_state("t1", user_metadata={"stage": "sft"}).result().path
    sampler = trainer.save_weights_for_sampler("s1").result().path
    assert sampler == f"tinker://{run_id}/sampler_weights/s1"
    rest = tinker.RestClient(base_url=service, api_key=KEY)

    listed = rest.list_checkpoints(run_id).result()
    assert isinstance(listed, types.CheckpointsListResponse)
    by_path = {c.tinker_path: c for c in listed.checkpoints}
    assert set(by_path) == {training, sampler}
    assert by_path[training].checkpoint_type == "training" and by_path[sampler].checkpoint_type == "sampler"
    assert by_path[training].checkpoint_id == "weights/t1" and by_path[training].user_metadata == {
        "stage": "sft"
    }
    on_disk = sum(f.stat().st_size for f in (folders[0] / run_id / "weights" / "t1").glob("*.safetensors"))
    assert by_path[training].size_bytes == on_disk
    sampler_files = sorted(f.name for f in (folders[0] / run_id / "sampler_weights" / "s1").iterdir())
    assert sampler_files == ["adapter.safetensors", "meta.json"]  # adapter only, no optimizer

    run = rest.get_training_run(run_id).result()
    assert (run.base_model, run.lora_rank, run.is_lora) == ("tiny", RANK, True)
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == training
    assert run.user_metadata == {"team": "a", "n": "3"}
    assert {training, sampler} <= {
        c.tinker_path for c in rest.list_user_checkpoints(limit=1000).result().checkpoints
    }
    assert run_id in {r.training_run_id for r in rest.list_training_runs(limit=1000).result().training_runs}
    info = rest.get_weights_info_by_tinker_path(sampler).result()
    assert (info.base_model, info.lora_rank, info.is_lora) == ("tiny", RANK, True)

    with pytest.raises(tinker.BadRequestError, match="overwrite=True"):
        trainer.save_state("t1").result()
    assert trainer.save_state("t1", overwrite=True).result().path == training
    relisted = {c.tinker_path: c for c in rest.list_checkpoints(run_id).result().checkpoints}
    assert relisted[training].user_metadata is None  # an overwrite replaces the metadata too

    rest.delete_checkpoint_from_tinker_path(training).result()
    assert not (folders[0] / run_id / "weights" / "t1").exists()
    assert [c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints] == [sampler]
    with pytest.raises(tinker.NotFoundError, match="never saved, or deleted"):
        client.create_training_client_from_state(training).result()
    with pytest.raises(tinker.BadRequestError, match="not served"):
        rest.publish_checkpoint_from_tinker_path(sampler).result()


def test_a_restarted_service_loads_what_was_saved(tiny_model_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = TinkerServer({"tiny": tiny_model_dir}, api_key=KEY, state_dir=state)
    first = tinker.ServiceClient(base_url=server.start_in_thread(), api_key=KEY)
    try:
        trainer = _trainer(first)
        _step(trainer)
        path = trainer.save_state("before-restart").result().path
        expected = _step(trainer)
    finally:
        first.close("success").result(timeout=30)  # its session and heartbeat end before its server
        server.stop_thread()

    again = TinkerServer({"tiny": tiny_model_dir}, api_key=KEY, state_dir=state)
    url = again.start_in_thread()
    try:
        second = tinker.ServiceClient(base_url=url, api_key=KEY)
        resumed = second.create_training_client_from_state_with_optimizer(path).result()
        got = _step(resumed)
        listed = tinker.RestClient(base_url=url, api_key=KEY).list_checkpoints(trainer.model_id).result()
        second.close("success").result(timeout=30)
    finally:
        again.stop_thread()
    assert got[0] == expected[0] and np.array_equal(got[1], expected[1])
    assert [c.tinker_path for c in listed.checkpoints] == [path]


def _post(url: str, call: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/{call}", json=body, headers={"X-API-Key": KEY}, timeout=30)


@pytest.fixture(scope="module")
def hostile_run(client: Any, folders: tuple[Path, Path]) -> str:
    """A run with a sampler checkpoint `s1`, and symlinks planted in the store pointing outside it: the
    folder `weights/evil`, and the adapter file of the training checkpoint `weights/poisoned`."""
    trainer = _trainer(client)
    trainer.save_weights_for_sampler("s1").result()
    trainer.save_state("poisoned").result()
    weights = folders[0] / trainer.model_id / "weights"
    os.symlink(folders[1], weights / "evil")
    (weights / "poisoned" / "adapter.safetensors").unlink()
    os.symlink(folders[1] / "secret.txt", weights / "poisoned" / "adapter.safetensors")
    return str(trainer.model_id)


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("tinker://../../etc/passwd", 400),
        ("tinker://RUN/weights/../../x", 400),
        ("/etc/passwd", 400),
        ("tinker:///etc/passwd", 400),
        ("tinker://RUN/weights/", 400),
        ("tinker://RUN/other/x", 400),
        ("tinker://RUN/sampler_weights/s1", 400),  # another kind: a training client cannot load it
        ("tinker://RUN/weights/a\x00b", 400),
        ("tinker://RUN/weights/" + "x" * 10_000, 400),
        ("tinker://model-never-made/weights/x", 404),
        ("tinker://RUN/weights/never-saved", 404),
        ("tinker://RUN/weights/evil", 400),  # the planted symlinks
        ("tinker://RUN/weights/poisoned", 400),
    ],
)
def test_hostile_paths_answer_4xx_naming_the_path_and_touch_nothing_outside(
    service: str, folders: tuple[Path, Path], hostile_run: str, path: str, status: int
) -> None:
    state, outside = folders
    before = _tree_digest(outside)
    path = path.replace("RUN", hostile_run)
    for body in (
        {"model_id": hostile_run, "path": path, "optimizer": True, "seq_id": 1},  # load_state
        {"session_id": "session-x", "model_seq_id": 0, "path": path, "optimizer": False},  # from_state
    ):
        reply = _post(service, "load_weights", body)
        assert reply.status_code == status, reply.text
        assert reply.json()["error"]["param"] == "path" and len(reply.text) < 1000, reply.text
        assert "secret" not in reply.text  # nothing of the file outside is echoed
    if "sampler_weights" not in path:  # (weights_info and delete serve sampler checkpoints too)
        info = _post(service, "weights_info", {"tinker_path": path})
        assert info.status_code == status and info.json()["error"]["param"] == "tinker_path", info.text
        tail = path.removeprefix("tinker://").replace("/", "/checkpoints/", 1)
        if "\x00" not in tail:
            url = f"{service}/api/v1/training_runs/{tail}"
            deleted = httpx.delete(url, headers={"X-API-Key": KEY}, timeout=30)
            assert deleted.status_code in (400, 404), deleted.text
    assert _tree_digest(outside) == before and sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (state / hostile_run / "weights" / "evil").is_symlink()  # refused, not followed, not removed


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "x" * 10_000, "a\x00b", 7])
def test_hostile_save_names_answer_400_naming_the_path(
    service: str, folders: tuple[Path, Path], hostile_run: str, name: Any
) -> None:
    before = sorted(str(p) for p in folders[0].parent.rglob("*"))
    for call in ("save_weights", "save_weights_for_sampler"):
        reply = _post(service, call, {"model_id": hostile_run, "path": name, "seq_id": 1})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "path" and len(reply.text) < 1000
    assert sorted(str(p) for p in folders[0].parent.rglob("*")) == before  # nothing written anywhere


@pytest.mark.parametrize(
    ("call", "body", "field"),
    [
        ("save_weights", {"path": "ok", "user_metadata": {"a": 1}}, "user_metadata"),
        ("save_weights", {"path": "ok", "ttl_seconds": -5}, "ttl_seconds"),
        ("save_weights", {"path": "ok", "overwrite": "yes"}, "overwrite"),
        ("load_weights", {"path": "tinker://RUN/weights/poisoned", "optimizer": "yes"}, "optimizer"),
        ("save_weights", {"path": "ok", "model_id": "model-absent"}, "model_id"),
    ],
)
def test_hostile_fields_answer_4xx_naming_the_field(
    service: str, hostile_run: str, call: str, body: dict[str, Any], field: str
) -> None:
    sent = {"model_id": hostile_run, **{k: v.replace("RUN", hostile_run) if isinstance(v, str) else v
                                        for k, v in body.items()}}  # fmt: skip
    reply = _post(service, call, sent)
    assert reply.status_code in (400, 404), reply.text
    assert reply.json()["error"]["param"] == field


def test_a_session_id_that_would_climb_out_is_refused(service: str, hostile_run: str) -> None:
    body = {"session_id": "../../x", "model_seq_id": 0, "path": f"tinker://{hostile_run}/weights/fresh-one"}
    reply = _post(service, "load_weights", body)
    assert reply.status_code == 404  # the path is checked first: it names nothing
    store_path = _post(service, "save_weights", {"model_id": hostile_run, "path": "fresh-one", "seq_id": 1})
    assert store_path.status_code == 200
    request_id = store_path.json()["request_id"]
    for _ in range(50):
        done = _post(service, "retrieve_future", {"request_id": request_id}).json()
        if done.get("type") != "try_again":
            break
    reply = _post(service, "load_weights", body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "session_id", reply.text


@pytest.mark.parametrize("query", ["limit=-1", "offset=x", "limit=" + "9" * 30])
def test_bad_pages_answer_400_naming_the_parameter(service: str, query: str) -> None:
    reply = httpx.get(f"{service}/api/v1/training_runs?{query}", headers={"X-API-Key": KEY}, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == query.split("=")[0]


def test_loading_into_a_client_of_another_rank_is_refused_naming_the_path(client: Any) -> None:
    path = _trainer(client).save_state("rank-4").result().path
    other = client.create_lora_training_client("tiny", rank=2 * RANK, seed=SEED).result()
    with pytest.raises(tinker.BadRequestError, match="lora_rank 4 differs from this model's 8"):
        other.load_state(path).result()
    _forward(other)  # the refused load changed nothing and the client still works
