"""Fixtures of the node tests: a tester graph, made on demand, closed after the test."""

import pytest

from test.ros.helpers import ros_context
from test.ros.tester_graph import Graph


@pytest.fixture
def graph(tmp_path):
    made = []
    with ros_context() as context:

        def make(**kwargs):
            g = Graph(context, tmp_path, **kwargs)
            made.append(g)
            if kwargs.get('start', True):
                g.wait(lambda: g.camera.publisher.get_subscription_count() > 0, 5, 'the tester to subscribe')
            return g

        yield make
        for g in made:
            g.close()
