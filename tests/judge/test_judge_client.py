"""The litellm boundary: the one error classifier and the retry policy, with litellm's own exceptions."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

from tests.support.judge_fakes import litellm_error
from vigil.judge.client import (
    PROVIDER_KEYS,
    LiteLLMClient,
    _litellm,
    classify,
    has_credentials,
    missing_credentials,
    supports_json_mode,
)
from vigil.judge.errors import ProviderError
from vigil.judge.limits import Budget, CircuitBreaker, decide


@pytest.mark.parametrize(
    ("name", "kind", "reason"),
    [
        ("RateLimitError", "retryable", "rate_limited"),
        ("InternalServerError", "retryable", "server_error"),
        ("ServiceUnavailableError", "retryable", "server_error"),
        ("Timeout", "retryable", "timeout"),
        ("AuthenticationError", "config", "auth"),
        ("PermissionDeniedError", "config", "auth"),
        ("NotFoundError", "config", "unknown_model"),
        ("ContextWindowExceededError", "rejected", "context_window_exceeded"),
        ("ContentPolicyViolationError", "rejected", "content_filtered"),
    ],
)
def test_litellm_exceptions_are_classified_once(name: str, kind: str, reason: str) -> None:
    err = classify(litellm_error(name))
    assert (err.kind, err.reason) == (kind, reason)


def test_other_failures_are_classified() -> None:
    assert classify(TimeoutError()).kind == "retryable"
    assert classify(ConnectionResetError()).reason == "connection"
    assert classify(httpx.ConnectError("refused")).kind == "retryable"
    assert classify(RuntimeError("surprise")).reason == "unknown"
    already = ProviderError("config", "auth", "x")
    assert classify(already) is already


def test_unknown_model_through_litellm_is_a_configuration_error() -> None:
    with pytest.raises(Exception) as info:
        asyncio.run(LiteLLMClient().complete("nosuchprovider/model", [{"role": "user", "content": "hi"}]))
    assert (classify(info.value).kind, classify(info.value).reason) == ("config", "unknown_model")


@pytest.mark.parametrize(
    ("model", "env"),
    [
        ("openai/gpt-4o-mini", ["OPENAI_API_KEY", "OPENAI_ADMIN_KEY"]),  # litellm raises InternalServerError
        ("gemini/gemini-1.5-pro", ["GEMINI_API_KEY", "GOOGLE_API_KEY"]),  # ... APIConnectionError
        ("anthropic/claude-3-5-sonnet-20240620", ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"]),
    ],
)
def test_a_missing_provider_key_through_litellm_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, model: str, env: list[str]
) -> None:
    for name in env:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(Exception) as info:
        asyncio.run(LiteLLMClient().complete(model, [{"role": "user", "content": "hi"}], timeout=5))
    err = classify(info.value)
    assert (err.kind, err.reason) == ("config", "missing_credentials"), err
    assert missing_credentials(model) is not None and env[0] in (missing_credentials(model) or "")


def test_credential_words_do_not_turn_rate_limits_or_timeouts_into_config_errors() -> None:
    lm = _litellm()
    limited = lm.RateLimitError(message="Rate limit reached for api key sk-...", llm_provider="openai", model="m")
    assert classify(limited).kind == "retryable"
    assert classify(lm.Timeout(message="api_key check timed out", llm_provider="openai", model="m")).kind == (
        "retryable"
    )


def test_start_up_credential_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert "OPENAI_API_KEY" in (missing_credentials("openai/gpt-4o-mini") or "")
    assert missing_credentials("openai/gpt-4o-mini", {"api_key": "sk-test"}) is None  # from extra_params
    assert missing_credentials("hosted_vllm/llama", {"api_base": "http://vllm:8000/v1"}) is None
    assert missing_credentials("ollama/llama3") is None  # only a base URL, which has a default: not a key
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert missing_credentials("openai/gpt-4o-mini") is None


def test_json_mode_and_credentials_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert supports_json_mode("openai/gpt-4o-mini") and not supports_json_mode("nosuchprovider/model")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    has_credentials.cache_clear()
    assert not has_credentials("anthropic/claude-3-5-sonnet-20240620")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    has_credentials.cache_clear()
    assert has_credentials("anthropic/claude-3-5-sonnet-20240620")
    has_credentials.cache_clear()


def test_retry_policy_grows_with_jitter_and_is_bounded() -> None:
    retry = ProviderError("retryable", "rate_limited", "x")
    rng = random.Random(1)
    delays = [decide(retry, n, 6, 1.0, 10.0, rng).delay for n in range(1, 6)]
    for n, d in enumerate(delays, 1):
        step = min(10.0, 2 ** (n - 1))
        assert step / 2 <= d <= step
    assert decide(retry, 6, 6, 1.0, 10.0).action == "give_up"
    assert decide(ProviderError("config", "auth", "x"), 1, 6, 1.0, 10.0).action == "stop_judge"
    assert decide(ProviderError("rejected", "content_filtered", "x"), 1, 6, 1.0, 10.0).action == "unscored"


def test_circuit_breaker_and_budget() -> None:
    now = [0.0]
    cb = CircuitBreaker(2, 5.0, clock=lambda: now[0])
    cb.failure()
    assert cb.allow()
    cb.failure()
    assert cb.is_open and not cb.allow()
    now[0] = 5.0
    assert cb.allow() and not cb.allow()  # one probe at a time
    cb.failure()
    assert cb.is_open and not cb.allow()  # a failed probe reopens for a full cooldown
    now[0] = 10.0
    assert cb.allow()
    cb.success()
    assert not cb.is_open and cb.allow()

    b = Budget(0.01)
    first = b.reserve()
    assert first == 0.0
    b.settle(first, 0.004)
    second = b.reserve()
    assert second == pytest.approx(0.004)
    assert b.reserve() is None  # 0.004 spent + 0.004 held + 0.004 more would pass the cap
    b.settle(second, 0.004)
    assert b.exhausted and b.reserve() is None


def test_a_providers_retry_after_is_waited_for() -> None:
    """A 429 with Retry-After: 120 was retried after the policy's own short delay, and the circuit's probe
    went every cooldown (5 s): the provider's word on when to come back is now the least wait."""
    from email.utils import formatdate
    from types import SimpleNamespace

    from vigil.judge.client import classify, retry_after

    class RateLimited(Exception):
        status_code = 429

        def __init__(self, headers: dict[str, str]) -> None:
            super().__init__("429 Too Many Requests")
            self.response = SimpleNamespace(headers=headers)

    assert retry_after(RateLimited({"retry-after": "120"})) == 120
    assert retry_after(RateLimited({"retry-after-ms": "1500"})) == 1.5
    assert 50 <= (retry_after(RateLimited({"retry-after": formatdate(time.time() + 60, usegmt=True)})) or 0) <= 61
    assert retry_after(RateLimited({"retry-after": "soon"})) is None
    assert retry_after(RateLimited({"retry-after": "1e9"})) == 3600  # bounded
    assert retry_after(RateLimited({})) is None and retry_after(ValueError("x")) is None
    err = classify(RateLimited({"retry-after": "120"}))
    assert (err.kind, err.reason, err.retry_after) == ("retryable", "rate_limited", 120)
    assert decide(err, 1, 6, 1.0, 10.0).delay == 120
    assert decide(ProviderError("retryable", "rate_limited", "x"), 1, 6, 1.0, 10.0).delay <= 1.0
    now = [0.0]
    cb = CircuitBreaker(1, 5.0, clock=lambda: now[0])
    cb.failure(retry_after=120)
    assert cb.is_open and cb.remaining() == 120
    now[0] = 60.0
    assert not cb.allow()
    now[0] = 120.0
    assert cb.allow()


def test_retry_and_limit_docs_match_the_code() -> None:
    from vigil.settings import PROJECT_ROOT, Settings

    described = Settings.model_fields["judge_retry_base_seconds"].description or ""
    assert "equal jitter" in described and "full jitter" not in described
    retry = ProviderError("retryable", "rate_limited", "x")
    rng = random.Random(3)
    delays = [decide(retry, 3, 6, 1.0, 10.0, rng).delay for _ in range(500)]
    assert min(delays) >= 2.0 and max(delays) <= 4.0  # equal jitter: half of the 4 s step is fixed
    configuration = (PROJECT_ROOT / "docs" / "configuration.md").read_text()
    assert f"| `VIGIL_JUDGE_RETRY_BASE_SECONDS` | `2.0` | {described} |" in configuration
    judge_page = (PROJECT_ROOT / "docs" / "judge.md").read_text()
    judge_section = judge_page.split("<!-- section:judge -->")[1].split("<!-- section:")[0]
    assert "*Limits are per process.*" in judge_section and "N × `rpm`" in judge_section


def test_retry_after_is_read_from_a_real_litellm_rate_limit_error() -> None:
    """Through litellm against a local OpenAI-compatible server answering 429 with Retry-After: 1."""
    import asyncio

    from tests.support.fake_openai import Script, fake_openai
    from vigil.judge.client import LiteLLMClient, classify

    with fake_openai(Script(fault=lambda: 429)) as (url, _script):
        client = LiteLLMClient(api_base=url, api_key="sk-test")
        with pytest.raises(Exception) as info:
            asyncio.run(client.complete("openai/gpt-4o-mini", [{"role": "user", "content": "hi"}]))
    err = classify(info.value)
    assert (err.kind, err.reason, err.retry_after) == ("retryable", "rate_limited", 1.0)


def test_a_refused_connection_is_classified_as_one() -> None:
    """litellm reports a refused connection as an InternalServerError ('Connection error.'): the judge's
    state said server_error, sending on-call to the provider's status page instead of the network."""
    import asyncio

    from tests.support.services import free_port
    from vigil.judge.client import LiteLLMClient, classify

    client = LiteLLMClient(api_base=f"http://127.0.0.1:{free_port()}/v1", api_key="sk-test")
    with pytest.raises(Exception) as info:
        asyncio.run(client.complete("openai/gpt-4o-mini", [{"role": "user", "content": "hi"}], timeout=10))
    err = classify(info.value)
    assert (err.kind, err.reason) == ("retryable", "connection")


@pytest.mark.parametrize("provider", sorted(PROVIDER_KEYS))
def test_a_provider_without_keys_is_known_offline_as_litellm_would_say(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`surely_keyless` answers without importing litellm: it must agree with litellm's own check, with
    none of the provider's variables set and with each one set alone."""
    from vigil.judge.client import surely_keyless

    model = f"{provider}/some-model"
    for name in PROVIDER_KEYS[provider]:
        monkeypatch.delenv(name, raising=False)
    assert surely_keyless(model)
    assert not _litellm().validate_environment(model=model)["keys_in_environment"]
    for name in PROVIDER_KEYS[provider]:
        monkeypatch.setenv(name, "k")
        assert not surely_keyless(model)
        assert _litellm().validate_environment(model=model)["keys_in_environment"], name
        monkeypatch.delenv(name)
    assert not surely_keyless(f"{provider}-like/some-model") and not surely_keyless("gpt-4o-mini")


@pytest.mark.parametrize(
    "message",
    [
        "Incorrect API key provided: sk-fake. You can find your API key at https://provider.invalid/keys.",
        "invalid x-api-key",
        "API key not valid. Please pass a valid API key.",
        'Error code: 401 - {"error": {"code": "invalid_api_key"}}',
    ],
)
def test_a_key_sent_and_refused_is_a_wrong_key_not_a_missing_one(message: str) -> None:
    """A 401 for a wrong key stopped the judge as `missing_credentials`, sending the operator to set a
    key that was set. A key refused is `auth`; a key absent stays `missing_credentials`."""
    lm = _litellm()
    err = classify(lm.AuthenticationError(message=message, llm_provider="openai", model="gpt-4o-mini"))
    assert (err.kind, err.reason) == ("config", "auth"), err
    missing = (
        "The api_key client option must be set either by passing api_key to the client or by setting the "
        "OPENAI_API_KEY environment variable"
    )
    assert classify(lm.InternalServerError(message=missing, llm_provider="openai", model="gpt-4o-mini")).reason == (
        "missing_credentials"
    )
