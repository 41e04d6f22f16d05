"""The API server's errors: a Status object with its HTTP code, reason, message and details.

The wording is the API server's (k8s.io/apimachinery/pkg/api/errors), so that a client
that reads ``reason`` or matches a message behaves here as against a cluster.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

Obj = dict[str, Any]


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body

    def response(self) -> web.Response:
        return web.json_response(self.status(), status=self.code)


def _details(name: str, group: str, kind: str, **more: Any) -> Obj:
    details: Obj = {"name": name} if name else {}
    if group:
        details["group"] = group
    return {**details, "kind": kind, **more}


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    return ApiError(404, "NotFound", f'{_qualified(plural, group)} "{name}" not found', _details(name, group, plural))


def no_such_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(plural: str, name: str, group: str = "") -> ApiError:
    message = f'{_qualified(plural, group)} "{name}" already exists'
    return ApiError(409, "AlreadyExists", message, _details(name, group, plural))


def conflict(plural: str, name: str, why: str, group: str = "") -> ApiError:
    message = f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {why}'
    return ApiError(409, "Conflict", message, _details(name, group, plural))


MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, name: str, causes: list[tuple[str, str, str]], group: str = "") -> ApiError:
    """422: causes are (field, type, message), e.g. ("metadata.name", "FieldValueRequired", "Required value")."""
    words = [f"{field}: {message}" for field, _, message in causes]
    text = words[0] if len(words) == 1 else "[" + ", ".join(words) + "]"
    details = _details(name, group, kind, causes=[{"reason": t, "message": m, "field": f} for f, t, m in causes])
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details)


def forbidden(plural: str, name: str, why: str, group: str = "") -> ApiError:
    return ApiError(
        403, "Forbidden", f'{_qualified(plural, group)} "{name}" is forbidden: {why}', _details(name, group, plural)
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(method: str) -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", f"the server does not allow this method on the requested resource ({method})", {}
    )


def unsupported_media(content_type: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json "
        f"({content_type})",
    )


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def success(plural: str, name: str, uid: str, group: str = "") -> Obj:
    """What DELETE answers for resources that do not return the deleted object."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {**_details(name, group, plural), "uid": uid},
    }
