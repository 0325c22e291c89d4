import gc

from gdserve.utils import GC_THRESHOLDS, settle_gc


def test_settle_gc_freezes_the_startup_heap_and_raises_thresholds():
    before = gc.get_threshold()
    try:
        survivor = [object()]
        settle_gc()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == GC_THRESHOLDS
        assert all(o is not survivor for o in gc.get_objects())  # frozen: out of every collection
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
