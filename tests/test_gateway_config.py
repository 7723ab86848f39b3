"""Config: one frozen, validated tree from file < KVGATE_* environment < flags; a bad value fails at
start with exit code 2 and one line naming the field."""

from __future__ import annotations

import os
from pathlib import Path

import pydantic
import pytest

from gateway.backend_settings import normalise_backend_url
from gateway.cli import main
from gateway.config import ConfigError, Settings, load_settings

FULL = """
server:
  host: 0.0.0.0
  port: 9000
  max_body_bytes: 1048576
  connect_timeout_s: 2
  first_byte_timeout_s: 30
backends:
  - url: http://127.0.0.1:8001
    id: gpu-a
    models: [llama-3-8b]
    metrics_format: vllm
    weight: 2
    labels: {zone: a}
  - url: http://127.0.0.1:8002/v1/
    metrics_format: tgi
    max_batch_total_tokens: 131072
  - url: http://127.0.0.1:8003
    metrics_format: llamacpp
    kv_unified: true
model_aliases:
  gpt-4o: llama-3-8b
routing:
  policy: round_robin
  poll_interval_s: 0.5
  max_snapshot_age_s: 2
health: {consecutive_failures: 7}
slo: {ttft_s: 2, tpot_s: 0.04}
advanced:
  poll_group_size: 16
  full_scrape_interval_s: 2.5
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kvgate.yaml"
    path.write_text(text)
    return path


def test_a_full_file_loads_into_typed_settings(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, FULL), environ={})
    assert settings.server.port == 9000 and settings.server.host == "0.0.0.0"
    assert settings.model_aliases == {"gpt-4o": "llama-3-8b"}
    assert settings.health.consecutive_failures == 7
    assert settings.advanced.poll_group_size == 16
    assert settings.advanced.full_scrape_interval_s == 2.5
    assert (settings.slo.ttft_s, settings.slo.tpot_s) == (2.0, 0.04)
    specs = settings.backend_specs()
    assert [s.id for s in specs] == ["gpu-a", "b1", "b2"]  # unnamed backends get b<position>
    assert specs[0].metrics_format == "vllm" and specs[0].weight == 2.0
    assert dict(specs[0].labels) == {"zone": "a"}
    assert specs[1].url == "http://127.0.0.1:8002"
    assert specs[1].max_batch_total_tokens == 131072
    assert specs[2].kv_unified and not specs[0].kv_unified


def test_defaults_without_file() -> None:
    settings = load_settings(None, environ={})
    assert settings.server.port == 8000
    assert settings.server.max_body_bytes == 32 * 1024 * 1024
    assert settings.routing.policy == "cost"
    assert (settings.slo.ttft_s, settings.slo.tpot_s, settings.slo.admission) == (1.0, 0.05, True)
    assert settings.advanced.slo_wait_s == 0.0
    assert settings.slo.exempt_priority is None  # every class is gated
    assert settings.routing.offload_long_prompts
    assert settings.backends == ()


def test_settings_are_frozen() -> None:
    settings = load_settings(None, environ={})
    with pytest.raises(pydantic.ValidationError):
        settings.server.__setattr__("port", 1)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        pytest.param("server: {prot: 1}\n", "server.prot", id="unknown key names its path"),
        pytest.param("backends: [{url: 'ftp://x'}]\n", "backends.0.url", id="bad URL scheme"),
        pytest.param("backends: [{url: 'http://:80'}]\n", "backends.0.url", id="URL without host"),
        pytest.param("backends: [{url: 'http://h:99999'}]\n", "backends.0.url", id="bad port"),
        pytest.param("server: {port: many}\n", "server.port", id="wrong type"),
        pytest.param("routing: {policy: nope}\n", "routing.policy", id="unknown policy"),
        pytest.param("advanced: {poll_group_size: 0}\n", "advanced.poll_group_size",
                     id="empty poll group"),
        pytest.param("slo: {tpot_s: 0}\n", "slo.tpot_s", id="zero TPOT SLO"),
        pytest.param("slo: {ttft_s: -1}\n", "slo.ttft_s", id="negative TTFT SLO"),
        pytest.param("advanced: {slo_wait_s: -1}\n", "advanced.slo_wait_s",
                     id="negative SLO wait"),
        pytest.param("slo: {exempt_priority: high}\n", "slo.exempt_priority",
                     id="non-integer exempt priority"),
        pytest.param("advanced: {full_scrape_interval_s: 0}\n",
                     "advanced.full_scrape_interval_s", id="no full scrape interval"),
        pytest.param("advanced: {offload: {ratio: 0}}\n", "advanced.offload.ratio",
                     id="a plugin parameter out of range"),
        pytest.param("routing: {tpot_slo_s: 0.05}\n", "routing.tpot_slo_s is now slo.tpot_s",
                     id="the SLO lives in the slo section"),
        pytest.param("routing: {weights: {ttft: 1}}\n", "routing.weights is now advanced.weights",
                     id="expert knobs live in the advanced section"),
        pytest.param("routing: {failure_threshold: 3}\n",
                     "routing.failure_threshold is now health.consecutive_failures",
                     id="health is decided by requests, in the health section"),
        pytest.param("backends: [{url: 'http://h', metrics_format: x}]\n",
                     "backends.0.metrics_format", id="unknown metrics format"),
        pytest.param("backends: [{url: 'http://a', id: x}, {url: 'http://b', id: x}]\n",
                     "backends", id="duplicate backend id"),
        pytest.param("model_aliases: {m: m}\n", "model_aliases", id="alias onto itself"),
        pytest.param("- just\n- a list\n", "top level", id="top level is not a mapping"),
        pytest.param("server: [unclosed\n", "invalid YAML", id="invalid YAML"),
    ],
)
def test_bad_config_is_a_config_error_naming_the_field(
    tmp_path: Path, text: str, names: str
) -> None:
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")) as info:
        load_settings(write(tmp_path, text), environ={})
    assert "\n" not in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "absent.yaml", environ={})


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    env = {
        "KVGATE_SERVER__PORT": "8080",
        "KVGATE_BACKENDS__0__WEIGHT": "3.5",
        "KVGATE_MODEL_ALIASES": '{"fast": "llama-3.2-1b"}',
        "UNRELATED": "ignored",
    }
    settings = load_settings(write(tmp_path, FULL), environ=env)
    assert settings.server.port == 8080
    assert settings.server.host == "0.0.0.0"  # untouched siblings stay
    assert settings.backends[0].weight == 3.5
    assert settings.model_aliases == {"fast": "llama-3.2-1b"}


def test_environment_index_one_past_the_end_appends_a_backend() -> None:
    settings = load_settings(None, environ={"KVGATE_BACKENDS__0__URL": "http://127.0.0.1:1"})
    assert [b.url for b in settings.backends] == ["http://127.0.0.1:1"]


def test_an_unknown_environment_variable_is_named_in_the_error() -> None:
    with pytest.raises(ConfigError, match="KVGATE_SERVER__PROT"):
        load_settings(None, environ={"KVGATE_SERVER__PROT": "1"})


def test_flags_override_the_environment(tmp_path: Path) -> None:
    settings = load_settings(
        write(tmp_path, FULL),
        environ={"KVGATE_SERVER__PORT": "8080"},
        overrides={"server": {"port": 7000}, "backends": [{"url": "http://127.0.0.1:9"}]},
    )
    assert settings.server.port == 7000
    assert [b.url for b in settings.backends] == ["http://127.0.0.1:9"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param("http://127.0.0.1:8001", "http://127.0.0.1:8001", id="plain"),
        pytest.param("http://127.0.0.1:8001/", "http://127.0.0.1:8001", id="trailing slash"),
        pytest.param("http://h:8001/v1", "http://h:8001", id="an OpenAI base_url loses /v1"),
        pytest.param("https://h/vllm/v1/", "https://h/vllm", id="a path prefix stays"),
    ],
)
def test_backend_urls_are_normalised_to_a_base_url(given: str, expected: str) -> None:
    assert normalise_backend_url(given) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["serve", "--config", "/nonexistent/kvgate.yaml"], "not found",
                     id="missing config file"),
        pytest.param(["serve", "--backend", "localhost:8000"], "backends.0.url",
                     id="backend URL without scheme"),
        pytest.param(["serve"], "no backends", id="no backends at all"),
    ],
)
def test_kvgate_serve_exits_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in [v for v in os.environ if v.startswith("KVGATE_")]:
        monkeypatch.delenv(var)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert err.startswith("kvgate serve: ")


def test_settings_can_be_built_directly() -> None:
    settings = Settings.model_validate({"backends": [{"url": "http://127.0.0.1:1"}]})
    assert settings.backend_specs()[0].id == "b0"
