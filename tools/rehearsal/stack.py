"""Deploy template.yaml on moto as `sam deploy` would: SAM transform, package, CloudFormation create_stack.

What moto's CloudFormation does not create (as of moto 5.2.5: Glue and Athena resources, bucket and queue
policies, alarms, Lambda aliases, function URLs and the permissions naming an alias, and the bucket properties beyond
encryption) is created from the transformed template through each service's own API, and generated secrets through
a model taught to it; whatever none of these creates is listed as not rehearsed. The state machine
is created in moto's Step Functions interpreter with its definition substituted from the stack's resources,
which moto's CloudFormation does not do.

One piece: packaging, the transform, what moto leaves out and the state machine are one deploy, made in
CloudFormation's order from one transformed template.
"""

from __future__ import annotations

import ast
import copy
import functools
import io
import json
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from tools.aws.sam_template import TEMPLATE_PATH
from tools.local.runner import MOTO_CONFIG as LOCAL_MOTO_CONFIG
from tools.local.workflow import for_moto, substitute, without_function_timeouts
from tools.rehearsal.iam import Statement, statements

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


Clients = Callable[[str], Any]  # service name -> a boto3 client in the stack's region


def _camel_case(value: Any) -> Any:
    """CloudFormation's property names (RuntimePlatform) as the ECS API spells them (runtimePlatform)."""
    if isinstance(value, dict):
        return {key[:1].lower() + key[1:]: _camel_case(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_camel_case(item) for item in value]
    return value


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
    if rule.get("ExpiredObjectDeleteMarker"):
        api["Expiration"] = {"ExpiredObjectDeleteMarker": True}
    if "NoncurrentVersionExpiration" in rule:
        api["NoncurrentVersionExpiration"] = {
            "NoncurrentDays": int(rule["NoncurrentVersionExpiration"]["NoncurrentDays"])
        }
    if "AbortIncompleteMultipartUpload" in rule:
        days = int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])
        api["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": days}
    return api


def _complete_bucket(clients: Clients, bucket: str, properties: dict[str, Any]) -> list[str]:
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


def _bucket_policy(logical_id: str, properties: dict[str, Any], stack_name: str, clients: Clients) -> _Rehearsed:
    # Not put into moto: its S3 applies a Deny whatever the statement's Condition says, so the TLS-only policy
    # would refuse every request. The rehearsal evaluates it itself (DeployedStack.bucket_policies).
    return _Rehearsed(properties["Bucket"])


def _queue_policy(logical_id: str, properties: dict[str, Any], stack_name: str, clients: Clients) -> _Rehearsed:
    for url in properties["Queues"]:
        clients("sqs").set_queue_attributes(
            QueueUrl=url, Attributes={"Policy": json.dumps(properties["PolicyDocument"])}
        )
    return _Rehearsed(logical_id)


def _glue_database(logical_id: str, properties: dict[str, Any], stack_name: str, clients: Clients) -> _Rehearsed:
    clients("glue").create_database(DatabaseInput=properties["DatabaseInput"])
    return _Rehearsed(properties["DatabaseInput"]["Name"])


def _glue_table(logical_id: str, properties: dict[str, Any], stack_name: str, clients: Clients) -> _Rehearsed:
    clients("glue").create_table(DatabaseName=properties["DatabaseName"], TableInput=properties["TableInput"])
    return _Rehearsed(properties["TableInput"]["Name"])


def _workgroup(logical_id: str, properties: dict[str, Any], stack_name: str, clients: Clients) -> _Rehearsed:
    configuration = copy.deepcopy(properties["WorkGroupConfiguration"])
    configuration["BytesScannedCutoffPerQuery"] = int(configuration["BytesScannedCutoffPerQuery"])
    clients("athena").create_work_group(
        Name=properties["Name"], Description=properties.get("Description", ""), Configuration=configuration
    )
    return _Rehearsed(properties["Name"])


def _named_query(logical_id: str, properties: dict[str, Any], stack_name: str, clients: Clients) -> _Rehearsed:
    fields = {key: properties[key] for key in ("Name", "Description", "Database", "QueryString", "WorkGroup")}
    return _Rehearsed(clients("athena").create_named_query(**fields)["NamedQueryId"])


def _alarm(logical_id: str, properties: dict[str, Any], stack_name: str, clients: Clients) -> _Rehearsed:
    name = f"{stack_name}-{logical_id}"  # CloudFormation's own naming when AlarmName is not given
    alarm = copy.deepcopy(properties) | {"Threshold": float(properties["Threshold"])}
    for key in ("Period", "EvaluationPeriods"):
        if key in alarm:
            alarm[key] = int(alarm[key])
    for metric in alarm.get("Metrics", []):
        if "MetricStat" in metric:
            metric["MetricStat"]["Period"] = int(metric["MetricStat"]["Period"])
    clients("cloudwatch").put_metric_alarm(AlarmName=name, **alarm)
    return _Rehearsed(name)


def _alias(logical_id: str, properties: dict[str, Any], stack_name: str, clients: Clients) -> _Rehearsed:
    alias = clients("lambda").create_alias(
        FunctionName=properties["FunctionName"],
        Name=properties["Name"],
        FunctionVersion=str(properties["FunctionVersion"]),
    )
    return _Rehearsed(alias["AliasArn"])


def _function_url(logical_id: str, properties: dict[str, Any], stack_name: str, clients: Clients) -> _Rehearsed:
    name, _, qualifier = properties["TargetFunctionArn"].split(":function:", 1)[-1].partition(":")
    url = clients("lambda").create_function_url_config(
        FunctionName=name,
        Qualifier=qualifier,
        AuthType=properties["AuthType"],
        InvokeMode=properties.get("InvokeMode", "BUFFERED"),
    )
    return _Rehearsed(url["FunctionArn"], {"FunctionUrl": url["FunctionUrl"]})


def _permission(logical_id: str, properties: dict[str, Any], stack_name: str, clients: Clients) -> _Rehearsed:
    name, _, qualifier = properties["FunctionName"].split(":function:", 1)[-1].partition(":")
    named = ("FunctionUrlAuthType", "InvokedViaFunctionUrl", "SourceArn")  # the last: a schedule's rule
    extra = {k: properties[k] for k in named if k in properties}
    if qualifier:  # an alias's; a schedule's permission names the function itself
        extra["Qualifier"] = qualifier
    clients("lambda").add_permission(
        FunctionName=name,
        StatementId=logical_id,
        Action=properties["Action"],
        Principal=properties["Principal"],
        # CloudFormation takes the template's boolean as written, true or "true"
        **{k: (str(v).lower() == "true" if k == "InvokedViaFunctionUrl" else v) for k, v in extra.items()},
    )
    return _Rehearsed(logical_id)


# What moto's CloudFormation skips, created through each service's API, dependencies first: aliases after
# versions (which moto makes), tables after their database, queries after their workgroup.
_CREATORS: dict[str, Callable[[str, dict[str, Any], str, Clients], _Rehearsed]] = {
    "AWS::Lambda::Alias": _alias,
    "AWS::Lambda::Url": _function_url,
    "AWS::Lambda::Permission": _permission,
    "AWS::Glue::Database": _glue_database,
    "AWS::Glue::Table": _glue_table,
    "AWS::Athena::WorkGroup": _workgroup,
    "AWS::Athena::NamedQuery": _named_query,
    "AWS::S3::BucketPolicy": _bucket_policy,
    "AWS::SQS::QueuePolicy": _queue_policy,
    "AWS::CloudWatch::Alarm": _alarm,
}


def _condition_holds(resource: dict[str, Any], resource_map: Any) -> bool:
    return "Condition" not in resource or bool(resource_map.lazy_condition_map[resource["Condition"]])


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


@dataclass
class _Completion:
    """The stack as moto's CloudFormation left it, completed through the services' own APIs."""

    resource_map: Any  # moto's, so that Ref and GetAtt resolve as CloudFormation resolves them
    clients: Clients
    stack_name: str
    created: dict[str, str]  # logical id -> physical id
    completed: list[str] = field(default_factory=list)
    not_rehearsed: list[str] = field(default_factory=list)
    bucket_policies: dict[str, list[Statement]] = field(default_factory=dict)

    def resolve(self, value: Any) -> Any:
        from tools.aws.moto_internals import cfn_parsing

        return cfn_parsing.clean_json(value, self.resource_map)

    def _stand_in(self, logical_id: str, made: _Rehearsed) -> None:
        self.resource_map._parsed_resources[logical_id] = made
        self.created[logical_id] = made.physical_resource_id

    def version(self, logical_id: str, resource: dict[str, Any]) -> None:
        """moto publishes a version but answers neither its Ref (the version's ARN) nor GetAtt Version."""
        version = str(self.resource_map[logical_id].version)
        function = self.resolve(resource["Properties"]["FunctionName"])
        arn = self.clients("lambda").get_function_configuration(FunctionName=function)["FunctionArn"]
        self._stand_in(logical_id, _Rehearsed(f"{arn}:{version}", {"Version": version}))

    def role(self, logical_id: str, resource: dict[str, Any]) -> None:
        """moto's CloudFormation does not attach a role's ManagedPolicyArns (SAM's basic execution, X-Ray, SQS)."""
        for arn in self.resolve(resource["Properties"].get("ManagedPolicyArns", [])):
            self.clients("iam").attach_role_policy(RoleName=self.created[logical_id], PolicyArn=arn)
            self.completed.append(f"{logical_id} (AWS::IAM::Role): ManagedPolicyArns {arn.rsplit('/', 1)[-1]}")

    def bucket(self, logical_id: str, resource: dict[str, Any]) -> None:
        done = _complete_bucket(self.clients, self.created[logical_id], self.resolve(resource["Properties"]))
        self.completed += [f"{logical_id} (AWS::S3::Bucket): {name}" for name in done]

    def task_definition(self, logical_id: str, resource: dict[str, Any]) -> None:
        """moto's CloudFormation keeps only the containers and memory of a task definition (no roles, network mode,
        CPU or platform): register it again, whole, through the ECS API, as the revision the stack names."""
        ecs = self.clients("ecs")
        family = ecs.describe_task_definition(taskDefinition=self.created[logical_id])["taskDefinition"]["family"]
        properties = _camel_case(self.resolve(resource["Properties"]))
        properties |= {"cpu": str(properties["cpu"]), "memory": str(properties["memory"]), "family": family}
        for container in properties[
            "containerDefinitions"
        ]:  # a Ref to a Number parameter is a string in CloudFormation
            for variable in container.get("environment", []):
                variable["value"] = str(variable["value"])
        ecs.deregister_task_definition(taskDefinition=self.created[logical_id])
        arn = ecs.register_task_definition(**properties)["taskDefinition"]["taskDefinitionArn"]
        self._stand_in(logical_id, _Rehearsed(arn))
        self.completed.append(f"{logical_id} (AWS::ECS::TaskDefinition): registered whole through the ECS API")

    def cluster(self, logical_id: str, resource: dict[str, Any]) -> None:
        """moto's CloudFormation ignores a cluster's CapacityProviders: associate them through the ECS API, so that
        a RunTask's capacity provider strategy is checked against what the stack deploys."""
        providers = self.resolve(resource["Properties"].get("CapacityProviders", []))
        if providers:
            self.clients("ecs").put_cluster_capacity_providers(
                cluster=self.created[logical_id], capacityProviders=providers, defaultCapacityProviderStrategy=[]
            )
            self.completed.append(f"{logical_id} (AWS::ECS::Cluster): CapacityProviders {', '.join(providers)}")

    def skipped(self, logical_id: str, resource: dict[str, Any]) -> None:
        kind = resource["Type"]
        if kind not in _CREATORS:
            self.not_rehearsed.append(f"{logical_id} ({kind})")
            return
        properties = self.resolve(resource.get("Properties", {}))
        self._stand_in(logical_id, _CREATORS[kind](logical_id, properties, self.stack_name, self.clients))
        if kind == "AWS::S3::BucketPolicy":
            self.bucket_policies[properties["Bucket"]] = statements(logical_id, properties["PolicyDocument"])
            self.completed.append(f"{logical_id} ({kind}): evaluated by the rehearsal, not by moto")
        else:
            self.completed.append(f"{logical_id} ({kind})")

    def complete(self, resources: dict[str, dict[str, Any]]) -> None:
        fixes = {
            "AWS::Lambda::Version": self.version,
            "AWS::IAM::Role": self.role,
            "AWS::S3::Bucket": self.bucket,
            "AWS::ECS::TaskDefinition": self.task_definition,
            "AWS::ECS::Cluster": self.cluster,
        }
        for logical_id, resource in resources.items():
            if logical_id in self.created and resource["Type"] in fixes:
                fixes[resource["Type"]](logical_id, resource)
        order = list(_CREATORS)
        skipped = [k for k in resources if k not in self.created]
        for logical_id in sorted(skipped, key=lambda k: order.index(t) if (t := resources[k]["Type"]) in order else 99):
            self.skipped(logical_id, resources[logical_id])


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


@functools.cache
def _teach_moto_generated_secrets() -> None:
    """moto 5.2.5's CloudFormation does not create AWS::SecretsManager::Secret: this model makes one, with a value
    generated as GenerateSecretString asks, in moto's Secrets Manager, so that Ref and the functions' environments
    and policies name it as CloudFormation would."""
    import secrets

    from tools.aws.moto_internals import CloudFormationModel, secretsmanager_backends
    from tools.aws.moto_internals import cfn_parsing as parsing

    class GeneratedSecret(CloudFormationModel):
        def __init__(self, arn: str) -> None:
            self.arn = arn

        @property
        def physical_resource_id(self) -> str:
            return self.arn

        @staticmethod
        def cloudformation_name_type() -> str:
            return "Name"

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::SecretsManager::Secret"

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **_: Any
        ) -> GeneratedSecret:
            length = int(cloudformation_json["Properties"].get("GenerateSecretString", {}).get("PasswordLength", 32))
            made = secretsmanager_backends[account_id][region_name].create_secret(
                name=resource_name,
                secret_string=secrets.token_urlsafe(length)[:length],
                secret_binary=None,
                description=None,
                tags=None,
                kms_key_id=None,
                client_request_token=None,
                replica_regions=[],
                force_overwrite=False,
            )
            return cls(json.loads(made)["ARN"])

    for cached in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cached.cache_clear()


def _without_what_moto_cannot_create(template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The template for moto's CloudFormation, and the outputs it would fail on (an attribute of a resource it does
    not know, such as a function URL's), resolved once the rehearsal has created those resources. Lambda permissions
    wait too: moto's would look for the alias they name, which it does not create."""
    kinds = ("AWS::Lambda::Url", "AWS::Lambda::Permission")
    late = {k for k, r in template["Resources"].items() if r["Type"] in kinds}
    outputs = template.get("Outputs", {})
    late_outputs = {k: o for k, o in outputs.items() if any(f'"{name}"' in json.dumps(o["Value"]) for name in late)}
    for_moto = {
        **template,
        "Resources": {k: r for k, r in template["Resources"].items() if r["Type"] != "AWS::Lambda::Permission"},
        "Outputs": {k: o for k, o in outputs.items() if k not in late_outputs},
    }
    return for_moto, late_outputs


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
    _teach_moto_generated_secrets()
    for_moto, late_outputs = _without_what_moto_cannot_create(template)
    with _novalue_removes_list_items(), _layer_versions_ref_to_their_arn():
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
        completion = _Completion(resource_map, clients, deployment.stack_name, created)
        completion.complete({k: r for k, r in template["Resources"].items() if _condition_holds(r, resource_map)})
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
