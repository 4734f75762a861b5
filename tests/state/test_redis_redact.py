"""No message shows a Redis password, however odd: a raw space, ``@``, ``#``, ``/``, ``?``,
``:``, quotes, ``%`` and percent-encoding, a password that looks like a URL.

Each password is a real ``redis-server``'s ``requirepass``; `prepare` (what ``serve`` and
``shards`` run) is given it raw in the URL, percent-encoded, as a parameter and in a
password file, right and wrong, and then the store's calls fail with Redis gone. Every
error, every log line, and the settings' repr are searched for the password in each form
a message could hold it.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from state_support import RedisServer
from structlog.testing import capture_logs

from ctxactors.errors import StoreUnavailableError
from ctxactors.redis_access import prepare
from ctxactors.redis_url import redact
from ctxactors.settings import RedisSettings, Settings
from ctxactors.state import RedisStore

NASTY = [
    "pass word 9f",
    "p@ss@word",
    "p#ss#word",
    "pa/ss/word",
    "pa?ss=word&db=3",
    "p%40ss%2Fword",
    "p:ss:word",
    "p'ss\"word",
    "a://b@c d",
    "päss wörd",
    "100% sure",
    " leading and trailing ",
]


def forms(password: str) -> set[str]:
    """The forms a message could hold `password` in."""
    return {password, quote(password, safe=""), quote(password), unquote(password)}


def shown_nowhere(password: str, texts: list[str]) -> None:
    for text in texts:
        for form in forms(password):
            assert form not in text, (form, text)


@pytest.mark.parametrize("password", NASTY)
def test_no_message_shows_an_odd_password(password: str, tmp_path: Path) -> None:
    server = RedisServer(tmp_path, password=password)
    server.start()
    host = f"127.0.0.1:{server.port}"
    secret_file = tmp_path / "pw"
    secret_file.write_text(password + "\n")
    secret_file.chmod(0o600)
    settings = Settings(redis=RedisSettings(password_file=str(secret_file)))
    encoded = quote(password, safe="")
    texts: list[str] = [repr(settings), repr(Settings.from_env())]
    opened: list[str] = []
    with capture_logs() as logs:
        for url, works in [
            (f"redis://:{encoded}@{host}/0", True),
            (f"redis://{host}/0?password={encoded}", True),
            (f"redis://:{password}@{host}/0", None),  # raw: refused, or read as it is
            (f"redis://{password}@{host}/0", False),  # a password where the user goes
            (f"redis://:{encoded}x@{host}/0", False),
            (f"redis://alice:{password}@{host}/0", False),
        ]:
            try:
                opened.append(prepare(url, Settings()))
                assert works is not False, url
            except ValueError as exc:
                assert works is not True, (url, exc)
                texts.append(str(exc))
            texts.append(redact(f"unknown store {url!r}; see {url}"))
        from_file = prepare(f"redis://{host}/0", settings)
        opened.append(from_file)
    try:
        for url in opened:
            store = RedisStore(url, timeout=2)
            store.delete_session(("s",))
            texts.append(redact(url))
            texts.append(repr(store))
            server.stop(kill=True)
            with pytest.raises(StoreUnavailableError) as refused:
                store.delete_session(("s",))
            texts.append(str(refused.value))
            store.close()
            server.start()
    finally:
        server.stop(kill=True)
    texts += [repr(line) for line in logs]
    assert any(line["event"] == "redis_password_on_command_line" for line in logs)
    shown_nowhere(password, texts)


def test_a_url_redis_py_would_read_another_way_is_refused() -> None:
    for url, why in [
        ("redis://:zq/xv@h/0", "the password holds a raw '/', '?' or '#'"),
        ("redis://:zq#xv@h/0", "the password holds a raw '/', '?' or '#'"),
        ("unix://:zq/xv@/run/redis.sock", "a socket's URL is unix:///ABSOLUTE/PATH"),
        ("unix://relative.sock", "a socket's URL is unix:///ABSOLUTE/PATH"),
    ]:
        with pytest.raises(ValueError) as refused:
            prepare(url, Settings())
        assert why in str(refused.value) and "zq" not in str(refused.value), refused.value


def test_a_url_is_hidden_to_its_last_at_before_the_next_url() -> None:
    word = secrets.token_hex(4)  # never remembered: the rules alone hide it
    for password, shown in [
        (f"a b{word}", "redis://:***@h/0"),
        (f"a@b{word}", "redis://:***@h/0"),
        (f"a://b{word}", "redis://:***@h/0"),
        (f"a'b{word}", "redis://:***@h/0"),
    ]:
        assert redact(f"redis://:{password}@h/0") == shown, password
        quoted = redact(f"got 'redis://alice:{password}@h/0' and redis://bob:x@k/1 too")
        assert quoted == "got 'redis://alice:***@h/0' and redis://bob:***@k/1 too"
    # An "@" that no host follows ends no user part: the message after a URL is kept.
    advice = "redis://h:1/0 is open: put USER:PASSWORD@ before the host, or mail a@ b"
    assert redact(advice) == advice
    # A user part that is not plainly USER:PASSWORD is hidden whole.
    assert redact(f"redis://al ice:{word}@h/0") == "redis://***@h/0"
    assert redact(f"redis://{word}@h/0") == "redis://***@h/0"
