"""Every rank of the job runs the same tests in the same order (tandemrun
starts pytest once per rank), so each test's collectives match across ranks.
The world is joined once per session and left at its end."""
import pytest

import tandem


@pytest.fixture(scope="session", autouse=True)
def world():
    tandem.init()
    yield tandem.world()
    tandem.shutdown()
