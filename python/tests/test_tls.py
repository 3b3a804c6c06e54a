"""The client over TLS: a node whose API speaks TLS on loopback (the hidden `--api-tls on`,
as every API does beyond loopback), trusted by the pin its api.token carries."""

import pytest

import ringleader

from conftest import Node


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory):
    n = Node(tmp_path_factory.mktemp("tls") / "data", name="py-tls",
             extra=["--api-tls", "on"])
    yield n
    n.stop()


def test_https_pinned_by_the_token_file(tls_node, monkeypatch):
    monkeypatch.setenv("RINGLEADER_TOKEN_FILE", tls_node.token_file)
    monkeypatch.delenv("RINGLEADER_TOKEN", raising=False)
    monkeypatch.delenv("RINGLEADER_TLS_SHA256", raising=False)
    c = ringleader.Client("https://" + tls_node.api)
    assert c.status()["api_tls"].startswith("sha256:")
    job = c.submit({"name": "py-tls", "kind": "command", "command": ["true"]})
    assert job.wait(timeout=60)["state"] == "succeeded"


def test_a_wrong_pin_or_none_is_refused_before_the_token_is_sent(tls_node, monkeypatch):
    monkeypatch.delenv("RINGLEADER_TOKEN_FILE", raising=False)
    monkeypatch.delenv("RINGLEADER_TLS_SHA256", raising=False)
    token = open(tls_node.token_file).readline().strip()
    wrong = "sha256:" + "ab" * 32
    with pytest.raises(ringleader.Unreachable) as e:
        ringleader.Client("https://" + tls_node.api, token, tls_sha256=wrong).status()
    assert "not the pinned" in str(e.value)
    with pytest.raises(ringleader.Unreachable) as e:
        ringleader.Client("https://" + tls_node.api, token).status()
    assert "fingerprint is unknown" in str(e.value)
    # Plain http to an API that speaks TLS gets no HTTP answer.
    with pytest.raises(ringleader.Unreachable):
        ringleader.Client("http://" + tls_node.api, token, timeout=5).status()
