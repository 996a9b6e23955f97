"""Kubeconfig loading and API errors: the one place that turns client failures into Error + Hint."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from gpustack.errors import BadInput, ExitCode, GpustackError

FIELD_MANAGER = "gpustack"
# (connect, read) seconds for every API call; waits poll, they never hold a request open.
REQUEST_TIMEOUT = (5, 30)
# An answer 429 or 5xx with a Retry-After header is asked again after that many seconds, up to
# this many times: client-go's default (k8s.io/client-go@v0.36.1 rest/request.go maxRetries,
# rest/with_retry.go checkWait), which kubectl and controllers run with. The API server's
# priority and fairness sends Retry-After when it throttles; a PodDisruptionBudget's refusal
# of an eviction sends none (or 10 s while the budget is being processed).
MAX_RETRIES = 10
_KUBECONFIG_HINT = (
    "check it with `kubectl --kubeconfig {path} config view`, or pass another --kubeconfig"
)


class Clock:
    """Real time for waits; tests pass one whose sleep advances a fake clock instead."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


Seen = TypeVar("Seen")


def poll(observe: Callable[[], tuple[Seen, bool]], timeout: float, interval: float, clock: Clock
         ) -> tuple[Seen, float]:  # fmt: skip
    """Call `observe` (-> what it saw, whether that is all that was waited for) until it is done
    or `timeout` seconds have passed, `interval` seconds apart; it runs at least once. Returns
    the last observation and the seconds the wait took."""
    start = clock.now()
    while True:
        seen, done = observe()
        elapsed = clock.now() - start
        if done or elapsed >= timeout:
            return seen, elapsed
        clock.sleep(interval)


@dataclass
class Cluster:
    """An API client for one cluster plus the typed and dynamic APIs gpustack uses."""

    api: client.ApiClient
    source: str  # the kubeconfig path or "in-cluster", for messages
    _tmp: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="gpustack-k8s-"))
    _dynamic: Any = None

    @property
    def dynamic(self):
        if self._dynamic is None:
            from kubernetes import dynamic

            # A private discovery cache: the client's default lives in /tmp per server URL and
            # would hide a CRD installed after it was written.
            self._dynamic = call(
                lambda: dynamic.DynamicClient(
                    self.api, cache_file=os.path.join(self._tmp, "discovery.json")
                ),
                "read the API discovery",
            )
        return self._dynamic

    def raw(
        self,
        method: str,
        path: str,
        query: list | None = None,
        body: Any = None,
        ctype: str = "",
        retries: int = MAX_RETRIES,
    ) -> Any:
        """One request; the JSON answer as plain dicts (camelCase, as in manifests).

        Back-pressure (429 or 5xx with Retry-After) is waited out and asked again up to
        `retries` times, as client-go does. Raises ApiException for an error status; callers
        wrap it with `call()`.
        """
        headers = {"Accept": "application/json"}
        if ctype:
            headers["Content-Type"] = ctype
        attempt = 0
        while True:
            serialized = self.api.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(*serialized, _request_timeout=REQUEST_TIMEOUT)
            response.read()
            if response.status < 400:
                break
            wait = retry_after(response.getheader("Retry-After"))
            if wait is None or attempt >= retries or not backpressure(response.status):
                raise ApiException(http_resp=response)
            attempt += 1
            time.sleep(wait)
        text = response.data or b""
        if "json" not in (response.getheader("Content-Type") or "json"):
            return text.decode("utf-8", "replace")
        return json.loads(text or b"null")

    def get(self, path: str, what: str, **query: Any) -> Any:
        params = [(k, v) for k, v in query.items() if v is not None]
        return call(lambda: self.raw("GET", path, params), what)

    def list_all(self, path: str, what: str, page: int = 500, **query: Any) -> list[dict]:
        """Every item of a list, fetched `page` at a time (limit/continue)."""
        items: list[dict] = []
        token = None
        while True:
            answer = self.get(path, what, limit=page, **{"continue": token}, **query)
            items.extend(answer.get("items") or [])
            token = (answer.get("metadata") or {}).get("continue")
            if not token:
                return items

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)
        self.api.close()


def backpressure(status: int) -> bool:
    """Pure: an answer that may carry Retry-After worth waiting for (client-go's checkWait)."""
    return status == 429 or status >= 500


def retry_after(value: str | None) -> int | None:
    """Pure: the seconds of a Retry-After header (an integer, as client-go reads it)."""
    try:
        seconds = int(str(value).strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def connect(kubeconfig: str | None, *, required: bool = True) -> Cluster | None:
    """Load `kubeconfig` (the flag or $KUBECONFIG), else the in-cluster service account.

    Returns None when nothing is configured and `required` is False. Every predictable
    problem is a BadInput: nothing has run on any host yet.
    """
    configuration = client.Configuration()
    if kubeconfig:
        # $KUBECONFIG may list several files (the client merges them); the first must exist.
        path = Path(kubeconfig.split(os.pathsep)[0]).expanduser()
        if not path.is_file():
            raise BadInput(
                f"kubeconfig {kubeconfig} does not exist",
                "pass the path of a kubeconfig file with --kubeconfig (or set $KUBECONFIG)",
            )
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ConfigException("not a kubeconfig (expected a YAML mapping)")
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        except RecursionError:
            raise BadInput(f"kubeconfig {kubeconfig} is not usable: nested too deeply",
                           _KUBECONFIG_HINT.format(path=kubeconfig)) from None  # fmt: skip
        except (ConfigException, yaml.YAMLError, OSError, TypeError, ValueError, KeyError) as exc:
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise BadInput(
                f"kubeconfig {kubeconfig} is not usable: {reason}",
                _KUBECONFIG_HINT.format(path=kubeconfig),
            ) from None
        source = str(path)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise BadInput(
                f"in-cluster configuration is not usable: {exc}",
                "pass --kubeconfig, or run gpustack in a pod with a service account",
            ) from None
        source = "in-cluster"
    elif required:
        raise BadInput(
            "no kubeconfig: this command needs the cluster",
            "pass --kubeconfig FILE or set $KUBECONFIG",
        )
    else:
        return None
    configuration.retries = 1
    return Cluster(client.ApiClient(configuration), source)


def check_reachable(cluster: Cluster) -> str:
    """GET /version; returns the server's gitVersion or raises BadInput with a hint."""
    host = cluster.api.configuration.host
    try:
        version = cluster.raw("GET", "/version")
    except ApiException as exc:
        if exc.status in (401, 403):
            raise BadInput(
                f"the Kubernetes API server at {host} rejected the credentials "
                f"of {cluster.source} ({exc.status} {exc.reason})",
                "refresh the kubeconfig's token or certificate",
            ) from None
        raise BadInput(
            f"the Kubernetes API server at {host} answered {exc.status} {exc.reason}",
            f"check that {cluster.source} points at a Kubernetes API server",
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise BadInput(
            f"cannot reach the Kubernetes API server at {host}: {_reason(exc)}",
            f"check the server address in {cluster.source} and that the cluster is up; "
            "nothing was changed on any host",
        ) from None
    if not isinstance(version, dict) or "gitVersion" not in version:
        raise BadInput(
            f"{host} does not answer like a Kubernetes API server (GET /version)",
            f"check the server address in {cluster.source}",
        )
    return str(version["gitVersion"])


def _reason(exc: BaseException) -> str:
    while isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    text = str(exc)
    if "Connection refused" in text:
        return "connection refused"
    return " ".join(text.split())[:200]


def status_body(exc: ApiException) -> dict[str, Any]:
    """The Kubernetes Status object an API error carries ({} when its body is not one)."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def status_message(exc: ApiException) -> str:
    """The `message` of a Kubernetes Status body, else the HTTP reason."""
    return f"{exc.status} {status_body(exc).get('message') or exc.reason}"


def api_hint(exc: ApiException) -> str:
    """The Hint: line for an API error (every Kubernetes error carries one)."""
    if exc.status in (401, 403):
        return "check the kubeconfig's permissions (RBAC) for gpustack's objects"
    return "see the message above; `kubectl` with the same kubeconfig shows the object"


def call(fn, what: str):
    """Run one API call; a client failure becomes a GpustackError naming what was attempted."""
    try:
        return fn()
    except ApiException as exc:
        raise GpustackError(f"cannot {what}: {status_message(exc)}", api_hint(exc)) from None
    except ResourceNotFoundError:
        raise GpustackError(
            f"cannot {what}: the cluster does not serve this API",
            "check the Kubernetes version and installed CRDs",
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise GpustackError(
            f"cannot {what}: the API server is unreachable ({_reason(exc)})",
            "check the cluster; gpustack can be re-run safely (apply is idempotent)",
            ExitCode.HOST_FAILED,
        ) from None
