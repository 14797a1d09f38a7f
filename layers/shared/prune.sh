#!/usr/bin/env bash
# Drop from the shared layer what Lambda's Python runtime already has: boto3's SDK, which the X-Ray SDK of Powertools'
# tracer pulls in again ("Lambda's Python runtimes include the AWS SDK for Python (Boto3)", Lambda runtimes). A
# layer's copy would stand before the runtime's boto3 on sys.path, a botocore of another version than that boto3.
set -euo pipefail
site=${1:?usage: prune.sh SITE_PACKAGES_DIR}
cd "$site"
rm -rf boto3 boto3-* botocore botocore-* s3transfer s3transfer-* jmespath jmespath-* dateutil python_dateutil-* \
  urllib3 urllib3-* six.py six-*
