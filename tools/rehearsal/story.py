"""The rehearsal: deploy template.yaml on moto and play the user's story through the deployed resources.

    python -m tools.rehearsal            # make rehearse: both configurations, a report, exit 1 on a failure

Everything comes from the deployed stack: names from its outputs, each function's handler, environment,
memory, timeout and role from Lambda, the workflow as CloudFormation substituted it. Every AWS request a
deployed principal makes is checked against that principal's deployed policies.

The story is one sequence, told in order (``_story`` is its table of contents), each act reading what the ones
before deployed and sent; the acts are in tools/rehearsal/acts/.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from unittest import mock

from shared.settings import Profile, Settings
from tools.rehearsal.acts.api import the_api_answers_through_its_url
from tools.rehearsal.acts.drops import dropped_images_are_annotated, dropped_images_are_gathered
from tools.rehearsal.acts.ended import a_stopped_execution_ends_as_failure_rows
from tools.rehearsal.acts.messages import (
    a_bulk_message_is_annotated,
    a_prompt_message_is_annotated,
    refused_messages_reach_the_dead_letter_queue,
)
from tools.rehearsal.acts.missing import missing_objects_read_as_missing
from tools.rehearsal.acts.results import results_where_athena_reads_them
from tools.rehearsal.aws_behaviours import (
    PublishFailed,
    missing_keys_answer_403,
    publish_versions,
    versions_replaced,
)
from tools.rehearsal.aws_requests import RequestLog, record_requests
from tools.rehearsal.iam import evaluate
from tools.rehearsal.operable import check_operable
from tools.rehearsal.report import Report
from tools.rehearsal.stack import ACCOUNT, MOTO_CONFIG, DeployedStack, Deployment, deploy, policies, redeploy

REGION = "eu-central-1"  # anything but us-east-1, boto3's and many tools' silent default


def default_deployments() -> list[tuple[Deployment, bool]]:
    """The two configurations: `sam deploy` with only the required answers (variants off, no VPC, pictures drawn
    when looked at), and with everything on: variants, the bulk lane, the API and pictures stored (the rehearsal
    makes the VPC the user would name)."""
    everything = {"EnableVariants": "true", "EnableBulk": "true", "EnableApi": "true", "ApiAuth": "API_KEY"}
    everything |= {"HandBackWaitSeconds": "1"}  # its prompt message's group is handed back once: wait a second
    everything |= {"MaxWaitMinutes": "15"}  # its dropped images are gathered
    everything |= {"StorePictures": "true"}  # WriteResult, the bulk task and the API store pictures, on their roles
    return [
        (Deployment("annotate-rehearsal", REGION), False),
        (Deployment("annotate-variants", REGION, everything), True),
    ]


def _network(region: str) -> dict[str, str]:
    """Private subnets, each with its own route table, as a user without public subnets names them: the tasks get
    no public address, and the stack adds its S3 gateway endpoint to those route tables."""
    import boto3

    ec2 = boto3.client("ec2", region_name=region)
    vpc = ec2.create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
    subnets, route_tables = [], []
    for i, zone in enumerate("ab"):
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.8.{i}.0/24", AvailabilityZone=f"{region}{zone}")
        subnets.append(subnet["Subnet"]["SubnetId"])
        route_tables.append(ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"])
        ec2.associate_route_table(RouteTableId=route_tables[-1], SubnetId=subnets[-1])
    return {
        "VpcId": vpc,
        "SubnetA": subnets[0],
        "SubnetB": subnets[1],
        "TaskPublicIp": "DISABLED",
        "S3GatewayRouteTables": ",".join(route_tables),
    }


def rehearse(deployment: Deployment, with_variants: bool, settings: Settings | None = None) -> Report:
    """Deploy and play the story on a fresh moto; the report says what happened and what failed."""
    from moto import mock_aws

    from shared.pipeline import gathering, ingest
    from shared.storage import objects as storage

    # The user's shell is set for the stack's region (README: export AWS_REGION), as `sam deploy` was, and so
    # are Lambda's and ECS's environments. EMF metrics would go to stdout here, not to CloudWatch. moto decodes
    # the aws-chunked bodies of botocore's default upload checksums at about 15 MB/s, far too slow for the
    # 0.85 GB diffusion model: checksums only where an API requires them.
    region = {
        "AWS_REGION": deployment.region,
        "AWS_DEFAULT_REGION": deployment.region,
        "POWERTOOLS_METRICS_DISABLED": "true",
        "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    }
    with (
        mock_aws(config=MOTO_CONFIG),
        mock.patch.dict(os.environ, region),
        record_requests(deployment.region, ACCOUNT) as log,
    ):
        storage.refresh_clients()  # clients made before the call log would go unrecorded
        ingest.refresh_clients()
        gathering.deployed_gatherer.cache_clear()
        if with_variants:
            deployment = replace(deployment, parameters=deployment.parameters | _network(deployment.region))
        report = Report(deployment)
        started = time.monotonic()
        stack = deploy(deployment)
        report.completed, report.not_rehearsed = stack.completed, stack.not_rehearsed
        report.step(f"deployed: {len(stack.resources)} resources, {len(stack.functions)} functions", started)
        settings = settings or Settings(profile=Profile.TINY)
        if _published(stack, report, settings):
            check_operable(stack, report)
            _story(stack, report, with_variants, settings, log)
        report.requests = list(log.requests)
        report.failures += log.problems
        _check_iam(stack, report)
    storage.refresh_clients()
    ingest.refresh_clients()
    gathering.deployed_gatherer.cache_clear()
    return report


def _published(stack: DeployedStack, report: Report, settings: Settings, only: list[str] | None = None) -> bool:
    """CloudFormation publishes each SnapStart function's version while it creates the stack (``only`` those an
    update replaces), and Lambda runs the function's init for its snapshot then (aws_behaviours): a failure there
    fails the deployment."""
    from tools.rehearsal.services import settings_of

    started = time.monotonic()
    try:
        published = publish_versions(stack, lambda function: settings_of(function.environment), only)
    except PublishFailed as error:
        report.failures.append(f"the deployment failed: {error}")
        return False
    if published:
        report.step(f"SnapStart versions published, their init run: {', '.join(published)}", started)
    return True


def _check_iam(stack: DeployedStack, report: Report) -> None:
    report.policies = {principal: policies(stack, arn) for principal, arn in stack.principals.items()}
    used: set[str] = set()
    for call in report.requests:
        principal_statements = report.policies.get(call.request.principal)
        if principal_statements is None:
            report.failures.append(f"{call.request.principal} has no role in the stack: {call.request}")
            continue
        decision = evaluate(principal_statements, call.request)
        used |= {f"{call.request.principal}: {s.name}" for s in decision.allowed_by}
        report.check(decision.allowed, f"DENIED {call.request}")
        # Same account: the identity policy allows, and the bucket's policy may still deny.
        bucket_denies = evaluate(stack.bucket_policy(call.request.resource), call.request).denied_by
        report.check(not bucket_denies, f"DENIED by {[s.name for s in bucket_denies]}: {call.request}")
    declared = {f"{p}: {s.name}" for p, found in report.policies.items() for s in found if s.effect == "Allow"}
    # AWS-managed policies are shared wholesale; only the template's own statements should all be needed.
    report.unused_statements = sorted(s for s in declared - used if ":iam::aws:policy/" not in s)


def _story(stack: DeployedStack, report: Report, with_variants: bool, settings: Settings, log: RequestLog) -> None:
    from tools.rehearsal.services import InProcessServices

    _push_models(stack, report, with_variants, settings)
    if stack.deployment.redeploy_with:
        before = stack.deployment.parameters
        stack = redeploy(stack)
        overrides = ", ".join(f"{k}={v}" for k, v in stack.deployment.redeploy_with.items())
        try:
            replaced = versions_replaced(stack.template, before, stack.deployment.parameters)
        except PublishFailed as error:
            report.failures.append(f"the update failed: {error}")
            return
        report.steps.append(f"deployed again with {overrides}")
        if not _published(stack, report, settings, replaced):
            return
    services = InProcessServices(stack, log)
    batches = 0
    with services.serving(), missing_keys_answer_403(stack, log):
        if "GatherFunction" in stack.functions:
            dropped = dropped_images_are_gathered(services, stack, report)
        else:
            dropped = dropped_images_are_annotated(services, stack, report)
        if dropped and a_prompt_message_is_annotated(services, stack, report, with_variants):
            batches = 2
            if "BulkJobDefinition" in stack.resources and a_bulk_message_is_annotated(services, stack, report):
                batches = 3
            refused_messages_reach_the_dead_letter_queue(services, stack, report)
    if dropped:
        results_where_athena_reads_them(stack, report, dropped, batches, with_variants=with_variants)
    with services.serving(), missing_keys_answer_403(stack, log):  # after the rows are counted: it writes one
        missing_objects_read_as_missing(services, stack, report)
        if dropped:
            a_stopped_execution_ends_as_failure_rows(services, stack, report)
        if "ApiFunction" in stack.functions:
            the_api_answers_through_its_url(services, stack, report)
    report.failures += services.problems


def _push_models(stack: DeployedStack, report: Report, with_variants: bool, settings: Settings) -> None:
    import boto3

    from tools.models.push import push_models, stack_model_uris

    started = time.monotonic()
    cloudformation = boto3.client("cloudformation", region_name=stack.region)
    pushed = push_models(settings, stack_model_uris(stack.deployment.stack_name, cloudformation))
    expected = {"DetectorModelUri", "ClassifierModelUri", "TaggerModelUri", "SegmenterModelUri", "CaptionModelUri"}
    expected |= {"VariantsModelUri"} if with_variants else set()
    report.check({p.output for p in pushed} == expected, f"models push missed outputs: {[p.output for p in pushed]}")
    report.step(
        "models pushed where the outputs say: " + ", ".join(f"{p.output} ({p.files} files)" for p in pushed), started
    )


def main() -> int:
    from shared.observability import logger

    logger.setLevel("WARNING")  # the handlers' logs would bury the report
    reports = [rehearse(deployment, variants) for deployment, variants in default_deployments()]
    for report in reports:
        print(report.render(), end="\n\n")
    return 0 if all(r.ok for r in reports) else 1
