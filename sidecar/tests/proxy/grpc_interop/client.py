"""A grpcio client for the interoperability tests.

    client.py TARGET METHOD COUNT [AUTHORITY]

Calls METHOD (Say or Stream) COUNT times on TARGET and prints one JSON line
per call: the status code name, its details, and the messages received.
With AUTHORITY the calls carry it as :authority (the sidecar routes by it);
a proxy comes from the standard http_proxy variable, which grpc core honours
by opening a CONNECT tunnel.
"""
import json
import sys

import grpc

from codec import decode, encode

target, method, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
options = [("grpc.enable_retries", 0)]
if len(sys.argv) > 4:
    options.append(("grpc.default_authority", sys.argv[4]))
channel = grpc.insecure_channel(target, options=options)
path = f"/reprise.test.Echo/{method}"
if method == "Say":
    call = channel.unary_unary(path, request_serializer=encode, response_deserializer=decode)
else:
    call = channel.unary_stream(path, request_serializer=encode, response_deserializer=decode)
for i in range(count):
    got = []
    try:
        if method == "Say":
            got.append(call(f"hi {i}", timeout=10))
        else:
            got.extend(call(f"hi {i}", timeout=10))
        code, details = "OK", ""
    except grpc.RpcError as e:
        code, details = e.code().name, e.details()
    print(json.dumps({"code": code, "details": details, "messages": got}), flush=True)
