"""Which AWS refusals mean "these credentials are stale" (pure): the gateway fetches the
credentials of a SigV4 server again, once, when the server's 400/403 says its session token
expired or its key or signature is not (or no longer) recognised (a role's credentials replaced
early, a static key rotated), rather than waiting for their scheduled renewal.

The AWS error code is read where AWS services put it: the `x-amzn-ErrorType` header (API Gateway,
Lambda and the JSON protocols: `Code:namespace`), a JSON body's `__type` (`namespace#Code`),
`code`/`Code` or `Error.Code`, an XML body's `<Code>` (S3, the query protocols), or failing
those, API Gateway's fixed messages. Bodies are looked at only up to `MAX_ERROR_BODY` bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

MAX_ERROR_BODY: Final = 16 * 1024
STALE_CODES: Final = frozenset({
    "ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired", "InvalidToken",
    "InvalidClientTokenId", "UnrecognizedClientException",
    "InvalidSignatureException", "SignatureDoesNotMatch",
})
_MESSAGES: Final = (  # API Gateway's answers, whose body has only a message
    ("security token included in the request is expired", "ExpiredTokenException"),
    ("security token included in the request is invalid", "UnrecognizedClientException"),
    ("request signature we calculated does not match", "InvalidSignatureException"),
)
_XML_CODE: Final = re.compile(rb"<Code>\s*([A-Za-z][A-Za-z0-9.]{0,63})\s*</Code>")


def _json_code(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    for key in ("__type", "code", "Code"):
        value = data.get(key)
        if isinstance(value, str):
            return value.rpartition("#")[2]
    error = data.get("Error")
    if isinstance(error, dict) and isinstance(error.get("Code"), str):
        return str(error["Code"])
    message = data.get("message", data.get("Message"))
    if isinstance(message, str):
        lowered = message.lower()
        return next((code for text, code in _MESSAGES if text in lowered), None)
    return None


def error_code(headers: Mapping[str, str], body: bytes) -> str | None:
    """The AWS error code of a refusal, if it names one."""
    typed = headers.get("x-amzn-errortype")
    if typed:
        return typed.split(":", 1)[0].strip() or None
    if not body or len(body) > MAX_ERROR_BODY:
        return None
    stripped = body.lstrip()
    if stripped.startswith(b"<"):
        match = _XML_CODE.search(body)
        return match[1].decode("ascii") if match else None
    try:
        return _json_code(json.loads(body))
    except ValueError:
        return None


def stale_credentials_code(status: int, headers: Mapping[str, str], body: bytes) -> str | None:
    """The AWS error code when a refusal says the credentials are stale or not recognised
    (STALE_CODES), else None."""
    if status not in (400, 403):
        return None
    code = error_code(headers, body)
    return code if code in STALE_CODES else None
