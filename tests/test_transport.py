"""Messages between the judge, its zygote and a candidate's process: JSON with file descriptors
beside it, and a closed end read as closed however it closed."""

from __future__ import annotations

import os

import pytest

from core.evaluate.transport import TransportError, receive, send, socket_pair


def test_a_message_and_its_descriptors_cross():
    ours, theirs = socket_pair()
    read, write = os.pipe()
    send(ours, {"op": "call", "n": 3}, [read])
    message, fds = receive(theirs)
    assert message == {"op": "call", "n": 3} and len(fds) == 1
    os.write(write, b"x")
    assert os.read(fds[0], 1) == b"x"
    for fd in (read, write, *fds):
        os.close(fd)


def test_an_end_closed_is_read_as_closed():
    ours, theirs = socket_pair()
    ours.close()
    assert receive(theirs) == (None, [])


def test_an_end_closed_with_our_messages_unread_is_read_as_closed():
    # The other end had not read what this end sent: the kernel resets the connection.
    ours, theirs = socket_pair()
    send(theirs, {"type": "exited", "pid": 7})
    ours.close()
    assert receive(theirs) == (None, [])


def test_a_message_too_long_is_refused():
    ours, _ = socket_pair()
    with pytest.raises(TransportError, match="too long"):
        send(ours, {"blob": "x" * (1 << 22)})
