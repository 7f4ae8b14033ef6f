"""The one-field message (field 1: a string) of the interoperability tests'
reprise.test.Echo service, encoded by hand: no generated code."""


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode(text):
    data = text.encode()
    return b"\x0a" + varint(len(data)) + data


def decode(data):
    if not data:
        return ""
    # Field 1, wire type 2; one-byte length is enough for the tests' texts.
    assert data[0] == 0x0A, data
    return data[2 : 2 + data[1]].decode()
