"""template.yaml: least privilege, Glue tables that read what the code writes, named queries that run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import sqlglot

from shared.storage import layout
from shared.storage.tables import QUERIED_SCHEMAS, SCHEMAS
from tests.conftest import REPO
from tests.unit.test_workflow_definition import template
from tools.aws.sam_template import layer_ids
from tools.local.workflow import DEFINITION_PATH
from tools.results.query import IMAGES_LATEST_SQL, duckdb_of_athena, glue_type, images_latest_view, run_local_query

TEMPLATE_TEXT = (REPO / "template.yaml").read_text()
RESOURCES = template()["Resources"]


def _when_deployed(item: Any) -> Any:
    """A conditional item (!If [condition, item, !Ref AWS::NoValue]) as it is when its condition holds."""
    return item["Fn::If"][1] if isinstance(item, dict) and "Fn::If" in item else item


def statements(resource: dict[str, Any]) -> list[dict[str, Any]]:
    properties = resource.get("Properties", {})
    policies = [_when_deployed(p) for p in properties.get("Policies", []) if isinstance(p, dict)]
    documents = [p.get("PolicyDocument", p) for p in policies if "Statement" in p.get("PolicyDocument", p)]
    if "PolicyDocument" in properties:
        documents.append(properties["PolicyDocument"])
    return [_when_deployed(statement) for document in documents for statement in document["Statement"]]


# Wildcards that still name their resource: objects under a named bucket's prefix (or of a named suffix there),
# streams of a named log group.
NAMED_WILDCARD = re.compile(r"(Arn\}/|s3:::\$\{[^}]+\}/).*\*[\w.-]*$|\.Arn\}:\*$")


def test_every_wildcard_in_a_policy_is_justified_by_a_comment_on_its_line() -> None:
    wildcard_lines = [
        line.strip()
        for line in TEMPLATE_TEXT.splitlines()
        if re.match(r"\s*(- )?(Action|Resource|Principal):.*\*", line) and not NAMED_WILDCARD.search(line.strip())
    ]
    assert len(wildcard_lines) >= 5, "the TLS-only Deny statements use s3:*, so the check must see them"
    unjustified = [line for line in wildcard_lines if "#" not in line]
    assert unjustified == []


def test_allow_statements_name_actions_and_never_a_bare_wildcard_action() -> None:
    for name, resource in RESOURCES.items():
        for statement in statements(resource):
            if statement["Effect"] != "Allow":
                continue
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            assert all("*" not in action for action in actions), f"{name}: {actions}"


def test_every_function_has_its_own_role_from_its_own_policies() -> None:
    functions = {n: r for n, r in RESOURCES.items() if r["Type"] == "AWS::Serverless::Function"}
    deployed = {
        r["Properties"].get("CodeUri", "").strip("/").removeprefix("functions/")
        or r["Metadata"]["DockerBuildArgs"]["FUNCTION"]
        for r in functions.values()
    }
    assert deployed == {p.name for p in (REPO / "functions").iterdir() if (p / "app.py").is_file()}
    for name, function in functions.items():
        assert "Role" not in function["Properties"], f"{name} shares a role"
        assert function["Properties"].get("Policies"), f"{name} has no policies"


def test_buckets_are_encrypted_private_and_tls_only() -> None:
    buckets = [n for n, r in RESOURCES.items() if r["Type"] == "AWS::S3::Bucket"]
    policies = {r["Properties"]["Bucket"]["Ref"] for r in RESOURCES.values() if r["Type"] == "AWS::S3::BucketPolicy"}
    assert sorted(buckets) == ["InputBucket", "ModelsBucket", "ResultsBucket"]
    for name in buckets:
        properties = RESOURCES[name]["Properties"]
        assert properties["BucketEncryption"] and all(properties["PublicAccessBlockConfiguration"].values())
    assert policies == set(buckets)


def test_queues_are_encrypted_and_have_dead_letter_queues() -> None:
    queues = {n: r["Properties"] for n, r in RESOURCES.items() if r["Type"] == "AWS::SQS::Queue"}
    for name, properties in queues.items():
        assert properties["SqsManagedSseEnabled"] is True, name
        if not name.endswith("DeadLetterQueue"):
            assert properties["RedrivePolicy"]["maxReceiveCount"] >= 1


@pytest.mark.parametrize("table", ["images", "detections", "embeddings", "box_embeddings", "masks", "evaluations"])
def test_glue_columns_equal_the_parquet_schema_the_code_writes(table: str) -> None:
    [glue] = [
        r
        for r in RESOURCES.values()
        if r["Type"] == "AWS::Glue::Table" and r["Properties"]["TableInput"]["Name"] == table
    ]
    table_input = glue["Properties"]["TableInput"]
    columns = [(c["Name"], c["Type"]) for c in table_input["StorageDescriptor"]["Columns"]]
    assert columns == [(field.name, glue_type(field.type)) for field in QUERIED_SCHEMAS[table]]
    assert table_input["PartitionKeys"] == [{"Name": "dt", "Type": "string"}]
    assert f"/{layout.TABLES}/{table}/dt=" in TEMPLATE_TEXT


def test_the_iam_prefixes_are_the_ones_the_code_writes_under() -> None:
    for prefix in (layout.RESULTS, layout.PICTURES, layout.TABLES, layout.MANIFESTS, layout.BATCHES):
        assert f"${{ResultsBucket.Arn}}/{prefix}/*" in TEMPLATE_TEXT


def test_the_pictures_and_a_batch_s_records_expire_and_the_documents_and_tables_do_not() -> None:
    rules = RESOURCES["ResultsBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    expiring = {rule["Prefix"]: rule for rule in rules if "ExpirationInDays" in rule}
    records = {f"{layout.MANIFESTS}/", "map-runs/", f"{layout.BATCHES}/"}
    assert set(expiring) == {f"{layout.PICTURES}/", "athena-results/"} | records
    assert expiring[f"{layout.PICTURES}/"]["ExpirationInDays"] == {"Ref": "PictureRetentionDays"}
    # a batch's records outlive it (an execution lasts at most its TimeoutSeconds), and their old versions go too
    days = template()["Parameters"]["RunRecordsRetentionDays"]
    assert days["MinValue"] * 86_400 > json.loads(DEFINITION_PATH.read_text())["TimeoutSeconds"]
    for prefix in records:
        assert expiring[prefix]["ExpirationInDays"] == {"Ref": "RunRecordsRetentionDays"}
        assert expiring[prefix]["NoncurrentVersionExpiration"]["NoncurrentDays"] >= 1
    assert f"{layout.RESULTS}/" not in expiring and f"{layout.TABLES}/" not in expiring


def named_queries() -> dict[str, str]:
    return {
        r["Properties"]["Name"]: r["Properties"]["QueryString"]
        for r in RESOURCES.values()
        if r["Type"] == "AWS::Athena::NamedQuery"
    }


def test_the_named_queries_cover_the_common_questions() -> None:
    assert {"labels-per-day", "images-containing-dog", "breeds-and-colors", "failed-images"} <= set(named_queries())


def test_every_named_query_runs_on_the_local_tables(results_with_rows: Path) -> None:
    for name, athena_sql in named_queries().items():
        sqlglot.parse_one(athena_sql, read="athena")  # Athena's syntax, as written
        rows = run_local_query(duckdb_of_athena(athena_sql), results_with_rows).to_pylist()
        assert rows, f"{name} returned nothing over rows that hold answers"


def test_the_images_latest_view_is_the_sql_and_the_columns_the_local_view_has() -> None:
    [view] = [
        r["Properties"]["TableInput"]
        for r in RESOURCES.values()
        if r["Type"] == "AWS::Glue::Table" and r["Properties"]["TableInput"]["Name"] == "images_latest"
    ]
    _, (prefix, encoded, suffix) = view["ViewOriginalText"]["Fn::Join"]
    assert (prefix, suffix) == ("/* Presto View: ", " */")
    definition = json.loads(encoded["Fn::Base64"]["Fn::Sub"].replace("${AnnotateDatabase}", "annotate_db"))
    assert definition == images_latest_view("annotate_db")
    assert definition["originalSql"] == IMAGES_LATEST_SQL
    hive_columns = [(c["Name"], c["Type"]) for c in view["StorageDescriptor"]["Columns"]]
    assert hive_columns == [(field.name, glue_type(field.type)) for field in SCHEMAS["images"]] + [("dt", "string")]


def test_images_latest_gives_each_source_image_its_newest_row(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from shared.contracts import ImageResult, Status
    from shared.storage.objects import store_for
    from shared.storage.tables import write_table_files

    # GIVEN a source image annotated twice (a failure, then a success a day later) and another once
    first = datetime(2026, 11, 29, tzinfo=UTC)

    def result(source: str, status: Status, at: datetime) -> ImageResult:
        return ImageResult(
            image_id=source[-1] * 16, source_uri=source, batch_id="b-1", status=status, prompt="dog.", processed_at=at
        )

    write_table_files([result("s3://in/a", Status.FAILED, first)], str(tmp_path), "b-1-g-000000", first, store_for)
    later = first + timedelta(days=1)
    rows = [result("s3://in/a", Status.SUCCEEDED, later), result("s3://in/b", Status.FAILED, later)]
    write_table_files(rows, str(tmp_path), "b-2-g-000000", later, store_for)
    # WHEN the view is read, THEN it has one row per source image, the newest
    latest = run_local_query("SELECT source_uri, status FROM images_latest ORDER BY source_uri", tmp_path)
    assert latest.to_pylist() == [
        {"source_uri": "s3://in/a", "status": "succeeded"},
        {"source_uri": "s3://in/b", "status": "failed"},
    ]
    assert run_local_query("SELECT count(*) AS n FROM images", tmp_path).to_pylist() == [{"n": 3}]


# --- Versions and SnapStart ---------------------------------------------------------------------------------------
PARAMETERS = set(template()["Parameters"])
CONDITIONS = template()["Conditions"]
VERSIONED = {
    name: resource["Properties"]
    for name, resource in RESOURCES.items()
    if resource["Type"] == "AWS::Serverless::Function" and "AutoPublishAlias" in resource["Properties"]
}


def _parameters_in(value: Any) -> set[str]:
    """The template parameters ``value`` depends on: Refs, ${Name} in Subs, and those of the conditions it names."""
    if isinstance(value, list):
        return set().union(*(_parameters_in(item) for item in value)) if value else set()
    if isinstance(value, str):
        return set(re.findall(r"\$\{(\w+)\}", value)) & PARAMETERS
    if not isinstance(value, dict):
        return set()
    found = set().union(*(_parameters_in(item) for item in value.values())) if value else set()
    if value.get("Ref") in PARAMETERS:
        found.add(value["Ref"])
    if str(value.get("Ref", "")).endswith(".Version"):  # a function's version: what its own description holds
        found |= _parameters_in(VERSIONED[value["Ref"].removesuffix(".Version")]["VersionDescription"])
    if "Fn::If" in value:
        found |= _parameters_in(CONDITIONS[value["Fn::If"][0]])
    return found


def test_snapstart_is_off_unless_asked_and_then_switches_every_model_function_and_its_preload() -> None:
    assert template()["Parameters"]["EnableSnapStart"]["Default"] == "false"
    model_functions = {"DetectFunction", "ClassifyFunction", "TagFunction", "SegmentFunction", "CaptionFunction"}
    assert set(VERSIONED) == model_functions | {"ApiFunction"}
    for properties in VERSIONED.values():
        assert properties["SnapStart"]["ApplyOn"] == {"Fn::If": ["SnapStartEnabled", "PublishedVersions", "None"]}
    preload = template()["Globals"]["Function"]["Environment"]["Variables"]["ANNOTATE_PRELOAD_MODELS"]
    assert preload == {"Fn::If": ["SnapStartEnabled", "true", "false"]}


def test_a_new_layer_or_parameter_value_publishes_a_new_version_and_the_old_one_is_deleted() -> None:
    # SAM hashes the properties into the version's logical id with parameters unresolved (aws-sam-translator's
    # _construct_version); a changed VersionDescription replaces the version instead. What a version does not hold
    # (reserved concurrency) changes the function in place: no version to publish (tests/rehearsal/test_versions).
    from tools.rehearsal.aws_behaviours import NOT_IN_A_VERSION

    globals_ = template()["Globals"]["Function"]
    for name, properties in VERSIONED.items():
        assert properties["AutoPublishAliasAllProperties"] is True, name
        assert properties["VersionDeletionPolicy"] == "Delete", name
        used = _parameters_in(
            {k: v for k, v in properties.items() if k != "VersionDescription" and k not in NOT_IN_A_VERSION}
        )
        used |= _parameters_in(globals_)
        missing = used - _parameters_in(properties["VersionDescription"])
        assert not missing, f"{name}: a new value of {sorted(missing)} would publish no version"
        for layer in layer_ids(properties["Layers"]):
            assert RESOURCES[layer]["Properties"]["PublishLambdaVersion"] is True, (name, layer)


def _longest(parameter: dict[str, Any]) -> str:
    """The longest value CloudFormation accepts for a parameter that bounds its length."""
    if "AllowedValues" in parameter:
        return max(map(str, parameter["AllowedValues"]), key=len)
    if "MaxValue" in parameter:
        return str(parameter["MaxValue"])
    assert "MaxLength" in parameter, "a parameter in a version's description must bound its length"
    return "x" * int(parameter["MaxLength"])


def _render(value: Any, parameters: dict[str, Any]) -> str:
    """A description as its longest: each parameter at its longest, a function's or layer's version number at six
    digits, the name part of a secret's ARN (its seventh field) as long as the ARN's bound leaves it."""
    if isinstance(value, str):
        return value
    if "Fn::Sub" in value:
        text, names = (value["Fn::Sub"], {}) if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"]
        values = {name: _render(item, parameters) for name, item in names.items()}
        return re.sub(
            r"\$\{(\w+)\}", lambda found: values.get(found.group(1)) or _longest(parameters[found.group(1)]), text
        )
    if "Fn::If" in value:
        return max((_render(item, parameters) for item in value["Fn::If"][1:]), key=len)
    if "Fn::Select" in value:
        index, [separator, source] = value["Fn::Select"][0], value["Fn::Select"][1]["Fn::Split"]
        if index == 7:  # a function's or a layer's version number
            return "999999"
        shortest_arn_prefix = len("arn:aws:secretsmanager:eu-west-1:123456789012:secret:")
        assert index == 6 and separator == ":"
        return "x" * (len(_longest(parameters[source["Ref"]])) - shortest_arn_prefix)
    raise AssertionError(f"not rendered: {value}")


def test_every_version_description_fits_lambdas_256_characters_at_its_parameters_longest() -> None:
    # GIVEN each parameter at the longest value the template accepts (CloudFormation refuses a longer one before
    # anything is created)
    for name, properties in VERSIONED.items():
        # THEN each version's description fits PublishVersion's limit ("Maximum length of 256")
        described = _render(properties["VersionDescription"], template()["Parameters"])
        assert len(described) <= 256, (name, len(described), described)


def test_a_bulk_task_holds_the_workers_measured_peak_with_a_sixth_to_spare() -> None:
    # GIVEN the bulk task's size as deployed, and the worker's peak as annotate bench-bulk measured it (every size
    # of Detect compiled, the longest prompt)
    parameters = template()["Parameters"]
    cpu, memory = int(parameters["BulkCpu"]["Default"]), int(parameters["BulkMemory"]["Default"])
    measured = json.loads((REPO / "bench" / "bulk.json").read_text())
    peak = max(measured["task_peak_rss_mb"], measured["task_peak_rss_models_from_s3_mb"])  # S3's: as deployed
    # THEN the task's memory holds it with a sixth of it to spare, in a size Fargate takes for 2 vCPUs: 4 to 16 GB in
    # 1 GB steps (ECS Developer Guide, "Fargate task CPU and memory")
    assert peak * 7 / 6 <= memory
    assert cpu == 2048 and memory in range(4096, 16385, 1024)


def test_a_bulk_task_compiles_detect_without_the_cache_a_fresh_task_never_reads() -> None:
    from tools.aws.sam_template import bulk_task_settings

    # GIVEN the bulk task definition's environment, read as the settings type it
    task = bulk_task_settings(template())
    # THEN OpenVINO's compiled cache is off (each Fargate task starts on empty ephemeral storage: writing the cache
    # would cost 1.5 s a size and never be read), and the runtimes are the task image's
    assert task["detector_compiled_cache"] is False
    assert task["detector_runtime"] == task["classifier_runtime"] == "openvino"


def test_a_new_accounts_3008_mb_fits_every_function_deployed_as_the_docs_say_and_not_without() -> None:
    from tools.aws.sam_template import deployed_memory_mb, load_template
    from tools.local.chaos_faults import SMALL_MEMORY_PARAMETERS, Faults

    template = load_template()
    assert max(deployed_memory_mb(template, SMALL_MEMORY_PARAMETERS).values()) <= 3008
    assert deployed_memory_mb(template)["DetectFunction"] > 3008  # the default asks more
    assert "ApiFunction" not in deployed_memory_mb(template)  # EnableApi=false by default
    # annotate chaos names what does not fit a smaller quota
    assert "DetectFunction 3,008 MB" in Faults(function_memory_mb=2048).functions_over_memory()


# Fargate's task sizes for Linux (ECS developer guide, "Task CPU and memory"): vCPU units -> memory in MB
FARGATE_SIZES = {
    1024: range(2048, 8192 + 1, 1024),
    2048: range(4096, 16384 + 1, 1024),
    4096: range(8192, 30720 + 1, 1024),
    8192: range(16384, 61440 + 1, 4096),
    16384: range(32768, 122880 + 1, 8192),
}


def _rule_holds(expression: Any, parameters: dict[str, str]) -> Any:
    """A CloudFormation rule's value for these parameters (the functions the template's rules use)."""
    if isinstance(expression, list):
        return [_rule_holds(item, parameters) for item in expression]
    if not isinstance(expression, dict):
        return expression
    [(function, argument)] = expression.items()
    if function == "Ref":
        return parameters[argument]
    values = _rule_holds(argument, parameters)
    return {
        "Fn::Or": lambda: any(values),
        "Fn::And": lambda: all(values),
        "Fn::Not": lambda: not values[0],
        "Fn::Equals": lambda: str(values[0]) == str(values[1]),
        "Fn::Contains": lambda: str(values[1]) in [str(value) for value in values[0]],
    }[function]()


@pytest.mark.parametrize(
    ("cpu", "memory", "rule"),
    [("BulkCpu", "BulkMemory", "BulkTaskFitsFargate"), ("VariantsCpu", "VariantsMemory", "VariantsTaskFitsFargate")],
)
def test_a_fargate_task_size_fargate_does_not_offer_is_refused_before_anything_is_created(
    cpu: str, memory: str, rule: str
) -> None:
    loaded = template()
    [assertion] = loaded["Rules"][rule]["Assertions"]
    defaults = {name: str(p.get("Default", "")) for name, p in loaded["Parameters"].items()}
    assert _rule_holds(assertion["Assert"], defaults)  # the defaults deploy
    for units in loaded["Parameters"][cpu]["AllowedValues"]:
        for megabytes in range(2048, 122880 + 1, 1024):
            allowed = _rule_holds(assertion["Assert"], defaults | {cpu: str(units), memory: str(megabytes)})
            assert allowed == (megabytes in FARGATE_SIZES[units]), (units, megabytes)


def test_a_label_studio_secret_under_a_customer_managed_key_is_decrypted_through_secrets_manager_only() -> None:
    from tools.aws.sam_template import by_default

    loaded = template()
    api = loaded["Resources"]["ApiFunction"]
    given = {
        "EnableApi": "true",
        "LabelStudioApiKeySecretArn": "arn:aws:secretsmanager:eu-central-1:1:secret:ls-AbCdEf",
    }
    key = "arn:aws:kms:eu-central-1:1:key/abcd"

    def decrypting(overrides: dict[str, str]) -> list[dict[str, Any]]:
        deployed = by_default(loaded, api, overrides)
        return [s for s in statements(deployed) if isinstance(s, dict) and s.get("Sid") == "DecryptLabelStudioKey"]

    assert decrypting(given) == []
    [statement] = decrypting(given | {"LabelStudioApiKeyKmsKeyArn": key})
    assert (statement["Action"], statement["Resource"]) == (["kms:Decrypt"], key)
    assert statement["Condition"] == {
        "StringEquals": {"kms:ViaService": {"Fn::Sub": "secretsmanager.${AWS::Region}.amazonaws.com"}}
    }


def test_caption_vision_switches_every_lane_to_the_files_models_push_uploads() -> None:
    from tools.models.push import MODEL_OUTPUTS

    outputs = template()["Outputs"]
    uploaded = {outputs[name]["Value"]["Fn::Sub"] for name in ("CaptionVisionModelUri", "CaptionVisionProjectorUri")}
    assert {MODEL_OUTPUTS[name] for name in ("CaptionVisionModelUri", "CaptionVisionProjectorUri")} == {
        "caption_vision_model",
        "caption_vision_mmproj",
    }
    lanes = {
        "CaptionFunction": RESOURCES["CaptionFunction"]["Properties"]["Environment"]["Variables"],
        "ApiFunction": RESOURCES["ApiFunction"]["Properties"]["Environment"]["Variables"],
        "BulkJobDefinition": {
            variable["Name"]: variable["Value"]
            for variable in RESOURCES["BulkJobDefinition"]["Properties"]["ContainerProperties"]["Environment"]
        },
    }
    for lane, variables in lanes.items():
        assert variables["ANNOTATE_CAPTION_VISION"] == {"Ref": "CaptionVision"}, lane
        read = {variables[f"ANNOTATE_CAPTION_VISION_{kind}"]["Fn::Sub"] for kind in ("MODEL", "MMPROJ")}
        assert read == uploaded, lane
