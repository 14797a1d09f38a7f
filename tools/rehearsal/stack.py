"""Deploy template.yaml on moto as `sam deploy` would: SAM transform, package, CloudFormation create_stack.

What moto's CloudFormation does not create is created from the transformed template through each service's own API
(tools/rehearsal/stand_ins.py); whatever none of those creates is listed as not rehearsed. The state machine
is created in moto's Step Functions interpreter with its definition substituted from the stack's resources,
which moto's CloudFormation does not do.
"""

from __future__ import annotations

import ast
import copy
import io
import json
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from tools.aws.sam_template import TEMPLATE_PATH
from tools.local.runner import MOTO_CONFIG as LOCAL_MOTO_CONFIG
from tools.local.workflow import for_moto, substitute, without_function_timeouts
from tools.rehearsal.iam import Statement, statements
from tools.rehearsal.stand_ins import (
    Clients,
    Completion,
    condition_holds,
    teach_moto_generated_secrets,
    without_what_moto_cannot_create,
)

if TYPE_CHECKING:
    from tools.aws.moto_internals import DefaultConfig

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"  # moto's
ARTIFACTS_BUCKET = "rehearsal-sam-artifacts"  # the bucket `sam deploy --resolve-s3` would make
# The local runner's moto, with AWS's managed policies, which SAM attaches to the functions' roles.
MOTO_CONFIG: DefaultConfig = {**LOCAL_MOTO_CONFIG, "iam": {"load_aws_managed_policies": True}}


@dataclass(frozen=True)
class Deployment:
    """What a user passes to `sam deploy`: a stack name, a region, parameter overrides (and the template); and the
    overrides of a second `sam deploy` after `annotate models push`, if any (the README's order for SnapStart)."""

    stack_name: str
    region: str
    parameters: dict[str, str] = field(default_factory=dict)
    template_file: Path = TEMPLATE_PATH
    redeploy_with: dict[str, str] = field(default_factory=dict)


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
    state_machine: str  # its logical id
    state_machine_arn: str
    state_machine_role_arn: str
    completed: list[str]  # created through service APIs, not by moto's CloudFormation
    not_rehearsed: list[str]
    bucket_policies: dict[str, list[Statement]]  # bucket name -> its policy's statements

    def bucket_policy(self, resource_arn: str) -> list[Statement]:
        """The statements of the policy of the bucket ``resource_arn`` (a bucket's or an object's) is in."""
        if not resource_arn.startswith("arn:aws:s3:::"):
            return []
        return self.bucket_policies.get(resource_arn.removeprefix("arn:aws:s3:::").split("/", 1)[0], [])

    @property
    def region(self) -> str:
        return self.deployment.region

    def function_by_arn(self, arn: str) -> DeployedFunction:
        name = arn.split(":function:", 1)[-1].split(":", 1)[0]
        [function] = [f for f in self.functions.values() if f.name == name]
        return function

    @property
    def principals(self) -> dict[str, str]:
        """Who acts, by template name, and the role it acts as: the functions, the state machine, and every other
        role of the stack (the Variants task's) under its own name."""
        found = {f.logical_id: f.role_arn for f in self.functions.values()}
        found[self.state_machine] = self.state_machine_role_arn
        for logical_id, resource in self.template["Resources"].items():
            arn = f"arn:aws:iam::{ACCOUNT}:role/{self.resources.get(logical_id)}"
            if resource["Type"] == "AWS::IAM::Role" and logical_id in self.resources and arn not in found.values():
                found[logical_id] = arn
        return found

    def logical_id_of_role(self, role_arn: str) -> str:
        name = role_arn.rsplit("/", 1)[-1]
        [logical_id] = [
            logical_id
            for logical_id, physical in self.resources.items()
            if physical == name and self.template["Resources"][logical_id]["Type"] == "AWS::IAM::Role"
        ]
        return logical_id


def _zip_folder(folder: Path | None) -> bytes:
    """The folder's files in a zip archive (None: an empty archive)."""
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts] if folder else []
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(path, path.relative_to(folder or path))
    return buffer.getvalue()


def package(
    template: dict[str, Any], deployment: Deployment, s3: Any
) -> tuple[dict[str, Any], dict[str, FunctionCode]]:
    """What `sam package` does: local code and definitions uploaded to S3.

    Layers are built by `make sam-build` (their recipes compile native code); here each is an empty zip, since
    the rehearsal runs the functions with this environment's packages.
    """
    packaged = copy.deepcopy(template)
    s3.create_bucket(Bucket=ARTIFACTS_BUCKET, CreateBucketConfiguration={"LocationConstraint": deployment.region})
    code: dict[str, FunctionCode] = {}

    def upload(key: str, body: bytes) -> str:
        s3.put_object(Bucket=ARTIFACTS_BUCKET, Key=key, Body=body)
        return f"s3://{ARTIFACTS_BUCKET}/{key}"

    for logical_id, resource in packaged["Resources"].items():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::Serverless::Function":
            folder = REPO / properties["CodeUri"]
            code[logical_id] = FunctionCode(folder, properties["Handler"])
            properties["CodeUri"] = upload(f"{logical_id}.zip", _zip_folder(folder))
        elif resource["Type"] == "AWS::Serverless::LayerVersion":
            properties["ContentUri"] = upload(f"{logical_id}.zip", _zip_folder(None))
        elif resource["Type"] == "AWS::Serverless::StateMachine":
            properties["DefinitionUri"] = upload(
                f"{logical_id}.asl.json", (REPO / properties["DefinitionUri"]).read_bytes()
            )
    return packaged, code


def transform(packaged: dict[str, Any], deployment: Deployment, iam: Any) -> dict[str, Any]:
    """The SAM transform, as the SAM CLI runs it: defaults and pseudo parameters filled in from the region."""
    import boto3
    from samtranslator.parser.parser import Parser
    from samtranslator.public.translator import ManagedPolicyLoader
    from samtranslator.sdk.parameter import SamParameterValues
    from samtranslator.translator.translator import Translator

    session = boto3.session.Session(region_name=deployment.region)
    values = SamParameterValues(deployment.parameters)
    values.add_default_parameter_values(packaged)
    values.add_pseudo_parameter_values(session)
    translator = Translator(None, Parser(), boto_session=session)
    managed = ManagedPolicyLoader(iam)  # SAM's own: AWS's managed policies by name, from the account's IAM
    return translator.translate(  # type: ignore[no-any-return]
        copy.deepcopy(packaged), parameter_values=values.parameter_values, get_managed_policy_map=managed.load
    )


@contextmanager
def _novalue_removes_list_items() -> Iterator[None]:
    """CloudFormation drops a list item that is AWS::NoValue (``!If [cond, item, !Ref AWS::NoValue]``);
    moto 5.2.5 keeps it as null, which would put a null statement into a role's policy."""
    from tools.aws.moto_internals import cfn_parsing as parsing

    original = parsing.clean_json

    def clean_json(resource_json: Any, resources_map: Any) -> Any:
        if isinstance(resource_json, list):
            cleaned = (clean_json(item, resources_map) for item in resource_json)
            return [item for item in cleaned if item is not None]
        return original(resource_json, resources_map)

    with mock.patch.object(parsing, "clean_json", clean_json):
        yield


@contextmanager
def _find_in_map_by_the_parameter_s_text() -> Iterator[None]:
    """CloudFormation passes every parameter as a string, so ``!FindInMap [Map, !Ref BulkCpu, ...]`` looks up the key
    "2048"; moto 5.2.5 resolves a Number parameter's Ref to the number it parsed, which no key of a mapping equals."""
    from tools.aws.moto_internals import cfn_parsing as parsing

    original = parsing.clean_json

    def clean_json(resource_json: Any, resources_map: Any) -> Any:
        if isinstance(resource_json, dict) and "Fn::FindInMap" in resource_json:
            name, *path = resource_json["Fn::FindInMap"]
            found = resources_map[name]
            for key in path:
                found = found[str(clean_json(key, resources_map))]
            return found
        return original(resource_json, resources_map)

    with mock.patch.object(parsing, "clean_json", clean_json):
        yield


@contextmanager
def _layer_versions_ref_to_their_arn() -> Iterator[None]:
    """CloudFormation's Ref of an AWS::Lambda::LayerVersion, or an AWS::Lambda::Version, is its ARN; moto 5.2.5
    answers the object itself, which an Fn::Split of it (Detect's version description, the API's) cannot take."""
    from tools.aws.moto_internals import LambdaVersion, LayerVersion
    from tools.aws.moto_internals import lambda_backend as get_backend

    def create_version(
        cls: type[LambdaVersion], name: str, template: dict[str, Any], account_id: str, region_name: str, **_: Any
    ) -> LambdaVersion:
        function = get_backend(account_id, region_name).publish_version(template["Properties"]["FunctionName"])
        made = LambdaVersion({"Version": function.version})  # type: ignore[abstract, union-attr]
        made.arn = function.function_arn  # type: ignore[attr-defined, union-attr]  # the version's, qualified
        return made

    with (
        mock.patch.object(LayerVersion, "physical_resource_id", property(lambda layer: layer.arn), create=True),
        mock.patch.object(LambdaVersion, "create_from_cloudformation_json", classmethod(create_version)),
        mock.patch.object(LambdaVersion, "physical_resource_id", property(lambda version: version.arn), create=True),
    ):
        yield


@contextmanager
def _batch_uses_its_service_linked_role() -> Iterator[None]:
    """A compute environment without a ServiceRole: "If ... you don't specify a service role, AWS Batch uses the
    service-linked role for AWS Batch", which it creates itself (AWS Batch User Guide, "Using service-linked roles
    for AWS Batch"). moto 5.2.5's CloudFormation requires the property: the role is made as Batch would make it, and
    named."""
    from tools.aws.moto_internals import BatchComputeEnvironment

    create = BatchComputeEnvironment.create_from_cloudformation_json

    def with_the_linked_role(
        cls: type[BatchComputeEnvironment],
        name: str,
        template: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> BatchComputeEnvironment:
        import boto3

        iam = boto3.client("iam", region_name=region_name)
        linked = iam.list_roles(PathPrefix="/aws-service-role/batch.amazonaws.com/")["Roles"]
        role = linked[0]["Arn"] if linked else None
        role = role or iam.create_service_linked_role(AWSServiceName="batch.amazonaws.com")["Role"]["Arn"]
        template = {**template, "Properties": {"ServiceRole": role, **template["Properties"]}}
        return create.__func__(cls, name, template, account_id, region_name, **kwargs)  # type: ignore[attr-defined, no-any-return]

    with mock.patch.object(
        BatchComputeEnvironment, "create_from_cloudformation_json", classmethod(with_the_linked_role)
    ):
        yield


def _document(document: str | dict[str, Any]) -> dict[str, Any]:
    if not isinstance(document, str):
        return document
    try:
        return dict(json.loads(document))
    except ValueError:  # moto 5.2.5 answers a role policy its CloudFormation made with the dict's Python repr
        return dict(ast.literal_eval(document))


def _policies_of(iam: Any, role_arn: str) -> list[Statement]:
    role = role_arn.rsplit("/", 1)[-1]
    found = []
    for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
        document = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
        found += statements(name, _document(document))
    for attached in iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"]:
        version = iam.get_policy(PolicyArn=attached["PolicyArn"])["Policy"]["DefaultVersionId"]
        document = iam.get_policy_version(PolicyArn=attached["PolicyArn"], VersionId=version)["PolicyVersion"]
        found += statements(attached["PolicyArn"], _document(document["Document"]))
    return found


def policies(stack: DeployedStack, role_arn: str) -> list[Statement]:
    """Every statement of the role's deployed policies: inline ones and the managed ones attached."""
    import boto3

    return _policies_of(boto3.client("iam", region_name=stack.region), role_arn)


def _functions(code: dict[str, FunctionCode], created: dict[str, str], clients: Clients) -> dict[str, DeployedFunction]:
    """Each deployed function as Lambda describes it."""
    functions = {}
    for logical_id, folder_code in code.items():
        if logical_id not in created:
            continue
        configuration = clients("lambda").get_function_configuration(FunctionName=created[logical_id])
        functions[logical_id] = DeployedFunction(
            logical_id=logical_id,
            name=configuration["FunctionName"],
            arn=configuration["FunctionArn"],
            code=folder_code,
            # Lambda keeps strings; moto keeps a Number parameter's !Ref as the number it parsed.
            environment={k: str(v) for k, v in configuration.get("Environment", {}).get("Variables", {}).items()},
            memory_mb=configuration["MemorySize"],
            timeout_s=configuration["Timeout"],
            role_arn=configuration["Role"],
        )
    return functions


def deploy(deployment: Deployment) -> DeployedStack:
    """Create the stack inside an active ``mock_aws`` (with the Step Functions interpreter on)."""
    import boto3
    from samtranslator.yaml_helper import yaml_parse

    from tools.aws.moto_internals import cloudformation_backends  # the SAM CLI's reader: !GetAtt A.B becomes [A, B]

    def clients(service: str) -> Any:
        return boto3.client(service, region_name=deployment.region)

    packaged, code = package(yaml_parse(deployment.template_file.read_text()), deployment, clients("s3"))
    template = transform(packaged, deployment, clients("iam"))
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] == "AWS::ECR::Repository" and "RepositoryName" not in resource.get("Properties", {}):
            # moto 5.2.5 generates a mixed-case name for an unnamed repository, then rejects it; CloudFormation
            # generates a valid lowercase one. Name it as CloudFormation would.
            name = f"{deployment.stack_name}-{logical_id}".lower()
            resource.setdefault("Properties", {})["RepositoryName"] = name
    cloudformation = clients("cloudformation")
    teach_moto_generated_secrets()
    for_moto, late_outputs = without_what_moto_cannot_create(template)
    with (
        _novalue_removes_list_items(),
        _find_in_map_by_the_parameter_s_text(),
        _layer_versions_ref_to_their_arn(),
        _batch_uses_its_service_linked_role(),
    ):
        stack_id = cloudformation.create_stack(
            StackName=deployment.stack_name,
            TemplateBody=json.dumps(for_moto),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in deployment.parameters.items()],
            Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
        )["StackId"]
        resource_map = cloudformation_backends[ACCOUNT][deployment.region].get_stack(stack_id).resource_map
        created = {
            r["LogicalResourceId"]: r["PhysicalResourceId"]
            for r in cloudformation.list_stack_resources(StackName=stack_id)["StackResourceSummaries"]
        }
        completion = Completion(resource_map, clients, deployment.stack_name, created)
        completion.complete({k: r for k, r in template["Resources"].items() if condition_holds(r, resource_map)})
        machine, machine_arn, role_arn = _create_state_machine(template, resource_map, created, clients)
        [described] = cloudformation.describe_stacks(StackName=stack_id)["Stacks"]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
        outputs |= {
            key: str(completion.resolve(output["Value"]))
            for key, output in late_outputs.items()
            if "Condition" not in output or resource_map.lazy_condition_map[output["Condition"]]
        }
    return DeployedStack(
        deployment=deployment,
        template=template,
        outputs=outputs,
        resources=created,
        functions=_functions(code, created, clients),
        state_machine=machine,
        state_machine_arn=machine_arn,
        state_machine_role_arn=role_arn,
        completed=completion.completed,
        not_rehearsed=completion.not_rehearsed,
        bucket_policies=completion.bucket_policies,
    )


def redeploy(stack: DeployedStack) -> DeployedStack:
    """The second `sam deploy` (``redeploy_with``): a parameter change, which CloudFormation applies to each function
    whose environment the template derives from it (UpdateFunctionConfiguration) and to the state machine's
    substitutions (UpdateStateMachine: with SnapStart, the functions' aliases)."""
    import boto3

    from tools.aws.moto_internals import cloudformation_backends
    from tools.aws.sam_template import by_default

    deployment = replace(stack.deployment, parameters=stack.deployment.parameters | stack.deployment.redeploy_with)

    def clients(service: str) -> Any:
        return boto3.client(service, region_name=stack.region)

    [described] = clients("cloudformation").describe_stacks(StackName=deployment.stack_name)["Stacks"]
    resource_map = cloudformation_backends[ACCOUNT][stack.region].get_stack(described["StackId"]).resource_map
    _, definition, _ = _machine_definition(stack.template, resource_map, clients, deployment.parameters)
    clients("stepfunctions").update_state_machine(stateMachineArn=stack.state_machine_arn, definition=definition)
    client = clients("lambda")
    functions = {}
    for logical_id, function in stack.functions.items():
        variables = stack.template["Resources"][logical_id]["Properties"].get("Environment", {}).get("Variables", {})
        resolved = by_default(stack.template, variables, deployment.parameters)
        environment = function.environment | {k: str(v) for k, v in resolved.items() if isinstance(v, str | int)}
        if environment != function.environment:
            client.update_function_configuration(FunctionName=function.name, Environment={"Variables": environment})
        functions[logical_id] = replace(function, environment=environment)
    return replace(stack, deployment=deployment, functions=functions)


def _machine_definition(
    template: dict[str, Any], resource_map: Any, clients: Clients, parameters: dict[str, str] | None = None
) -> tuple[str, str, dict[str, Any]]:
    """The state machine's logical id, its definition as the interpreter runs it, substituted as CloudFormation
    would from DefinitionSubstitutions resolved against the stack's resources (its conditions with ``parameters``,
    when given: an update's), and its resolved properties."""
    from tools.aws.moto_internals import cfn_parsing
    from tools.aws.sam_template import by_default

    [(logical_id, resource)] = [
        (k, r) for k, r in template["Resources"].items() if r["Type"] == "AWS::StepFunctions::StateMachine"
    ]
    declared = by_default(template, resource["Properties"], parameters) if parameters else resource["Properties"]
    properties = cfn_parsing.clean_json(declared, resource_map)
    location = properties["DefinitionS3Location"]
    definition = clients("s3").get_object(Bucket=location["Bucket"], Key=location["Key"])["Body"].read().decode()
    substituted = substitute({k: str(v) for k, v in properties["DefinitionSubstitutions"].items()}, definition)
    # Invocations take turns here (one settings override per process), so a Task would wait for its function on
    # the state's clock: each invocation is held to its function's deployed timeout from its start instead
    # (services.py), which the workflow's TimeoutSeconds equal (a test holds them).
    return logical_id, without_function_timeouts(for_moto(substituted)), properties


def _create_state_machine(
    template: dict[str, Any], resource_map: Any, created: dict[str, str], clients: Clients
) -> tuple[str, str, str]:
    """The deployed machine, in moto's interpreter (moto's CloudFormation does not substitute its definition)."""
    logical_id, definition, properties = _machine_definition(template, resource_map, clients)
    name = created[logical_id].rsplit(":", 1)[-1]
    arn = clients("stepfunctions").create_state_machine(
        name=name,
        definition=definition,
        roleArn=properties["RoleArn"],
        type=properties.get("StateMachineType", "STANDARD"),
    )["stateMachineArn"]
    if arn != created[logical_id]:
        raise RuntimeError(f"the interpreter's machine {arn} is not the stack's {created[logical_id]}")
    return logical_id, arn, properties["RoleArn"]
