"""The servers grant tests configure: one for each leg of the Rule of Two, each with a static key
(the secret KEY_NAME) and its one tag. Shared by tests/test_grants.py and tests/test_hardening_state.py.

The texts are plain TOML; `template()` escapes one for a config that is filled in with
str.format (as `CONFIG.format(socket=...)`)."""

from __future__ import annotations

UNTRUSTED, SENSITIVE, EGRESS = "web", "crm", "mail"  # the names the tests use for the three legs


def tagged_server(name: str, tag: str, extra: str = "") -> str:
    """A [[servers]] entry: `name` at https://NAME.example.com/mcp, sending X-Api-Key =
    {{secret:KEY_NAME}} (a secret of its own: servers naming one secret share their tags), with
    the tag `tag` (untrusted_input, sensitive or egress); `extra` is appended as is."""
    return f"""[[servers]]
name = "{name}"
endpoint = "https://{name}.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:KEY_{name.upper()}}}}}" }}
tags = ["{tag}"]
{extra}"""


WEB = tagged_server(UNTRUSTED, "untrusted_input")
CRM = tagged_server(SENSITIVE, "sensitive")
MAIL = tagged_server(EGRESS, "egress")


def template(toml: str) -> str:
    """`toml` with its braces doubled, to be part of a str.format template."""
    return toml.replace("{", "{{").replace("}", "}}")
