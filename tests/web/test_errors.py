"""The HTTP helpers' errors: in lance_async.web.errors, under the one base, with their statuses."""

from __future__ import annotations

import pytest

import lance_async as la
import lance_async.fastapi as la_fastapi
from lance_async.web import errors as web_errors
from lance_async.web.handlers import error_payload, http_status


def test_every_http_error_derives_from_the_one_base_and_is_exported() -> None:
    for name in web_errors.__all__:
        kind = getattr(web_errors, name)
        assert issubclass(kind, la.LanceAsyncError), name
        assert getattr(la_fastapi, name) is kind, name  # lance_async.fastapi still exports it


def test_a_moved_name_says_where_it_went() -> None:
    from lance_async import errors

    with pytest.raises(AttributeError, match=r"moved to lance_async\.web\.errors"):
        errors.UnknownTableError  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        errors.Nope  # noqa: B018


def test_statuses_and_public_names_of_the_moved_and_new_errors() -> None:
    cases = [
        (web_errors.UnknownTableError("t"), 404),
        (web_errors.ServerBusyError("busy"), 503),
        (web_errors.AuthenticationError("who?"), 401),
        (web_errors.PermissionDeniedError("no", required="write"), 403),
        (web_errors.BodyTimeoutError("slow"), 408),
    ]
    for exc, status in cases:
        assert http_status(exc) == status
        assert error_payload(exc)["error"] == type(exc).__name__
