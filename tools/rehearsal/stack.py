"""Deploy template.yaml on moto as `sam deploy` would: SAM transform, package, CloudFormation create_stack.

What moto's CloudFormation does not create (as of moto 5.2.5: Glue and Athena resources, bucket and queue
policies, alarms, Lambda aliases, and the bucket properties beyond encryption) is created from the transformed
template through each service's own API; whatever neither creates is listed as not rehearsed. The state machine
is created in moto's Step Functions interpreter with its definition substituted from the stack's resources,
which moto's CloudFormation does not do.
"""

from __future__ import annotations

import copy
import io
import json
import re
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from shared.sam_template import TEMPLATE_PATH
from shared.workflow import substitute
from tools.rehearsal.iam import Statement, statements

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"  # moto's
ARTIFACTS_BUCKET = "rehearsal-sam-artifacts"  # the bucket `sam deploy --resolve-s3` would make
IMAGE_REPOSITORY = "annotate-functions"  # the repository `sam deploy --resolve-image-repos` would make


@dataclass(frozen=True)
class Deployment:
    """What a user passes to `sam deploy`: a stack name, a region and parameter overrides."""

    stack_name: str
    region: str
    parameters: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FunctionCode:
    """Where a function's handler lives in this repository (what `sam build` would package)."""

    folder: Path  # functions/<name>/
    handler: str  # module.function inside the folder, "app.handler"

    @property
    def module(self) -> str:
        return ".".join([*self.folder.relative_to(REPO).parts, self.handler.rsplit(".", 1)[0]])

    @property
    def function(self) -> str:
        return self.handler.rsplit(".", 1)[1]


@dataclass(frozen=True)
class DeployedFunction:
    logical_id: str
    name: str
    arn: str
    code: FunctionCode
    environment: dict[str, str]
    memory_mb: int
    timeout_s: int
    role_arn: str


@dataclass
class DeployedStack:
    deployment: Deployment
    template: dict[str, Any]  # the transformed template, as CloudFormation received it
    outputs: dict[str, str]
    resources: dict[str, str]  # logical id -> physical id, of everything that exists
    functions: dict[str, DeployedFunction]  # by logical id
    state_machine_arn: str
    state_machine_role_arn: str
    completed: list[str]  # created through service APIs, not by moto's CloudFormation
    not_rehearsed: list[str]

    @property
    def region(self) -> str:
        return self.deployment.region

    def function_by_arn(self, arn: str) -> DeployedFunction:
        name = arn.split(":function:", 1)[-1].split(":", 1)[0]
        [function] = [f for f in self.functions.values() if f.name == name]
        return function

    def logical_id_of_role(self, role_arn: str) -> str:
        name = role_arn.rsplit("/", 1)[-1]
        [logical_id] = [
            logical_id
            for logical_id, physical in self.resources.items()
            if physical == name and self.template["Resources"][logical_id]["Type"] == "AWS::IAM::Role"
        ]
        return logical_id


def _zip_folder(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(folder))
    return buffer.getvalue()


def _dockerfile_handler(dockerfile: Path) -> str:
    match = re.search(r'^CMD \["([\w.]+)"\]', dockerfile.read_text(), re.MULTILINE)
    if not match:
        raise ValueError(f"{dockerfile} has no CMD [\"module.function\"]")
    return match.group(1)


def package(template: dict[str, Any], deployment: Deployment, s3: Any) -> tuple[dict[str, Any], dict[str, FunctionCode]]:
    """What `sam package` does: local code and definitions uploaded to S3, image functions given their image URI.

    Layers are built by `make sam-build` (their recipes compile native code); here each layer is a zip of its
    recipe folder, since the rehearsal runs the functions with this environment's packages.
    """
    packaged = copy.deepcopy(template)
    s3.create_bucket(Bucket=ARTIFACTS_BUCKET, CreateBucketConfiguration={"LocationConstraint": deployment.region})
    code: dict[str, FunctionCode] = {}

    def upload(key: str, body: bytes) -> str:
        s3.put_object(Bucket=ARTIFACTS_BUCKET, Key=key, Body=body)
        return f"s3://{ARTIFACTS_BUCKET}/{key}"

    for logical_id, resource in packaged["Resources"].items():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::Serverless::Function" and properties.get("PackageType") == "Image":
            metadata = resource["Metadata"]
            folder = REPO / "functions" / metadata["DockerBuildArgs"]["FUNCTION"]
            code[logical_id] = FunctionCode(folder, _dockerfile_handler(REPO / metadata["Dockerfile"]))
            registry = f"{ACCOUNT}.dkr.ecr.{deployment.region}.amazonaws.com"
            properties["ImageUri"] = f"{registry}/{IMAGE_REPOSITORY}:{metadata['DockerTag']}"
        elif resource["Type"] == "AWS::Serverless::Function":
            folder = REPO / properties["CodeUri"]
            code[logical_id] = FunctionCode(folder, properties["Handler"])
            properties["CodeUri"] = upload(f"{logical_id}.zip", _zip_folder(folder))
        elif resource["Type"] == "AWS::Serverless::LayerVersion":
            recipes = [p for p in (REPO / "layers").iterdir() if p.name.replace("-", "") + "layer" == logical_id.lower()]
            properties["ContentUri"] = upload(f"{logical_id}.zip", _zip_folder(recipes[0]) if recipes else b"")
        elif resource["Type"] == "AWS::Serverless::StateMachine":
            properties["DefinitionUri"] = upload(f"{logical_id}.asl.json", (REPO / properties["DefinitionUri"]).read_bytes())
    return packaged, code


class _ManagedPolicies:
    """SAM's managed-policy loader, answered by the (moto) account's IAM like `sam deploy` answers it."""

    def __init__(self, iam: Any) -> None:
        self._iam = iam

    def load(self) -> dict[str, str]:
        pages = self._iam.get_paginator("list_policies").paginate(Scope="AWS")
        return {p["PolicyName"]: p["Arn"] for page in pages for p in page["Policies"]}


def transform(packaged: dict[str, Any], deployment: Deployment, iam: Any) -> dict[str, Any]:
    """The SAM transform, as the SAM CLI runs it: defaults and pseudo parameters filled in from the region."""
    import boto3
    from samtranslator.parser.parser import Parser
    from samtranslator.sdk.parameter import SamParameterValues
    from samtranslator.translator.translator import Translator

    session = boto3.session.Session(region_name=deployment.region)
    values = SamParameterValues(deployment.parameters)
    values.add_default_parameter_values(packaged)
    values.add_pseudo_parameter_values(session)
    translator = Translator(None, Parser(), boto_session=session)
    managed = _ManagedPolicies(iam)
    return translator.translate(  # type: ignore[no-any-return]
        copy.deepcopy(packaged), parameter_values=values.parameter_values, get_managed_policy_map=managed.load
    )


@contextmanager
def _novalue_removes_list_items() -> Iterator[None]:
    """CloudFormation drops a list item that is AWS::NoValue (``!If [cond, item, !Ref AWS::NoValue]``);
    moto 5.2.5 keeps it as null, which would put a null statement into a role's policy."""
    from moto.cloudformation import parsing

    original = parsing.clean_json

    def clean_json(resource_json: Any, resources_map: Any) -> Any:
        if isinstance(resource_json, list):
            cleaned = (clean_json(item, resources_map) for item in resource_json)
            return [item for item in cleaned if item is not None]
        return original(resource_json, resources_map)

    with mock.patch.object(parsing, "clean_json", clean_json):
        yield


@dataclass(frozen=True)
class _Rehearsed:
    """A resource created through its service's API, standing in moto's resource map so references resolve."""

    physical_resource_id: str
    attributes: dict[str, str] = field(default_factory=dict)

    def get_cfn_attribute(self, name: str) -> str:
        return self.attributes[name]


def _lifecycle_rule(rule: dict[str, Any]) -> dict[str, Any]:
    api: dict[str, Any] = {"ID": rule["Id"], "Status": rule["Status"], "Filter": {"Prefix": rule.get("Prefix", "")}}
    if "ExpirationInDays" in rule:
        api["Expiration"] = {"Days": int(rule["ExpirationInDays"])}
    if "NoncurrentVersionExpiration" in rule:
        api["NoncurrentVersionExpiration"] = {
            "NoncurrentDays": int(rule["NoncurrentVersionExpiration"]["NoncurrentDays"])
        }
    if "AbortIncompleteMultipartUpload" in rule:
        days = int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])
        api["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": days}
    return api


def _complete_bucket(clients: Callable[[str], Any], bucket: str, properties: dict[str, Any]) -> list[str]:
    """The bucket properties moto's CloudFormation ignores, set through the S3 API; returns their names."""
    s3 = clients("s3")
    done = []
    if "VersioningConfiguration" in properties:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration=properties["VersioningConfiguration"])
        done.append("VersioningConfiguration")
    if "PublicAccessBlockConfiguration" in properties:
        s3.put_public_access_block(
            Bucket=bucket, PublicAccessBlockConfiguration=properties["PublicAccessBlockConfiguration"]
        )
        done.append("PublicAccessBlockConfiguration")
    if "OwnershipControls" in properties:
        s3.put_bucket_ownership_controls(Bucket=bucket, OwnershipControls=properties["OwnershipControls"])
        done.append("OwnershipControls")
    if "LifecycleConfiguration" in properties:
        rules = [_lifecycle_rule(rule) for rule in properties["LifecycleConfiguration"]["Rules"]]
        s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})
        done.append("LifecycleConfiguration")
    if properties.get("NotificationConfiguration", {}).get("EventBridgeConfiguration", {}).get("EventBridgeEnabled"):
        s3.put_bucket_notification_configuration(
            Bucket=bucket, NotificationConfiguration={"EventBridgeConfiguration": {}}
        )
        done.append("NotificationConfiguration.EventBridgeConfiguration")
    return done


def _create_unsupported(
    logical_id: str, resource_type: str, properties: dict[str, Any], stack_name: str, clients: Callable[[str], Any]
) -> _Rehearsed | None:
    """Create one resource moto's CloudFormation skips, through its service's API; None: no way here."""
    if resource_type == "AWS::S3::BucketPolicy":
        clients("s3").put_bucket_policy(Bucket=properties["Bucket"], Policy=json.dumps(properties["PolicyDocument"]))
        return _Rehearsed(properties["Bucket"])
    if resource_type == "AWS::SQS::QueuePolicy":
        for url in properties["Queues"]:
            clients("sqs").set_queue_attributes(
                QueueUrl=url, Attributes={"Policy": json.dumps(properties["PolicyDocument"])}
            )
        return _Rehearsed(logical_id)
    if resource_type == "AWS::Glue::Database":
        clients("glue").create_database(DatabaseInput=properties["DatabaseInput"])
        return _Rehearsed(properties["DatabaseInput"]["Name"])
    if resource_type == "AWS::Glue::Table":
        clients("glue").create_table(DatabaseName=properties["DatabaseName"], TableInput=properties["TableInput"])
        return _Rehearsed(properties["TableInput"]["Name"])
    if resource_type == "AWS::Athena::WorkGroup":
        configuration = copy.deepcopy(properties["WorkGroupConfiguration"])
        configuration["BytesScannedCutoffPerQuery"] = int(configuration["BytesScannedCutoffPerQuery"])
        clients("athena").create_work_group(
            Name=properties["Name"], Description=properties.get("Description", ""), Configuration=configuration
        )
        return _Rehearsed(properties["Name"])
    if resource_type == "AWS::Athena::NamedQuery":
        query_id = clients("athena").create_named_query(
            **{key: properties[key] for key in ("Name", "Description", "Database", "QueryString", "WorkGroup")}
        )["NamedQueryId"]
        return _Rehearsed(query_id)
    if resource_type == "AWS::CloudWatch::Alarm":
        name = f"{stack_name}-{logical_id}"
        alarm = {key: value for key, value in properties.items() if key != "AlarmName"}
        for key in ("Period", "EvaluationPeriods"):
            if key in alarm:
                alarm[key] = int(alarm[key])
        alarm["Threshold"] = float(alarm["Threshold"])
        for metric in alarm.get("Metrics", []):
            if "MetricStat" in metric:
                metric["MetricStat"]["Period"] = int(metric["MetricStat"]["Period"])
        clients("cloudwatch").put_metric_alarm(AlarmName=name, **alarm)
        return _Rehearsed(name)
    if resource_type == "AWS::Lambda::Alias":
        alias = clients("lambda").create_alias(
            FunctionName=properties["FunctionName"], Name=properties["Name"], FunctionVersion=str(properties["FunctionVersion"])
        )
        return _Rehearsed(alias["AliasArn"])
    return None


def _condition_holds(resource: dict[str, Any], resource_map: Any) -> bool:
    return "Condition" not in resource or bool(resource_map.lazy_condition_map[resource["Condition"]])


def _policies_of(iam: Any, role_arn: str) -> list[Statement]:
    role = role_arn.rsplit("/", 1)[-1]
    found = []
    for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
        found += statements(name, iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"])
    for attached in iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"]:
        version = iam.get_policy(PolicyArn=attached["PolicyArn"])["Policy"]["DefaultVersionId"]
        document = iam.get_policy_version(PolicyArn=attached["PolicyArn"], VersionId=version)["PolicyVersion"]
        found += statements(attached["PolicyArn"], document["Document"])
    return found


def policies(stack: DeployedStack, role_arn: str) -> list[Statement]:
    """Every statement of the role's deployed policies: inline ones and the managed ones attached."""
    import boto3

    return _policies_of(boto3.client("iam", region_name=stack.region), role_arn)


def deploy(deployment: Deployment) -> DeployedStack:
    """Create the stack inside an active ``mock_aws`` (with the Step Functions interpreter on)."""
    import boto3
    from moto.cloudformation.models import cloudformation_backends
    from moto.cloudformation.parsing import clean_json

    def clients(service: str) -> Any:
        return boto3.client(service, region_name=deployment.region)

    from samtranslator.yaml_helper import yaml_parse  # the SAM CLI's reader: !GetAtt A.B becomes [A, B]

    sam = yaml_parse(TEMPLATE_PATH.read_text())
    packaged, code = package(sam, deployment, clients("s3"))
    template = transform(packaged, deployment, clients("iam"))
    with _novalue_removes_list_items():
        stack_id = clients("cloudformation").create_stack(
            StackName=deployment.stack_name,
            TemplateBody=json.dumps(template),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in deployment.parameters.items()],
            Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
        )["StackId"]
        resource_map = cloudformation_backends[ACCOUNT][deployment.region].get_stack(stack_id).resource_map
        created = {
            r["LogicalResourceId"]: r["PhysicalResourceId"]
            for r in clients("cloudformation").list_stack_resources(StackName=stack_id)["StackResourceSummaries"]
        }
        completed, not_rehearsed = [], []
        resources = {k: r for k, r in template["Resources"].items() if _condition_holds(r, resource_map)}
        for logical_id, resource in resources.items():
            if resource["Type"] == "AWS::Lambda::Version" and logical_id in created:
                # moto publishes the version but answers neither Ref (its ARN) nor GetAtt Version.
                function = clean_json(resource["Properties"]["FunctionName"], resource_map)
                version = resource_map[logical_id].version
                arn = clients("lambda").get_function_configuration(FunctionName=function)["FunctionArn"]
                resource_map._parsed_resources[logical_id] = _Rehearsed(f"{arn}:{version}", {"Version": str(version)})
                created[logical_id] = f"{arn}:{version}"
        for logical_id, resource in resources.items():
            if resource["Type"] == "AWS::S3::Bucket" and logical_id in created:
                done = _complete_bucket(clients, created[logical_id], clean_json(resource["Properties"], resource_map))
                completed += [f"{logical_id} ({resource['Type']}): {name}" for name in done]
        # Dependencies first: aliases after versions, tables after their database, queries after their workgroup.
        order = ["AWS::Lambda::Alias", "AWS::Glue::Database", "AWS::Glue::Table", "AWS::Athena::WorkGroup"]
        missing = sorted(
            (k for k in resources if k not in created),
            key=lambda k: order.index(resources[k]["Type"]) if resources[k]["Type"] in order else len(order),
        )
        for logical_id in missing:
            resource = resources[logical_id]
            properties = clean_json(resource.get("Properties", {}), resource_map)
            made = _create_unsupported(logical_id, resource["Type"], properties, deployment.stack_name, clients)
            if made is None:
                not_rehearsed.append(f"{logical_id} ({resource['Type']})")
                continue
            resource_map._parsed_resources[logical_id] = made
            created[logical_id] = made.physical_resource_id
            completed.append(f"{logical_id} ({resource['Type']})")
        machine_arn, role_arn = _create_state_machine(template, resource_map, created, clients)
        outputs = {
            o["OutputKey"]: o["OutputValue"]
            for o in clients("cloudformation").describe_stacks(StackName=stack_id)["Stacks"][0].get("Outputs", [])
        }
    lambda_client = clients("lambda")
    functions = {}
    for logical_id, folder_code in code.items():
        if logical_id not in created:
            continue
        configuration = lambda_client.get_function_configuration(FunctionName=created[logical_id])
        functions[logical_id] = DeployedFunction(
            logical_id=logical_id,
            name=configuration["FunctionName"],
            arn=configuration["FunctionArn"],
            code=folder_code,
            environment=configuration.get("Environment", {}).get("Variables", {}),
            memory_mb=configuration["MemorySize"],
            timeout_s=configuration["Timeout"],
            role_arn=configuration["Role"],
        )
    return DeployedStack(
        deployment=deployment,
        template=template,
        outputs=outputs,
        resources=created,
        functions=functions,
        state_machine_arn=machine_arn,
        state_machine_role_arn=role_arn,
        completed=completed,
        not_rehearsed=not_rehearsed,
    )


def _create_state_machine(
    template: dict[str, Any], resource_map: Any, created: dict[str, str], clients: Callable[[str], Any]
) -> tuple[str, str]:
    """The deployed machine, in moto's interpreter: its definition from the artifacts bucket, substituted as
    CloudFormation would from DefinitionSubstitutions resolved against the stack's resources."""
    from moto.cloudformation.parsing import clean_json

    [(logical_id, resource)] = [
        (k, r) for k, r in template["Resources"].items() if r["Type"] == "AWS::StepFunctions::StateMachine"
    ]
    properties = clean_json(resource["Properties"], resource_map)
    location = properties["DefinitionS3Location"]
    definition = clients("s3").get_object(Bucket=location["Bucket"], Key=location["Key"])["Body"].read().decode()
    substituted = substitute({k: str(v) for k, v in properties["DefinitionSubstitutions"].items()}, definition)
    name = created[logical_id].rsplit(":", 1)[-1]
    arn = clients("stepfunctions").create_state_machine(
        name=name, definition=substituted, roleArn=properties["RoleArn"], type=properties.get("StateMachineType", "STANDARD")
    )["stateMachineArn"]
    if arn != created[logical_id]:
        raise RuntimeError(f"the interpreter's machine {arn} is not the stack's {created[logical_id]}")
    return arn, properties["RoleArn"]
