"""boto3 (the official AWS SDK for Python) with placeholder keys, through the proxy, against
the S3-like origin of aws_origin.py. Prints one JSON object: each step's outcome.

usage: aws_client.py PROXY_URL CA_FILE ENDPOINT ACCESS_KEY_ID SECRET_ACCESS_KEY
"""
import datetime
import hashlib
import hmac
import io
import json
import os
import sys

import boto3
import botocore
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

PROXY, CA, ENDPOINT, KEY_ID, SECRET = sys.argv[1:6]
PROXIES = {"https": PROXY}
REGION = "us-east-1"


def client(service="s3", **s3):
    cfg = Config(proxies=PROXIES, region_name=REGION, retries={"max_attempts": 1},
                 signature_version="s3v4" if service == "s3" else None,
                 s3=dict(addressing_style="path", **s3),
                 request_checksum_calculation="when_required")
    return boto3.client(service, endpoint_url=ENDPOINT, aws_access_key_id=KEY_ID,
                        aws_secret_access_key=SECRET, verify=CA, config=cfg)


def outcome(f):
    try:
        return f()
    except botocore.exceptions.ClientError as e:
        return "error %s %s" % (e.response["Error"].get("Code"), e.response["Error"].get("Message", ""))
    except Exception as e:  # noqa: BLE001 - the test reads what failed
        return "error %r" % e


def signed_chunks(path, data, chunk=65536):
    """A PUT with STREAMING-AWS4-HMAC-SHA256-PAYLOAD (botocore does not send these): the
    seed signed by botocore's signer, each chunk signed as the S3 documentation says."""
    chunks = [data[i:i + chunk] for i in range(0, len(data), chunk)] + [b""]
    encoded_len = sum(len("%x;chunk-signature=%s\r\n" % (len(c), "0" * 64)) + len(c) + 2
                      for c in chunks)
    req = AWSRequest(method="PUT", url=ENDPOINT + path, headers={
        "X-Amz-Content-SHA256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "Content-Encoding": "aws-chunked",
        "X-Amz-Decoded-Content-Length": str(len(data)),
        "Content-Length": str(encoded_len),
    })
    # SigV4Auth, not S3SigV4Auth: the latter would replace x-amz-content-sha256 by a hash.
    SigV4Auth(Credentials(KEY_ID, SECRET), "s3", REGION).add_auth(req)
    timestamp = req.context["timestamp"]
    previous = req.headers["Authorization"].rsplit("Signature=", 1)[1]
    key = ("AWS4" + SECRET).encode()
    for part in (timestamp[:8], REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    scope = "%s/%s/s3/aws4_request" % (timestamp[:8], REGION)
    body = b""
    for c in chunks:
        sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", timestamp, scope, previous,
                         hashlib.sha256(b"").hexdigest(), hashlib.sha256(c).hexdigest()])
        previous = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        body += b"%x;chunk-signature=%s\r\n%s\r\n" % (len(c), previous.encode(), c)
    assert len(body) == encoded_len
    r = requests.put(ENDPOINT + path, data=body, headers=dict(req.headers.items()),
                     proxies=PROXIES, verify=CA)
    return r.status_code if r.status_code == 200 else "%d %s" % (r.status_code, r.text[:300])


out = {}
data = bytes(range(256)) * 1000  # 256 KB
s3_signed = client(payload_signing_enabled=True)
s3_unsigned = client(payload_signing_enabled=False)
out["signed_put"] = outcome(lambda: s3_signed.put_object(
    Bucket="b", Key="signed", Body=data)["ResponseMetadata"]["HTTPStatusCode"])
out["unsigned_put"] = outcome(lambda: s3_unsigned.put_object(
    Bucket="b", Key="unsigned", Body=data)["ResponseMetadata"]["HTTPStatusCode"])
# The SDK's default for uploads: aws-chunked with a trailing checksum.
streaming = boto3.client("s3", endpoint_url=ENDPOINT, aws_access_key_id=KEY_ID,
                         aws_secret_access_key=SECRET, verify=CA,
                         config=Config(proxies=PROXIES, region_name=REGION,
                                       s3={"addressing_style": "path"},
                                       request_checksum_calculation="when_supported"))
out["streaming_put"] = outcome(lambda: streaming.put_object(
    Bucket="b", Key="streaming", Body=data)["ResponseMetadata"]["HTTPStatusCode"])
out["signed_chunks_put"] = outcome(lambda: signed_chunks("/b/chunked", data))
# upload_fileobj (the transfer manager), as an agent's code would upload a file.
out["fileobj_upload"] = outcome(lambda: (streaming.upload_fileobj(
    io.BytesIO(data), "b", "fileobj"), 200)[1])
if os.environ.get("AWS_CLIENT_LEAK"):
    # A private key straddling the SDK's 1 MiB aws-chunked chunk boundary.
    leak = b"x" * (1024 * 1024 - 10) + b"-----BEGIN RSA PRIVATE KEY-----" + b"y" * 100
    out["leak_put"] = outcome(lambda: streaming.put_object(
        Bucket="b", Key="leak", Body=leak)["ResponseMetadata"]["HTTPStatusCode"])
out["get"] = outcome(lambda: hashlib.sha256(
    s3_unsigned.get_object(Bucket="b", Key="signed")["Body"].read()).hexdigest() ==
    hashlib.sha256(data).hexdigest())
for k in ["unsigned", "streaming", "chunked"]:
    out["same_" + k] = outcome(lambda k=k: s3_unsigned.get_object(
        Bucket="b", Key=k)["Body"].read() == data)
url = s3_unsigned.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "signed"},
                                         ExpiresIn=300)
r = requests.get(url, proxies=PROXIES, verify=CA)
out["presigned_get"] = [r.status_code, hashlib.sha256(r.content).hexdigest() ==
                        hashlib.sha256(data).hexdigest()]
if r.status_code != 200:
    out["presigned_error"] = r.text[:300]
# A SigV2 presigned URL (boto3's default for S3 presigning) carries the placeholder key id
# under another scheme: refused, never passed on.
v2 = boto3.client("s3", endpoint_url=ENDPOINT, aws_access_key_id=KEY_ID,
                  aws_secret_access_key=SECRET,
                  config=Config(region_name=REGION, s3={"addressing_style": "path"}))
url = v2.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "signed"})
r = requests.get(url, proxies=PROXIES, verify=CA)
out["sigv2_presigned"] = [r.status_code, "AWSAccessKeyId" in url]
out["modes"] = outcome(lambda: requests.get(ENDPOINT + "/_modes", proxies=PROXIES,
                                            verify=CA).text)
sts = client("sts")
out["caller"] = outcome(lambda: sts.get_caller_identity()["UserId"])
print(json.dumps(out))
