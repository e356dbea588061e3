"""A TCP to Unix-socket forwarder, so that a host in a network namespace reaches PostgreSQL.

    python -m bench.torture.torture_proxy ADDRESS PORT SOCKET_PATH

bench/torture/torture.py runs it in the database host's namespace (tests/netns.py), listening on
the veth address that the partitioned worker host connects to, and forwarding each
connection to the server's Unix socket (file-system sockets are not namespaced). Cutting
the veth then partitions that host alone, while the server and every other supervisor,
and the server's restarts and outages, stay those of the run. It prints "ready" once it
listens, and runs until killed.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading


def pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def serve(address: str, port: int, path: str) -> None:
    listener = socket.create_server((address, port), backlog=128)
    print("ready", flush=True)
    while True:
        client, _ = listener.accept()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.connect(path)
        except OSError:  # the server is stopped (an outage): refuse, as it would
            client.close()
            server.close()
            continue
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=pump, args=(source, sink), daemon=True).start()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), sys.argv[3])
