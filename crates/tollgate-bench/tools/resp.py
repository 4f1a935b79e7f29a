"""A minimal RESP2 client for the experiment tools beside it (no dependencies)."""
import socket, time


class Err(Exception):
    """A Redis error reply (returned, not raised, when Conn(raise_errors=False))."""


def enc(args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)


class Conn:
    def __init__(s, port, raise_errors=True, tries=600):
        for _ in range(tries):
            try:
                s.sock = socket.create_connection(('127.0.0.1', port)); break
            except OSError: time.sleep(0.2)
        s.f = s.sock.makefile('rb')
        s.raise_errors = raise_errors
    def cmd(s, *args):
        s.sock.sendall(enc(args)); return s.read()
    def read(s):
        line = s.f.readline(); t, rest = line[:1], line[1:-2]
        if t == b'+': return rest.decode()
        if t == b'-':
            if s.raise_errors: raise Err(rest.decode())
            return Err(rest.decode())
        if t == b':': return int(rest)
        if t == b'$':
            n = int(rest)
            if n < 0: return None
            d = s.f.read(n + 2); return d[:-2].decode()
        if t == b'*':
            n = int(rest); return None if n < 0 else [s.read() for _ in range(n)]
        raise RuntimeError(line)
