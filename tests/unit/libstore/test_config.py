"""StoreConfig: RocketMQ defaults (spec §8), key spellings, sources and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from libstore.config import BrokerRole, FlushDiskType, StoreConfig
from libstore.errors import ConfigError


def test_defaults_are_rocketmqs():
    c = StoreConfig()
    assert c.mapped_file_size_commit_log == 1073741824
    assert c.mapped_file_size_consume_queue == 6_000_000
    assert c.max_message_size == 4194304
    assert (
        c.flush_interval_commit_log,
        c.flush_commit_log_least_pages,
        c.flush_commit_log_thorough_interval,
    ) == (
        500,
        4,
        10000,
    )
    assert (c.commit_interval_commit_log, c.commit_commit_log_least_pages) == (200, 4)
    assert c.sync_flush_timeout == 5000
    assert c.flush_disk_type is FlushDiskType.ASYNC_FLUSH and c.broker_role is BrokerRole.ASYNC_MASTER
    assert c.check_crc_on_recover and c.flush_commit_log_timed
    assert not c.warm_mapped_file_enable and c.flush_least_pages_when_warm_mapped_file == 4096
    assert not c.transient_store_pool_enable and c.transient_store_pool_size == 5
    assert c.os_page_cache_busy_time_out_mills == 1000
    assert c.commit_log_dir == Path(c.store_path_root_dir) / "commitlog"


def test_broker_conf_keys_env_and_overrides_in_precedence_order(tmp_path: Path):
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# RocketMQ spelling, typo included\n"
        "warmMapedFileEnable=true\n"
        "flushDiskType=SYNC_FLUSH\n"
        "mappedFileSizeCommitLog=1048576\n"
        "syncFlushTimeout = 1000\n"
    )
    env = {"MQSTORE_SYNC_FLUSH_TIMEOUT": "2000", "MQSTORE_MAX_MESSAGE_SIZE": "65536", "HOME": "/x"}
    c = StoreConfig.from_sources(conf_file=conf, env=env, overrides={"max_message_size": 1024})
    assert c.warm_mapped_file_enable is True
    assert c.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert c.mapped_file_size_commit_log == 1048576
    assert c.sync_flush_timeout == 2000  # env beats file
    assert c.max_message_size == 1024  # override beats env
    assert c.describe()["warmMapedFileEnable"] is True


@pytest.mark.parametrize(
    "values, match",
    [
        ({"noSuchKey": "1"}, "unknown config key"),
        ({"flushDiskType": "SOMETIMES"}, "bad value"),
        ({"syncFlushTimeout": "soon"}, "bad value"),
        ({"syncFlushTimeout": "0"}, "must be > 0"),
        ({"mappedFileSizeCommitLog": "100000"}, "multiple of 4096"),
        ({"mappedFileSizeCommitLog": "1048576", "maxMessageSize": "4194304"}, "hold the largest record"),
        ({"storeHost": "localhost:1"}, "numeric"),
        ({"transientStorePoolEnable": "true", "brokerRole": "SLAVE"}, "SLAVE"),
        ({"checkCRCOnRecover": "maybe"}, "bad value"),
        ({"deleteWhen": "4pm"}, "hours 00-23"),
        ({"deleteWhen": "24"}, "hours 00-23"),
        ({"diskMaxUsedSpaceRatio": "100"}, "within 1..99"),
        ({"diskSpaceCleanForciblyRatio": "95"}, "exceeds disk_space_warning_level_ratio"),
        ({"fileReservedTime": "0"}, "must be > 0"),
    ],
)
def test_bad_values_raise_config_error(values, match):
    with pytest.raises(ConfigError, match=match):
        StoreConfig.from_mapping(values)


def test_missing_config_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        StoreConfig.from_sources(conf_file=tmp_path / "nope.conf")


# The key=value lines of Apache RocketMQ's distribution conf/broker.conf and
# conf/2m-2s-sync/broker-a.properties, broker-a-s.properties.
STOCK_CONFS = {
    "broker.conf": "brokerClusterName = DefaultCluster\nbrokerName = broker-a\nbrokerId = 0\n"
    "deleteWhen = 04\nfileReservedTime = 48\nbrokerRole = ASYNC_MASTER\nflushDiskType = ASYNC_FLUSH\n",
    "broker-a.properties": "brokerClusterName=DefaultCluster\nbrokerName=broker-a\nbrokerId=0\n"
    "deleteWhen=04\nfileReservedTime=48\nbrokerRole=SYNC_MASTER\nflushDiskType=ASYNC_FLUSH\n",
    "broker-a-s.properties": "brokerClusterName=DefaultCluster\nbrokerName=broker-a\nbrokerId=1\n"
    "deleteWhen=04\nfileReservedTime=48\nbrokerRole=SLAVE\nflushDiskType=ASYNC_FLUSH\n",
}


@pytest.mark.parametrize("name", sorted(STOCK_CONFS))
def test_a_stock_rocketmq_broker_conf_loads(tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture):
    conf = tmp_path / name
    conf.write_text(STOCK_CONFS[name])
    c = StoreConfig.from_sources(conf_file=conf)
    assert (c.broker_name, c.file_reserved_time, c.delete_hours) == ("broker-a", 48, frozenset({4}))
    assert c.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert c.broker_role.value == {"broker.conf": "ASYNC_MASTER", "broker-a.properties": "SYNC_MASTER"}.get(
        name, "SLAVE"
    )
    assert c.broker_id == (1 if name == "broker-a-s.properties" else 0)
    ignored = [r.getMessage() for r in caplog.records if "does not implement" in r.getMessage()]
    assert ignored == ["ignoring RocketMQ config keys that mqstore does not implement: brokerClusterName"]


def test_rocketmq_keys_not_implemented_are_ignored_and_typos_are_refused_with_a_suggestion():
    c = StoreConfig.from_mapping({"namesrvAddr": "127.0.0.1:9876", "sendMessageThreadPoolNums": "16"})
    assert c == StoreConfig()
    with pytest.raises(
        ConfigError, match="unknown config key 'fileReservedTim'; did you mean 'fileReservedTime'"
    ):
        StoreConfig.from_mapping({"fileReservedTim": "48"})
    with pytest.raises(ConfigError, match="did you mean 'namesrvAddr'"):
        StoreConfig.from_mapping({"namesrvAdr": "x"})
    with pytest.raises(ConfigError, match=r"unknown config key 'zzz'$"):
        StoreConfig.from_mapping({"zzz": "1"})
