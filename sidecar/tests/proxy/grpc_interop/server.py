"""A grpcio server for the interoperability tests: reprise.test.Echo with a
unary Say and a server-streaming Stream (three messages), no generated code
(the one-field message is encoded by hand).

    server.py NAME SCRIPT

SCRIPT is a comma-separated list of what the successive calls get: ok,
unavailable, internal (a status before any message, sent by grpc core as
Trailers-Only). Calls past the list get ok. Prints its port, then one JSON
line per call with the method and the request metadata.
"""
import json
import sys
import threading
from concurrent import futures

import grpc

from codec import decode, encode


name, script = sys.argv[1], [a for a in sys.argv[2].split(",") if a]
calls = 0
lock = threading.Lock()


def begin(method, context):
    global calls
    with lock:
        n = calls
        calls += 1
    print(
        json.dumps({"method": method, "metadata": dict(context.invocation_metadata())}),
        flush=True,
    )
    action = script[n] if n < len(script) else "ok"
    if action == "unavailable":
        context.abort(grpc.StatusCode.UNAVAILABLE, "scripted unavailable")
    if action == "internal":
        context.abort(grpc.StatusCode.INTERNAL, "scripted internal")


def say(request, context):
    begin("Say", context)
    return f"{request} from {name}"


def stream(request, context):
    begin("Stream", context)
    for i in range(1, 4):
        yield f"{request} from {name} #{i}"


class Echo(grpc.GenericRpcHandler):
    def service(self, details):
        if details.method == "/reprise.test.Echo/Say":
            return grpc.unary_unary_rpc_method_handler(
                say, request_deserializer=decode, response_serializer=encode
            )
        if details.method == "/reprise.test.Echo/Stream":
            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=decode, response_serializer=encode
            )
        return None


server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers((Echo(),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination()
