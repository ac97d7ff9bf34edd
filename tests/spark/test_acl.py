"""The ``mqstore`` data source's ``accessKey``/``secretKey`` options against a gateway with an
accounts file: a writer account writes, a reader account (SUB on the topic and on the source's
group ``mqstore-spark``) reads, and reads without keys or with the writer's are refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.client import Admin
from services.credentials import Credentials
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites

ACL = """
accounts:
  - accessKey: etl-writer
    secretKey: w-secret
    topicPerms: [Rows=PUB]
  - accessKey: etl-reader
    secretKey: r-secret
    topicPerms: [Rows=SUB]
    groupPerms: [mqstore-spark=SUB]
  - accessKey: ops
    secretKey: ops-secret
    admin: true
"""


@pytest.fixture(scope="module")
def acl_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("spark-acl")
    (root / "plain_acl.yml").write_text(ACL)
    suites = InProcessSuites()
    try:
        options = embedded_options(root / "data")
        options.acl_file = root / "plain_acl.yml"
        suite = suites.start(options)
        suites.wait_ready(suite)
        with Admin(suite.address, credentials=Credentials("ops", "ops-secret")) as admin:
            admin.create_topic("Rows", 2)
        yield suite.address
    finally:
        suites.close()


def test_keys_options_write_and_read_with_each_accounts_rights(spark: Any, acl_gateway: str) -> None:
    df = spark.createDataFrame([(f"row-{i}".encode(),) for i in range(10)], "body binary")
    writer = df.write.format("mqstore").option("endpoint", acl_gateway).option("topic", "Rows")
    writer.options(accessKey="etl-writer", secretKey="w-secret").mode("append").save()

    def read(**options: str) -> list[Any]:
        reader = spark.read.format("mqstore").option("endpoint", acl_gateway).option("topic", "Rows")
        return reader.options(**options).load().collect()  # type: ignore[no-any-return]

    rows = read(accessKey="etl-reader", secretKey="r-secret")
    assert sorted(r.body for r in rows) == sorted(f"row-{i}".encode() for i in range(10))
    with pytest.raises(Exception, match="signed"):  # no keys
        read()
    with pytest.raises(Exception, match="may not"):  # PUB only
        read(accessKey="etl-writer", secretKey="w-secret")
    with pytest.raises(Exception, match="go together"):
        read(accessKey="etl-reader")
