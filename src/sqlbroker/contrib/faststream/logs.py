"""FastStream's log lines for SqlBroker: ``time level - topic | message id - text``."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from faststream._internal.logger import DefaultLoggerStorage, make_logger_state
from faststream._internal.logger.logging import get_broker_logger

if TYPE_CHECKING:
    from faststream._internal.basic_types import LoggerProto
    from faststream._internal.context import ContextRepo


class SqlParamsStorage(DefaultLoggerStorage):
    def __init__(self) -> None:
        super().__init__()
        self._max_topic_len = 4

    def set_level(self, level: int) -> None:
        self.logger_log_level = level

    def register_subscriber(self, params: dict[str, Any]) -> None:
        self._max_topic_len = max(self._max_topic_len, len(params.get("topic", "")))

    def get_logger(self, *, context: ContextRepo) -> LoggerProto:
        if not (lg := self._get_logger_ref()):
            lg = get_broker_logger(
                name="sqlbroker",
                default_context={"topic": ""},
                message_id_ln=10,
                fmt=(
                    "%(asctime)s %(levelname)-8s - "
                    f"%(topic)-{self._max_topic_len}s | "
                    "%(message_id)-10s - %(message)s"
                ),
                context=context,
                log_level=self.logger_log_level,
            )
            self._logger_ref.add(lg)
        return lg


make_sql_logger_state = partial(make_logger_state, default_storage_cls=SqlParamsStorage)
