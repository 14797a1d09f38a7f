"""Stand-ins for what moto's CloudFormation does not create or completes only in part (as of moto 5.2.5).

Each is made through its service's own API from the transformed template and put in moto's resource map, so that
Ref and GetAtt resolve as CloudFormation resolves them: Glue and Athena resources, bucket and queue policies, alarms,
Lambda aliases, function URLs and the permissions naming an alias, a bucket's properties beyond encryption, a role's
managed policies, a task definition whole, a cluster's capacity providers, versions' ARNs, and generated secrets
(through a model taught to moto). Whatever none of these creates is listed as not rehearsed.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tools.rehearsal.iam import Statement, statements

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


def condition_holds(resource: dict[str, Any], resource_map: Any) -> bool:
    return "Condition" not in resource or bool(resource_map.lazy_condition_map[resource["Condition"]])


@dataclass
class Completion:
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


@functools.cache
def teach_moto_generated_secrets() -> None:
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


def without_what_moto_cannot_create(template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
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
