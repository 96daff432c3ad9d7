"""The suite's own guard: grouped tests fail, saying why, when pytest-xdist loses their group."""
from types import SimpleNamespace

import pytest

import conftest


def _item(nodeid, grouped, config):
    mark = pytest.mark.xdist_group("wheels").mark if grouped else None
    return SimpleNamespace(nodeid=nodeid, config=config,
                           get_closest_marker=lambda name: mark if name == "xdist_group" else None)


def _session(ids, loadgroup=True):
    config = SimpleNamespace(option=SimpleNamespace(loadgroup=loadgroup), stash=pytest.Stash())
    items = [_item(nodeid, grouped, config) for nodeid, grouped in ids]
    return SimpleNamespace(config=config, items=items), items


def test_grouped_tests_fail_when_their_group_tag_is_lost():
    session, (grouped, plain) = _session([("test_w.py::test_a", True), ("test_x.py::test_b", False)])
    conftest.pytest_collection_finish(session)
    with pytest.raises(pytest.fail.Exception, match=r"did not tag .*\(pytest-xdist issue 1386\).*"
                                                    r"pip install \"\.\[test\]\""):
        conftest.pytest_runtest_setup(grouped)
    conftest.pytest_runtest_setup(plain)  # an ungrouped test runs on


@pytest.mark.parametrize("ids, loadgroup", [
    ([("test_w.py::test_a@wheels", True), ("test_x.py::test_b", False)], True),  # tagged
    ([("test_w.py::test_a", True)], False),                   # -n 0 or another --dist: no tags
])
def test_grouped_tests_run_when_the_group_holds_or_is_not_asked_for(ids, loadgroup):
    session, items = _session(ids, loadgroup)
    conftest.pytest_collection_finish(session)
    for item in items:
        conftest.pytest_runtest_setup(item)
