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
    ],
)
def test_bad_values_raise_config_error(values, match):
    with pytest.raises(ConfigError, match=match):
        StoreConfig.from_mapping(values)


def test_missing_config_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        StoreConfig.from_sources(conf_file=tmp_path / "nope.conf")
