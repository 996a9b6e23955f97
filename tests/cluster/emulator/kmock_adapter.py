"""The only module that knows kmock: HTTP server, API discovery, request log, fault injection.

kmock 0.8 (`kmock.KubernetesScaffold`) gives an aiohttp server (`kmock.Server`), API discovery
(`/api`, `/apis`, `/apis/GROUP/VERSION`) built from declared resources, Kubernetes `Status`
errors, a request log and its reaction DSL, so a test can inject a fault:
`emu["get", re.compile("/api/v1/nodes")] << 500` (reactions beat the emulated API server).

kmock decides which reaction answers a request with `request in view`, which walks the view's
whole request history: every request cost grew with the requests before it (a 50-node rollout
spent most of its 110 s there). The history kmock's views see is therefore the last
`KMOCK_HISTORY` requests; the emulator's own `request_log` (`count`, `request_bodies`) keeps
every one. A test that needs a reaction on the Nth request counts with `count`, not with kmock
slices.

Everything else in the emulator sees plain `ApiRequest` objects and answers
`(status, payload, content type)`; kmock's private modules are imported here only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import kmock
import yaml
from kmock._internal import parsing, rendering

from tests.cluster.emulator.errors import ApiError
from tests.cluster.emulator.kinds import VERBS, Kind

JSON = "application/json"
KMOCK_HISTORY = 64  # the requests kmock's views see (see above)


@dataclass
class ApiRequest:
    """One HTTP request as the emulated API server sees it."""

    method: str  # upper case
    path: str
    params: dict[str, str]
    headers: dict[str, str]
    data: Any  # parsed JSON/YAML body, or None
    group: str | None = None
    version: str | None = None
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";")[0].strip()


def parse_path(path: str) -> tuple[str | None, str | None, str | None, str | None, str | None, str | None]:  # fmt: skip
    """(group, version, plural, namespace, name, subresource); Namespace URLs included."""
    parts = [p for p in path.strip("/").split("/") if p != ""]
    if len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    elif len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    else:
        return None, None, None, None, None, None
    namespace = None
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest else None
    name = rest[1] if len(rest) > 1 else None
    sub = "/".join(rest[2:]) or None
    return group, version, plural, namespace, name, sub


class KmockServer(kmock.KubernetesScaffold):
    """kmock's scaffold; subclasses implement `serve(ApiRequest)`."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.server_errors: list[BaseException] = []
        self.request_log: list[rendering.Request] = []  # every request served, in order
        self.fallback[re.compile(r"/apis?/.*|/version/")] << self._serve

    # -- what subclasses provide --------------------------------------------------------

    def serve(self, request: ApiRequest) -> tuple[int, Any, str]:
        raise NotImplementedError

    # -- discovery ---------------------------------------------------------------------

    def declare(self, kind: Kind) -> None:
        info = self.resources[f"{kind.group}/{kind.version}/{kind.plural}"]
        info.kind = kind.kind
        info.namespaced = kind.namespaced
        info.verbs = set(VERBS)
        info.subresources = set(kind.subresources)

    def undeclare(self, kind: Kind) -> None:
        del self.resources[f"{kind.group}/{kind.version}/{kind.plural}"]

    # -- request log --------------------------------------------------------------------

    def count(self, method: str | None = None, path: str | re.Pattern | None = None) -> int:
        """How many requests were served, optionally by HTTP method and path (regex: fullmatch)."""
        total = 0
        for request in list(self.request_log):
            if method and request.method.value.upper() != method.upper():
                continue
            if path is not None:
                text = request.url.path
                if isinstance(path, re.Pattern) and not path.fullmatch(text):
                    continue
                if isinstance(path, str) and text != path:
                    continue
            total += 1
        return total

    def request_bodies(self, method: str, path_suffix: str) -> list[Any]:
        """Parsed bodies of the requests whose path ends with `path_suffix`."""
        return [
            r.data
            for r in list(self.request_log)
            if r.method.value.upper() == method.upper() and r.url.path.endswith(path_suffix)
        ]

    # -- HTTP entry ----------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock's entry point with a path parser that also understands Namespace URLs."""
        body = await raw_request.read()
        text = body.decode("utf-8", "replace")
        try:
            data = yaml.safe_load(text) if text.strip() else None  # JSON is YAML
        except yaml.YAMLError:
            data = None
        group, version, plural, namespace, name, sub = parse_path(raw_request.path)
        path = parsing.ParsedPath(group, version, plural, namespace, name, sub)
        resource = None
        if group is not None:
            resource = kmock.resource(group=group, version=version, plural=plural)
        request = rendering.Request(
            id=len(self.request_log),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            data=data,
            body=body,
            text=text,
            action=parsing.guess_k8s(path, kmock.method(raw_request.method), raw_request.query),
            resource=resource,
            namespace=namespace,
            name=name,
            subresource=sub,
        )
        self.request_log.append(request)
        self._requests.append(request)
        del self._requests[:-KMOCK_HISTORY]
        try:
            return await self._handle(request)
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)
        except ApiError as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.code)
        except Exception as exc:  # an emulator bug: the test fixture fails on these
            self.server_errors.append(exc)
            return await self._render_error(exc)

    def _serve(self, request: rendering.Request) -> kmock.Response:
        res = request.resource
        api_request = ApiRequest(
            method=request.method.value.upper(),
            path=request.url.path,
            params=dict(request.params),
            headers=dict(request.headers),
            data=request.data,
            group=res.group if res else None,
            version=res.version if res else None,
            plural=res.plural if res else None,
            namespace=request.namespace,
            name=request.name,
            subresource=request.subresource,
        )
        try:
            status, payload, content_type = self.serve(api_request)
        except ApiError as exc:
            status, payload, content_type = exc.code, exc.status(), JSON
        except Exception as exc:  # an emulator bug: the test fixture fails on these
            self.server_errors.append(exc)
            raise
        if content_type == JSON and not isinstance(payload, bytes):
            payload = json.dumps(payload).encode()
        elif isinstance(payload, str):
            payload = payload.encode()
        # Always set status and type: kmock keeps a reaction's metadata between requests.
        return kmock.Response(
            status=status, payload=payload, headers={"Content-Type": content_type}
        )


def start_server(emulator: KmockServer):
    """The async context manager that serves `emulator` on a free local port."""
    return kmock.Server(emulator)
