"""Every part of moto that is not its public API (``mock_aws``, its server) that the local runner, the rehearsal, the
benches and the tests reach into: its backends, its CloudFormation parsing, its Step Functions interpreter. They may
move in any release (moto is pinned exactly: pyproject.toml); an upgrade changes this module, and the test that imports
it says what moved.

Import this module inside the function that needs it: it loads moto's interpreter. Where code patches one of moto's
functions, it reaches it through its module (``cfn_parsing.clean_json``), so that a patch in force is what it calls.
It sits in tools/aws/, below the benches, the local runner and the rehearsal, so that each may import it
(docs/development.md's layers).
"""

from __future__ import annotations

from moto.athena.models import QueryResults, athena_backends
from moto.awslambda.models import LambdaVersion, LayerVersion
from moto.awslambda.models import get_backend as lambda_backend
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.batch.models import ComputeEnvironment as BatchComputeEnvironment
from moto.cloudformation import parsing as cfn_parsing
from moto.cloudformation.models import cloudformation_backends
from moto.core.botocore_stubber import MockRawResponse
from moto.core.common_models import CloudFormationModel
from moto.core.config import DefaultConfig
from moto.events.models import EventPattern
from moto.s3.models import s3_backends
from moto.secretsmanager.models import secretsmanager_backends
from moto.sqs import sqs_backends
from moto.stepfunctions.parser.api import HistoryEventType, TaskFailedEventDetails
from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import CustomErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
    FailureEvent,
    FailureEventException,
)
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import StatesErrorNameType
from moto.stepfunctions.parser.asl.component.eval_component import EvalComponent
from moto.stepfunctions.parser.asl.component.program.program import Program
from moto.stepfunctions.parser.asl.component.state.exec.state_map.item_reader.item_reader_decl import ItemReader
from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.itemprocessor import (
    distributed_item_processor_worker,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_map.result_writer.result_writer_decl import (
    ResultWriter,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_batch import (
    StateTaskServiceBatch,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.state_task_lambda import StateTaskLambda
from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails
from moto.stepfunctions.parser.utils import TMP_THREADS

__all__ = [
    "TMP_THREADS",
    "BatchComputeEnvironment",
    "CloudFormationModel",
    "CustomErrorName",
    "DefaultConfig",
    "EvalComponent",
    "EventDetails",
    "EventPattern",
    "FailureEvent",
    "FailureEventException",
    "HistoryEventType",
    "ItemReader",
    "LambdaSimpleBackend",
    "LambdaVersion",
    "LayerVersion",
    "MockRawResponse",
    "Program",
    "QueryResults",
    "ResultWriter",
    "StateTaskLambda",
    "StateTaskServiceBatch",
    "StatesErrorName",
    "StatesErrorNameType",
    "TaskFailedEventDetails",
    "athena_backends",
    "cfn_parsing",
    "cloudformation_backends",
    "distributed_item_processor_worker",
    "lambda_backend",
    "lambda_eval_utils",
    "s3_backends",
    "secretsmanager_backends",
    "sqs_backends",
]
