"""Every file and folder name of a store, in one place (spec sheet §0).

Under the store root: ``commitlog/<20-digit offset>``, ``consumequeue/<topic>/<queueId>/<20-digit
offset>``, ``index/<yyyyMMddHHmmssSSS>``, ``checkpoint``, ``abort`` (marker of an unclean
shutdown), ``lock`` (exclusive OS lock), ``config/`` (JSON state: topics, queue offsets,
consumer offsets, HA role and epochs, the log's truncation history), ``segmentsummary/<20-digit
offset>.json`` (the topics each CommitLog segment holds, for retention), ``transient/`` (scratch
files of paged-out transient messages, deleted on start).
"""

from __future__ import annotations

from pathlib import Path

COMMIT_LOG_DIR = "commitlog"
CONSUME_QUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
CONFIG_DIR = "config"
TOPICS_FILE = "topics.json"
QUEUE_OFFSET_TABLE_FILE = "queueOffsetTable.json"
CONSUMER_OFFSET_FILE = "consumerOffset.json"
HA_STATE_FILE = "haState.json"
LOG_GENERATION_FILE = "logGeneration.json"
CLEAN_END_FILE = "cleanEnd.json"
SEGMENT_SUMMARY_DIR = "segmentsummary"
TRANSIENT_SCRATCH_DIR = "transient"
# Inside consumequeue/ and index/: how far each is built and flushed (deleted with its folder).
DISPATCH_CHECKPOINT_FILE = "dispatchOffset.json"


def commit_log_dir(root: Path) -> Path:
    return Path(root) / COMMIT_LOG_DIR


def consume_queue_dir(root: Path) -> Path:
    return Path(root) / CONSUME_QUEUE_DIR


def index_dir(root: Path) -> Path:
    return Path(root) / INDEX_DIR


def transient_scratch_dir(root: Path) -> Path:
    return Path(root) / TRANSIENT_SCRATCH_DIR


def checkpoint_path(root: Path) -> Path:
    return Path(root) / CHECKPOINT_FILE


def abort_path(root: Path) -> Path:
    return Path(root) / ABORT_FILE


def lock_path(root: Path) -> Path:
    return Path(root) / LOCK_FILE


def config_dir(root: Path) -> Path:
    return Path(root) / CONFIG_DIR


def topics_path(root: Path) -> Path:
    return config_dir(root) / TOPICS_FILE


def queue_offset_table_path(root: Path) -> Path:
    return config_dir(root) / QUEUE_OFFSET_TABLE_FILE


def consumer_offset_path(root: Path) -> Path:
    return config_dir(root) / CONSUMER_OFFSET_FILE


def dispatch_checkpoint_path(derived_dir: Path) -> Path:
    """The dispatch checkpoint of a derived folder (``consumequeue`` or ``index``)."""
    return Path(derived_dir) / DISPATCH_CHECKPOINT_FILE


def ha_state_path(root: Path) -> Path:
    """Replication role and master epochs (libstore.ha_state)."""
    return config_dir(root) / HA_STATE_FILE


def log_generation_path(root: Path) -> Path:
    """The CommitLog's truncation history (libstore.log_generation)."""
    return config_dir(root) / LOG_GENERATION_FILE


def clean_end_path(root: Path) -> Path:
    """Where the last clean shutdown left the log's end and its last record (libstore.recovery)."""
    return config_dir(root) / CLEAN_END_FILE


def segment_summary_dir(root: Path) -> Path:
    """Per-segment topic summaries of the CommitLog (libstore.segment_summary)."""
    return Path(root) / SEGMENT_SUMMARY_DIR
