"""The per-client connection cap counts a client, not an address it can change at will: an
IPv6 client's whole /64 (a host or site picks any of its 2**64 addresses), and an
IPv4-mapped address as the IPv4 client it is (`connections.Admission`, `client_of`)."""

from __future__ import annotations

import itertools

import pytest

from ctxactors.settings import HttpSettings
from ctxactors.transports.connections import Admission, client_of

PER_CLIENT = 4


def refused(admission: Admission, fds: itertools.count[int], hosts: list[str]) -> list[bool]:
    return [admission.admit(next(fds), host) is not None for host in hosts]


def test_addresses_of_one_ipv6_64_share_one_clients_cap() -> None:
    admission = Admission(HttpSettings(max_connections=64, max_connections_per_client=PER_CLIENT))
    fds = itertools.count(10)
    # Five connections, each from another address of 2001:db8:0:7::/64: the fifth is refused.
    same = [f"2001:db8:0:7::{n:x}" for n in range(1, 6)]
    assert refused(admission, fds, same) == [False, False, False, False, True]
    # Another /64 of the same /48 is another client; the server's cap holds for all.
    assert refused(admission, fds, ["2001:db8:0:8::1"]) == [False]
    refusal = admission.admit(next(fds), "2001:db8:0:7:ffff:ffff:ffff:ffff")
    assert refusal is not None and b"2001:db8:0:7::/64 holds 4 connections" in refusal
    assert admission.open == PER_CLIENT + 1


def test_an_ipv4_mapped_address_counts_as_its_ipv4_client() -> None:
    admission = Admission(HttpSettings(max_connections=64, max_connections_per_client=PER_CLIENT))
    fds = itertools.count(10)
    hosts = ["192.0.2.9", "::ffff:192.0.2.9", "::ffff:c000:209", "192.0.2.9", "::ffff:192.0.2.9"]
    assert refused(admission, fds, hosts) == [False, False, False, False, True]


@pytest.mark.parametrize(
    ("host", "client"),
    [
        ("127.0.0.2", "127.0.0.2"),
        ("::1", "::1"),
        ("2001:db8::1", "2001:db8::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("", ""),  # a Unix socket's peer: as it is
    ],
)
def test_client_of(host: str, client: str) -> None:
    assert client_of(host) == client


def test_a_descriptor_handed_out_again_frees_the_place_of_its_old_connection() -> None:
    """A connection asyncio failed to make a transport for never reaches `connection_lost`:
    when the kernel hands its descriptor to a new connection, its place is given back."""
    admission = Admission(HttpSettings(max_connections=64, max_connections_per_client=1))
    assert admission.admit(10, "192.0.2.1") is None
    assert admission.admit(10, "192.0.2.1") is None  # 10 again: the first is gone
    assert admission.open == 1
    assert admission.admit(11, "192.0.2.1") is not None  # the one place is held


def test_a_closed_connection_gives_its_client_one_place_back() -> None:
    admission = Admission(HttpSettings(max_connections=64, max_connections_per_client=3))
    fds = itertools.count(10)
    held = [next(fds) for _ in range(3)]
    assert [admission.admit(fd, "192.0.2.7") for fd in held] == [None] * 3
    admission.release(held[0])
    admission.release(held[0])  # twice: nothing more
    assert refused(admission, fds, ["192.0.2.7", "192.0.2.7"]) == [False, True]
    for fd in held[1:]:
        admission.release(fd)
    assert admission.open == 1  # the one admitted after the first release
    assert refused(admission, fds, ["192.0.2.7"] * 3) == [False, False, True]
