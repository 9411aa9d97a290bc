"""Secrets out, control sequences out: the last filter before text is journaled, cached, shown or sent.

Defense in depth. The compile sandbox already keeps NVRTC from reading host files and runs it with
an empty environment; this module makes sure that, should a secret reach a log anyway, it is not
written to disk, printed, or sent to the LLM endpoint.

What counts as a secret (collected once per process, plus what :func:`register_secret` adds):

- the value of every environment variable whose NAME says it is one (``*KEY*``, ``*TOKEN*``,
  ``*SECRET*``, ``*PASSWORD*``, ``*PASSWD*``, ``*CREDENTIAL*``, ``*AUTH*``, ``*PRIVATE*``,
  ``*COOKIE*``, ``*SESSION*``) and is at least 8 characters long;
- the value of any environment variable that LOOKS like one (``sk-...``, ``ghp_...``, ``xox?-...``,
  ``AKIA...``, a JWT, ``hf_...``), whatever its name;
- the API key of the configured endpoint (registered by the LLM client);
- credentials inside a URL (``https://user:password@host/v1``, a ``--base-url`` or any environment
  variable holding one): the user-info part of every URL in the text becomes ``[redacted]``
  whatever it is, and the password of a URL handed to :func:`register_url` (or found in the
  environment) is redacted wherever it appears alone, percent-encoded or not.

Each occurrence becomes ``[redacted]``; its JSON-escaped spelling is replaced too, so a journal
line can be redacted after it was serialised.

:func:`printable` removes terminal control sequences (CSI, OSC such as the clipboard write
``ESC ] 52``, DCS, single ESC sequences and C0/C1 controls other than newline and tab) from text
that a model wrote before it reaches a terminal.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any, Mapping
from urllib.parse import unquote, urlsplit

REDACTED = "[redacted]"
MIN_SECRET_LEN = 8

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION", re.I)
_SECRET_SHAPE = re.compile(
    r"^(sk-[A-Za-z0-9_-]{8,}|ghp_[A-Za-z0-9]{20,}|gh[ousr]_[A-Za-z0-9]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}|hf_[A-Za-z0-9]{20,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+)$"
)
# values that name a thing rather than hold a secret (KERNGEN_LOG_LEVEL=ERROR has no "key", but
# e.g. SSH_AUTH_SOCK=/tmp/... does): paths and plain words are not redacted
_NOT_SECRET = re.compile(r"^(/|~|\.{1,2}/)|^(true|false|yes|no|none|null|empty)$", re.I)

# scheme://USERINFO@ : the user-info of a URL (no '/', whitespace or quote before the '@')
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/@'\"<>\\]+@")

_lock = threading.Lock()
_registered: set[str] = set()


def url_secrets(url: str) -> set[str]:
    """The password of a URL's user-info, as written and percent-decoded (empty when none)."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return set()
    if "@" not in parts.netloc:
        return set()
    userinfo = parts.netloc.rsplit("@", 1)[0]
    password = userinfo.split(":", 1)[1] if ":" in userinfo else userinfo  # a lone token is a secret too
    return {p for p in (password, unquote(password)) if len(p) >= MIN_SECRET_LEN}


def register_url(url: str | None) -> None:
    """Treat the credentials inside ``url`` (a ``--base-url``) as secrets from now on."""
    for value in url_secrets(url or ""):
        with _lock:
            _registered.add(value)


def _from_env(env: Mapping[str, str]) -> set[str]:
    out: set[str] = set()
    for name, value in env.items():
        value = value.strip()
        if "://" in value:
            out |= url_secrets(value)
        if len(value) < MIN_SECRET_LEN:
            continue
        if _SECRET_SHAPE.match(value) or (_SECRET_NAME.search(name) and not _NOT_SECRET.search(value)):
            out.add(value)
    return out


def register_secret(value: str | None) -> None:
    """Treat ``value`` as a secret from now on (the configured API key). Short values (< 8
    characters, e.g. a local server's placeholder) are ignored: redacting them would eat words."""
    if value and len(value) >= MIN_SECRET_LEN:
        with _lock:
            _registered.add(value)


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    """Every secret known now, longest first (so a key that contains another is replaced whole)."""
    found = _from_env(os.environ if env is None else env)
    with _lock:
        found |= _registered
    spellings: set[str] = set()
    for s in found:
        spellings.add(s)
        spellings.add(json.dumps(s)[1:-1])  # as it appears inside a JSON string
    return sorted(spellings, key=len, reverse=True)


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """``text`` with every known secret, and the user-info of every URL, replaced by ``[redacted]``."""
    if not text:
        return text
    if "://" in text:
        text = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    for s in secret_values(env):
        if s in text:
            text = text.replace(s, REDACTED)
    return text


def redact_obj(obj: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings) with every string redacted."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj


# ESC [ ... final | ESC ] ... (BEL | ESC \) | ESC P/X/^/_ ... ESC \ | ESC + one char | C0/C1 except \t \n
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def printable(text: str) -> str:
    """``text`` without terminal control sequences; newlines and tabs kept. Also removes the
    bidirectional overrides that make a line read differently than it is (U+202A-202E, 2066-2069)."""
    if not text:
        return text
    text = _CONTROL.sub("", text.replace("\r\n", "\n"))
    return re.sub("[\u202a-\u202e\u2066-\u2069]", "", text)


__all__ = ["REDACTED", "printable", "redact", "redact_obj", "register_secret", "register_url", "secret_values",
           "url_secrets"]
