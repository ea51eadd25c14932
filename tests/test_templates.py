from __future__ import annotations

import pytest

from mcpcreds.core.templates import FileRef, SecretRef, TemplateError, is_credential_header, parse_template


def test_secret_and_file_refs_with_whitespace_trimmed() -> None:
    t = parse_template("Bearer {{ secret:MCP_TOKEN }} / {{secret-file: /run/x }}")
    assert t.parts == ("Bearer ", SecretRef("MCP_TOKEN"), " / ", FileRef("/run/x"))
    assert t.secret_names == {"MCP_TOKEN"}
    assert not t.is_literal


def test_render_calls_lookup_per_reference() -> None:
    t = parse_template("a{{secret:X}}b{{secret:Y}}")
    assert t.render(lambda ref: ref.name.lower() if isinstance(ref, SecretRef) else "") == "axby"


def test_literal_text_renders_unchanged() -> None:
    t = parse_template("plain { braces } here")
    assert t.is_literal and t.render(lambda ref: "") == "plain { braces } here"


@pytest.mark.parametrize(
    "text",
    ["{{secret:X", "x {{", "{{env:HOME}}", "{{SECRETVALUE123}}", "{{secret:}}", "{{secret:a/b}}",
     "{{secret-file:relative}}", "{{}}"],
)
def test_bad_templates(text: str) -> None:
    with pytest.raises(TemplateError):
        parse_template(text)


def test_unknown_placeholder_error_does_not_echo_its_content() -> None:
    with pytest.raises(TemplateError) as info:
        parse_template("{{sk-live-123456}}")
    assert "sk-live-123456" not in str(info.value)


@pytest.mark.parametrize(
    "name",
    ["Authorization", "api-key", "X-API-KEY", "token", "password", "secret", "X-Auth-Token",
     "my_token", "X-Client-Key", "client_key"],
)
def test_credential_shaped_header_names(name: str) -> None:
    assert is_credential_header(name)


@pytest.mark.parametrize("name", ["X-Client", "Accept", "User-Agent", "X-Tokenizer", "keyboard"])
def test_other_header_names(name: str) -> None:
    assert not is_credential_header(name)
