"""A user's script with no ``if __name__ == "__main__":`` guard that starts a sidecar: test_sidecar runs
it as ``python tests/tracking/unguarded_script.py`` with ``OPRO_TEST_MARKER`` set. Every run of its top level
adds a line to that file, so a sidecar child that ran the script again would leave two."""

import functools
import os

from children import Counter

from opro.tracking.sidecar import Sidecar

with open(os.environ["OPRO_TEST_MARKER"], "a") as f:
    f.write("run\n")
car = Sidecar(name="s")
car.host("a", functools.partial(Counter, start=1))
print(car.call("a", "add", 1))
car.close()
