"""A process the scope does not admit tries to have its request judged as a scoped tool's
(security review A06, A06b, A07). Usage:

    handoff.py VARIANT PROXY_PORT ORIGIN_PORT CURL_PATH

Every request is `POST http://origin.test:ORIGIN_PORT/upload` with a 10-byte body, so the
origin's byte count says how many reached it. Prints one line per answer read.

- inherit: python connects, starts curl holding the socket (an inherited descriptor; curl is
  blocked on a local listener that never answers), writes its request and closes its own
  copy: curl is then the only holder when the proxy reads the request.
- park: as inherit, but python first parks a copy of the descriptor in flight (`SCM_RIGHTS`
  over a socketpair: in no process's table), writes request 1 and closes its copy; once curl
  was seen it takes the descriptor back, kills curl, writes request 2 and reads both answers.
- exec: python writes its request, then `execv`s curl keeping the socket (the same pid).
"""
import os
import socket
import subprocess
import sys
import time

variant, proxy_port, origin_port, curl = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

REQUEST = (
    f"POST http://origin.test:{origin_port}/upload HTTP/1.1\r\n"
    f"Host: origin.test:{origin_port}\r\nContent-Length: 10\r\n\r\n0123456789"
).encode()

# A local listener that accepts and never answers: curl waits on it, holding the socket.
blocker = socket.socket()
blocker.bind(("127.0.0.1", 0))
blocker.listen(8)
blocker.set_inheritable(True)
wait = "1" if variant == "exec" else "5"
stall = ["-s", "--max-time", wait, f"http://127.0.0.1:{blocker.getsockname()[1]}/"]

conn = socket.create_connection(("127.0.0.1", proxy_port))
conn.set_inheritable(True)


def answer(s):
    s.settimeout(5)
    try:
        print(s.recv(4096).split(b"\r\n")[0].decode(), flush=True)
    except OSError as e:
        print(f"no answer: {e}", flush=True)


if variant == "exec":
    time.sleep(0.15)
    conn.sendall(REQUEST)
    os.execv(curl, [curl] + stall)

child = subprocess.Popen([curl] + stall, pass_fds=[conn.fileno()])
time.sleep(0.15)
if variant == "inherit":
    conn.sendall(REQUEST)
    conn.close()
    time.sleep(0.5)
elif variant == "park":
    parked, receiver = socket.socketpair(socket.AF_UNIX)
    socket.send_fds(parked, [b"x"], [conn.fileno()])
    conn.sendall(REQUEST)
    conn.close()
    time.sleep(0.5)
    _, fds, _, _ = socket.recv_fds(receiver, 1, 1)
    child.kill()
    child.wait()
    back = socket.socket(fileno=fds[0])
    answer(back)
    back.sendall(REQUEST)
    answer(back)
child.kill()
child.wait()
