"""get_free_port: a port someone binds later (torch.distributed's store), drawn outside the OS's ephemeral range."""

import socket

from verl.single_controller.base import worker


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_port_is_free_and_below_the_ephemeral_range():
    low, _ = worker._ephemeral_range()
    ports = {worker.get_free_port("127.0.0.1") for _ in range(20)}
    for port in ports:
        assert _bindable(port), port
        if low > 20000:  # the usual Linux range: the OS never hands these out as source ports
            assert max(1024, low - 12000) <= port < low, (port, low)
    assert len(ports) > 1  # drawn at random, not one fixed port


def test_a_taken_port_is_skipped(monkeypatch):
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    taken = held.getsockname()[1]
    free = worker.get_free_port("127.0.0.1")

    class Draws:  # the first draw is the taken port, the second a free one
        def __init__(self):
            self.left = [taken, free]

        def randrange(self, start, stop):
            return self.left.pop(0)

    try:
        monkeypatch.setattr(worker, "_ephemeral_range", lambda: (40000, 60999))
        monkeypatch.setattr(worker.random, "Random", Draws)
        assert worker.get_free_port("127.0.0.1") == free
    finally:
        held.close()


def test_small_ephemeral_range_falls_back_to_the_os(monkeypatch):
    monkeypatch.setattr(worker, "_ephemeral_range", lambda: (1024, 65535))
    port = worker.get_free_port("127.0.0.1")
    assert 1024 <= port <= 65535 and _bindable(port)
