"""The API function behind its function URL, called as a client calls it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tools.rehearsal.acts.common import SAMPLES
from tools.rehearsal.iam import Statement
from tools.rehearsal.report import Report
from tools.rehearsal.stack import ACCOUNT, DeployedStack

if TYPE_CHECKING:
    from tools.rehearsal.services import InProcessServices


@dataclass
class FunctionUrl:
    """Calls to the API function's URL as a client makes them: refused by the URL as AWS would (aws_behaviours), or
    handed to the deployed function (as its role, with its environment) as a payload 2.0 event."""

    services: InProcessServices
    stack: DeployedStack
    url: str
    auth_type: str
    resource_policy: list[dict[str, Any]]

    def call(
        self, method: str, path: str, *, caller: list[Statement] | None = None, **request: Any
    ) -> tuple[int, bytes]:
        import base64

        import httpx

        from tools.rehearsal.aws_behaviours import function_url_event, function_url_refusal, payload_refusal

        function = self.stack.functions["ApiFunction"]
        refusal = function_url_refusal(self.resource_policy, self.auth_type, f"{function.arn}:live", caller)
        if refusal:
            return 403, refusal.encode()
        built = httpx.Request(method, f"{self.url.rstrip('/')}{path}", **request)
        caller_arn = f"arn:aws:iam::{ACCOUNT}:role/ApiCaller" if caller is not None else ""
        event = function_url_event(self.url, method, path, built.read(), dict(built.headers), caller_arn)
        if too_large := payload_refusal(event):
            return too_large[0], too_large[1].encode()
        response, failed = self.services.invoke(function, event)
        if too_large := payload_refusal(event, response):
            return too_large[0], too_large[1].encode()
        if failed:
            return 502, json.dumps(response).encode()
        body = response.get("body", "")
        return int(response["statusCode"]), base64.b64decode(body) if response.get("isBase64Encoded") else body.encode()


def the_api_answers_through_its_url(services: InProcessServices, stack: DeployedStack, report: Report) -> None:
    """The API function behind its function URL: the URL lets through only what its auth type and policies allow
    (both permissions since October 2025); a recorded annotation of an input-bucket image lands where the workflow's
    results do, with its row (WriteGroupTable, invoked by the API's role); an upload, a streamed chat; the key
    checked in API_KEY mode."""
    import boto3

    from shared.models.cache import forget_loaded_models
    from shared.models.sources import forget_model_files
    from tools.rehearsal.iam import statements

    started = time.monotonic()
    forget_loaded_models()  # the API's environment reads its own models, as its role
    forget_model_files()
    function = stack.functions["ApiFunction"]
    client = boto3.client("lambda", region_name=stack.region)
    config = client.get_function_url_config(FunctionName=function.name, Qualifier="live")
    policy = (
        json.loads(client.get_policy(FunctionName=function.name)["Policy"])["Statement"]
        if config["AuthType"] == "NONE"
        else []
    )
    url = FunctionUrl(services, stack, config["FunctionUrl"], config["AuthType"], policy)
    live = f"{function.arn}:live"
    signer = statements(
        "ApiCaller",
        {
            "Statement": [
                {"Effect": "Allow", "Action": ["lambda:InvokeFunctionUrl", "lambda:InvokeFunction"], "Resource": live}
            ]
        },
    )
    url_only = statements(
        "ApiCaller", {"Statement": [{"Effect": "Allow", "Action": "lambda:InvokeFunctionUrl", "Resource": live}]}
    )
    headers: dict[str, str] = {}
    caller: list[Statement] | None = signer
    if config["AuthType"] == "NONE":
        secret = boto3.client("secretsmanager", region_name=stack.region)
        key = secret.get_secret_value(SecretId=stack.outputs["ApiKeySecretArn"])["SecretString"]
        headers, caller = {"Authorization": f"Bearer {key}"}, None
        status, _ = url.call("GET", "/v1/models")
        report.check(status == 401, f"the API in API_KEY mode answered {status} to a call without the key")
    else:
        status, _ = url.call("GET", "/health")
        report.check(status == 403, f"an unsigned call to the AWS_IAM URL got {status}, not 403")
        status, _ = url.call("GET", "/health", caller=url_only)
        report.check(status == 403, f"a caller without lambda:InvokeFunction got {status} from the URL, not 403")
    image = f"s3://{stack.outputs['InputBucketName']}/incoming/cat.jpg"
    asked = {"prompt": "cat.", "caption": False, "record": True, "image": image}
    status, body = url.call("POST", "/v1/annotations", json=asked, headers=headers, caller=caller)
    answer = json.loads(body) if status == 200 else {}
    report.check(
        status == 200 and answer.get("status") == "succeeded", f"the API's recorded annotation: {status} {body[:300]!r}"
    )
    if answer:
        bucket, key = answer["result_uri"].removeprefix("s3://").split("/", 1)
        report.check(bucket == stack.outputs["ResultsBucketName"], f"the recorded result went to {bucket}")
        boto3.client("s3", region_name=stack.region).head_object(Bucket=bucket, Key=key)
    gone = asked | {"image": f"s3://{stack.outputs['InputBucketName']}/incoming/deleted.jpg", "record": False}
    status, body = url.call("POST", "/v1/annotations", json=gone, headers=headers, caller=caller)
    report.check(status == 400 and b"does not exist" in body, f"the API on a missing image: {status} {body[:300]!r}")
    upload = {"image": ("coffee.webp", (SAMPLES / "coffee.webp").read_bytes(), "image/webp")}
    status, body = url.call(
        "POST",
        "/v1/annotations",
        files=upload,
        data={"request": '{"prompt": "cup.", "picture": true}'},
        headers=headers,
        caller=caller,
    )
    report.check(status == 200 and b'"picture_base64":"' in body, f"the API's upload: {status} {body[:300]!r}")
    _answers_fit_the_url(url, stack, headers, caller, report)
    chat = {"messages": [{"role": "user", "content": "Name a cat."}], "max_tokens": 8, "stream": True}
    status, body = url.call("POST", "/v1/chat/completions", json=chat, headers=headers, caller=caller)
    report.check(
        status == 200 and body.rstrip().endswith(b"data: [DONE]"), f"the API's streamed chat: {status} {body[:300]!r}"
    )
    status, _ = url.call("POST", "/v1/images/generations", json={"prompt": "a cat"}, headers=headers, caller=caller)
    report.check(status == 501, f"the Lambda API has no image model, yet answered {status}")
    report.step(
        f"the API answered through its {config['AuthType']} function URL: a recorded annotation, an upload, a chat",
        started,
    )


def _answers_fit_the_url(
    url: FunctionUrl, stack: DeployedStack, headers: dict[str, str], caller: list[Statement] | None, report: Report
) -> None:
    """Lambda's 6 MB each way (aws_behaviours): a 12-megapixel photo's annotated picture comes back whole, within it
    (a JPEG); a body over the app's bound gets the app's 413 in OpenAI's shape, one over Lambda's the URL's own."""
    import io

    import boto3
    from PIL import Image

    photo = Image.open(SAMPLES / "chelsea-the-cat.jpg").convert("RGB").resize((4000, 3000))
    encoded = io.BytesIO()
    photo.save(encoded, format="JPEG", quality=95)
    bucket = stack.outputs["InputBucketName"]
    boto3.client("s3", region_name=stack.region).put_object(
        Bucket=bucket, Key="incoming/large.jpg", Body=encoded.getvalue()
    )
    asked = {"prompt": "cat.", "caption": False, "picture": True, "image": f"s3://{bucket}/incoming/large.jpg"}
    status, body = url.call("POST", "/v1/annotations", json=asked, headers=headers, caller=caller)
    scale = json.loads(body).get("picture_scale") if status == 200 else None
    report.check(status == 200 and scale == 1.0, f"a 4000x3000 photo's picture: {status} {body[:300]!r}")
    for size, expected in ((4_600_000, b'"body_too_large"'), (7_000_000, b"Request must be smaller")):
        upload = {"image": ("big.png", b"\x89PNG" + bytes(size), "image/png")}
        status, body = url.call("POST", "/v1/annotations", files=upload, headers=headers, caller=caller)
        report.check(status == 413 and expected in body, f"a {size:,}-byte upload: {status} {body[:200]!r}")
