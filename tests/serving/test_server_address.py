"""A server's URL names an address other machines can reach, not the wildcard it is bound to."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from serving_cases import API_KEY, MESSAGES, MODEL_NAME, client
from transformers import PreTrainedTokenizerBase

from quartet.rollout import TorchRolloutEngine
from quartet.serving import OpenAIServer, ServerThread
from quartet.serving.address import advertised_host, node_ip


def test_a_wildcard_bind_is_advertised_as_this_nodes_address() -> None:
    ip = node_ip()
    assert ip not in ("0.0.0.0", "::", "")
    assert advertised_host("0.0.0.0") == ip
    assert advertised_host("::") == ip
    assert advertised_host("127.0.0.1") == "127.0.0.1"  # a chosen bind address stays as it is
    assert advertised_host("10.0.0.7") == "10.0.0.7"


@pytest.mark.parametrize("bind", ["0.0.0.0"])
def test_a_server_bound_to_every_interface_answers_at_its_advertised_url(
    serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase, bind: str
) -> None:
    server = OpenAIServer(
        serving_engine, serving_tokenizer, MODEL_NAME, host=bind, api_key=API_KEY, max_new_tokens_default=4
    )
    with ServerThread(server) as thread:
        url = thread.start()
        host = urlparse(url).hostname
        assert host == node_ip() and host != bind
        answer = client(url).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
        assert answer.choices[0].message.role == "assistant"
        assert answer.usage is not None and answer.usage.completion_tokens >= 1
