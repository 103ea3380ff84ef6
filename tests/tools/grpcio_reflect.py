#!/usr/bin/env python3
"""An independent reflection and health client for a ringd Admin port (what `grpcurl list`,
`grpcurl describe` and `grpc_health_probe` do), with grpcio's own clients: reflection
v1alpha (grpcio-reflection) and grpc.health.v1 (grpcio-health-checking).

Usage: grpcio_reflect.py HOST:PORT CA_FILE [CERT_FILE KEY_FILE]

Prints `services: ...`, `methods: ...` (of gardenring.v1.Admin), `health: ...` (the server)
and `admin health: ...`. Without CERT_FILE and KEY_FILE it presents no client certificate.
On a gRPC error it prints the status code and details on stderr and exits 1.
"""

import sys

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main(argv):
    if len(argv) not in (3, 5):
        print(__doc__, file=sys.stderr)
        return 2
    address, ca = argv[1], argv[2]
    key = read(argv[4]) if len(argv) == 5 else None
    cert = read(argv[3]) if len(argv) == 5 else None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(ca), private_key=key, certificate_chain=cert
    )
    with grpc.secure_channel(address, credentials) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        try:
            database = ProtoReflectionDescriptorDatabase(channel)
            print("services:", *sorted(database.get_services()))
            admin = DescriptorPool(database).FindServiceByName("gardenring.v1.Admin")
            print("methods:", *[m.name for m in admin.methods])
            health = health_pb2_grpc.HealthStub(channel)
            names = health_pb2.HealthCheckResponse.ServingStatus.Name
            for label, service in (("health", ""), ("admin health", "gardenring.v1.Admin")):
                reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                print(f"{label}:", names(reply.status))
        except grpc.RpcError as e:
            print(f"{e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
