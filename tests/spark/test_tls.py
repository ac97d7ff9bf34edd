"""The ``mqstore`` data source's ``tls.*`` options against a gateway that serves TLS and requires
client certificates (127.0.0.1, certificates from tests/tls_certs.py): a write and a read with
the options, and a read without them refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.client import Admin
from services.serve import ServeOptions, Suite
from tests.service.harness import SMALL_STORE, InProcessSuites
from tests.tls_certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_gateway(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[str]:
    suites = InProcessSuites()
    try:
        options = ServeOptions(
            role="embedded",
            data_dir=tmp_path_factory.mktemp("spark-tls") / "data",
            listen="127.0.0.1:0",
            store=SMALL_STORE,
            tls=pki.server(client_auth=True),
        )
        suite: Suite = suites.start(options)
        suites.wait_ready(suite)
        yield suite.address
    finally:
        suites.close()


def test_tls_options_write_and_read_through_a_mutual_tls_gateway(
    spark: Any, tls_gateway: str, pki: Pki
) -> None:
    with Admin(tls_gateway, tls=pki.app()) as admin:
        admin.create_topic("SecureRows", 2)
    tls = {"tls.ca": str(pki.ca), "tls.cert": str(pki.app_cert), "tls.key": str(pki.app_key)}
    df = spark.createDataFrame([(f"row-{i}".encode(),) for i in range(20)], "body binary")
    writer = df.write.format("mqstore").option("endpoint", tls_gateway).option("topic", "SecureRows")
    writer.options(**tls).mode("append").save()

    def read(**options: str) -> list[Any]:
        reader = spark.read.format("mqstore").option("endpoint", tls_gateway).option("topic", "SecureRows")
        return reader.options(**options).load().collect()  # type: ignore[no-any-return]

    rows = read(**tls)
    assert sorted(r.body for r in rows) == sorted(f"row-{i}".encode() for i in range(20))
    with pytest.raises(Exception, match=r"UNAVAILABLE|not available"):  # plaintext: refused
        read()
    with pytest.raises(Exception, match=r"UNAVAILABLE|not available"):  # TLS without a client cert
        read(**{"tls.ca": str(pki.ca)})
    with pytest.raises(Exception, match="does not exist"):  # a bad path: a clear option error
        read(**{**tls, "tls.ca": str(pki.ca) + ".missing"})
