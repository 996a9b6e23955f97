"""Kubernetes `Status` errors the emulator answers with."""

from __future__ import annotations


class ApiError(Exception):
    """Answered as a Kubernetes `Status` with this code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "code": self.code,
            "reason": self.reason,
            "message": self.message,
            "details": self.details,
        }


def forbidden(user: str, verb: str, group: str, resource: str, namespace: str | None,
              name: str | None) -> ApiError:  # fmt: skip
    """403 in kube-apiserver's wording (RBAC authorizer, `forbidden` responsewriter)."""
    what = f"{resource}.{group}" if group else resource
    subject = f'{what} "{name}"' if name else what
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
        f'in API group "{group}"{where}'
    )
    return ApiError(
        403, "Forbidden", message, {"name": name or "", "group": group, "kind": resource}
    )
