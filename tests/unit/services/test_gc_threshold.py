"""``mqstore serve`` collects its youngest generation less often than CPython's default
(services.serve.tune_young_collections); the older generations keep their thresholds."""

from __future__ import annotations

import gc

from services.serve import YOUNG_GENERATION_THRESHOLD, tune_young_collections


def test_only_the_young_threshold_changes() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        tune_young_collections()
        assert gc.get_threshold() == (YOUNG_GENERATION_THRESHOLD, 10, 10)
        assert YOUNG_GENERATION_THRESHOLD > 700
    finally:
        gc.set_threshold(*before)
