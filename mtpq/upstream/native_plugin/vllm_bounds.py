"""pytest plugin (`-p vllm_bounds`): no test reaches a network, and none runs past a time limit.

A test that would reach a host other than this machine (loopback, the unspecified address, its own
name and addresses) fails at once: a name lookup or a connection raises, however the test retries. A
test needing the Hub thus fails on stock as with the series and is left out of what a run compares. A
test still running after $MTPQ_TEST_TIME_LIMIT seconds (default 300: twice the slowest of vLLM's own
tests measured on the CPU engine here) fails, naming the limit, and the run goes on. Each test starts
with the Hub's offline switch as the run set it: some of vLLM's tests turn it off and leave it so
(huggingface_hub.constants.HF_HUB_OFFLINE = False), after which every Hub request of a later test
retries with back-off until that test's time limit (vLLM 0.30.0's suite lost 20 minutes so).
"""

import ipaddress
import os
import signal
import socket

import pytest

TIME_LIMIT = float(os.environ.get("MTPQ_TEST_TIME_LIMIT", "300"))
_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo


def _own_names() -> set[str]:
    names = {"", "localhost", socket.gethostname(), socket.getfqdn()}
    for name in list(names - {""}):
        try:
            names.update(str(info[4][0]) for info in _getaddrinfo(name, None))
        except OSError:
            pass
    return names


_OWN_NAMES = _own_names()


class NoNetwork(OSError):
    pass


class TimeLimitExceeded(Exception):
    pass


def _is_local(host) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if not isinstance(host, str) or host in _OWN_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _checked(address) -> None:
    host = address[0] if isinstance(address, tuple) else None  # a path: a Unix socket
    if host is not None and not _is_local(host):
        raise NoNetwork(f"no network in these tests (a connection to {host})")


def _guarded_connect(self, address):
    _checked(address)
    return _connect(self, address)


def _guarded_connect_ex(self, address):
    _checked(address)
    return _connect_ex(self, address)


def _guarded_getaddrinfo(host, *args, **kwargs):
    _checked((host,))
    return _getaddrinfo(host, *args, **kwargs)


def _hub_constants():
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    return constants


_HUB = _hub_constants()
_HUB_OFFLINE = _HUB and _HUB.HF_HUB_OFFLINE


def pytest_configure(config):
    socket.socket.connect = _guarded_connect
    socket.socket.connect_ex = _guarded_connect_ex
    socket.getaddrinfo = _guarded_getaddrinfo


def _exceeded(signum, frame):
    raise TimeLimitExceeded(f"the test ran past the time limit of {TIME_LIMIT:.0f} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _HUB is not None:
        _HUB.HF_HUB_OFFLINE = _HUB_OFFLINE
    previous = signal.signal(signal.SIGALRM, _exceeded)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
