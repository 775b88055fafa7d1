"""An OTLP receiver built on the official protobuf definitions (PyPI `opentelemetry-proto`), for
tests of the proxy's OpenTelemetry export. It decodes every export request with the generated
message classes (a body that does not parse is answered 400 / INVALID_ARGUMENT and counted) and
appends what it received, as JSON lines, to OUT:

  {"signal": "logs", "resource": {...}, "records": [{"body": "...", "severity": "INFO",
   "attributes": {...}}]}
  {"signal": "metrics", "resource": {...}, "points": [{"name": "...", "attributes": {...},
   "value": N}]}

usage: otlp_receiver.py grpc|http OUT [PORT]   (prints the port it listens on; 0 by default)
"""
import http.server
import json
import sys
import threading
from concurrent import futures

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def write(out, entry):
    with LOCK:
        with open(out, "a") as f:
            f.write(json.dumps(entry) + "\n")


def logs(out, req):
    for rl in req.resource_logs:
        records = []
        for sl in rl.scope_logs:
            for r in sl.log_records:
                records.append(
                    {
                        "body": value(r.body),
                        "severity": r.severity_text,
                        "event_name": r.event_name,
                        "attributes": attrs(r.attributes),
                    }
                )
        write(out, {"signal": "logs", "resource": attrs(rl.resource.attributes), "records": records})


def metrics(out, req):
    for rm in req.resource_metrics:
        points = []
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                data = getattr(m, m.WhichOneof("data"))
                for p in data.data_points:
                    v = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
                    points.append({"name": m.name, "attributes": attrs(p.attributes), "value": v})
        write(out, {"signal": "metrics", "resource": attrs(rm.resource.attributes), "points": points})


def serve_http(out):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                if self.path == "/v1/logs":
                    req = logs_service_pb2.ExportLogsServiceRequest()
                    req.ParseFromString(body)
                    logs(out, req)
                    resp = logs_service_pb2.ExportLogsServiceResponse()
                elif self.path == "/v1/metrics":
                    req = metrics_service_pb2.ExportMetricsServiceRequest()
                    req.ParseFromString(body)
                    metrics(out, req)
                    resp = metrics_service_pb2.ExportMetricsServiceResponse()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
            except DecodeError:
                write(out, {"signal": "invalid", "path": self.path})
                self.send_response(400)
                self.end_headers()
                return
            if self.headers.get("x-tenant"):
                write(out, {"signal": "header", "x-tenant": self.headers.get("x-tenant")})
            data = resp.SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()


def serve_grpc(out):
    import grpc
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):
        def Export(self, request, context):
            tenant = dict(context.invocation_metadata()).get("x-tenant")
            if tenant:
                write(out, {"signal": "header", "x-tenant": tenant})
            logs(out, request)
            return logs_service_pb2.ExportLogsServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):
            metrics(out, request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port(f"127.0.0.1:{PORT}")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    PORT = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if mode == "grpc":
        serve_grpc(out)
    else:
        serve_http(out)
