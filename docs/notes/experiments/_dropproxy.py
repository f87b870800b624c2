"""A TCP proxy that loses the reply to one marked request (the server did execute it)."""

import socket
import threading


class DropProxy:
    """Forward 127.0.0.1:<port> -> 127.0.0.1:<target>.

    While ``armed`` > 0, a request containing ``marker`` is forwarded, but its
    reply is swallowed and both sockets are closed: the client sees a reset
    connection after the server executed the command.
    """

    def __init__(self, target: int, marker: bytes = b"lost-reply") -> None:
        self.target, self.marker, self.armed = target, marker, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(("127.0.0.1", self.target))
            drop = threading.Event()
            threading.Thread(target=self._up, args=(client, server, drop), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, drop), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, drop: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                if self.armed and self.marker in data:
                    self.armed -= 1
                    drop.set()
                server.sendall(data)
        except OSError:
            pass

    def _down(self, server: socket.socket, client: socket.socket, drop: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if drop.is_set():
                    break
                client.sendall(data)
        except OSError:
            pass
        for sock in (client, server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
